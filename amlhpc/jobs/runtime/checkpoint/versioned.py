"""Versioned checkpoints from the training process: torch.distributed.checkpoint (DCP) per rank,
written in the background into the node-local tier, loaded safely into any world size.

Saving (`Checkpointer.save`): the training waits only while the state is staged, copied into
CPU memory (stager.py: torch's `StateDictStager`, page-locked buffers on a GPU node, allocated
at the first save and reused by every later one, with non-blocking copies); a writer thread
then runs DCP's FileSystemWriter into `versions/step-N/rank-<r>/` (tier.py) with `no_dist=True`
(no collective in the background thread, where it could interleave with the training's own)
and `AMLHPC_CHECKPOINT_WRITERS` file-writing threads, writes the rank's trainer state (JSON:
step, sampler, RNG) beside it, and last the rank's marker. Every byte is hashed on its way to
the disk (`HashingFileSystem`: the writer threads hash what they write), so the marker records
the SHA-256 of what was written without reading any file back, and a restart trusts it
(tier.py `verify`). One save is in flight per rank: the next one first waits for it (bounded
memory; a rank is never more than one version behind, which is why two versions kept locally
always leave one that every node holds whole).

Why this thread and not `dcp.async_save`: async_save runs the same `dcp.save` in a one-worker
thread pool with the same stager (measured against this writer on the same state in
bench/RESULTS.md, "dcp.async_save against this writer": the same stall and the same write, as
expected of the same code), but refuses a job whose default process group has no CPU backend
(NCCL alone, as our GPU workloads start) even with `no_dist=True` (torch 2.13,
torch/distributed/checkpoint/state_dict_saver.py); a CPU backend beside NCCL would mean a gloo
full mesh across every rank of the job, which does not scale to thousands of ranks. And its
writer is DCP's own, whose files we would have to read back to hash. DCP's FileSystemWriter is
used as it is; its `DefaultStager` is not (stager.py says why).

Loading (`load_version`): the metadata of the rank folders present is merged (safeload.py,
no pickled code), and DCP reads into the given state dict: the same world size reads only the
rank's own folder (its node's files); another world size reshards from every rank's folder,
whose data files a reshard restore left in Blob: the reader then fetches the rows of each saved
chunk its plan needs (rows.py), in blocks checked against the part's block digests (ranged.py;
blocks.json written beside the files).
Meanwhile threads hash the files of the folders it reads (the same bytes, from the page cache
the load fills) against their markers: a copy the medium corrupted after the save (size and
mtime unchanged, so the restart's quick check passed it) fails the load with LocalCopyCorrupt
and its marker is set aside (tier.quarantine), so the next restart agrees on Blob's copy.

Imports torch: used by the training process (amlhpc/jobs/workloads/common.py), never by the launcher.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.checkpoint import blocks, ranged, rows, safeload, tier
from amlhpc.jobs.runtime.checkpoint.errors import (
    CheckpointError,
    LocalCopyCorrupt,
    UnsafeCheckpoint,
)
from amlhpc.jobs.runtime.checkpoint.stager import KeptBuffersStager

log = logging.getLogger("amlhpc.checkpoint")
TRAINER_FILE = "trainer.json"
WRITERS_VARIABLE = "AMLHPC_CHECKPOINT_WRITERS"
"""File-writing threads per rank (DCP FileSystemWriter's thread_count); default `default_writers()`."""
# Each rank saves and loads its part on its own (no_dist) on purpose; DCP warns about it each time.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def default_writers(environ: dict[str, str] | None = None) -> int:
    """The node's CPUs shared by its local ranks, at least 1 and at most 8 (past that the disk,
    not the threads, is the bound); `AMLHPC_CHECKPOINT_WRITERS` when set (a positive integer)."""
    environ = dict(os.environ) if environ is None else environ
    given = environ.get(WRITERS_VARIABLE, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise CheckpointError(f"{WRITERS_VARIABLE}={given!r} is not a positive integer: set it to the number "
                                  "of threads each rank writes its checkpoint files with, or unset it")
        return int(given)
    local = max(1, int(environ.get("LOCAL_WORLD_SIZE") or 1))
    return max(1, min(8, (os.cpu_count() or 1) // local))


class HashingWriter(io.RawIOBase):
    """A file opened for writing that hashes every byte written to it, in order. DCP writes its
    files front to back (torch.save streams its zip sequentially; its NoCloseWriter offers no
    seek), so the digest is the file's; a seek would break that and is refused."""

    def __init__(self, raw: Any, block: int = blocks.DEFAULT_KIB * 1024):
        super().__init__()
        self.raw, self.digest, self.size = raw, hashlib.sha256(), 0
        self.blocks = blocks.BlockHasher(block)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = self.raw.write(view)
        if written is None or written < len(view):  # a short write: the rest would go unhashed
            raise OSError(f"short write to {self.raw.name}: {written} of {len(view)} bytes")
        self.digest.update(view)  # hashlib releases the GIL on large buffers: the writer threads hash in parallel
        self.blocks.update(view)
        self.size += len(view)
        return len(view)

    def tell(self) -> int:
        return self.raw.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        raise io.UnsupportedOperation("a checkpoint file is hashed as it is written: written front to back only")

    def fileno(self) -> int:
        return self.raw.fileno()

    def flush(self) -> None:
        self.raw.flush()


def _file_system_class():
    from torch.distributed.checkpoint.filesystem import FileSystem

    class HashingFileSystem(FileSystem):
        """DCP's local file system, recording the SHA-256, size and block digests of every file
        it writes (`digests`, by final path: a `.metadata.tmp` renamed takes its record along)."""

        def __init__(self, block: int) -> None:
            super().__init__()
            self.block = block
            self.digests: dict[str, tuple[str, int, list[str]]] = {}
            self._lock = threading.Lock()

        @contextlib.contextmanager
        def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
            if mode != "wb":
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            with Path(path).open("wb") as raw:
                writer = HashingWriter(raw, self.block)
                yield writer
                raw.flush()
            with self._lock:
                self.digests[str(path)] = (writer.digest.hexdigest(), writer.size, writer.blocks.finish())

        def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
            super().rename(path, new_path)
            with self._lock:
                if str(path) in self.digests:
                    self.digests[str(new_path)] = self.digests.pop(str(path))

    return HashingFileSystem


def hashing_writer(folder: Path, writers: int, block: int | None = None):
    """DCP's FileSystemWriter into `folder` (fsync per file, `writers` threads) whose file system
    records the SHA-256 and block digests of every file as it writes it (`.fs.digests`)."""
    import torch.distributed.checkpoint as dcp

    writer = dcp.FileSystemWriter(str(folder), sync_files=True, thread_count=writers)
    writer.fs = _file_system_class()(block or blocks.block_bytes())
    return writer


class Checkpointer:
    """This rank's saves into the node's tier (see the module docstring)."""

    def __init__(self, checkpoint_dir: Path, rank: int, world: int, tag: str, background: bool = True,
                 writers: int | None = None):
        self.checkpoint_dir, self.rank, self.world, self.tag, self.background = (
            Path(checkpoint_dir), rank, world, tag, background)
        self.writers = writers or default_writers()
        self.block = blocks.block_bytes()  # read once, at the start: a bad value stops the training there
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stager: Any = None
        """The stager (stager.py), made at the first background save and kept: its CPU buffers are
        the next save's (the caller must know the last write is done with them: `wait`)."""
        self.saved: list[int] = []
        """Steps whose part this rank finished writing."""
        self.last_write_s: float | None = None
        """Seconds the last finished write took (DCP files, trainer state, marker)."""

    def save(self, step: int, state: dict[str, Any], trainer: dict[str, Any]) -> float:
        """Save `state` (tensors, DTensors, plain values) and `trainer` (JSON) as version step-N.
        Returns the seconds the caller was held (waiting for the previous save, and the copy)."""
        started = time.perf_counter()
        self.wait()
        version_dir = tier.versions_dir(self.checkpoint_dir) / tier.version_name(step)
        if not self.background:
            self._write(version_dir, step, state, trainer)
            return time.perf_counter() - started
        if self._stager is None:
            self._stager = KeptBuffersStager()
        staged = self._stager.stage(state)
        self._thread = threading.Thread(target=self._write_guarded, args=(version_dir, step, staged, trainer),
                                        name=f"checkpoint-rank{self.rank}", daemon=True)
        self._thread.start()
        return time.perf_counter() - started

    def wait(self) -> None:
        """Block until the save in flight is on disk; raise what it failed with."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"rank {self.rank}: writing a checkpoint failed: {error}") from error

    def close(self) -> None:
        """Wait for the last save and free the stager's buffers (page-locked memory on a GPU node)."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None

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
        writer = hashing_writer(folder, self.writers, self.block)
        dcp.save(state, storage_writer=writer, no_dist=True)
        digests, block_digests = {}, {}
        for path, (digest, size, by_block) in writer.fs.digests.items():
            relative = Path(path).relative_to(version_dir).as_posix()
            if Path(path).stat().st_size == size:  # what was hashed is what is there
                digests[relative] = digest
                if relative.endswith(blocks.DATA_SUFFIX):
                    block_digests[Path(path).name] = by_block
        for name, data in ((blocks.BLOCKS_FILE, blocks.document(self.block, block_digests)),
                           (TRAINER_FILE, json.dumps(trainer).encode())):
            with open(folder / name, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            digests[f"{folder.name}/{name}"] = hashlib.sha256(data).hexdigest()
        tier.write_marker(version_dir, self.rank, step=step, world=self.world, tag=self.tag, workers=self.writers,
                          digests=digests)
        self.saved.append(step)
        self.last_write_s = time.perf_counter() - started
        log.info("rank %d: checkpoint %s written in %.2fs (%d writer threads)", self.rank, version_dir.name,
                 self.last_write_s, self.writers)


def load_version(version_dir: Path, state: dict[str, Any], rank: int, world: int | None = None,
                 verify: bool = True) -> dict[str, Any]:
    """Load the version into `state` in place; returns the trainer state to resume from, with
    "same_world" saying whether it is this rank's own at the world size that saved it (RNG and
    data position included) or, on another world size (`world`), rank 0's or the lowest's.
    `verify`: hash the files of the rank folders read, beside the load, against their markers
    (LocalCopyCorrupt, and the part set aside, on a mismatch)."""
    import torch.distributed.checkpoint as dcp

    version_dir = Path(version_dir)
    found = tier.read_version(version_dir)
    markers = found.markers if found else {}
    if not markers:
        raise CheckpointError(f"{version_dir} holds no complete rank part (no rank-<r>.json marker)")
    worlds = {m["world"] for m in markers.values()}
    try:
        metadata = safeload.merged_metadata(version_dir, sorted(markers), prefer=rank)
    except Exception as exc:  # a `.metadata` the medium corrupted fails here, before the load: say so
        if verify and found:
            _refuse_corrupt(version_dir, {r: _check_part(found, r) for r in sorted(markers)}, exc)
        raise
    missing = safeload.uncovered(state, metadata)
    if missing:
        raise CheckpointError(f"{version_dir}: {missing[0]} is only partly there: the ranks present "
                              f"({', '.join(map(str, sorted(markers)))}) hold part of what rank {rank} loads; the "
                              "other ranks' parts are needed (restore the version from Blob)")
    saved = worlds.pop() if len(worlds) == 1 else None
    same = rank in markers and saved is not None and (world is None or world == saved)
    source = rank if same else min(markers)
    read = sorted({int(info.relative_path.split("/", 1)[0].removeprefix("rank-"))
                   for info in metadata.storage_data.values()} | {source})
    reader = safeload.safe_reader(version_dir, metadata)
    remote = ranged.RemoteFiles(version_dir, markers) if found and found.ranged else None
    if remote is not None:
        reader.fs = ranged.file_system(remote)  # the data by range from Blob, each block checked
        by_rows = rows.read_by_rows(reader, metadata, remote)  # of a saved chunk, only the rows the load needs
    failed: BaseException | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="checkpoint-verify") as pool:
        checks = ({r: pool.submit(_check_part, found, r, remote) for r in read} if verify and found else {})
        try:
            dcp.load(state, storage_reader=reader, planner=safeload.safe_planner(), no_dist=True)
        except dcp.CheckpointException as exc:
            failed = safeload.unwrap(exc)
        except Exception as exc:  # noqa: BLE001 - a corrupt file may fail the load itself: the check says which
            failed = exc
        _refuse_corrupt(version_dir, {r: check.result() for r, check in checks.items()}, failed)
    if failed is not None:
        raise failed
    trainer = json.loads((tier.rank_dir(version_dir, source) / TRAINER_FILE).read_text())
    trainer["same_world"] = same
    trainer["saved_world"] = saved
    if remote is not None:
        log.info("rank %d: %s resharded from Blob by range: %d bytes fetched by this rank, %d saved chunks read by "
                 "rows", rank, version_dir.name, remote.fetched, by_rows.by_rows)
        trainer["fetched_bytes"] = remote.fetched
        trainer["read_by_rows"] = by_rows.by_rows
    return trainer


def _check_part(version: tier.LocalVersion, rank: int, remote: ranged.RemoteFiles | None = None) -> str | None:
    """Rank `rank`'s files of the version against its marker, every byte (beside the load); the
    files read from Blob by range are checked block by block as they arrive instead."""
    return version.check_hashes([e for e in version.markers[rank]["files"] if remote is None or e["path"] not in remote])


def _refuse_corrupt(version_dir: Path, checked: dict[int, str | None], cause: BaseException | None) -> None:
    """LocalCopyCorrupt, the parts that failed their check set aside, when any did. A part the
    safe loader refused as forged (UnsafeCheckpoint) is set aside too, and that refusal is what
    is raised: it names the forgery and says nothing in it ran."""
    problems = {r: problem for r, problem in checked.items() if problem}
    if not problems:
        return
    for bad in problems:
        tier.quarantine(version_dir, bad)
    if isinstance(cause, UnsafeCheckpoint):
        raise cause
    raise LocalCopyCorrupt(f"{'; '.join(problems.values())}: the part of rank(s) {', '.join(map(str, problems))} "
                           "is set aside; the next restart agrees on another version (Blob's)") from cause
