"""Scale benchmark: the project's coordination at 8 to 1,000 nodes, in the simulated Azure.

    python -m bench.scale [--nodes 8,64,512,1000] [--seeds 5] [--big-seeds 1] [--sweep 1000]
                          [--sweep-from OLD/scale.json] [--out bench/out] [--update-results]

Every figure comes from the real code running in amlhpc.sim (one process, virtual time, Azure's
published targets: 20,000 requests/s per account, 500/s per blob, Resource Manager's token
buckets), never from a formula. For each node count N and each coordination protocol (today's:
`blob-polling`; add one function per protocol to PROTOCOLS to measure another):

- steady: the training runs; every node's launcher polls as it does (the restart coordinator
  reads the job's failure record every 0.5 s, the version uploader's follow round every 1 s,
  the watchdog's heartbeat every check): peak requests/s on the account and on the hottest blob;
- commit: every node holds a new version; node 0 leads it and the others stage their parts:
  the time until `latest` names it (or "> H s" when it did not within the simulated H), and the
  peak requests/s meanwhile;
- restart: one node's training fails; the restart agreement's time from the failure to the last
  node's decision, and whether every node decided the same - idle, and beside 12,800 requests/s
  of other jobs' traffic on the account (50 jobs of 64 nodes polling as above);
- listing: the List Blobs pages staging asks for at a job's start (every node lists the whole
  dataset: measured on one node, times N);
- start: every node resolves a versioned dataset as staging does (one listing page of its
  `_versions/`, then its manifest in the node's read slot): the manifest blob's peak requests/s
  and when the last node has it;
- end: every launcher's goodbye on the job's store (the nodes finishing over 30 s): how long
  node 0, which hosts the store, stays after the last node's goodbye, and when it fails with a
  node that never reached the store, that it waits only for those that did;
- controllers: 50 managed runs' controllers observing their attempts every poll (jobs.get,
  the run's history, the cluster's nodes) under one identity: Resource Manager calls/s against
  its limits, and 429s;
- the seeded exploration: `--sweep` seeds per scenario, violations by known defect.

N = 512 and 1,000 cost minutes of CPU per run (each look of today's restart agreement is N GETs
on every node), so they run `--big-seeds` seeds; the smaller ones run `--seeds`. A figure is the
median over seeds with its range. Results: `--out` (scale.md, scale.json); `--update-results`
also writes the table as its own section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.machine import describe_machine, loadavg

RESULTS = Path(__file__).with_name("RESULTS.md")
SECTION = "# Scale benchmark: coordination at 8 to 1,000 nodes, simulated"
PREFIX = "exp/run"
CONTAINER = "checkpoints"
FLEET_JOBS, FLEET_NODES = 50, 64
BACKGROUND_RPS = 12_800.0
"""Other jobs' traffic beside a restart: 50 jobs of 64 nodes, ~4 requests/s a node (the steady figure)."""
COMMIT_HORIZON_S = 60.0
RESTART_HORIZON_S = 400.0


def _world(seed: int, background: float = 0.0):
    from amlhpc.sim.world import ACCOUNT, World

    world = World(seed, trace_limit=1, trace_requests=False, log_level=50)
    world.blob.account(ACCOUNT).set_background(background)
    return world


def _peaks(world, start_s: float = 0.0) -> dict[str, Any]:
    from amlhpc.sim.world import ACCOUNT

    accounting = world.blob.accounting
    per_second = [n for second, n in accounting.per_second.items() if second >= start_s]
    hottest = accounting.hottest(ACCOUNT)
    return {"account_rps": max(per_second, default=0), "hot_blob": hottest[0] if hottest else None,
            "hot_blob_rps": hottest[1].peak if hottest else 0, "requests": accounting.total(),
            "throttled": sum(v for k, v in accounting.throttled.items() if k == "*account*" or k == "*blob*")}


def _hold(root: Path, node: int, nodes: int, step: int) -> Path:
    from amlhpc.jobs.runtime.checkpoint import tier
    from amlhpc.sim.scenarios.checkpoints import save_version

    folder = root / f"node-{node}"
    save_version(folder, node, step, nodes, tier.timeline_tag("run", 0))
    return folder


# --- the protocol: coordination on the job's own store, Blob for what outlives the job -----------


def _channel(world, server, k: int, nodes: int):
    import random

    from amlhpc.jobs.runtime.coord.agree import Channel

    return Channel(server.client(), node=k, nodes=nodes, rng=random.Random(f"{world.seed}:{k}"))


def _coordinate(world, server, node, k: int, nodes: int, root: Path, agree_s: float = 300.0, outcome=None,
                fail_at: float | None = None, command: bool = True):
    """The node leader's restart coordinator (its generation's keys on the job's store), and (with
    `command`) its local rank's training command, which fails at `fail_at` or is stopped when the
    leader writes the node's stop record (the launcher's stopper polls for it every 0.1 s; here the
    record's writer wakes it, at the same instant)."""
    import random

    from amlhpc.jobs.runtime.launch import restart

    waiting: list = []

    class Records(restart.NodeRecords):
        def request_stop(self, failure: dict[str, Any]) -> None:
            super().request_stop(failure)
            for task in waiting:
                world.sim.wake(task)

    records = Records(root / f"node-{k}" / "restart", 0)

    def run_command() -> None:
        waiting.append(world.sim.current())
        stopped = world.sim.park(fail_at) if fail_at is not None else world.sim.park()
        if stopped or records.stop_requested() is not None:
            records.record_exit(0, 137, "restart", "stopped for an in-job restart")
        else:
            records.record_exit(0, 1, "exit", "exit 1")

    def coordinate() -> None:
        shared = restart.JobAgreement(_channel(world, server, k, nodes), 0)
        hooks = restart.Hooks(report=lambda: {"versions": [{"name": "step-000000100", "step": 100, "tag": "t"}],
                                              "folder_files": False}, apply=lambda decision: decision)
        coordinator = restart.Coordinator(generation=0, node=k, nodes=nodes, local_size=1, records=records,
                                          shared=shared, limit=3, agree_s=agree_s, hooks=hooks,
                                          rng=random.Random(f"{world.seed}:c{k}"))
        try:
            decision = coordinator.run()
            said = (decision.result, decision.version)
        except Exception as exc:  # noqa: BLE001 - the node then ends without a decision
            said = ("error", type(exc).__name__)
        if outcome is not None:
            outcome[k] = (said, world.now)
    if command:
        world.spawn(f"command-{k}", run_command, node=node)
    world.spawn(f"coordinator-{k}", coordinate, node=node)


def _uploader(world, server, node, k: int, nodes: int, folder: Path, lead_at: float | None = None):
    from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore
    from amlhpc.jobs.runtime.checkpoint.uploader import VersionUploader

    store = CheckpointStore(world.container(CONTAINER), f"{PREFIX}/versions", node=k, workers=2, blocks_in_flight=2)
    uploader = VersionUploader(store, folder, [k], k, nodes, 600.0, 3, 2,
                               channel=_channel(world, server, k, nodes).scoped("ckpt", "u0"))

    def loop() -> None:
        if k == 0:
            uploader._announce(lead=None, committed=None)
        led = False
        while True:
            world.sim.sleep(uploader.poll_s)
            due = k == 0 and lead_at is not None and not led and world.now >= lead_at
            led = led or due
            uploader._step(due)
    world.spawn(f"upload-{k}", loop, node=node)


def _heartbeats(world, node, k: int, nodes: int, folder: Path, check_s: float = 60.0):
    """The node's watchdog as its launcher runs it: a heartbeat and one listing of the peers' per look,
    looks paced with the node count (Guard.look_s)."""
    from amlhpc.jobs.runtime.launch import watchdog
    from amlhpc.sim.scenarios.watchdog import write_progress

    def loop() -> None:
        folder.mkdir(parents=True, exist_ok=True)
        write_progress(watchdog.progress_path(folder, 0), 1, 1, 1, node.clock.time())
        guard = watchdog.Guard(settings=watchdog.WatchdogSettings(hang_s=1200.0, check_s=check_s), node=k,
                               local_rank=0, local_size=1, folder=folder, child_pid=-1, term_grace_s=5.0,
                               shared=(world.container(CONTAINER), PREFIX, "job"), nodes=nodes)
        world.sim.sleep(world.sim.rng.uniform(0.0, guard.look_s))
        while True:
            guard.check()
            world.sim.sleep(guard.look_s)
    world.spawn(f"watchdog-{k}", loop, node=node)


def _store_rates(server, window_s: float, nodes: int, before: int = 0) -> dict[str, Any]:
    """The store's busiest second, and its operations per node per second over the window
    (`before`: the operations served before the window)."""
    return {"store_ops_peak_per_s": server.served.peak,
            "store_ops_per_node_s": round((server.served.total - before) / window_s / nodes, 3)}


def job_store_steady(n: int, seed: int, root: Path, window_s: float = 8.0, check_s: float = 5.0,
                     warmup_s: float = 2.0) -> dict[str, Any]:
    """A job training with nothing happening: every node's restart coordinator, version uploader
    and watchdog poll as they do; `window_s` virtual seconds after a warm-up."""
    with _world(seed) as world:
        world.container(CONTAINER)
        nodes = [world.node(f"node-{k}") for k in range(n)]
        server = world.jobstore(nodes[0])
        for k, node in enumerate(nodes):
            folder = _hold(root, k, n, 100)
            _coordinate(world, server, node, k, n, root, command=False)
            _uploader(world, server, node, k, n, folder)
            _heartbeats(world, node, k, n, folder / "progress", check_s)
        world.run(warmup_s)
        ops_before, requests_before = server.served.total, world.blob.accounting.total()
        world.run(warmup_s + window_s)
        return {**_peaks(world, start_s=warmup_s), **_store_rates(server, window_s, n, ops_before),
                "blob_requests_per_node_s": round((world.blob.accounting.total() - requests_before) / window_s / n, 3)}


def job_store_commit(n: int, seed: int, root: Path) -> dict[str, Any]:
    from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of
    from amlhpc.sim.world import ACCOUNT

    with _world(seed) as world:
        world.container(CONTAINER)
        blobs = world.blob.accounts[ACCOUNT].containers[CONTAINER].blobs
        nodes = [world.node(f"node-{k}") for k in range(n)]
        server = world.jobstore(nodes[0])
        for k, node in enumerate(nodes):
            _uploader(world, server, node, k, n, _hold(root, k, n, 100), lead_at=1.0)

        def committed() -> bool:
            blob = blobs.get(f"{PREFIX}/versions/latest")
            return blob is not None and sequence_of(json.loads(blob.data)["version"]) == 100
        world.sim.run_until(committed, limit_s=COMMIT_HORIZON_S)
        done = committed()
        return {**_peaks(world), **_store_rates(server, max(world.now, 1.0), n),
                "commit_s": round(world.now - 1.0, 1) if done else None, "horizon_s": COMMIT_HORIZON_S}


def job_store_restart(n: int, seed: int, root: Path, background: float = 0.0) -> dict[str, Any]:
    with _world(seed, background) as world:
        world.container(CONTAINER)
        outcome: dict[int, tuple[tuple[str, Any], float]] = {}
        fail_at = 1.0
        nodes = [world.node(f"node-{k}") for k in range(n)]
        server = world.jobstore(nodes[0])
        for k, node in enumerate(nodes):
            _coordinate(world, server, node, k, n, root, outcome=outcome, fail_at=fail_at if k == n // 2 else None)
        world.sim.run_until(lambda: len(outcome) == n, limit_s=RESTART_HORIZON_S)
        said = Counter(str(v[0]) for v in outcome.values())
        decided = len(outcome) == n
        return {**_peaks(world), **_store_rates(server, max(world.now, 1.0), n),
                "agree_s": round(max(t for _, t in outcome.values()) - fail_at, 1) if decided else None,
                "decisions": dict(said), "split": len(said) > 1, "horizon_s": RESTART_HORIZON_S}


def job_store_listing(n: int, seed: int, root: Path, files: int = 20_000) -> dict[str, Any]:
    from amlhpc.jobs.runtime.staging.stager import list_entries
    from amlhpc.jobs.runtime.staging.stagespec import StageSpec
    from amlhpc.sim.world import ACCOUNT

    with _world(seed) as world:
        world.container("datasets")
        for i in range(files):
            world.blob.call(ACCOUNT, "put_blob", "setup", container="datasets", blob=f"ds/{i:07d}.rec", data=b"x")
        before = world.blob.accounting.ops["list_blobs"]
        reader = world.reader("datasets")
        entries = world.call(lambda: list_entries(reader, StageSpec(name="ds", container="datasets", prefix="ds")),
                             node=world.node("node-0"))
        pages = world.blob.accounting.ops["list_blobs"] - before
    return {"files": len(entries), "pages_per_node": pages, "pages_per_job": pages * n}


def job_store_start(n: int, seed: int, root: Path, files: int = 2_000, part_rows: int | None = None) -> dict[str, Any]:
    """Every node resolves a versioned dataset and plans its share as staging does at a job's
    start (one listing of `<name>/_versions/`, then the manifest in the node's read slot, and
    with `part_rows` set below `files`, the manifest's parts that hold its share): the manifest
    blobs' peak, and the bytes each node read."""
    from amlhpc.jobs.runtime.base.ranks import validated
    from amlhpc.jobs.runtime.blob import blobhttp
    from amlhpc.jobs.runtime.staging import dataversion
    from amlhpc.jobs.runtime.staging.stager import plan_source, resolve_source
    from amlhpc.jobs.runtime.staging.stagespec import StageSpec
    from amlhpc.sim.world import ACCOUNT

    with _world(seed) as world:
        world.container("datasets")
        rows: list[Any] = [[f"ds/v1/{i:07d}.rec", 1000 + i % 7, '"0x1"', "", "", {}] for i in range(files)]
        manifest, parts = dataversion.build_version("ds", 1, "ds/v1/", rows, created="2026-11-29T00:00:00Z",
                                                    session="s", part_rows=part_rows or files)
        for name, body in [*parts, (dataversion.manifest_name("ds", 1), json.dumps(manifest).encode())]:
            world.blob.call(ACCOUNT, "put_blob", "setup", container="datasets", blob=name, data=body)
        reader = world.reader("datasets")
        spec = StageSpec(name="ds", container="datasets", prefix="ds")
        resolved: dict[int, float] = {}
        held: dict[int, int] = {}
        written = len(parts)  # each part blob's one setup write, counted apart from the nodes' reads
        for k in range(n):
            def resolve(k: int = k) -> None:
                source = resolve_source(reader, spec, node=k)
                plan = plan_source(source, reader, validated(k, 0, n, 1), blobhttp.NO_DEADLINE)
                assert source.version == 1 and plan.files_total == files
                held[k] = len(plan.node_idx)
                resolved[k] = world.now
            world.spawn(f"stage-{k}", resolve, node=world.node(f"node-{k}"))
        world.sim.run_until(lambda: len(resolved) == n, limit_s=600.0)
        peaks = _peaks(world)
        accounting = world.blob.accounting
        index = accounting.targets[(ACCOUNT, f"datasets/{dataversion.manifest_name('ds', 1)}")]
        part_blobs = [peak for (acct, name), peak in accounting.targets.items()
                      if acct == ACCOUNT and name.startswith("datasets/ds/_parts/")]
        assert sum(held.values()) == files, "every file is in exactly one node's share"
        return {**peaks, "manifest_rps": max([index.peak, *(peak.peak for peak in part_blobs)]),
                "part_reads_max": max((peak.total - 1 for peak in part_blobs), default=0),
                "parts_read_per_node": round((sum(peak.total for peak in part_blobs) - written) / n, 2),
                "parts": len(parts), "bytes_read_per_node": round(accounting.bytes_out / n),
                "resolved": len(resolved), "start_s": round(max(resolved.values(), default=0.0), 1)}


END_SPREAD_S = 30.0
"""The nodes of a job finish their last upload over this long (the slowest stripe's last part)."""


def job_store_end(n: int, seed: int, root: Path, failing: bool = False) -> dict[str, Any]:
    """The launchers' goodbye on the job's store at the job's end (agree.greet at the start,
    agree.farewell at the end): every node finishes at a seeded moment within END_SPREAD_S; node
    0, which hosts the store, must keep it up until the last node said goodbye, and not much
    longer. `failing`: node 0 fails and one node never reached the store (it never greeted): the
    host waits for the nodes that greeted, not its full BYE_WAIT_S for the one that did not."""
    import random

    from amlhpc.jobs.runtime.coord.agree import farewell, greet
    from amlhpc.jobs.runtime.launch.launcher import BYE, BYE_WAIT_S

    del root
    rng = random.Random(f"end:{seed}:{n}")
    ends = {k: rng.uniform(0.0, END_SPREAD_S) for k in range(n)}
    absent = n - 1 if failing else None
    with _world(seed) as world:
        nodes = [world.node(f"node-{k}") for k in range(n)]
        server = world.jobstore(nodes[0])
        arrived: dict[int, float] = {}
        returned: dict[int, float] = {}
        for k, node in enumerate(nodes):
            if k == absent:
                continue
            def run(k: int = k) -> None:
                channel = _channel(world, server, k, n)
                greet(channel, BYE)
                world.sim.sleep(ends[k])
                arrived[k] = world.now
                farewell(channel, BYE, hosting=k == 0, wait_s=BYE_WAIT_S, failing=failing)
                returned[k] = world.now
            world.spawn(f"launcher-{k}", run, node=node)
        expected = n - (1 if absent is not None else 0)
        world.sim.run_until(lambda: len(returned) == expected, limit_s=BYE_WAIT_S * 3)
        last = max(arrived.values(), default=0.0)
        host = returned.get(0)
        return {**_store_rates(server, max(world.now, 1.0), n),
                "store_ops_per_node": round(server.served.total / n, 2),
                "host_after_last_s": None if host is None else round(host - last, 2),
                "host_returned_s": None if host is None else round(host, 1),
                "returned": len(returned), "expected": expected, "wait_s": BYE_WAIT_S}


def controllers(seed: int, jobs: int = FLEET_JOBS, minutes: float = 10.0) -> dict[str, Any]:
    from amlhpc.jobs.managed.azureml import AzureJobService
    from amlhpc.jobs.managed.policy import Policy
    from amlhpc.sim.arm import MLClient

    poll = Policy.__dataclass_fields__["poll_s"].default
    with _world(seed) as world:
        for j in range(jobs):
            world.arm.create_job(SimpleNamespace(name=f"run-{j}-a1", tags={}, compute="gpu-cluster", status=None))
            world.arm.set_status(f"run-{j}-a1", "Running")
            world.arm.nodes["gpu-cluster"] = [SimpleNamespace(node_state="running", run_id=f"run-{j}-a1")]

            def controller(j: int = j) -> None:
                service = AzureJobService(MLClient(world.arm, "controller-identity"), Path("."), "code", f"run-{j}", "exp")
                world.sim.sleep(world.sim.rng.uniform(0.0, poll))
                while True:
                    service.observe(f"run-{j}-a1")
                    world.sim.sleep(poll)
            world.spawn(f"controller-{j}", controller, node=world.node(f"controller-{j}", principal="controller-identity"))
        world.run(minutes * 60.0)
        arm = world.arm
        seconds = minutes * 60.0
        return {"calls_per_s": round(sum(p.total for p in arm.calls.values()) / seconds, 2),
                "peak_calls_per_s": max(arm.per_second.values(), default=0),
                "reads_per_s": round(arm.by_kind["read"] / seconds, 2), "writes_per_s": round(arm.by_kind["write"] / seconds, 2),
                "throttled": sum(arm.throttled.values()), "poll_s": poll}


PARTS_FILES, PARTS_ROWS = 20_000, 250
"""The start with a manifest in parts: 80 parts (PART_ROWS is 4,000 in an upload; fewer rows keep the run short)."""

PROTOCOLS: dict[str, dict[str, Callable[..., dict[str, Any]]]] = {
    "job-store": {"steady": job_store_steady, "commit": job_store_commit, "restart": job_store_restart,
                  "listing": job_store_listing, "start": job_store_start, "end": job_store_end},
}
"""Coordination protocols under test: one function per measurement (a new protocol adds its own)."""


# --- the runs ------------------------------------------------------------------------------


def _median(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [r[key] for r in rows if r.get(key) is not None]
    missing = len(rows) - len(values)
    if not values:
        return {"median": None, "min": None, "max": None, "runs": len(rows), "missing": missing}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(rows),
            "missing": missing}


def measure(protocol: str, n: int, seeds: int, root: Path) -> dict[str, Any]:
    fns = PROTOCOLS[protocol]
    runs: dict[str, list[dict[str, Any]]] = {"steady": [], "commit": [], "restart": [], "restart_busy": [], "listing": [], "start": []}
    started = time.perf_counter()
    for seed in range(seeds):
        base = root / f"{protocol}-{n}-{seed}"
        for what, fn, extra in (("steady", fns["steady"], ()), ("commit", fns["commit"], ()),
                                ("restart", fns["restart"], ()), ("restart_busy", fns["restart"], (BACKGROUND_RPS,))):
            t = time.perf_counter()
            row = fn(n, seed, base / what, *extra)
            row["wall_s"] = round(time.perf_counter() - t, 1)
            runs[what].append(row)
            print(f"scale: {protocol} N={n} seed {seed} {what}: {json.dumps(row)}", flush=True)
    runs["listing"].append(fns["listing"](n, 0, root / f"{protocol}-{n}-listing"))
    runs["start"].append(fns["start"](n, 0, root / f"{protocol}-{n}-start"))
    print(f"scale: {protocol} N={n} start: {json.dumps(runs['start'][0])}", flush=True)
    # A version too large to read whole on every node: its manifest in parts, each node reading its share's.
    runs["start_parts"] = [fns["start"](n, 0, root / f"{protocol}-{n}-start-parts", files=PARTS_FILES,
                                        part_rows=PARTS_ROWS)]
    print(f"scale: {protocol} N={n} start, manifest in parts: {json.dumps(runs['start_parts'][0])}", flush=True)
    runs["end"] = [fns["end"](n, seed, root / f"{protocol}-{n}-end", failing=failing)
                   for seed in range(seeds) for failing in (False, True)]
    print(f"scale: {protocol} N={n} end: {json.dumps(runs['end'])}", flush=True)
    summary = {
        "steady_account_rps": _median(runs["steady"], "account_rps"),
        "steady_hot_blob_rps": _median(runs["steady"], "hot_blob_rps"),
        "steady_hot_blob": runs["steady"][0]["hot_blob"],
        "commit_s": _median(runs["commit"], "commit_s"),
        "commit_account_rps": _median(runs["commit"], "account_rps"),
        "commit_hot_blob_rps": _median(runs["commit"], "hot_blob_rps"),
        "restart_s": _median(runs["restart"], "agree_s"),
        "restart_account_rps": _median(runs["restart"], "account_rps"),
        "restart_busy_s": _median(runs["restart_busy"], "agree_s"),
        "splits": sum(r["split"] for r in runs["restart"] + runs["restart_busy"]),
        "listing": runs["listing"][0],
        "start": runs["start"][0],
        "start_parts": runs["start_parts"][0],
        "end_host_after_last_s": _median([r for r in runs["end"] if r["expected"] == n], "host_after_last_s"),
        "end_failing_host_after_last_s": _median([r for r in runs["end"] if r["expected"] < n], "host_after_last_s"),
        "end_store_ops_per_node": _median(runs["end"], "store_ops_per_node"),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    return {"protocol": protocol, "nodes": n, "seeds": seeds, "summary": summary, "runs": runs}


def sweep(seeds: int) -> dict[str, Any]:
    from amlhpc.sim import known
    from amlhpc.sim.explore import run, scenarios

    table: dict[str, Any] = {}
    for name in sorted(scenarios()):
        started, causes, unknown = time.perf_counter(), Counter[str](), []
        for seed in range(seeds):
            outcome = run(name, seed, keep_trace=False)
            if not outcome.ok:
                cause = known.cause(outcome)
                causes[cause or "unknown"] += 1
                if cause is None:
                    unknown.append(seed)
        table[name] = {"seeds": seeds, "violations": dict(causes), "unknown_seeds": unknown[:20],
                       "wall_s": round(time.perf_counter() - started, 1)}
        print(f"scale: sweep {name}: {json.dumps(table[name])}", flush=True)
    return table


def _f(stat: dict[str, Any] | None, unit: str = "", horizon: float | None = None) -> str:
    if not stat or stat.get("median") is None:
        return f"> {horizon:.0f} s (none within the simulation)" if horizon else "-"
    median, low, high = stat["median"], stat["min"], stat["max"]
    spread = "" if stat["runs"] == 1 or low == high else f" ({low:g}-{high:g})"
    missing = f", {stat['missing']} run(s) > {horizon:.0f} s" if horizon and stat.get("missing") else ""
    return f"{median:g}{unit}{spread}{missing}"


def render(results: dict[str, Any]) -> str:
    from amlhpc.sim.limits import ArmLimits, BlobLimits

    blob, arm = BlobLimits(), ArmLimits()
    lines = [SECTION, "",
             f"Command: `{results['command']}`, {results['date']}. Machine: {results['machine']}; load average "
             f"before/after {results['load_before']} / {results['load_after']} (a shared machine: the simulated "
             "figures do not depend on it, only the wall time does).", "",
             "The real code in the simulated Azure (amlhpc.sim; docs/simulation.md), on Azure's targets: "
             f"{blob.account_requests_per_s:,.0f} requests/s per account, {blob.blob_requests_per_s:,.0f}/s per blob "
             "(Learn: \"Scalability and performance targets for standard storage accounts\" and \"... for Blob "
             f"storage\"), Resource Manager {arm.read_per_s:g} reads/s and {arm.write_per_s:g} writes/s per principal "
             "(Learn: \"Understand how Azure Resource Manager throttles requests\"). Each figure: the median over the "
             "seeds, with the range; rates are per virtual second. Times are virtual seconds.", ""]
    for protocol in sorted({row["protocol"] for row in results["rows"]}):
        lines += [f"## Protocol `{protocol}`", "",
                  "| N | seeds | steady: account req/s | steady: hottest blob req/s | commit: time | commit: account req/s "
                  "| commit: hottest blob req/s | restart agreement (idle) | restart beside 12,800 req/s | split "
                  "decisions | listing pages per job start | versioned start: manifest req/s (last node) | end: host "
                  "stays after the last goodbye (failing, a node absent) | end: store ops a node | wall s |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for row in (r for r in results["rows"] if r["protocol"] == protocol):
            s = row["summary"]
            lines.append(
                f"| {row['nodes']} | {row['seeds']} | {_f(s['steady_account_rps'])} | {_f(s['steady_hot_blob_rps'])} "
                f"({s['steady_hot_blob']}) | {_f(s['commit_s'], ' s', COMMIT_HORIZON_S)} | {_f(s['commit_account_rps'])} "
                f"| {_f(s['commit_hot_blob_rps'])} | {_f(s['restart_s'], ' s', RESTART_HORIZON_S)} | "
                f"{_f(s['restart_busy_s'], ' s', RESTART_HORIZON_S)} | {s['splits']} | {s['listing']['pages_per_job']:,} "
                f"({s['listing']['pages_per_node']} a node, {s['listing']['files']:,} blobs) | "
                f"{s['start']['manifest_rps']} ({s['start']['start_s']:g} s) | "
                f"{_f(s.get('end_host_after_last_s'), ' s')} ({_f(s.get('end_failing_host_after_last_s'), ' s')}) | "
                f"{_f(s.get('end_store_ops_per_node'))} | {s['wall_s']:g} |")
        lines.append("")
    fleet = results.get("fleet")
    if fleet:
        lines += [f"Fleet: {FLEET_JOBS} jobs of {FLEET_NODES} nodes on one account, steady: "
                  f"{fleet['account_rps']:,.0f} requests/s ({FLEET_JOBS} x the {FLEET_NODES}-node job's median "
                  f"{fleet['per_job']:,.0f}/s; the jobs poll independently), against the account's "
                  f"{blob.account_requests_per_s:,.0f}.", ""]
    controllers = results.get("controllers")
    if controllers:
        c = controllers
        lines += [f"Controllers: {FLEET_JOBS} managed runs' controllers under one identity, each observing its attempt "
                  f"every {c['poll_s']:g} s (jobs.get, the run's history, the cluster's nodes: a POST, a write): "
                  f"{c['calls_per_s']:g} calls/s on average, {c['peak_calls_per_s']} in the busiest second; "
                  f"{c['reads_per_s']:g} reads/s (limit {arm.read_per_s:g}), {c['writes_per_s']:g} writes/s (limit "
                  f"{arm.write_per_s:g}); {c['throttled']} answered 429.", ""]
    if results.get("sweep"):
        lines += ["Seeded exploration (`python -m amlhpc.sim explore SCENARIO --seeds 0-N`), violations by known defect "
                  "(amlhpc/sim/known.py; `unknown`: a new finding):", "",
                  "| scenario | seeds | violations | wall s |", "|---|---:|---|---:|"]
        for name, row in results["sweep"].items():
            found = ", ".join(f"{k}: {v}" for k, v in sorted(row["violations"].items())) or "none"
            lines.append(f"| {name} | {row['seeds']} | {found} | {row['wall_s']:g} |")
        lines.append("")
    lines += ["Reading the table: `steady` is a job training with nothing happening (its polls alone); `commit` one "
              "versioned checkpoint of every node; `restart` the agreement after one node's training failed (the "
              "agreement's `agree_s` is 300 s: past it a node that has not seen every report ends the job). "
              "A time shown as `> H s` did not finish within the simulated horizon.", ""]
    return "\n".join(lines)


def write(results: dict[str, Any], out: Path, update: bool) -> str:
    text = render(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.md").write_text(text)
    (out / "scale.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    if update:
        previous = RESULTS.read_text() if RESULTS.exists() else ""
        if SECTION in previous:
            head, _, rest = previous.partition(SECTION)
            after = rest.find("\n# ")
            previous = head.rstrip() + ("\n\n" + rest[after + 1:] if after >= 0 else "")
        RESULTS.write_text(previous.rstrip() + "\n\n" + text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="8,64,512,1000", help="node counts, comma-separated")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per node count up to 64")
    parser.add_argument("--big-seeds", type=int, default=1, help="seeds per node count above 64")
    parser.add_argument("--sweep", type=int, default=0, help="exploration seeds per scenario (0: none)")
    parser.add_argument("--sweep-from", type=Path, help="take the sweep from an earlier run's scale.json instead")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="protocols to measure")
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--update-results", action="store_true", help="also write the table into bench/RESULTS.md")
    args = parser.parse_args(argv)
    try:
        counts = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--nodes {args.nodes!r}: give node counts such as 8,64,512")
    unknown = sorted(set(args.protocols.split(",")) - set(PROTOCOLS))
    if unknown or any(n < 2 for n in counts):
        parser.error(f"--protocols: choose from {', '.join(PROTOCOLS)}; --nodes: at least 2 each")
    if args.sweep_from is not None and not args.sweep_from.is_file():
        parser.error(f"--sweep-from {args.sweep_from}: no such file (an earlier run's scale.json)")
    machine = describe_machine()
    results: dict[str, Any] = {"command": "python -m bench.scale " + " ".join(argv if argv is not None else sys.argv[1:]),
                               "date": time.strftime("%Y-%m-%d %H:%M %Z"), "load_before": loadavg(),
                               "machine": f"{machine['cpu']}, {machine['cpus']} CPUs, {machine['mem_gib']} GiB, Python "
                                          f"{machine['python']}", "rows": []}
    with tempfile.TemporaryDirectory(prefix="amlhpc-scale-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        for protocol in args.protocols.split(","):
            for n in counts:
                results["rows"].append(measure(protocol, n, args.seeds if n <= 64 else args.big_seeds, Path(tmp)))
        fleet_row = next((r for r in results["rows"] if r["nodes"] == FLEET_NODES), None)
        if fleet_row is not None:
            per_job = fleet_row["summary"]["steady_account_rps"]["median"]
            results["fleet"] = {"per_job": per_job, "account_rps": per_job * FLEET_JOBS}
        results["controllers"] = controllers(0)
        if args.sweep:
            results["sweep"] = sweep(args.sweep)
        elif args.sweep_from is not None:
            earlier = json.loads(args.sweep_from.read_text())
            results["sweep"] = earlier.get("sweep")
            results["command"] += f" (the sweep from {earlier.get('command')}, {earlier.get('date')})"
    results["load_after"] = loadavg()
    print(write(results, args.out, args.update_results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
