"""A reshard restore's data files, read from Blob by the byte ranges the load asks for.

A job that resumes on another world size than the one that saved (shrink-and-continue) needs
pieces of every rank's part. The node restores the small files of every part (DCP's
`.metadata`, the markers, the trainer state: node.py), not the data files, and writes
`remote.json` into the version folder: where each data file lives in Blob (blob, size, ETag,
account endpoint). The training's load (versioned.load_version) then reads through DCP's own
reader, whose file system opens a data file that is remote as a `RemoteFile`: DCP seeks to
each item its load plan needs and reads it, and only those bytes' blocks are fetched, with
ranged GETs (staging's stdlib reader, blobhttp), each block checked against the part's
`blocks.json` (blocks.py; fetched whole and checked against the marker, which the manifest
vouches for). A block that does not match fails the load naming the file and the block.

The node's ranks share what they fetched: verified blocks go into a sparse copy of the file
under `<version>/.ranged/` with a byte per block saying it is there, both written under a lock
on the file (fcntl.flock), so a block is fetched once per node however many of its ranks read
it (a replicated tensor every rank loads). The copy is never taken for the file itself: the
version folder keeps `remote.json`, and tier.LocalVersion.verify reports it as not held whole,
so an in-job restart restores from Blob again rather than trusting it.

DCP reads whole items (a tensor chunk as saved by one rank); rows.py serves a load plan's tensor
reads by the rows they need first, through these readers: 1.007x the state for FSDP shards of 4
ranks loaded on 3 nodes (tests/test_ranged_restore.py), 1.017x modelled for Llama 3 405B from
1,000 nodes to 900 (bench/shrink_reads.py `built`, 16 KiB blocks), against N times the state when
every node read every part.

Standard library plus azure-storage-blob (the SAS) / azure-identity (the token), as blobhttp.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.blob import blobhttp, blobio
from amlhpc.jobs.runtime.checkpoint import blocks
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError, LocalCopyCorrupt
from amlhpc.jobs.runtime.checkpoint.tier import REMOTE_FILE
from amlhpc.jobs.runtime.coord.nodebarrier import write_bytes_atomic, write_json_atomic

CACHE_DIR = ".ranged"


@dataclass(frozen=True)
class Remote:
    """One data file of the version in Blob."""

    path: str
    """Relative to the version folder (`rank-<r>/<name>`)."""
    blob: str
    size: int
    etag: str | None
    url: str | None
    """The account's blob endpoint (None: the connection string's account)."""


def write_remote(version_dir: Path, container: str, remotes: list[Remote]) -> None:
    """Record which of the version's files stay in Blob (node.py, after the small files are restored)."""
    write_json_atomic(Path(version_dir) / REMOTE_FILE, {
        "container": container,
        "files": {r.path: {"blob": r.blob, "size": r.size, "etag": r.etag, "url": r.url} for r in remotes}})


def read_remote(version_dir: Path) -> tuple[str, dict[str, Remote]] | None:
    """(container, path -> Remote) of a version restored for a reshard, else None."""
    try:
        document = json.loads((Path(version_dir) / REMOTE_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{Path(version_dir) / REMOTE_FILE} cannot be read: {exc}") from None
    files = {path: Remote(path, str(v["blob"]), int(v["size"]), v.get("etag"), v.get("url"))
             for path, v in document["files"].items()}
    return str(document["container"]), files


class RemoteFiles:
    """The remote data files of one version as this process reads them (see the module docstring)."""

    def __init__(self, version_dir: Path, markers: Mapping[int, Mapping[str, Any]],
                 environ: Mapping[str, str] | None = None, retry: blobio.RetrySettings | None = None):
        self.version_dir = Path(version_dir)
        found = read_remote(self.version_dir)
        if found is None:
            raise CheckpointError(f"{self.version_dir} was not restored for a reshard ({REMOTE_FILE} is missing)")
        self.container, self.files = found
        self.environ = dict(os.environ if environ is None else environ)
        self.retry = retry or blobio.RetrySettings()
        self.sha256 = {entry["path"]: entry["sha256"] for marker in markers.values() for entry in marker["files"]}
        self._readers: dict[str | None, blobhttp.Reader] = {}
        self._blocks: dict[str, tuple[int, dict[str, list[str]]]] = {}
        self.fetched = 0
        """Bytes this process fetched from Blob (blocks another rank of the node fetched are not counted)."""

    def __contains__(self, path: str) -> bool:
        return path in self.files and not (self.version_dir / path).exists()

    def open(self, path: str) -> io.BufferedReader:
        """A seekable reader of remote file `path` (relative to the version folder)."""
        block, digests = self._digests(path)
        return io.BufferedReader(RemoteFile(self, self.files[path], block, digests), buffer_size=block)

    def fetch(self, remote: Remote, offset: int, length: int) -> bytes:
        reader = self._readers.get(remote.url)
        if reader is None:
            url, auth = blobhttp.auth_from_env(self.container, remote.url, self.environ)
            reader = self._readers[remote.url] = blobhttp.Reader(url, auth, self.retry)
        try:
            data = reader.get(remote.blob, offset, length, etag=remote.etag)[0]
        except blobhttp.BlobReadError as exc:
            raise CheckpointError(f"reading {remote.path} of {self.version_dir.name} from Blob ({remote.blob}, "
                                  f"bytes {offset}+{length}) failed: {exc}") from None
        self.fetched += len(data)
        return data

    def _digests(self, path: str) -> tuple[int, list[str]]:
        """The block size and block digests of data file `path`, from its part's `blocks.json`."""
        folder, name = path.split("/", 1)
        if folder not in self._blocks:
            listed = f"{folder}/{blocks.BLOCKS_FILE}"
            local = self.version_dir / listed
            fetched = not local.exists()
            data = self._whole(listed) if fetched else local.read_bytes()
            if hashlib.sha256(data).hexdigest() != self.sha256.get(listed):
                raise LocalCopyCorrupt(f"{listed} of {self.version_dir.name} does not match its marker")
            self._blocks[folder] = blocks.parse(data, listed)
            if fetched:  # checked: kept for the node's other ranks (which may race to keep it too)
                write_bytes_atomic(local, data)
        block, files = self._blocks[folder]
        digests = files.get(name)
        if digests is None or not blocks.covers(digests, block, self.files[path].size):
            raise CheckpointError(f"{path} of {self.version_dir.name} has no block digests for its "
                                  f"{self.files[path].size} bytes in {folder}/{blocks.BLOCKS_FILE}")
        return block, digests

    def _whole(self, path: str) -> bytes:
        remote = self.files.get(path)
        if remote is None:
            raise CheckpointError(f"{path} of {self.version_dir.name} is neither restored nor in {REMOTE_FILE}")
        return self.fetch(remote, 0, remote.size) if remote.size else b""


class RemoteFile(io.RawIOBase):
    """One remote data file, read through the node's cache of verified blocks."""

    def __init__(self, files: RemoteFiles, remote: Remote, block: int, digests: list[str]):
        super().__init__()
        self.files, self.remote, self.block, self.digests = files, remote, block, digests
        self.position = 0
        cache = files.version_dir / CACHE_DIR
        cache.mkdir(exist_ok=True)
        stem = remote.path.replace("/", "__")
        self._data = cache / f"{stem}.data"
        self._have = cache / f"{stem}.{block}.have"  # the block size in the name: fetched_by_node counts bytes
        self._lock = cache / f"{stem}.lock"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.remote.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        length = max(0, min(len(view), self.remote.size - self.position))
        if not length:
            return 0
        data = self._read(self.position, length)
        view[:length] = data
        self.position += length
        return length

    def _read(self, offset: int, length: int) -> bytes:
        first, last = offset // self.block, (offset + length - 1) // self.block
        with self._locked() as (data_fd, have_fd):
            have = os.pread(have_fd, last - first + 1, first)
            missing = [first + k for k in range(last - first + 1) if have[k:k + 1] != b"\x01"]
            for run in _runs(missing):
                self._fetch(run, data_fd, have_fd)
            return os.pread(data_fd, length, offset)

    def _fetch(self, run: list[int], data_fd: int, have_fd: int) -> None:
        start = run[0] * self.block
        end = min(self.remote.size, (run[-1] + 1) * self.block)
        data = self.files.fetch(self.remote, start, end - start)
        for index in run:
            piece = data[(index - run[0]) * self.block:(index - run[0] + 1) * self.block]
            if hashlib.sha256(piece).hexdigest() != self.digests[index]:
                raise LocalCopyCorrupt(f"{self.remote.path} of {self.files.version_dir.name}: block {index} read from "
                                       f"{self.remote.blob} does not match its digest in {blocks.BLOCKS_FILE}; the "
                                       "version in Blob is damaged or was rewritten")
        os.pwrite(data_fd, data, start)
        os.pwrite(have_fd, b"\x01" * len(run), run[0])  # after the bytes: a flag never vouches for bytes not there

    @contextlib.contextmanager
    def _locked(self) -> Iterator[tuple[int, int]]:
        with open(self._lock, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            data_fd = os.open(self._data, os.O_RDWR | os.O_CREAT, 0o600)
            have_fd = os.open(self._have, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(have_fd).st_size == 0:
                    os.ftruncate(data_fd, self.remote.size)
                    os.ftruncate(have_fd, len(self.digests))
                yield data_fd, have_fd
            finally:
                os.close(data_fd)
                os.close(have_fd)


def _runs(indices: list[int]) -> Iterator[list[int]]:
    """Consecutive runs of sorted block indices: one ranged GET each."""
    run: list[int] = []
    for index in indices:
        if run and index != run[-1] + 1:
            yield run
            run = []
        run.append(index)
    if run:
        yield run


def file_system(remote: RemoteFiles):
    """DCP's local file system, opening the version's remote data files as RemoteFile readers."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class RangedFileSystem(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
            inside = mode == "rb" and Path(path).is_relative_to(remote.version_dir)
            relative = Path(path).relative_to(remote.version_dir).as_posix() if inside else ""
            if relative in remote:
                with remote.open(relative) as stream:
                    yield stream
                return
            with super().create_stream(path, mode) as stream:
                yield stream

    return RangedFileSystem()


def fetched_by_node(version_dir: Path) -> int:
    """Bytes the node's ranks fetched for the version's remote files (the blocks flagged in its cache)."""
    found = read_remote(version_dir)
    if found is None:
        return 0
    total = 0
    for remote in found[1].values():
        for have in (Path(version_dir) / CACHE_DIR).glob(f"{remote.path.replace('/', '__')}.*.have"):
            block = int(have.name.rsplit(".", 2)[-2])
            total += sum(min(block, remote.size - k * block) for k, flag in enumerate(have.read_bytes()) if flag == 1)
    return total
