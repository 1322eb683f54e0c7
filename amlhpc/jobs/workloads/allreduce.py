"""All-reduce bandwidth sweep over every rank of the job (the nccl-tests all_reduce_perf
measurement, the NDv4 performance article, in torch.distributed): NCCL on GPUs, gloo on CPU.

    python -m amlhpc.jobs.workloads.allreduce --min-bytes 8 --max-bytes 8G --factor 2 --report FILE

For each size: algbw = bytes / time, busbw = algbw x 2(n-1)/n (NVIDIA nccl-tests' bus bandwidth). The largest
size's bus bandwidth is judged against the SKU's marks from AMLHPC_SKU_JSON (the multi-node
band for what the all-reduce crosses and for SHARP on or off, amlhpc/jobs/runtime/node/multinode.py,
or the single-node minimum), unless --no-judge (the recipe's local rehearsal on CPU, where a
GPU's marks mean nothing). This sweep does not read the nodes' NVLink domains: on a size with
a multi-node NVLink domain it judges against the band across InfiniBand, the lower one. Exit 0
pass, warn or not judged, 1 fail.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.node.multinode import choose_band, job_topology, sharp_on
from amlhpc.jobs.runtime.node.skufacts import SkuFacts, parse_sku_facts
from amlhpc.jobs.workloads import common

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)([KMG]?)B?", text.strip().upper())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 8, 64K, 128M or 8G")
    return int(match.group(1)) * _UNITS[match.group(2)]


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= factor
    return out


def bus_bandwidth(algbw: float, world: int) -> float:
    return algbw * 2 * (world - 1) / world if world > 1 else 0.0


def judge(busbw_gbytes: float, sku: SkuFacts | None, nodes: int, sharp: bool = False) -> tuple[str, str]:
    """pass / warn / fail / unknown against the catalog's published figures."""
    if sku is not None and nodes > 1:
        band, why = choose_band(sku.health.multinode, job_topology(sku, [None] * nodes, nodes), sharp)
        if band is None:
            return "unknown", f"{busbw_gbytes:.1f} GB/s ({why})"
        expected, warn, fail = band.busbw_gbytes_per_s
        verdict = "fail" if busbw_gbytes < fail else "warn" if busbw_gbytes < warn else "pass"
        return verdict, f"{busbw_gbytes:.1f} GB/s vs expected {expected}, warn < {warn}, fail < {fail} ({why})"
    single = sku.health.nccl_allreduce_busbw_gbytes_per_s_min if sku else None
    if nodes == 1 and single:
        return ("pass" if busbw_gbytes >= single else "fail"), f"{busbw_gbytes:.1f} GB/s vs >= {single} (one node)"
    return "unknown", f"{busbw_gbytes:.1f} GB/s (no published mark for this size and node count)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="all-reduce bandwidth sweep")
    p.add_argument("--min-bytes", type=parse_size, default=8)
    p.add_argument("--max-bytes", type=parse_size, default=1 << 30)
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--report", type=Path, default=Path("outputs/aml-hpc/allreduce.json"))
    p.add_argument("--no-judge", dest="judge", action="store_false",
                   help="report the sweep without judging it against the SKU's marks (a CPU rehearsal over gloo)")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    d = common.init_distributed()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or d.world)
    nodes = max(1, d.world // max(local_world, 1))
    rows = []
    for size in sizes(args.min_bytes, args.max_bytes, args.factor):
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=d.device)
        for _ in range(args.warmup):
            dist.all_reduce(tensor) if d.world > 1 else None
        if d.device.type == "cuda":
            torch.cuda.synchronize()
        common.barrier(d)
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(tensor) if d.world > 1 else None
        if d.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = common.all_reduce_mean(d, (time.perf_counter() - start) / args.iters)
        algbw = tensor.numel() * 4 / seconds / 1e9 if seconds > 0 else 0.0
        rows.append({"bytes": tensor.numel() * 4, "time_us": seconds * 1e6, "algbw_gbytes_per_s": algbw,
                     "busbw_gbytes_per_s": bus_bandwidth(algbw, d.world)})
        if d.is_main:
            print(f"{rows[-1]['bytes']:>12} B {rows[-1]['time_us']:>12.1f} us  algbw {algbw:8.2f} GB/s  "
                  f"busbw {rows[-1]['busbw_gbytes_per_s']:8.2f} GB/s", flush=True)
    sku = parse_sku_facts(os.environ[contract.SKU_JSON]) if os.environ.get(contract.SKU_JSON) else None
    if args.judge:
        verdict, detail = judge(rows[-1]["busbw_gbytes_per_s"], sku, nodes, sharp_on(os.environ))
    else:
        verdict, detail = "not judged", f"{rows[-1]['busbw_gbytes_per_s']:.2f} GB/s (--no-judge: the SKU's marks are not applied)"
    if d.is_main:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps({"world_size": d.world, "nodes": nodes, "backend": dist.get_backend() if d.world > 1 else None,
                                           "sizes": rows, "verdict": verdict, "detail": detail}, indent=2))
        print(f"largest message: {verdict}: {detail}", flush=True)
    common.Metrics(d).summary(throughput=rows[-1]["busbw_gbytes_per_s"], throughput_unit="GB/s busbw",
                              world_size=d.world, workload="allreduce", verdict=verdict)  # every rank: it reports completion
    return 1 if verdict == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
