"""Synthetic CosmoFlow data in the real format and naming, for tests, rehearsal and bench.

`python -m amlhpc.jobs.workloads.cosmoflow.generate OUT --universes 2 --volume 32` writes
OUT/train/univ_ics_2019-03_aXXXXX_YYY.tfrecord (YYY 000-063: one sub-volume per file, as in
the MLPerf HPC dataset) and OUT/validation/... . Each record is a tf.train.Example with
x = raw int16 [D, D, D, 4] and y = 4 floats in [-1, 1].

Volumes are Poisson counts on a smooth density (a low-resolution Gaussian field,
upsampled trilinearly and exponentiated), so they compress like real dark-matter
histograms (NAG's CosmoFlow tutorial: 5.1 TB -> 1.1 TB gzip) rather than like noise or constants; the four parameters shape the field (mean density,
contrast, and two channel tilts) so a model can learn them. Deterministic per --seed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from amlhpc.jobs.workloads.cosmoflow import tfrecord

SUBVOLUMES_PER_UNIVERSE = 64
CHANNELS = 4


def file_name(universe_id: int, sub: int) -> str:
    return f"univ_ics_2019-03_a{universe_id:05d}_{sub:03d}.tfrecord"


def subvolume(params: np.ndarray, volume: int, rng: np.random.Generator) -> np.ndarray:
    """int16 [D, D, D, 4] counts whose statistics depend on the 4 parameters."""
    coarse = max(2, volume // 8)
    noise = torch.from_numpy(rng.standard_normal((1, CHANNELS, coarse, coarse, coarse)).astype(np.float32))
    field = F.interpolate(noise, size=(volume,) * 3, mode="trilinear", align_corners=False)[0]
    mean = 1.0 + 0.5 * params[0]
    contrast = 0.6 + 0.3 * params[1]
    tilt = torch.tensor([1.0 + 0.25 * params[2], 1.0 - 0.25 * params[2], 1.0 + 0.25 * params[3], 1.0 - 0.25 * params[3]])
    density = torch.exp(mean + contrast * field * tilt.view(CHANNELS, 1, 1, 1)).permute(1, 2, 3, 0).numpy()
    # particle counts per voxel: Poisson shot noise on the smooth density, like the real
    # N-body histograms (and it keeps gzip near the real dataset's ~4.6x, NAG's CosmoFlow tutorial)
    return np.clip(rng.poisson(density), 0, 32767).astype(np.int16)


def write_universe(folder: Path, universe_id: int, volume: int, subvolumes: int, rng: np.random.Generator) -> list[Path]:
    params = rng.uniform(-1.0, 1.0, size=4).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for sub in range(subvolumes):
        x = subvolume(params, volume, rng)
        record = tfrecord.encode_example({"x": x.astype("<i2").tobytes(), "y": [float(v) for v in params]})
        path = folder / file_name(universe_id, sub)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as stream:
            tfrecord.write_record(stream, record)
        tmp.replace(path)
        paths.append(path)
    return paths


def generate(out: Path, universes: int, volume: int, subvolumes: int = SUBVOLUMES_PER_UNIVERSE,
             validation_universes: int = 0, seed: int = 0) -> list[Path]:
    if not 1 <= subvolumes <= SUBVOLUMES_PER_UNIVERSE:
        raise ValueError(f"subvolumes must be 1-{SUBVOLUMES_PER_UNIVERSE} (YYY runs 000-063)")
    rng = np.random.default_rng(seed)
    ids = rng.choice(100_000, size=universes + validation_universes, replace=False)
    paths = []
    for i, uid in enumerate(ids):
        split = "train" if i < universes else "validation"
        paths += write_universe(out / split, int(uid), volume, subvolumes, rng)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--universes", type=int, default=2)
    parser.add_argument("--validation-universes", type=int, default=1)
    parser.add_argument("--volume", type=int, default=32, help="side D of each sub-volume (real data: 128)")
    parser.add_argument("--subvolumes", type=int, default=SUBVOLUMES_PER_UNIVERSE)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = generate(args.out, args.universes, args.volume, args.subvolumes, args.validation_universes, args.seed)
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} files, {total / 1e6:.1f} MB, to {args.out}")


if __name__ == "__main__":
    main()
