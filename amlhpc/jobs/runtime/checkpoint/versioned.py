"""Versioned checkpoints from the training process: torch.distributed.checkpoint (DCP) per rank,
written in the background into the node-local tier, loaded safely into any world size.

Saving (`Checkpointer.save`): the training waits only while the state is copied to CPU memory
(into the buffers of the previous save when the shapes match);
a writer thread then runs DCP's FileSystemWriter into `versions/step-N/rank-<r>/` (tier.py) with
`no_dist=True` - no collective in the background thread, where it could interleave with the
training's own - writes the rank's trainer state (JSON: step, sampler, RNG) beside it, and last
the rank's marker, with the size and SHA-256 of every file. One save is in flight per rank: the
next one first waits for it (bounded memory; a rank is never more than one version behind,
which is why two versions kept locally always leave one that every node holds whole).

Loading (`load_version`): the metadata of the rank folders present is merged (safeload.py,
no pickled code), and DCP reads into the given state dict: the same world size reads only the
rank's own folder (its node's files); another world size reshards from every rank's folder.

Imports torch: used by the training process (amlhpc/jobs/workloads/common.py), never by the launcher.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.checkpoint import safeload, tier
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError

log = logging.getLogger("amlhpc.checkpoint")
TRAINER_FILE = "trainer.json"
# Each rank saves and loads its part on its own (no_dist) on purpose; DCP warns about it each time.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def to_cpu(state: Any, buffers: dict | None = None) -> Any:
    """A copy of `state` whose tensors live in CPU memory and no longer change with training.
    `buffers` (kept between saves) holds the CPU tensors of the last copy: a tensor of the same
    shape and dtype is copied into its buffer instead of a new allocation, whose page faults
    cost as much as the copy itself (the caller must know the last write is done with them)."""
    import torch
    from torch.distributed.tensor import DTensor

    buffers = {} if buffers is None else buffers

    def to_host(path: tuple, tensor):
        tensor = tensor.detach()
        held = buffers.get(path)
        if held is not None and held.shape == tensor.shape and held.dtype == tensor.dtype:
            return held.copy_(tensor)
        buffers[path] = tensor.to("cpu", copy=True)
        return buffers[path]

    def copy(path: tuple, value):
        if isinstance(value, DTensor):
            local = to_host(path, value.to_local())
            return DTensor.from_local(local, value.device_mesh, value.placements, run_check=False,
                                      shape=value.shape, stride=value.stride())
        if isinstance(value, torch.Tensor):
            return to_host(path, value)
        if isinstance(value, dict):
            return {k: copy((*path, k), v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(copy((*path, i), v) for i, v in enumerate(value))
        return value

    return copy((), state)


class Checkpointer:
    """This rank's saves into the node's tier (see the module docstring)."""

    def __init__(self, checkpoint_dir: Path, rank: int, world: int, tag: str, background: bool = True):
        self.checkpoint_dir, self.rank, self.world, self.tag, self.background = (
            Path(checkpoint_dir), rank, world, tag, background)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict = {}
        """CPU copies of the last save's tensors, reused by the next (background saves)."""
        self.saved: list[int] = []
        """Steps whose part this rank finished writing."""

    def save(self, step: int, state: dict[str, Any], trainer: dict[str, Any]) -> float:
        """Save `state` (tensors, DTensors, plain values) and `trainer` (JSON) as version step-N.
        Returns the seconds the caller was held (waiting for the previous save, and the copy)."""
        started = time.perf_counter()
        self.wait()
        staged = to_cpu(state, self._buffers) if self.background else state
        version_dir = tier.versions_dir(self.checkpoint_dir) / tier.version_name(step)
        if self.background:
            self._thread = threading.Thread(target=self._write_guarded, args=(version_dir, step, staged, trainer),
                                            name=f"checkpoint-rank{self.rank}", daemon=True)
            self._thread.start()
        else:
            self._write(version_dir, step, staged, trainer)
        return time.perf_counter() - started

    def wait(self) -> None:
        """Block until the save in flight is on disk; raise what it failed with."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"rank {self.rank}: writing a checkpoint failed: {error}") from error

    def _write_guarded(self, *args) -> None:
        try:
            self._write(*args)
        except BaseException as exc:  # noqa: BLE001 - reported by the next save or wait()
            self._error = exc

    def _write(self, version_dir: Path, step: int, state: dict[str, Any], trainer: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp

        started = time.perf_counter()
        folder = tier.rank_dir(version_dir, self.rank)
        tier.marker_path(version_dir, self.rank).unlink(missing_ok=True)
        if folder.exists():
            shutil.rmtree(folder)  # an interrupted save, or an abandoned timeline's part
        folder.mkdir(parents=True)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder), sync_files=True), no_dist=True)
        (folder / TRAINER_FILE).write_text(json.dumps(trainer))
        tier.write_marker(version_dir, self.rank, step=step, world=self.world, tag=self.tag)
        self.saved.append(step)
        log.info("rank %d: checkpoint %s written in %.2fs", self.rank, version_dir.name, time.perf_counter() - started)


def load_version(version_dir: Path, state: dict[str, Any], rank: int, world: int | None = None) -> dict[str, Any]:
    """Load the version into `state` in place; returns the trainer state to resume from, with
    "same_world" saying whether it is this rank's own at the world size that saved it (RNG and
    data position included) or, on another world size (`world`), rank 0's or the lowest's."""
    import torch.distributed.checkpoint as dcp

    version_dir = Path(version_dir)
    found = tier.read_version(version_dir)
    markers = found.markers if found else {}
    if not markers:
        raise CheckpointError(f"{version_dir} holds no complete rank part (no rank-<r>.json marker)")
    worlds = {m["world"] for m in markers.values()}
    metadata = safeload.merged_metadata(version_dir, sorted(markers), prefer=rank)
    missing = safeload.uncovered(state, metadata)
    if missing:
        raise CheckpointError(f"{version_dir}: {missing[0]} is only partly there: the ranks present "
                              f"({', '.join(map(str, sorted(markers)))}) hold part of what rank {rank} loads; the "
                              "other ranks' parts are needed (restore the version from Blob)")
    try:
        dcp.load(state, storage_reader=safeload.safe_reader(version_dir, metadata), planner=safeload.safe_planner(),
                 no_dist=True)
    except dcp.CheckpointException as exc:
        raise safeload.unwrap(exc) from None
    saved = worlds.pop() if len(worlds) == 1 else None
    same = rank in markers and saved is not None and (world is None or world == saved)
    source = rank if same else min(markers)
    trainer = json.loads((tier.rank_dir(version_dir, source) / TRAINER_FILE).read_text())
    trainer["same_world"] = same
    trainer["saved_world"] = saved
    return trainer
