"""Reading torch.distributed.checkpoint (DCP) files without running code a job could have written.

DCP's own reader unpickles `.metadata` with `pickle.load`, and its default planner reads every
non-tensor value with `torch.load(weights_only=False)` (torch 2.13,
torch/distributed/checkpoint/filesystem.py `read_metadata` and default_planner.py `load_bytes`):
either runs whatever a forged file asks for. Checkpoints live where every job of the workspace
can write, so here:

- `.metadata` goes through metapickle.py, a pure-Python unpickler that builds only the plain
  records DCP's metadata consists of (its dataclasses, torch.Size, dtypes, layouts, paths),
  fills only records it just made with their own fields, and refuses any other global, call,
  attribute or opcode with UnsafeCheckpoint naming it: a `__reduce__` payload never runs, and
  a forged file cannot set an attribute on a class or function of the process;
- non-tensor values are read with `torch.load(weights_only=True)` (SafeLoadPlanner), as DCP
  already reads tensors;
- the file names the metadata points at must be plain names inside the rank's folder.

Each rank saves its part of a version on its own (tier.py: `rank-<r>/`, `no_dist`), so a
version's global metadata is the union of the ranks' (`merged_metadata`): chunks of sharded
tensors (FSDP, DTensor) from every rank, one copy of replicated ones, preferring the loading
rank's own copy so that a restart with the same world size reads only its node's files. The
union also loads into a different world size (DCP reshards by chunk offsets). `uncovered` names
what the loading rank needs and the parts present lack (a node holds only its own ranks' parts:
enough for its ranks' own shards at the same world size, not for a full tensor).

Imports torch: used by the training process, never by the launcher.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import re
from pathlib import Path

from amlhpc.jobs.runtime.checkpoint import metapickle, safepath
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError, UnsafeCheckpoint

METADATA_FILE = ".metadata"


def refusal(exc: BaseException) -> str:
    """What torch's weights_only unpickler refused, in a few words (its message goes on to explain
    how to load the file unsafely, which is not advice to pass on)."""
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc)) or re.search(r"Unsupported operand \d+", str(exc))
    return f"it refers to {found.group(1)}" if found and found.groups() else (found.group(0) if found else "not plain data")


def read_metadata(path: Path):
    """One rank's `.metadata`, unpickled safely and checked."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read: {exc}") from None
    metadata = metapickle.loads(data, str(path))
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"{path} is a {type(metadata).__name__}, not checkpoint metadata: refused. {safepath.FIX}")
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or "/" in safepath.checked_relative(name, str(path)):
            raise UnsafeCheckpoint(f"{path}: data file {name!r} is not a file of the rank's own folder: refused. "
                                   f"{safepath.FIX}")
        if not all(isinstance(v, int) and v >= 0 for v in (info.offset, info.length)):
            raise UnsafeCheckpoint(f"{path}: data offsets of {name!r} are not byte counts: refused")
    return metadata


def merged_metadata(version_dir: Path, ranks: list[int], prefer: int | None = None):
    """The version's metadata over the rank folders in `ranks` (see the module docstring)."""
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata

    order = ([prefer] if prefer in ranks else []) + [r for r in sorted(ranks) if r != prefer]
    state: dict = {}
    storage: dict = {}
    planner_data: dict = {}
    for rank in order:
        metadata = read_metadata(Path(version_dir) / f"rank-{rank}" / METADATA_FILE)
        for fqn, meta in metadata.state_dict_metadata.items():
            if isinstance(meta, TensorStorageMetadata):
                have = state.setdefault(fqn, TensorStorageMetadata(meta.properties, meta.size, []))
                if not isinstance(have, TensorStorageMetadata) or have.size != meta.size:
                    raise CheckpointError(f"{version_dir}: rank {rank} saved {fqn} with another shape than rank {order[0]}")
                known = {tuple(c.offsets) for c in have.chunks}
                have.chunks.extend(c for c in meta.chunks if tuple(c.offsets) not in known)
            else:
                state.setdefault(fqn, meta)
        for index, info in metadata.storage_data.items():
            key = MetadataIndex(index.fqn, index.offset)
            if key not in storage:
                storage[key] = dataclasses.replace(info, relative_path=f"rank-{rank}/{info.relative_path}")
        for key, value in (metadata.planner_data or {}).items():
            planner_data.setdefault(key, value)
    return Metadata(state_dict_metadata=state, planner_data=planner_data, storage_data=storage)


def uncovered(state: dict, metadata) -> list[str]:
    """The tensors of `state` whose part this rank loads (its own shard of a DTensor, all of a
    plain tensor) the metadata's chunks do not cover whole: DCP would leave the rest as it was.
    A node holds only its own ranks' parts of a version: enough for the same world size."""
    from torch.distributed.checkpoint.planner import LoadItemType
    from torch.distributed.tensor import DTensor

    planner = safe_planner()
    planner.set_up_planner(state, metadata, is_coordinator=False)
    read: dict[str, int] = {}
    for item in planner.create_local_plan().items:
        if item.type == LoadItemType.TENSOR:
            read[item.dest_index.fqn] = read.get(item.dest_index.fqn, 0) + math.prod(item.lengths)
    missing = []
    for fqn, value in planner.state_dict.items():
        if isinstance(value, DTensor):
            if value.device_mesh.get_coordinate() is None:
                continue
            value = value.to_local()
        if fqn in metadata.state_dict_metadata and hasattr(value, "numel") and read.get(fqn, 0) < value.numel():
            missing.append(fqn)
    return missing


def unwrap(exc: BaseException) -> BaseException:
    """DCP wraps what a rank raised in a CheckpointException: the first CheckpointError inside, else `exc`."""
    for failure in (getattr(exc, "failures", None) or {}).values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, CheckpointError):
            return inner
    return exc


def safe_reader(version_dir: Path, metadata):
    """A DCP FileSystemReader that answers with `metadata` instead of unpickling `.metadata`."""
    from torch.distributed.checkpoint import FileSystemReader

    class _Reader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            return metadata

    return _Reader(str(version_dir))


def safe_planner():
    """DCP's default load planner, reading non-tensor values with torch.load(weights_only=True)."""
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element  # as DCP's planner

    class _Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            try:
                loaded = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as exc:
                raise UnsafeCheckpoint(f"checkpoint value {read_item.dest_index.fqn} is not plain data (weights_only "
                                       f"refused it: {refusal(exc)}); nothing in it was run. {safepath.FIX}") from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return _Planner()


def load_file(path: Path, map_location="cpu"):
    """A whole-file torch.save checkpoint, as plain data only (weights_only=True)."""
    import torch

    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpoint(f"{path} is not plain tensors and data (weights_only refused it: {refusal(exc)}); "
                               f"nothing in it was run. {safepath.FIX}") from None
