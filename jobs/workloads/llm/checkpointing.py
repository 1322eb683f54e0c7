"""The LLM workload's checkpoints: sharded model and optimizer state with torch.distributed.checkpoint.

Every checkpoint call of the workload is here (`save`, `restore`), over the folder the
launcher uploads and restores (jobs/workloads/common.py `checkpoint_dir`, AMLHPC_RESUME_DIR).
Layout, per node (each node's launcher uploads its own folder: recipe checkpoint.writers
per_rank):

    step-000000120/__<rank>_0.distcp   this node's ranks' shards (DCP's FileSystemWriter)
    step-000000120/.metadata           DCP's index, written by rank 0 (node 0 only)
    step-000000120/done-rank<r>.json   rank r finished writing: {"step", "world"}

The state is `get_state_dict(model, optimizer)` (FSDP2's DTensor shards, no gather), the
step is in the folder's name, and the data position follows from the step
(jobs/workloads/llm/data.py): nothing else needs saving. A restore agrees on the newest
step every rank holds completely, reads DCP's index on rank 0 and hands it to the others
(their node folders hold only their own shards), and loads in place. A checkpoint loads
into the world size that wrote it: each node holds only its own ranks' shards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from jobs.runtime import contract, progress
from jobs.workloads import common

_STEP = re.compile(r"^step-(\d{9})$")


class CheckpointMismatch(RuntimeError):
    """The ranks hold no complete checkpoint in common, or one written by another world size."""


def _folders() -> list[Path]:
    found = [common.checkpoint_dir()]
    resume = os.environ.get(contract.RESUME_DIR)
    if resume and Path(resume) not in found:
        found.insert(0, Path(resume))
    return found


def _complete(folder: Path, rank: int, world: int) -> bool:
    marker = folder / f"done-rank{rank}.json"
    try:
        done = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if done.get("world") != world:
        raise CheckpointMismatch(f"{folder} was written by {done.get('world')} ranks, this job has {world}: each node "
                                 "holds only its own ranks' shards, so it loads into the same world size")
    return rank != 0 or (folder / ".metadata").is_file()


def _steps_held(rank: int, world: int) -> dict[int, Path]:
    held: dict[int, Path] = {}
    for base in _folders():
        if not base.is_dir():
            continue
        for child in base.iterdir():
            match = _STEP.match(child.name)
            if match and child.is_dir() and _complete(child, rank, world):
                held.setdefault(int(match.group(1)), child)
    return held


def save(d: common.Dist, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, keep: int = 2) -> Path:
    """Write this rank's shards of step `step`, mark them done, keep the newest `keep` steps."""
    folder = common.checkpoint_dir() / f"step-{step:09d}"
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, storage_writer=FileSystemWriter(folder))
    marker = folder / f"done-rank{d.rank}.json"
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps({"step": step, "world": d.world}))
    os.replace(tmp, marker)
    common.barrier(d)
    if d.local_rank == 0:
        older = sorted(p for p in common.checkpoint_dir().iterdir() if _STEP.match(p.name) and p != folder)
        for old in older[: max(0, len(older) - (keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    common.record_checkpoint(folder)
    return folder


class _GivenIndex(FileSystemReader):
    """DCP's reader over this node's folder, with the index rank 0 read (others lack the file)."""

    def __init__(self, path: Path, metadata):
        super().__init__(path)
        self._given = metadata

    def read_metadata(self):
        return self._given


def restore(d: common.Dist, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load the newest step every rank holds; returns it (0: a fresh start)."""
    held = _steps_held(d.rank, d.world)
    everyone: list[set[int]] = [set(held)]
    if d.world > 1:
        gathered: list = [None] * d.world
        dist.all_gather_object(gathered, set(held))
        everyone = gathered
    if not any(everyone):
        progress.report(0)  # a fresh start: the watchdog watches from here
        return 0
    shared = set.intersection(*everyone)
    if not shared:
        raise CheckpointMismatch("the ranks hold no checkpoint step in common: " + "; ".join(
            f"rank {r}: {sorted(s) or 'none'}" for r, s in enumerate(everyone)))
    step = max(shared)
    folder = held[step]
    index = [FileSystemReader(folder).read_metadata() if d.rank == 0 else None]
    if d.world > 1:
        dist.broadcast_object_list(index, src=0)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, storage_reader=_GivenIndex(folder, index[0]))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    progress.note_resumed(step)
    if d.is_main:
        print(f"resumed from {folder} (step {step})", flush=True)
    return step
