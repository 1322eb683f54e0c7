"""Does a rank that finished its training still die at exit? Many two-rank runs of the shipped workloads.

    python -m bench.exit_abort [--runs 100] [--workloads bert,cosmoflow,allreduce] [--burn 2]
                               [--one-cpu] [--out bench/out] [--keep-failures DIR] [--cores]

Each run is `torch.distributed.run --nproc-per-node 2 --standalone -m <workload>` over gloo
on CPU with the tiny shapes of tests/test_workloads.py, the workloads taking turns (run i
is workload i mod n), so a burst of load elsewhere hits each alike. A run counts as an
**exit abort** when a rank printed "terminate called" or torchrun reports a rank that died
by a signal (exitcode -6: SIGABRT); any other non-zero status is a plain failure. The
allreduce sweep runs with --no-judge (a CPU's bandwidth judged against a GPU mark would
exit 1 by design).

`--burn N` keeps N busy-looping processes beside the runs, at the runs' own priority, so the
ranks' threads are descheduled as they are on a loaded CI machine; `--one-cpu` puts both
ranks and the burners on CPU 0 (sched_setaffinity), the most contention; the figures say which.
Besides the counts, every run's ranks report whether a gloo worker thread (pt_gloo_runloop,
gloo_tcp_loop) was still alive after the workload's teardown (amlhpc/jobs/workloads/common.py):
a thread alive then runs into interpreter finalization, where taking the GIL ends the thread
with pthread_exit and std::terminate.

Results: --out/exit_abort.json and .md (git-ignored); bench/RESULTS.md has the recorded runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.machine import describe_machine, loadavg

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("bert", "cosmoflow", "allreduce")
EXTRA_WORKLOADS = ("llm", "ddp-exit")
"""Not in the default set: the LLM workload (FSDP2), and `ddp-exit`, a probe that wraps a model in
DDP, ends with a burst of small all-reduces of Python-made tensors and exits at once: the
shortest path from a gloo work to interpreter finalization, to see the race quickly."""

DDP_EXIT = '''
import torch
from amlhpc.jobs.workloads import common
def main():
    d = common.init_distributed()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    model(torch.ones(2, 8)).sum().backward()
    for i in range(200):
        common.all_reduce_mean(d, float(i))
main()
'''
PROBE_ENV = "AMLHPC_EXIT_PROBE"
"""Set for every rank: the path prefix its exit probe (below) writes to."""

BERT_PLAN = {"model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64,
                       "vocab_size": 128, "max_position": 64, "seq_len": 16},
             "config": {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}}
COSMO_TINY = ["--conv-size", "4", "--n-conv-layers", "3", "--fc1", "16", "--fc2", "8", "--workers", "0",
              "--batch-size", "1", "--log-every", "1", "--optimizer", "adam", "--epochs", "2"]

# Runs first in every rank (sitecustomize on PYTHONPATH): an exit handler registered before the
# workload's own, so it runs after the workload's teardown and sees which gloo threads are left.
_PROBE = '''
import atexit, os
def _amlhpc_exit_probe():
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    gloo = sorted(n for n in names if "gloo" in n)
    with open(os.environ["AMLHPC_EXIT_PROBE"] + f".rank{os.environ['RANK']}", "w") as f:
        f.write(",".join(gloo))
if os.environ.get("AMLHPC_EXIT_PROBE") and os.environ.get("RANK"):  # the ranks, not torchrun's agent
    atexit.register(_amlhpc_exit_probe)
'''


@dataclass
class Run:
    workload: str
    seconds: float
    returncode: int | None
    verdict: str
    """ok, exit_abort, failed or timeout."""
    rank_exitcodes: list[int] = field(default_factory=list)
    gloo_threads_at_exit: int = 0
    """Ranks whose probe saw a gloo thread alive after the workload's teardown."""
    tail: str = ""


def _command(workload: str, work: Path, data: Path | None) -> tuple[list[str], dict[str, str]]:
    env: dict[str, str] = {"AMLHPC_CHECKPOINT_DIR": str(work / "ckpt")}
    if workload == "bert":
        module, args = "amlhpc.jobs.workloads.bert_pretrain.train", ["--steps", "4", "--log-every", "2"]
        env["AMLHPC_DEEPSPEED_JSON"] = json.dumps(BERT_PLAN)
    elif workload == "cosmoflow":
        module, args = "amlhpc.jobs.workloads.cosmoflow.train", COSMO_TINY
        env["AMLHPC_DATA_DIR_COSMOFLOW"] = str(data)
    elif workload == "allreduce":
        module, args = "amlhpc.jobs.workloads.allreduce", ["--min-bytes", "1K", "--max-bytes", "64K", "--factor", "4",
                                                    "--iters", "3", "--no-judge", "--report", "r.json"]
    elif workload == "llm":
        module, args = "amlhpc.jobs.workloads.llm.train", ["--model", "tiny", "--steps", "3", "--seq-len", "32",
                                                    "--micro-batch", "2", "--warmup-steps", "1"]
    elif workload == "ddp-exit":
        script = work / "ddp_exit.py"
        if work.is_dir():
            script.write_text(DDP_EXIT)
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", str(script)], env
    else:
        raise SystemExit(f"unknown workload {workload!r}: choose from {', '.join(WORKLOADS + EXTRA_WORKLOADS)}")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", "-m", module, *args]
    return argv, env


_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")


def classify(returncode: int | None, stderr: str) -> tuple[str, list[int]]:
    """ok / exit_abort / failed / timeout from torchrun's status and its failure report."""
    codes = [int(c) for c in _EXITCODE.findall(stderr)]
    if returncode is None:
        return "timeout", codes
    if "terminate called" in stderr or any(c < 0 and c != -signal.SIGTERM for c in codes):
        return "exit_abort", codes
    return ("ok" if returncode == 0 else "failed"), codes


def run_once(workload: str, root: Path, data: Path | None, probe_dir: Path, cores: bool, timeout_s: float,
             one_cpu: bool = False) -> Run:
    work = Path(tempfile.mkdtemp(prefix=f"{workload}-", dir=root))
    argv, env = _command(workload, work, data)
    probe = work / "probe"
    full_env = {**os.environ, "PYTHONPATH": f"{probe_dir}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1",
                PROBE_ENV: str(probe), **env}

    def limits() -> None:
        if cores:
            resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        if one_cpu:
            os.sched_setaffinity(0, {0})

    started = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=work, env=full_env, capture_output=True, text=True, timeout=timeout_s,
                              preexec_fn=limits)
        returncode, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        returncode, stderr = None, (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    seconds = time.monotonic() - started
    verdict, codes = classify(returncode, stderr)
    alive = sum(1 for p in work.glob("probe.rank*") if p.read_text().strip())
    result = Run(workload, round(seconds, 2), returncode, verdict, codes, alive,
                 "" if verdict == "ok" else stderr[-4000:])
    if verdict == "ok":
        shutil.rmtree(work, ignore_errors=True)
    return result


@contextlib.contextmanager
def burners(count: int, one_cpu: bool = False):
    """`count` busy-looping processes at this process's priority, stopped by pid at the end."""
    pin = (lambda: os.sched_setaffinity(0, {0})) if one_cpu else None
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def summarise(runs: list[Run]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for workload in sorted({r.workload for r in runs}):
        mine = [r for r in runs if r.workload == workload]
        counts = Counter(r.verdict for r in mine)
        table[workload] = {"runs": len(mine), **{k: counts.get(k, 0) for k in ("ok", "exit_abort", "failed", "timeout")},
                           "gloo_threads_alive_at_exit": sum(1 for r in mine if r.gloo_threads_at_exit)}
    return table


def render(report: dict) -> str:
    lines = [f"exit-abort loop: {report['command']}", f"machine: {report['machine']}",
             f"load average before / after: {report['load_before']} / {report['load_after']}; burners: {report['burn']}; "
             f"{'ranks and burners on CPU 0; ' if report['one_cpu'] else ''}"
             f"{report['seconds']:.0f} s", "",
             "| workload | runs | ok | exit aborts | other failures | timeouts | runs with gloo threads alive after teardown |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in report["summary"].items():
        lines.append(f"| {name} | {row['runs']} | {row['ok']} | {row['exit_abort']} | {row['failed']} | {row['timeout']} | "
                     f"{row['gloo_threads_alive_at_exit']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=100, help="runs in all, shared round-robin by the workloads (default 100)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--burn", type=int, default=0, help="busy-looping processes beside the runs (default 0)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run before it counts as a timeout")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    p.add_argument("--keep-failures", type=Path, default=None, help="keep failed runs' folders here (default: a temp dir)")
    p.add_argument("--cores", action="store_true", help="let ranks write core files into their run folder")
    p.add_argument("--one-cpu", action="store_true", help="run the ranks and the burners on CPU 0 only")
    args = p.parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [name for name in workloads if name not in WORKLOADS + EXTRA_WORKLOADS]
    if unknown:  # before anything runs
        raise SystemExit(f"unknown workload(s) {', '.join(unknown)}: choose from {', '.join(WORKLOADS + EXTRA_WORKLOADS)}")

    root = args.keep_failures or Path(tempfile.mkdtemp(prefix="exit-abort-"))
    root.mkdir(parents=True, exist_ok=True)
    probe_dir = root / "probe-site"
    probe_dir.mkdir(exist_ok=True)
    (probe_dir / "sitecustomize.py").write_text(_PROBE)
    data = None
    if "cosmoflow" in workloads:
        from amlhpc.jobs.workloads.cosmoflow import generate

        data = root / "cosmoflow-data"
        if not data.is_dir():
            generate.generate(data, universes=1, volume=16, subvolumes=4, validation_universes=1, seed=1)

    load_before, started, runs = loadavg(), time.monotonic(), []
    with burners(args.burn, args.one_cpu):
        for i in range(args.runs):
            run = run_once(workloads[i % len(workloads)], root, data, probe_dir, args.cores, args.timeout, args.one_cpu)
            runs.append(run)
            print(f"{i + 1}/{args.runs} {run.workload}: {run.verdict} ({run.seconds:.1f}s, rank exit codes "
                  f"{run.rank_exitcodes or '-'}, gloo threads alive after teardown on {run.gloo_threads_at_exit} rank(s))",
                  flush=True)
    report = {"command": "python -m bench.exit_abort " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": describe_machine(), "burn": args.burn, "one_cpu": args.one_cpu, "load_before": load_before, "load_after": loadavg(),
              "seconds": time.monotonic() - started, "summary": summarise(runs),
              "failures": [asdict(r) for r in runs if r.verdict != "ok"], "kept_in": str(root)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "exit_abort.json").write_text(json.dumps(report, indent=2))
    (args.out / "exit_abort.md").write_text(render(report))
    print(render(report))
    return 0 if all(r.verdict == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
