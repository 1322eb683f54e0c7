"""Does a background checkpoint write slow the training's host beside it?

    python -m bench.writer_beside [--mib 1024] [--writers 1] [--repeats 3]

A host-bound loop (400 small torch operations a step, one thread: a training's kernel launches
as the CPU sees them) is timed alone, then while `Checkpointer` writes a state of `--mib` MiB
in its background thread (`--writers` file-writing threads, in the loop's own process), then
while the same write runs in a forked process (no shared interpreter lock), each `--repeats`
times, interleaved. Each line: the loop's median step before, during and after the write, and
during / before. On a GPU node llm-pretrain's steps ran 3.4x slower while a 14.8 GB save was
written (bench/RESULTS.md); this asks whether the writer's share of the process is why.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

MIB = 1 << 20


def _loop(seconds: float, x) -> list[float]:
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        y = x
        for _ in range(400):
            y = y * 1.0001 + 0.0001
        times.append(time.perf_counter() - started)
    return times


def _write_here(root: Path, state: dict, writers: int, x) -> tuple[list[float], float]:
    from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

    writer = Checkpointer(root, 0, 1, "bench", writers=writers)
    writer.save(1, state, {"step": 1})  # cold: the stager allocates
    writer.wait()
    writer.save(2, state, {"step": 2})
    started, during = time.perf_counter(), []
    while writer._thread is not None and writer._thread.is_alive():
        during += _loop(0.2, x)
    seconds = time.perf_counter() - started
    writer.close()
    return during, seconds


def _write_forked(root: Path, state: dict, writers: int, x) -> tuple[list[float], float]:
    from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

    def write() -> None:
        Checkpointer(root, 0, 1, "bench", background=False, writers=writers).save(2, state, {"step": 2})

    process = multiprocessing.get_context("fork").Process(target=write)
    started, during = time.perf_counter(), []
    process.start()
    while process.is_alive():
        during += _loop(0.2, x)
    return during, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.writer_beside", description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="state size in MiB (16 tensors)")
    parser.add_argument("--writers", type=int, default=1, help="the writer's file-writing threads")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    for name in ("mib", "writers", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: give a whole number of at least 1")
    import torch

    torch.set_num_threads(1)
    x = torch.randn(64)
    state = {"model": {f"w{i}": torch.randn(args.mib * MIB // 16 // 4) for i in range(16)}}
    ratios: dict[str, list[float]] = {"in the process": [], "forked": []}
    for repeat in range(args.repeats):
        for name, write in (("in the process", _write_here), ("forked", _write_forked)):
            root = Path(tempfile.mkdtemp(prefix="amlhpc-writer-beside-"))
            try:
                before = statistics.median(_loop(3.0, x))
                during, seconds = write(root, state, args.writers, x)
                after = statistics.median(_loop(3.0, x))
            finally:
                shutil.rmtree(root, ignore_errors=True)
            ratio = statistics.median(during) / before
            ratios[name].append(ratio)
            print(f"run {repeat + 1}, writer {name}: step {before * 1e3:.2f} ms before, "
                  f"{statistics.median(during) * 1e3:.2f} ms during the {seconds:.1f} s write, "
                  f"{after * 1e3:.2f} ms after: x{ratio:.2f}", flush=True)
    for name, values in ratios.items():
        print(f"writer {name}: during / before x{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}, "
              f"n={len(values)}), {args.mib} MiB, {args.writers} writer thread(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
