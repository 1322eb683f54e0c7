"""What hashing a checkpoint's blocks costs its writer: one SHA-256 of a buffer against the
file's SHA-256 and its blocks' (amlhpc/jobs/runtime/checkpoint/blocks.py) over the same bytes,
as one writer thread does while it writes. Median (min-max) of `--repeats` runs.

    python -m bench.block_hashing [--mib 256] [--block-kib 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time

from amlhpc.jobs.runtime.checkpoint.blocks import BlockHasher


def rates(mib: int, block: int, repeats: int) -> tuple[list[float], list[float]]:
    """GB/s of (the file's SHA-256 alone, the file's and the blocks' together) per run."""
    piece = memoryview(os.urandom(64 << 20))
    pieces = max(1, mib // 64)
    alone, both = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        digest = hashlib.sha256()
        for _ in range(pieces):
            digest.update(piece)
        alone.append(pieces * len(piece) / (time.perf_counter() - started) / 1e9)
        started = time.perf_counter()
        digest, blocks = hashlib.sha256(), BlockHasher(block)
        for _ in range(pieces):
            digest.update(piece)
            blocks.update(piece)
        blocks.finish()
        both.append(pieces * len(piece) / (time.perf_counter() - started) / 1e9)
    return alone, both


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--block-kib", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    alone, both = rates(args.mib, args.block_kib << 10, args.repeats)
    show = lambda v: f"{statistics.median(v):.2f} GB/s ({min(v):.2f}-{max(v):.2f})"  # noqa: E731
    print(f"{args.mib} MiB, {args.repeats} runs, one thread: the file's SHA-256 {show(alone)}; with its "
          f"{args.block_kib} KiB blocks' {show(both)}")


if __name__ == "__main__":
    main()
