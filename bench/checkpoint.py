"""Checkpoints and recovery, measured on this machine: training stall per checkpoint (async vs
sync), restore time (node tier vs Blob), recovery time (in-job restart vs a resubmitted attempt).

    python -m bench.checkpoint [--state-mib 256,1024] [--repeats 5] [--skip stall,restore,recovery]
                               [--out bench/out] [--update-results]

1. Stall: how long a training loop is held per checkpoint of each `--state-mib` state (4
   float32 tensors), synchronous (the DCP write, fsync and marker in the loop: `save_state(...,
   background=False)`) against asynchronous (the copy to CPU memory in the loop, the write in
   the background: the default) and against torch's `dcp.async_save` on the same state (with
   our stager options, and with staging in torch's thread), interleaved, `--repeats` each;
   medians with min-max, each run's async/sync ratio; the first save (cold: buffers allocated)
   apart from later ones (warm); the writers' GB/s. Page cache: nothing dropped, every file
   fsynced. Target: async stalls at most a tenth of sync.
2. Restore: the largest version (2 ranks' parts) from the node's tier (the restart's quick
   check of sizes and mtimes, then the load, which hashes what it reads) against from Blob
   (Azurite on this machine: download and verify, then the same load); interleaved, medians.
3. Recovery: the rehearsed cosmoflow job (2 simulated nodes x 2 ranks, gloo, the job's own
   command) with rank 3 crashing at step 5, and with rank 3 hanging at step 5 (watchdog.hang_s
   10): seconds from the fault to the first step logged after it,
   - in-job restart: the launchers stop, agree, restart from their node-local copies;
   - a resubmitted attempt: the same job with in-job restarts off ends (fault -> its last
     process gone), then a fresh rehearsal of it starts (launcher, staging, restore from Blob,
     process group, first step); the two are added.
   Azure ML's own part of a resubmission (queueing, node allocation, image pull, which take
   minutes) cannot be rehearsed and is not in the figure: the ratio is a lower bound. Target:
   in-job at least 5x faster.

Results go to `--out` (checkpoint.md and .json, git-ignored); `--update-results` also
replaces this benchmark's section of bench/RESULTS.md (between its two markers), keeping the
rest of the file. `--rerun-of` an earlier run's checkpoint.json checks its figures against this
run (bench/spread.py: inside the published spread, how many would miss it with nothing changed,
an exact rank test of each move); the exit status is 1 when a figure moved beyond chance.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.machine import azurite_version, describe_machine, loadavg
from bench.spread import check_rerun, rerun_summary, rerun_table

RESULTS = Path(__file__).with_name("RESULTS.md")
BEGIN, END = "<!-- bench.checkpoint: begin -->", "<!-- bench.checkpoint: end -->"
TRAIN = ("python -m amlhpc.jobs.workloads.cosmoflow.train --input cosmoflow --batch-size 1 --conv-size 4 --n-conv-layers 3 "
         "--fc1 16 --fc2 8 --workers 0 --log-every 1 --epochs 2 --checkpoint-every 2 --optimizer adam")
MIB = 1 << 20


# --- 1. stall ---------------------------------------------------------------------------


def _state(mib: int, device: str = "cpu"):
    import torch

    per = mib * MIB // 4 // 4
    return {"model": {f"layer{i}.weight": torch.randn(per, device=device) for i in range(4)}}


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def _commit() -> str:
    """The commit measured, `+dirty` when the working tree differs from it."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


class DcpAsync:
    """torch's own `dcp.async_save` on the same state: its DefaultStager (page-locked buffers and
    non-blocking copies on a GPU as ours, kept across saves, or torch's default of staging in a
    background thread; torch 2.11's drops its buffers after each save, pytorch/pytorch#183413) and DCP's
    FileSystemWriter (fsync, the same threads); no marker (it hashes nothing)."""

    def __init__(self, root: Path, writers: int, async_staging: bool):
        import torch
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.root, self.writers, self.async_staging = root, writers, async_staging
        accelerator = torch.accelerator.is_available() and not async_staging
        self.stager = DefaultStager(StagingOptions(use_pinned_memory=accelerator, use_shared_memory=False,
                                                   use_async_staging=async_staging, use_non_blocking_copy=accelerator))
        self.pending = None
        self.started = 0.0
        self.last_write_s: float | None = None

    def save(self, step: int, state: dict) -> float:
        """Seconds the training is held: the call, and with staging in a thread the wait for it
        (the training may not change its tensors before the copy is done)."""
        import torch.distributed.checkpoint as dcp

        started = time.perf_counter()
        self.wait()
        folder = self.root / f"step-{step}"
        shutil.rmtree(folder, ignore_errors=True)
        writer = dcp.FileSystemWriter(str(folder), sync_files=True, thread_count=self.writers)
        self.started = time.perf_counter()
        response = dcp.async_save(state, storage_writer=writer, async_stager=self.stager, no_dist=True)
        if hasattr(response, "staging_completion"):
            response.staging_completion.result()
            self.pending = response.upload_completion
        else:
            self.pending = response
        return time.perf_counter() - started

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.last_write_s = time.perf_counter() - self.started
            self.pending = None

    def close(self) -> None:
        self.wait()
        self.stager.close()


def stall_at(mib: int, repeats: int, workdir: Path, device: str = "cpu", baselines: bool = True) -> dict:
    """Sync against background saves of one rank, interleaved, at one state size: ours (the
    Checkpointer) and, with `baselines`, torch's dcp.async_save on the same state and our writer
    with one thread; the first background save (cold: the stager allocates its buffers) apart
    from the later ones (warm: reused); the writer's GB/s. `device`: where the state lives (on
    a GPU the copy out of it is what the training is held for)."""
    import gc

    from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

    load_before = loadavg()
    state, gb = _state(mib, device), mib * MIB / 1e9
    background = Checkpointer(workdir / "stall-async", 0, 1, "bench")
    cold = background.save(1, state, {"step": 1})
    background.wait()
    cold_write = background.last_write_s or 0.0
    others: dict[str, Any] = {}
    if baselines:
        others = {"one_writer": Checkpointer(workdir / "stall-one-writer", 0, 1, "bench", writers=1),
                  "dcp": DcpAsync(workdir / "stall-dcp", background.writers, async_staging=False),
                  "dcp_thread": DcpAsync(workdir / "stall-dcp-thread", background.writers, async_staging=True)}
    colds = {}
    for name in ("dcp", "dcp_thread"):
        if name in others:
            colds[name] = others[name].save(1, state)
            others[name].wait()
    rows: dict[str, list[float]] = defaultdict(list)
    for step in range(2, repeats + 2):
        folder = workdir / "stall-sync"
        shutil.rmtree(folder, ignore_errors=True)
        started = time.perf_counter()
        Checkpointer(folder, 0, 1, "bench", background=False, writers=background.writers).save(step, state, {"step": step})
        rows["sync"].append(time.perf_counter() - started)
        rows["warm"].append(background.save(step, state, {"step": step}))
        background.wait()
        rows["write"].append(background.last_write_s or 0.0)
        for name in ("dcp", "dcp_thread"):
            if name in others:
                rows[name].append(others[name].save(step, state))
                others[name].wait()
                rows[f"{name}_write"].append(others[name].last_write_s or 0.0)
        if "one_writer" in others:
            others["one_writer"].save(step, state, {"step": step})
            others["one_writer"].wait()
            rows["one_writer"].append(others["one_writer"].last_write_s or 0.0)
        for folder in ("stall-async", "stall-one-writer", "stall-dcp", "stall-dcp-thread"):  # one version each on disk
            for old in sorted((workdir / folder).rglob(f"step-*{step - 1}")):
                shutil.rmtree(old, ignore_errors=True)
        rows["ratio"].append(rows["warm"][-1] / rows["sync"][-1])
        if "dcp" in others:
            rows["dcp_ratio"].append(rows["dcp"][-1] / rows["sync"][-1])
    for writer in (background, *others.values()):
        writer.close()
    del state
    gc.collect()
    for folder in ("stall-async", "stall-one-writer", "stall-dcp", "stall-dcp-thread", "stall-sync"):
        shutil.rmtree(workdir / folder, ignore_errors=True)
    result = {"state_mib": mib, "device": device, "writers": background.writers, "load_before": load_before,
              "load_after": loadavg(), "sync_s": _spread(rows["sync"]), "cold_s": cold,
              "cold_write_gbps": gb / cold_write if cold_write else None, "warm_s": _spread(rows["warm"]),
              "ratio": _spread(rows["ratio"]), "write_gbps": _spread([gb / s for s in rows["write"]])}
    if baselines:
        result |= {"one_writer_gbps": _spread([gb / s for s in rows["one_writer"]]),
                   "dcp_cold_s": colds["dcp"], "dcp_s": _spread(rows["dcp"]), "dcp_ratio": _spread(rows["dcp_ratio"]),
                   "dcp_write_gbps": _spread([gb / s for s in rows["dcp_write"]]),
                   "dcp_thread_cold_s": colds["dcp_thread"], "dcp_thread_s": _spread(rows["dcp_thread"]),
                   "dcp_thread_write_gbps": _spread([gb / s for s in rows["dcp_thread_write"]])}
    return result


def stall(args, workdir: Path) -> list[dict]:
    from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

    Checkpointer(workdir / "warm-up", 0, 1, "bench", background=False).save(0, _state(1), {"step": 0})  # imports
    return [stall_at(mib, args.repeats, workdir, args.device, not args.no_baselines) for mib in args.sizes]


# --- 2. restore -------------------------------------------------------------------------


def restore(args, workdir: Path, server) -> dict:
    import torch

    from amlhpc.jobs.runtime.blob import blobio
    from amlhpc.jobs.runtime.checkpoint import CheckpointStore, parse_settings, tier
    from amlhpc.jobs.runtime.checkpoint.node import NodeCheckpoints
    from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer, load_version

    source = workdir / "restore-source"
    state = _state(max(args.sizes))
    halves = [{"model": {k: v for i, (k, v) in enumerate(state["model"].items()) if i % 2 == r}} for r in (0, 1)]
    for rank in (0, 1):
        Checkpointer(source, rank, 2, "bench", background=False).save(10, halves[rank], {"step": 10})
    version = tier.read_version(tier.versions_dir(source) / "step-000000010")
    container = blobio.container_client("checkpoints", connection_string=server.connection_string)
    container.create_container()
    store = CheckpointStore(container, "bench/versions")
    store.stage(version.path, version.files([0, 1]), "000000010-bench")
    store.commit("000000010-bench", 10, [0], {"layout": "versions", "step": 10, "world": 2, "tag": "bench",
                                               "local": "step-000000010", "nodes": 1})
    settings = parse_settings(json.dumps({"container": "checkpoints", "prefix": "bench"}))

    def load(folder: Path) -> None:
        for rank in (0, 1):
            target = {"model": {k: torch.empty_like(v) for k, v in halves[rank]["model"].items()}}
            load_version(folder, target, rank, 2)

    runs: dict[str, list[float]] = {"local": [], "blob": []}
    for repeat in range(args.repeats):
        started = time.perf_counter()
        problem = tier.read_version(version.path).verify([0, 1])
        assert problem is None, problem
        load(version.path)
        runs["local"].append(time.perf_counter() - started)
        node = NodeCheckpoints(settings, node=0, nodes=1, local_size=2, world=2,
                               checkpoint_dir=workdir / f"restore-blob-{repeat}",
                               environ={"AMLHPC_BLOB_CONNECTION_STRING": server.connection_string})
        started = time.perf_counter()
        restored = node.restore_blob_version()
        load(restored)
        runs["blob"].append(time.perf_counter() - started)
        shutil.rmtree(workdir / f"restore-blob-{repeat}", ignore_errors=True)
    local, blob = statistics.median(runs["local"]), statistics.median(runs["blob"])
    return {"state_mib": max(args.sizes), "runs_s": runs, "local_s": local, "blob_s": blob, "ratio": blob / local}


# --- 3. recovery --------------------------------------------------------------------------


class Rehearsals:
    """The cosmoflow job rehearsed on 2 nodes x 2 ranks, every line of every rank timestamped."""

    def __init__(self, workdir: Path, server):
        from amlhpc.jobs.data import upload
        from amlhpc.jobs.local import rehearsal
        from amlhpc.jobs.plan import build
        from amlhpc.jobs.plan import outputs as outputs_mod
        from amlhpc.jobs.runtime.blob import blobio
        from amlhpc.jobs.workloads.cosmoflow import generate

        self.rehearsal, self.build, self.server, self.workdir = rehearsal, build, server, workdir
        self.outputs = outputs_mod.load("dev", offline=True).outputs  # the dev stack's offline plan
        self.containers = list(self.outputs.storage.containers.values())
        rehearsal.ensure_containers(self.containers, server.connection_string)
        data = workdir / "cosmoflow"
        generate.generate(data, universes=1, volume=16, subvolumes=16, validation_universes=1, seed=3)
        self.data_prefix = f"bench/{uuid.uuid4().hex[:8]}"
        upload.upload_directory(blobio.container_client(self.outputs.storage.containers["datasets"],
                                                        connection_string=server.connection_string), data,
                                self.data_prefix)
        self.snapshot = build.snapshot(self.plan("snapshot").code_dirs)

    def plan(self, name: str, *sets: str):
        from amlhpc.jobs import recipes

        recipe = recipes.load("cosmoflow", recipes.parse_overrides([
            f"command={TRAIN}", "health=off", f"inputs.cosmoflow.path={self.data_prefix}", *sets]))
        return self.build.plan_job(recipe, self.outputs, nodes=2, processes_per_node=2, name=name)

    def run(self, name: str, *sets: str, faults: tuple[str, ...] = ()) -> tuple[object, list[tuple[float, int, str]], float, float]:
        """(result, [(time, rank, line)], start time, end time); `faults`: --fault SPECs its ranks act out."""
        from amlhpc.jobs.local import faults as fault_specs

        lines: list[tuple[float, int, str]] = []
        lock = threading.Lock()

        def sink(proc, line: str) -> None:
            with lock:
                lines.append((time.monotonic(), proc.rank, line))

        started = time.monotonic()
        result = self.rehearsal.rehearse(self.plan(name, *sets), snapshot=self.snapshot, workdir=self.workdir / name,
                                         procs_per_node=2, blob_endpoint=self.server.blob_endpoint,
                                         connection_string=self.server.connection_string, containers=self.containers,
                                         sink=sink, timeout_s=900, extra_env=fault_specs.env_for(*faults))
        return result, lines, started, time.monotonic()


def _first(lines, predicate, after: float = 0.0) -> float:
    found = next((t for t, rank, line in lines if t >= after and predicate(rank, line)), None)
    if found is None:
        tail = "\n".join(f"r{rank} {line[:200]}" for _, rank, line in lines[-60:])
        raise AssertionError(f"an expected line is missing from the rehearsal's output; its end:\n{tail}")
    return found


def _is_step(rank: int, line: str) -> bool:
    return rank == 0 and line.startswith('{"step"') and '"loss"' in line


def _is_verdict(rank: int, line: str) -> bool:
    return "hang: " in line and "stopping the training on node" in line


def _in_job(rehearsals: Rehearsals, kind: str, fault: str, *sets: str) -> tuple[float, float | None]:
    """Seconds from the fault to the first step of the restarted training inside one job, and
    from the fault to the watchdog's verdict (a hang)."""
    marker = f"injected fault: {kind} on rank 3 at step 5"
    result, lines, _, _ = rehearsals.run(f"{kind}-inside-{uuid.uuid4().hex[:6]}", *sets, faults=(fault,))
    assert result.ok, f"the in-job restart of the {kind} failed: {result.exit_codes}"
    at = _first(lines, lambda rank, line: marker in line)
    resumed = _first(lines, lambda rank, line: rank == 0 and line.startswith("resumed from"), at)
    detected = _first(lines, _is_verdict, at) - at if kind == "hang" else None
    return _first(lines, _is_step, resumed) - at, detected


def recovery(args, workdir: Path, server) -> dict:
    rehearsals = Rehearsals(workdir, server)
    found: dict = {}
    for kind in ("crash", "hang"):
        spec = {"crash": "crash", "hang": "stall"}[kind]  # a hang: the rank stops reporting progress
        fault = f"{spec}@step=5,rank=3"
        marker = f"injected fault: {spec} on rank 3 at step 5"
        watch = ("watchdog.hang_s=10",) if kind == "hang" else ()
        inside, detected = _in_job(rehearsals, kind, fault + ",after-standby=yes", "env.AMLHPC_STANDBY=on", *watch)
        row = {"in_job_s": inside, "in_job_detection_s": detected}
        if kind == "crash":
            row["in_job_cold_s"] = _in_job(rehearsals, kind, fault, "env.AMLHPC_STANDBY=off", *watch)[0]
        name = f"{kind}-resubmit-{uuid.uuid4().hex[:6]}"
        ended, lines_resubmit, _, end = rehearsals.run(name, "checkpoint.local_restarts=0", *watch, faults=(fault,))
        assert not ended.ok, "with in-job restarts off the fault ends the job"
        at = _first(lines_resubmit, lambda rank, line, marker=marker: marker in line)
        again, lines, start, _ = rehearsals.run(name, *watch)  # the new attempt: same name, same checkpoint prefix
        assert again.ok, f"the resubmitted attempt failed: {again.exit_codes}"
        resumed = _first(lines, lambda rank, line: rank == 0 and line.startswith("resumed from"))
        first_step = _first(lines, _is_step, resumed)
        row.update({"job_end_s": end - at, "new_attempt_s": first_step - start,
                    "resubmitted_s": (end - at) + (first_step - start)})
        row["ratio"] = row["resubmitted_s"] / row["in_job_s"]
        if kind == "hang":  # the watchdog's detection is the same on both paths: also compare what follows it
            row["detection_s"] = _first(lines_resubmit, _is_verdict, at) - at
            row["after_detection_ratio"] = (row["resubmitted_s"] - row["detection_s"]) / (
                row["in_job_s"] - row["in_job_detection_s"])
        found[kind] = row
    return found


# --- report -------------------------------------------------------------------------------


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def render(results: dict) -> str:
    machine = results["machine"]
    lines = [BEGIN, "# Checkpoints and recovery", "",
             f"Command: `{results['command']}` (`make bench`), {results['date']}. Written by bench/checkpoint.py.",
             f"Machine: {machine['cpu']}, {machine['cpus']} CPUs, {machine['mem_gib']} GiB RAM, Python "
             f"{machine['python']}; Azurite {machine['azurite']} on the same machine. Load average before/after: "
             f"{results['load_before']} / {machine['load_after']}.", ""]
    if "stall" in results:

        def cell(spread: dict, fmt: str = ".3f") -> str:
            return (f"{spread['median']:{fmt}} | {spread['min']:{fmt}}-{spread['max']:{fmt}} | "
                    f"{', '.join(f'{x:{fmt}}' for x in spread['runs'])}")

        def gbps(spread: dict) -> str:
            return f"{spread['median']:.2f} GB/s ({spread['min']:.2f}-{spread['max']:.2f})"

        lines += ["## Training stall per checkpoint", "",
                  f"Commit {results.get('commit', 'unknown')}. One rank, a state of 4 float32 tensors, "
                  "saved as `save_state` does (Checkpointer.save), interleaved with a synchronous save, torch's "
                  "`dcp.async_save` and a one-thread writer on the same state, each run in turn. Page cache: "
                  "nothing is dropped between runs (that needs root, and the machine is shared); every file is "
                  "fsynced before the marker, so a write's time includes reaching the disk; the data written is "
                  "fresh each run (no read path is measured here). Cold: the first background save (the stager "
                  "allocates its CPU buffers); warm: later saves into the same buffers. Ratio: each run's "
                  "background stall over the synchronous save of the same run, then the median and spread.", ""]
        for s in results["stall"]:
            baselines = "dcp_s" in s
            rows = [f"| synchronous (write + fsync + marker in the loop) | {cell(s['sync_s'])} |",
                    f"| ours, first save (cold) | {s['cold_s']:.3f} | - | - |",
                    f"| ours, later saves (warm) | {cell(s['warm_s'])} |"]
            ratios = (f"- ours (warm) / sync: **{s['ratio']['median']:.3f}** ({s['ratio']['min']:.3f}-"
                      f"{s['ratio']['max']:.3f}; target <= 0.10): {_met(s['ratio']['median'] <= 0.10)}")
            writer = (f"- the background writer (ours: DCP files, fsync, SHA-256 while writing, marker): "
                      f"{gbps(s['write_gbps'])} with {s['writers']} threads")
            if baselines:
                rows += [f"| dcp.async_save, our stager options, first save (cold) | {s['dcp_cold_s']:.3f} | - | - |",
                         f"| dcp.async_save, our stager options (warm) | {cell(s['dcp_s'])} |",
                         f"| dcp.async_save, staging in torch's thread, first save (cold) | "
                         f"{s['dcp_thread_cold_s']:.3f} | - | - |",
                         f"| dcp.async_save, staging in torch's thread (warm; held until staged) | "
                         f"{cell(s['dcp_thread_s'])} |"]
                ratios += (f"; dcp.async_save (warm) / sync: {s['dcp_ratio']['median']:.3f} "
                           f"({s['dcp_ratio']['min']:.3f}-{s['dcp_ratio']['max']:.3f})")
                writer += (f", {gbps(s['one_writer_gbps'])} with one; dcp.async_save's write (no hashes, no marker): "
                           f"{gbps(s['dcp_write_gbps'])}, staging in torch's thread {gbps(s['dcp_thread_write_gbps'])}")
            else:
                ratios += "; torch's dcp.async_save and the one-thread writer not run (`--no-baselines`)"
            lines += [f"### {s['state_mib']} MiB on {s.get('device', 'cpu')}, {s['writers']} writer threads", "",
                      f"Load average before/after: {s['load_before']} / {s['load_after']}.", "",
                      "| mode | training held, median s | spread s | runs (s) |", "|---|---:|---|---|", *rows, "",
                      ratios, writer + ". The training goes on meanwhile, sharing the CPUs with it", ""]
    if "restore" in results:
        r = results["restore"]
        lines += ["## Restore: node tier vs Blob", "",
                  f"A version of {r['state_mib']} MiB in 2 ranks' parts; checked as a restart does (sizes and mtimes "
                  "against the markers) and loaded with DCP, which hashes every file it reads beside the load; median "
                  f"of {len(r['runs_s']['local'])} interleaved runs each.", "",
                  "| source | median s | runs (s) |", "|---|---:|---|",
                  f"| node tier (NVMe here: the VM's disk) | {r['local_s']:.2f} | "
                  f"{', '.join(f'{x:.2f}' for x in r['runs_s']['local'])} |",
                  f"| Blob (Azurite, download + verify + load) | {r['blob_s']:.2f} | "
                  f"{', '.join(f'{x:.2f}' for x in r['runs_s']['blob'])} |", "",
                  f"- Blob / tier: {r['ratio']:.2f}x", ""]
    if "recovery" in results:
        rows = results["recovery"]
        lines += ["## Recovery: in-job restart vs a resubmitted attempt", "",
                  "The rehearsed cosmoflow job, 2 nodes x 2 ranks over gloo; seconds from the fault (rank 3, step 5) "
                  "to the first step logged after it. In-job: the launchers restart the training from node-local "
                  "copies, the command run by its warm standby (interpreter and torch loaded; the fault waits until "
                  "every rank's standby is ready); cold: the same without a standby. Resubmitted = the job ending "
                  "(in-job restarts off) + a new attempt from launcher start to its first step (staging, restore from "
                  "Blob). Azure ML's queueing, node allocation and image pull are not rehearsed: the ratio is a lower "
                  "bound.", "",
                  "| fault | in-job restart s | in-job, cold s | job ends s | new attempt s | resubmitted s | "
                  "resubmitted / in-job |", "|---|---:|---:|---:|---:|---:|---:|"]
        for kind, row in rows.items():
            cold = f"{row['in_job_cold_s']:.1f}" if "in_job_cold_s" in row else "-"
            lines.append(f"| {kind} | {row['in_job_s']:.1f} | {cold} | {row['job_end_s']:.1f} | "
                         f"{row['new_attempt_s']:.1f} | {row['resubmitted_s']:.1f} | **{row['ratio']:.1f}x** |")
        lines += ["", *(f"- {kind}: in-job restart {row['ratio']:.1f}x faster (target >= 5x): {_met(row['ratio'] >= 5)}"
                        for kind, row in rows.items())]
        hang = rows.get("hang")
        if hang and "after_detection_ratio" in hang:
            lines.append(f"- the hang's figures include the watchdog's detection (hang_s 10 s; here "
                         f"{hang['in_job_detection_s']:.1f} s in-job, {hang['detection_s']:.1f} s before the job ended), "
                         f"the same on both paths; what follows it: in-job "
                         f"{hang['in_job_s'] - hang['in_job_detection_s']:.1f} s, resubmitted "
                         f"{hang['resubmitted_s'] - hang['detection_s']:.1f} s: **{hang['after_detection_ratio']:.1f}x**")
        lines.append("")
    return "\n".join([*lines, END])


def figures(results: dict) -> dict[str, list[float]]:
    """Every figure of a run with its runs, by name: the stall's per state size, the restore's
    two paths and their ratio taken within each repeat."""
    out: dict[str, list[float]] = {}
    for s in results.get("stall") or []:
        for key, value in s.items():
            if isinstance(value, dict) and value.get("runs"):
                out[f"stall {s['state_mib']} MiB: {key}"] = list(value["runs"])
    runs = (results.get("restore") or {}).get("runs_s") or {}
    if runs.get("local") and runs.get("blob"):
        out["restore: node tier s"], out["restore: Blob s"] = list(runs["local"]), list(runs["blob"])
        out["restore: Blob / node tier, x"] = [b / t for b, t in zip(runs["blob"], runs["local"], strict=True)]
    return out


def render_rerun(published: dict, results: dict) -> tuple[str, bool]:
    """The check of an earlier run's figures by this one, and whether none moved beyond chance."""
    rows = check_rerun(figures(published), figures(results))
    text = "\n".join(["## Rerun", "",
                      f"This run again checks `{published.get('command')}` of {published.get('date')} (commit "
                      f"{published.get('commit', 'unknown')}): {rerun_summary(rows)}", "", *rerun_table(rows, 3), ""])
    return text, not any(r["moved"] for r in rows)


def write_results(text: str, results: dict, out: Path, update: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint.md").write_text(text + "\n")
    (out / "checkpoint.json").write_text(json.dumps(results, indent=2) + "\n")
    if update:
        previous = RESULTS.read_text() if RESULTS.exists() else ""
        if BEGIN in previous and END in previous:
            head, rest = previous.split(BEGIN, 1)
            RESULTS.write_text(head + text + rest.split(END, 1)[1])
        else:
            RESULTS.write_text(previous.rstrip("\n") + "\n\n" + text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint", description=__doc__.splitlines()[0])
    parser.add_argument("--state-mib", default="256,1024",
                        help="checkpoint sizes for the stall figures, comma-separated (the largest for restore)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (at least 5 for a median with a spread)")
    parser.add_argument("--skip", default="", help="comma-separated: stall, restore, recovery")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the stall's state lives: cpu, or cuda (on a GPU: the copy out of it is the stall)")
    parser.add_argument("--no-baselines", action="store_true",
                        help="stall: skip torch's dcp.async_save and the one-thread writer (memory: each keeps its "
                             "own staging buffers and version on disk)")
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--update-results", action="store_true", help="also rewrite this section of bench/RESULTS.md")
    parser.add_argument("--rerun-of", type=Path, metavar="JSON",
                        help="an earlier run's checkpoint.json: check its figures against this run")
    args = parser.parse_args(argv)
    published = None
    if args.rerun_of is not None:
        try:
            published = json.loads(args.rerun_of.read_text())
            if not isinstance(published, dict) or not figures(published):
                raise ValueError("it holds no figure with runs")
        except (OSError, ValueError) as exc:
            parser.error(f"--rerun-of {args.rerun_of}: not a checkpoint.json written by this benchmark ({exc}); "
                         "give the --out folder's checkpoint.json of the earlier run")
    try:
        args.sizes = [int(x) for x in args.state_mib.split(",") if x.strip()]
        if not args.sizes or min(args.sizes) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--state-mib {args.state_mib!r}: give sizes in MiB, comma-separated, e.g. 256,1024")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1 (5 for a median with a spread)")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA GPU here; run on a GPU node, or leave --device at cpu")
    results: dict = {"command": "python -m bench.checkpoint " + " ".join(argv if argv is not None else sys.argv[1:]),
                     "date": time.strftime("%Y-%m-%d %H:%M %Z", time.gmtime()), "load_before": loadavg(),
                     "commit": _commit()}
    skip = set(filter(None, args.skip.split(",")))
    workdir = Path(tempfile.mkdtemp(prefix="amlhpc-bench-ckpt-"))
    try:
        if "stall" not in skip:
            print("stall: ...", file=sys.stderr)
            results["stall"] = stall(args, workdir)
        blob_parts = [part for part in ("restore", "recovery") if part not in skip]
        if blob_parts:
            from amlhpc.jobs.local import azurite as azurite_server

            with azurite_server.start(workdir / "azurite") as server:
                for part in blob_parts:
                    print(f"{part}: ...", file=sys.stderr)
                    results[part] = {"restore": restore, "recovery": recovery}[part](args, workdir, server)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["machine"] = {**describe_machine(), "load_after": loadavg(), "azurite": azurite_version()}
    text = render(results)
    held = True
    if published is not None:
        rerun, held = render_rerun(published, results)
        text = text.replace(END, rerun + END)
    write_results(text, results, args.out, args.update_results)
    print(text)
    if not held:
        print("checkpoint: a figure moved beyond chance since the earlier run (see the Rerun table)", file=sys.stderr)
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
