"""CosmoFlow samples from TFRecord files: which files this rank reads, and how to read them.

File selection (in this order):
1. AMLHPC_FILE_LIST_<INPUT>: this rank's own list (staging's `local` placement already
   sharded the files over nodes and ranks; a JSON array of paths relative to
   AMLHPC_DATA_DIR_<INPUT>, read with amlhpc.jobs.runtime.staging.filelist);
2. else every *.tfrecord / *.tfrecord.gz under the data dir, sharded here by
   rank: file i goes to rank i mod world (shared/replica placement, Azure ML inputs).
Files under a `validation/` folder form the validation set; the rest are training data.

A sample: x int16 [D, D, D, 4] -> float32 [4, D, D, D] (channels first), log1p as in the
reference (`apply_log`); y: the 4 normalised cosmological parameters.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.staging import filelist
from amlhpc.jobs.workloads.cosmoflow import tfrecord

CHANNELS = 4


def data_dir(input_name: str, override: str | None = None) -> Path:
    folder = override or os.environ.get(contract.data_dir_var(input_name))
    if not folder:
        raise SystemExit(f"no data: set --data-dir or {contract.data_dir_var(input_name)} (the launcher sets it for staged inputs)")
    return Path(folder)


def rank_files(root: Path, input_name: str, rank: int, world: int, file_list: str | None = None) -> list[Path]:
    listing = file_list or os.environ.get(contract.file_list_var(input_name))
    if listing:
        return [root / name for name in filelist.read(listing) if name.endswith((".tfrecord", ".tfrecord.gz"))]
    every = sorted(p for p in root.rglob("*") if p.name.endswith((".tfrecord", ".tfrecord.gz")))
    return every[rank::world]


def split(files: list[Path]) -> tuple[list[Path], list[Path]]:
    val = [f for f in files if "validation" in f.parts]
    return [f for f in files if f not in val], val


def read_samples(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    if path.name.endswith(".gz"):
        raw = gzip.decompress(path.read_bytes())
        tmp = path.with_name(path.name[:-3] + ".tmp-decoded")
        tmp.write_bytes(raw)
        try:
            return read_samples(tmp)
        finally:
            tmp.unlink(missing_ok=True)
    out = []
    for record in tfrecord.read_records(path):
        features = tfrecord.decode_example(record)
        packed = features["x"]
        if not isinstance(packed, bytes):
            raise ValueError(f"{path}: x is a list of numbers, not the packed int16 bytes")
        x = np.frombuffer(packed, dtype="<i2")
        side = round((x.size / CHANNELS) ** (1 / 3))
        if side ** 3 * CHANNELS != x.size:
            raise ValueError(f"{path}: x has {x.size} values, not D^3 x {CHANNELS}")
        out.append((x.reshape(side, side, side, CHANNELS), np.asarray(features["y"], dtype=np.float32)))
    return out


def to_tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    volume = torch.from_numpy(np.log1p(x.astype(np.float32))).permute(3, 0, 1, 2).contiguous()
    return volume, torch.from_numpy(y)


class CosmoFlowFiles(Dataset):
    """Samples read from TFRecord files (one or more records per file) on access."""

    def __init__(self, files: list[Path]):
        self.files = files
        self.index: list[tuple[int, int]] = []
        for i, path in enumerate(files):
            count = sum(1 for _ in tfrecord.read_records(path)) if not path.name.endswith(".gz") else len(read_samples(path))
            self.index.extend((i, j) for j in range(count))

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, item: int):
        file_index, record = self.index[item]
        x, y = read_samples(self.files[file_index])[record]
        return to_tensors(x, y)


class InMemory(Dataset):
    """The same samples preloaded into RAM (`--from-memory`): training without input I/O."""

    def __init__(self, files: list[Path]):
        self.samples = [to_tensors(x, y) for path in files for x, y in read_samples(path)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: int):
        return self.samples[item]
