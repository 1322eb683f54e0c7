"""A synthetic dataset in CosmoFlow's file naming, compressible like the real volumes.

Names follow the MLPerf HPC CosmoFlow set (NAG's CosmoFlow tutorial): `univ_ics_2019-03_aXXXXX_YYY.tfrecord`,
XXXXX one number per simulated universe, YYY 000-063 within it.

Contents: int16 particle counts, the kind of data CosmoFlow's volumes hold: mostly small
counts whose typical size drifts through space (voids, filaments, halos). Counts are
drawn from a geometric distribution whose mean follows a random walk along the volume,
segment by segment. Gzip then shrinks it about 4.8x with isal and 5.5x with zlib's level
6, in line with NAG's CosmoFlow tutorial's 5.1 TB -> 1.1 TB (4.6x); random bytes would not compress at
all and a constant would compress 1000x, both giving meaningless staging numbers. The
generator runs at C speed (bytes.translate over random bytes), tens of MB/s, without
numpy, so tests and benchmarks can make their data on the fly. Deterministic per seed.

`python -m bench.dataset DEST [--universes N] [--files-per-universe 64] [--file-mib M]`
writes a dataset to DEST.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

SEGMENT = 64
"""Samples that share one density level."""


def _geometric_table(mean: float) -> bytes:
    """Map a uniform byte to a geometric count with this mean (inverse CDF at 256 points)."""
    p = 1.0 / (1.0 + mean)
    table = bytearray(256)
    for u in range(256):
        q = (u + 0.5) / 256
        table[u] = min(int(math.log(1 - q) / math.log(1 - p)), 255)
    return bytes(table)


# Density levels from near-empty voids (mean 0.02 particles) to dense halos (mean ~9).
_LEVELS = [_geometric_table(0.02 * 1.6**k) for k in range(14)]


def cosmoflow_name(universe: int, index: int) -> str:
    """`univ_ics_2019-03_aXXXXX_YYY.tfrecord` for universe XXXXX, file YYY (000-063)."""
    return f"univ_ics_2019-03_a{universe:05d}_{index:03d}.tfrecord"


def volume_bytes(seed: int, nbytes: int) -> bytes:
    """`nbytes` (rounded down to whole int16 samples) of smooth, compressible counts."""
    rng = random.Random(seed)
    samples = nbytes // 2
    level = rng.randrange(len(_LEVELS))
    parts = []
    for start in range(0, samples, SEGMENT):
        step = rng.random()
        if step < 0.15:
            level = max(0, level - 1)
        elif step > 0.85:
            level = min(len(_LEVELS) - 1, level + 1)
        parts.append(rng.randbytes(min(SEGMENT, samples - start)).translate(_LEVELS[level]))
    low = b"".join(parts)
    out = bytearray(2 * len(low))  # little-endian int16: counts < 256 leave the high byte 0
    out[0::2] = low
    return bytes(out)


def generate(dest: Path, universes: int = 1, files_per_universe: int = 64, file_bytes: int = 64 << 10,
             seed: int = 0, size_jitter: float = 0.0, first_universe: int = 10000) -> list[Path]:
    """Write the dataset under `dest`; returns the files, sorted.

    size_jitter: each file's size varies uniformly by +- this fraction (0: equal sizes,
    as in the real set).
    """
    dest.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    for u in range(universes):
        universe = first_universe + u
        for index in range(files_per_universe):
            size = file_bytes
            if size_jitter:
                size = max(2, int(file_bytes * (1 + rng.uniform(-size_jitter, size_jitter))))
            path = dest / cosmoflow_name(universe, index)
            path.write_bytes(volume_bytes(rng.getrandbits(64), size))
            paths.append(path)
    return sorted(paths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dataset", description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--universes", type=int, default=1)
    parser.add_argument("--files-per-universe", type=int, default=64)
    parser.add_argument("--file-mib", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = generate(args.dest, args.universes, args.files_per_universe, int(args.file_mib * (1 << 20)), args.seed)
    print(f"wrote {len(paths)} files, {sum(p.stat().st_size for p in paths) / 1e6:.1f} MB, to {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
