"""The node-local tier of versioned checkpoints: what each node holds on its NVMe.

Layout under the node's checkpoint folder (AMLHPC_CHECKPOINT_DIR):

    versions/step-000000120/rank-3/...        rank 3's files of the version (its torch.distributed.checkpoint
                                              shard, `.metadata`, trainer.json); written by rank 3 only
    versions/step-000000120/rank-3.json       rank 3's marker: written last, atomically, after its files are on
                                              disk: {step, rank, world, tag, files: [{path, size, sha256}]}

A rank's part of a version exists when its marker does; a node holds a version when every one
of its local ranks' markers is there, and holds it intact when every file matches its marker
(`verify`). The marker's SHA-256 of each file is the one computed while the file was written
(versioned.py hashes every byte on its way to the disk), with the file's size and mtime after
the write: a restart trusts that record and reads no data (`verify`'s quick check: sizes and
mtimes; a file whose mtime moved, or a marker without the record, is hashed), unless
`AMLHPC_CHECKPOINT_VERIFY=full` asks for every byte. Corruption that changes neither (the
medium's, not a writer's) is found by the load, which hashes the files it reads and, on a
mismatch, sets the rank's marker aside (`quarantine`): the node no longer holds the version,
and the next restart agrees on another one (Blob's). The job holds a version when every node holds its part: that is what the launchers
agree on before an in-job restart (amlhpc/jobs/runtime/launch/restart.py).

`tag` names the timeline that wrote the version (the job run and its restart generation): after
a restart from step 100, a second step 120 is a different version from the first, in Blob
(`<step>-<tag>`) as on the node (the abandoned one is deleted before training resumes).

Standard library only: the launcher reads this tier without importing torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.checkpoint import safepath
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError
from amlhpc.jobs.runtime.checkpoint.snapshot import LocalFile

VERSIONS_DIR = "versions"
SCHEMA = 1
_VERSION = re.compile(r"^step-(\d{9,})$")


def version_name(step: int) -> str:
    return f"step-{step:09d}"


def is_version_name(name: object) -> bool:
    """A version folder's name, nothing else (no path, no '..')."""
    return isinstance(name, str) and _VERSION.match(name) is not None


def versions_dir(checkpoint_dir: Path) -> Path:
    return Path(checkpoint_dir) / VERSIONS_DIR


def rank_dir(version_dir: Path, rank: int) -> Path:
    return Path(version_dir) / f"rank-{rank}"


def marker_path(version_dir: Path, rank: int) -> Path:
    return Path(version_dir) / f"rank-{rank}.json"


def timeline_tag(run_id: str, generation: int) -> str:
    """The same on every node of a job for one restart generation."""
    return hashlib.sha256(f"{run_id}:{generation}".encode()).hexdigest()[:8]


def blob_version(step: int, tag: str) -> str:
    """The version's name in Blob: ordered by step, unique per timeline."""
    return f"{step:09d}-{tag}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(4 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def hash_workers() -> int:
    """Threads that hash a version's files at once: hashlib releases the GIL on large buffers,
    so one thread per CPU (at most 16) reads at the disk's or the memory's speed."""
    return max(1, min(16, os.cpu_count() or 1))


def sha256_many(paths: list[Path], workers: int | None = None) -> list[str]:
    """SHA-256 of each file, in parallel, in `paths`' order."""
    workers = min(workers or hash_workers(), max(1, len(paths)))
    if workers == 1:
        return [file_sha256(p) for p in paths]
    with ThreadPoolExecutor(workers, thread_name_prefix="checkpoint-hash") as pool:
        return list(pool.map(file_sha256, paths))


VERIFY_VARIABLE = "AMLHPC_CHECKPOINT_VERIFY"
"""How a restart checks the node's copies: "quick" (the default: sizes and mtimes against the
markers, hashing only a file whose mtime moved) or "full" (the SHA-256 of every byte)."""
VERIFY_MODES = ("quick", "full")


def full_verify(environ: Mapping[str, str]) -> bool:
    """Whether `AMLHPC_CHECKPOINT_VERIFY` asks for the full check; CheckpointError on another value."""
    given = environ.get(VERIFY_VARIABLE, "").strip() or "quick"
    if given not in VERIFY_MODES:
        raise CheckpointError(f"{VERIFY_VARIABLE}={given!r} is not one of {', '.join(VERIFY_MODES)}: 'quick' trusts the "
                              "hashes recorded while the checkpoint was written, 'full' re-reads every byte; or unset it")
    return given == "full"


def write_marker(version_dir: Path, rank: int, *, step: int, world: int, tag: str, extra: dict[str, Any] | None = None,
                 workers: int | None = None, digests: Mapping[str, str] | None = None) -> Path:
    """Record rank `rank`'s part of the version as complete: every file under its rank folder
    with size, mtime and SHA-256, written through a temporary name (the last thing a save does).
    `digests` (path relative to the version folder -> SHA-256): what the writer hashed while it
    wrote (versioned.py); a file without one is read and hashed here, in parallel."""
    folder = rank_dir(version_dir, rank)
    digests = digests or {}
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    names = [path.relative_to(version_dir).as_posix() for path in paths]
    unknown = [path for path, name in zip(paths, names, strict=True) if name not in digests]
    hashed = dict(zip(unknown, sha256_many(unknown, workers), strict=True)) if unknown else {}
    files = []
    for path, name in zip(paths, names, strict=True):
        st = path.stat()
        files.append({"path": name, "size": st.st_size, "mtimeNs": st.st_mtime_ns,
                      "sha256": digests[name] if name in digests else hashed[path]})
    document = {"schema": SCHEMA, "version": Path(version_dir).name, "step": step, "rank": rank, "world": world,
                "tag": tag, "files": files, "written": time.time(), **(extra or {})}
    target = marker_path(version_dir, rank)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, target)
    return target


def read_marker(path: Path) -> dict[str, Any] | None:
    """A rank marker, checked; None when absent or not a marker (an interrupted or foreign file)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA or not isinstance(document.get("files"), list):
        return None
    rank = document.get("rank")
    if not isinstance(rank, int) or not isinstance(document.get("step"), int) or not isinstance(document.get("world"), int):
        return None
    for entry in document["files"]:
        if not isinstance(entry, dict):
            return None
        safepath.checked_relative(entry.get("path"), str(path))
        if not str(entry["path"]).startswith(f"rank-{rank}/"):
            return None
    return document


@dataclass
class LocalVersion:
    name: str
    step: int
    path: Path
    markers: dict[int, dict[str, Any]] = field(default_factory=dict)

    def holds(self, ranks: Iterable[int]) -> bool:
        return all(r in self.markers for r in ranks)

    @property
    def ranged(self) -> bool:
        """Restored for a reshard: the markers and small files are here, the data files in Blob (ranged.py)."""
        return (self.path / REMOTE_FILE).exists()

    @property
    def world(self) -> int | None:
        worlds = {m["world"] for m in self.markers.values()}
        return worlds.pop() if len(worlds) == 1 else None

    @property
    def tag(self) -> str | None:
        tags = {m.get("tag") for m in self.markers.values()}
        return tags.pop() if len(tags) == 1 else None

    def files(self, ranks: Iterable[int]) -> list[LocalFile]:
        """This node's files of the version (markers included), relative to the version folder."""
        out = []
        for rank in sorted(ranks):
            for rel in [f["path"] for f in self.markers[rank]["files"]] + [f"rank-{rank}.json"]:
                st = (self.path / rel).stat()
                out.append(LocalFile(rel, st.st_size, st.st_mtime_ns))
        return out

    def verify(self, ranks: Iterable[int], workers: int | None = None, full: bool = False) -> str | None:
        """None when every file of `ranks` matches its marker, else what does not.

        Quick (the default, what an in-job restart runs on every node): sizes and mtimes against
        the marker, no data read; the marker's SHA-256 was computed while the file was written,
        so the record is trusted. A file whose mtime moved (something wrote it after the save),
        or a marker without mtimes (written before they were recorded), is hashed. `full`: the
        SHA-256 of every file, `workers` files at a time (one thread hashed ~1.5 GB/s: 90 s for
        70 GB). Corruption that changes neither size nor mtime is left to the load (`quarantine`)."""
        if self.ranged:
            return f"{self.name}: restored for a reshard, its data files read from Blob (not held here)"
        entries = []
        for rank in sorted(ranks):
            marker = self.markers.get(rank)
            if marker is None:
                return f"{self.name}: rank {rank} has no marker"
            entries += marker["files"]
        to_hash = []
        for entry in entries:
            try:
                st = (self.path / entry["path"]).stat()
            except OSError as exc:
                return f"{self.name}: {entry['path']}: {exc.strerror or exc}"
            if st.st_size != entry["size"]:
                return f"{self.name}: {entry['path']} does not match its marker (corrupt)"
            if full or entry.get("mtimeNs") != st.st_mtime_ns:
                to_hash.append(entry)
        return self.check_hashes(to_hash, workers)

    def check_hashes(self, entries: list[dict[str, Any]], workers: int | None = None) -> str | None:
        """None when each of the marker `entries` hashes to its recorded SHA-256, else what does not."""
        try:
            digests = sha256_many([self.path / e["path"] for e in entries], workers)
        except OSError as exc:
            return f"{self.name}: {exc.filename}: {exc.strerror or exc}"
        for entry, digest in zip(entries, digests, strict=True):
            if digest != entry["sha256"]:
                return f"{self.name}: {entry['path']} does not match its marker (corrupt)"
        return None


QUARANTINE_SUFFIX = ".corrupt"
REMOTE_FILE = "remote.json"
"""In a version folder restored for a reshard: where its data files are in Blob (ranged.py)."""


def quarantine(version_dir: Path, rank: int) -> Path | None:
    """Set rank `rank`'s marker of the version aside (`rank-<r>.json.corrupt`, kept for a look):
    a part found corrupt is no longer held, so no restart offers it. None when it was not there."""
    marker = marker_path(version_dir, rank)
    target = marker.with_name(marker.name + QUARANTINE_SUFFIX)
    try:
        os.replace(marker, target)
    except FileNotFoundError:
        return None
    return target


def read_version(path: Path) -> LocalVersion | None:
    """One version folder with the rank markers it has; None when it is not a version folder."""
    path = Path(path)
    match = _VERSION.match(path.name)
    if not match or not path.is_dir() or path.is_symlink():
        return None
    version = LocalVersion(path.name, int(match.group(1)), path)
    for marker in path.glob("rank-*.json"):
        try:
            document = read_marker(marker)
        except CheckpointError:
            document = None
        if document is not None and marker.name == f"rank-{document['rank']}.json":
            version.markers[document["rank"]] = document
    return version


def scan_versions(checkpoint_dir: Path) -> list[LocalVersion]:
    """Every version folder under the node's checkpoint folder with the markers it has, oldest first."""
    root = versions_dir(checkpoint_dir)
    if not root.is_dir():
        return []
    found = [v for v in (read_version(child) for child in root.iterdir()) if v is not None]
    return sorted(found, key=lambda v: v.step)


def held(checkpoint_dir: Path, ranks: Iterable[int]) -> list[LocalVersion]:
    """Versions of which this node holds every one of `ranks`' parts (markers), oldest first."""
    ranks = list(ranks)
    return [v for v in scan_versions(checkpoint_dir) if v.holds(ranks)]


def remove(version: LocalVersion) -> None:
    shutil.rmtree(version.path, ignore_errors=True)


def prune_local(checkpoint_dir: Path, ranks: Iterable[int], keep: int, protect: Iterable[str] = ()) -> list[str]:
    """Keep the newest `keep` versions this node holds whole; delete older ones (held or not),
    never one named in `protect` (being uploaded, or restored from) and never a version newer
    than the newest held one (a save in progress)."""
    ranks, protect = list(ranks), set(protect)
    versions = scan_versions(checkpoint_dir)
    whole = [v for v in versions if v.holds(ranks)]
    if not whole:
        return []
    kept = {v.name for v in whole[-keep:]} | protect
    newest = whole[-1].step
    gone = [v for v in versions if v.name not in kept and v.step < newest]
    for version in gone:
        remove(version)
    return [v.name for v in gone]


def discard_after(checkpoint_dir: Path, step: int | None) -> list[str]:
    """Delete versions newer than `step` (all when None): an abandoned timeline after a restart."""
    gone = [v for v in scan_versions(checkpoint_dir) if step is None or v.step > step]
    for version in gone:
        remove(version)
    return [v.name for v in gone]
