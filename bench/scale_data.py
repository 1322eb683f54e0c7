"""Scale benchmark, data part: a 405B checkpoint from a 1,000-node job, striped over the
storage accounts it needs, in the simulated Azure.

    python -m bench.scale_data [--nodes 1000] [--accounts 1,4] [--seeds 5] [--factor 1e-6]
                               [--block-mib 256] [--ingress-gbps 25] [--interval-s 600]

Every node holds its part of one version (16 bytes per parameter of a 405B model, spread evenly
over the nodes); node 0 leads it and every node's VersionUploader stages its parts over the
job's checkpoint accounts (store.py's striping) and node 0 commits, the real code on virtual
time. The accounts take `--ingress-gbps` each (Azure's published ingress for a standard
general-purpose v2 account is 25-60 Gb/s by region: the low end here) and 20,000 requests/s;
each node's upload is capped as the job build caps it: 90 % of the accounts' ingress together,
shared by the nodes. `accounts` is what size / (interval x 0.9 x ingress) asks for.

Bytes are scaled by `--factor` (the service's ingress and the nodes' caps with them, so every
time is the real one) and the blocks with them (`--block-mib` of real bytes each), so the
request counts are those of a real upload with blocks of that size: the uploader's floor is
8 MiB, 32x the requests of 256 MiB blocks; both are printed against the account's target.

Figures per run: the commit time (from node 0's lead to `latest` naming the version), per
account its bytes, average Gb/s over the commit, and peak requests/s. Then what a shrink restore
of that checkpoint reads (`--shrink-to` nodes, 90 % by default): modelled by bench.shrink_reads,
no bytes move.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from amlhpc.core.storage_load import CHECKPOINT_INGRESS_SHARE, checkpoint_accounts_needed
from amlhpc.jobs.runtime.checkpoint import blocks
from bench import shrink_reads
from bench.machine import describe_machine, loadavg

PARAMS = 405e9
BYTES_PER_PARAM = 16
"""bf16 weights, fp32 master weights and two Adam moments: ~16 bytes per parameter."""
REQUEST_TARGET = 20_000
UPLOADER_BLOCK_MIB = 8
"""The checkpoint uploader's block floor (store.BLOCK_BYTES)."""
SHRINK_BOUND = 1.1
"""What a shrink restore may read across all nodes, as a multiple of the checkpoint."""


SCALED_PART = "shard.bin"
"""The one file of a rank's part whose bytes are scaled (save_version); its marker beside it, the
pending records, the manifest and the pointer keep their real size."""


def checkpoint_commit(nodes: int, accounts: int, seed: int, root: Path, *, factor: float, block_mib: int,
                      ingress_gbps: float, horizon_s: float) -> dict[str, Any]:
    import random

    from amlhpc.jobs.runtime.base.throttle import Throttle
    from amlhpc.jobs.runtime.checkpoint import tier
    from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of
    from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore
    from amlhpc.jobs.runtime.checkpoint.uploader import VersionUploader
    from amlhpc.jobs.runtime.coord.agree import Channel
    from amlhpc.sim.limits import BlobLimits
    from amlhpc.sim.scenarios.checkpoints import save_version
    from amlhpc.sim.world import ACCOUNT, World

    names = [ACCOUNT] + [f"simckpt{i}" for i in range(1, accounts)]
    # The parts' bytes are scaled by `factor` and so is the ingress; the records beside them keep
    # their real size, so they are charged at the same scale.
    limits = BlobLimits(account_ingress_gbit_s=ingress_gbps * factor,
                        ingress_charge=lambda name, size: size if name.endswith(SCALED_PART) else size * factor)
    per_node = PARAMS * BYTES_PER_PARAM / nodes * factor
    block = max(1, int(block_mib * (1 << 20) * factor))
    cap_bytes_s = ingress_gbps * 1e9 / 8 * accounts * CHECKPOINT_INGRESS_SHARE / nodes * factor
    with World(seed, limits=limits, trace_limit=1, trace_requests=False, log_level=50) as world:
        containers = [(name, world.container("checkpoints", account=name)) for name in names]
        hosts = [world.node(f"node-{k}") for k in range(nodes)]
        server = world.jobstore(hosts[0])
        tag = tier.timeline_tag("run", 0)
        uploaders: list[VersionUploader] = []
        for k, host in enumerate(hosts):
            folder = root / f"node-{k}"
            unit = len(f"{k}:100:")  # save_version writes size // 8 copies of this
            save_version(folder, k, 100, nodes, tag, size=int(per_node) * 8 // unit)
            throttle = Throttle(cap_bytes_s, burst_bytes=block, clock=lambda: world.now, sleep=world.sim.sleep)
            store = CheckpointStore(containers[0][1], "exp/run/versions", node=k, throttle=throttle,
                                    block_bytes=block, workers=2, blocks_in_flight=2,
                                    stripes=containers if accounts > 1 else ())
            channel = Channel(server.client(), node=k, nodes=nodes, rng=random.Random(f"{seed}:{k}"))
            uploader = VersionUploader(store, folder, [k], k, nodes, 600.0, 3, 2, channel=channel.scoped("ckpt", "u0"))

            def loop(uploader=uploader, k=k) -> None:
                if k == 0:
                    uploader._announce(lead=None, committed=None)
                led = False
                while True:
                    world.sim.sleep(uploader.poll_s)
                    due = k == 0 and not led and world.now >= 1.0
                    led = led or due
                    uploader._step(due)
            world.spawn(f"upload-{k}", loop, node=host)
            uploaders.append(uploader)
        blobs = world.blob.accounts[ACCOUNT].containers["checkpoints"].blobs

        def committed() -> bool:
            blob = blobs.get("exp/run/versions/latest")
            return blob is not None and sequence_of(json.loads(blob.data)["version"]) == 100
        world.sim.run_until(committed, limit_s=horizon_s)
        done = committed()
        seconds = world.now - 1.0
        per_account = {}
        for name in names:
            stored = sum(b.size if n.endswith(SCALED_PART) else b.size * factor
                         for n, b in world.blob.accounts[name].containers["checkpoints"].blobs.items() if "/data/" in n)
            peak = world.blob.accounting.accounts.get(name)
            per_account[name] = {"tb": round(stored / factor / 1e12, 3),
                                 "gbps": round(stored / factor * 8 / 1e9 / max(seconds, 1e-9), 1),
                                 "peak_rps": peak.peak if peak else 0}
        return {"commit_s": round(seconds, 1) if done else None, "horizon_s": horizon_s, "accounts": per_account,
                "throttled": world.blob.accounting.throttled.get("*account*", 0),
                "errors": sorted({e for u in uploaders for e in u.errors})[:3]}


def _median(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--accounts", default="", help="comma-separated account counts (default: 1 and what the size needs)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--factor", type=float, default=1e-6)
    parser.add_argument("--block-mib", type=int, default=256)
    parser.add_argument("--ingress-gbps", type=float, default=25.0)
    parser.add_argument("--interval-s", type=float, default=600.0)
    parser.add_argument("--shrink-to", type=int, default=0,
                        help="nodes a shrink restore of the checkpoint resumes on (default: 90 %% of --nodes)")
    args = parser.parse_args(argv)
    for name in ("nodes", "seeds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if not 0 <= args.shrink_to <= args.nodes:
        parser.error(f"--shrink-to {args.shrink_to} must be from 1 to --nodes ({args.nodes}), or 0 for 90 % of them")
    size = PARAMS * BYTES_PER_PARAM
    needed = checkpoint_accounts_needed(size, args.interval_s, args.ingress_gbps)
    counts = [int(a) for a in args.accounts.split(",")] if args.accounts else sorted({1, needed})
    started, load = time.monotonic(), loadavg()
    print(f"405B checkpoint: {size / 1e12:.2f} TB from {args.nodes} nodes, interval {args.interval_s:.0f} s, "
          f"{args.ingress_gbps:g} Gb/s ingress per account: {needed} account(s) needed")
    print("| accounts | commit s, median (range) | per account Gb/s (ingress) | peak requests/s per account "
          f"({args.block_mib} MiB blocks; at {UPLOADER_BLOCK_MIB} MiB) | target |")
    print("|---|---|---|---|---|")
    for count in counts:
        runs = []
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(checkpoint_commit(args.nodes, count, seed, Path(tmp), factor=args.factor,
                                              block_mib=args.block_mib, ingress_gbps=args.ingress_gbps,
                                              horizon_s=args.interval_s * 1.5))
        times = [r["commit_s"] for r in runs if r["commit_s"] is not None]
        commit = _median(times) if len(times) == len(runs) else f"> {args.interval_s * 1.5:.0f} ({len(times)}/{len(runs)} committed)"
        gbps = [a["gbps"] for r in runs for a in r["accounts"].values()]
        rps = [a["peak_rps"] for r in runs for a in r["accounts"].values()]
        scale = args.block_mib / UPLOADER_BLOCK_MIB
        print(f"| {count} | {commit} | {min(gbps):.1f}-{max(gbps):.1f} of {args.ingress_gbps:g} | "
              f"{max(rps):.0f}; ~{max(rps) * scale:.0f} | {REQUEST_TARGET:,} |")
    shrink_to = args.shrink_to or max(1, args.nodes * 9 // 10)
    total, read = shrink_reads.built(args.nodes, shrink_to, blocks.DEFAULT_KIB << 10)
    print(f"\nShrink restore from {args.nodes} to {shrink_to} nodes: {read / total:.3f}x the checkpoint read across "
          f"all nodes (at most {SHRINK_BOUND}x; the rows each node needs, bench.shrink_reads `built`, "
          f"{blocks.DEFAULT_KIB} KiB blocks; every part on every node: {shrink_to}x)")
    print(f"\n{describe_machine()}; load {load}; {time.monotonic() - started:.0f} s; command: python -m bench.scale_data "
          + " ".join(argv if argv is not None else sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
