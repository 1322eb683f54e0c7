"""What an upload sends: every regular file below a directory, and every entry it cannot send.

Symbolic links are followed, to files and to directories alike (as `cp -rL` and
`tar -h` do): a dataset assembled from links to where the data really lives uploads
what the links point at, under the link's own path. Nothing the walk meets is dropped
without a word: each entry that is not sent is a `Skipped` with its path and the reason:

- `symlink loop`: a link to a directory that is already being walked above it (the walk
  would never end); the link's path and target are named;
- `dangling symlink`: the link's target does not exist;
- `not a regular file`: a FIFO, socket or device (reading one could block forever);
- `unreadable`: a directory or file this user may not read (permission denied);
- `name not UTF-8`: a file or directory whose name is not valid UTF-8 (a blob name is
  Unicode; the path is shown with its bad bytes as `\\xNN`).

A directory reached twice through different links (not a loop) is walked under both
paths: that is what following links means, and it is what a reader of the dataset sees.

Standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class LocalFile:
    rel: str
    """Path below the dataset directory, '/'-separated."""
    path: Path
    size: int
    mtime_ns: int
    ctime_ns: int = 0
    """The inode's change time: every write moves it, even one that restores the mtime (rsync -a, tar -x)."""
    inode: str = ""
    """`<device>:<inode>`: a file replaced by another (a copy renamed over it) has another."""


@dataclass(frozen=True)
class Skipped:
    rel: str
    reason: str

    def line(self) -> str:
        return f"{self.rel}: {self.reason}"


@dataclass
class Walk:
    files: list[LocalFile] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def scan(local_dir: Path) -> Walk:
    """Regular files under `local_dir` following symlinks, sorted by relative path, and what was skipped."""
    walk = Walk()
    root = Path(local_dir)
    try:
        top = os.stat(root)
    except OSError as exc:
        walk.skipped.append(Skipped(".", f"unreadable ({exc.strerror})"))
        return walk
    _walk_dir(root, "", ((top.st_dev, top.st_ino),), walk)
    walk.files.sort(key=lambda f: f.rel)
    walk.skipped.sort(key=lambda s: s.rel)
    return walk


def _walk_dir(path: Path, rel_dir: str, ancestors: tuple[tuple[int, int], ...], walk: Walk) -> None:
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except PermissionError as exc:
        walk.skipped.append(Skipped(rel_dir.rstrip("/") or ".", f"unreadable directory ({exc.strerror})"))
        return
    for entry in entries:
        rel = rel_dir + entry.name
        try:
            entry.name.encode("utf-8")
        except UnicodeEncodeError:
            walk.skipped.append(Skipped(shown(rel), "name not UTF-8 (a blob name must be Unicode): rename it"))
            continue
        try:
            st = entry.stat(follow_symlinks=True)
        except FileNotFoundError:
            walk.skipped.append(Skipped(rel, f"dangling symlink (-> {_target(entry.path)})"))
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a link that points at itself, directly or through others
                walk.skipped.append(Skipped(rel, f"symlink loop (-> {_target(entry.path)})"))
            else:
                walk.skipped.append(Skipped(rel, f"unreadable ({exc.strerror})"))
            continue
        if stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key in ancestors:
                walk.skipped.append(Skipped(rel, f"symlink loop (-> {_target(entry.path)}, a directory above it)"))
                continue
            _walk_dir(Path(entry.path), rel + "/", (*ancestors, key), walk)
        elif stat.S_ISREG(st.st_mode):
            if not os.access(entry.path, os.R_OK):
                walk.skipped.append(Skipped(rel, "unreadable (permission denied)"))
                continue
            walk.files.append(LocalFile(rel, Path(entry.path), st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                        f"{st.st_dev}:{st.st_ino}"))
        else:
            walk.skipped.append(Skipped(rel, "not a regular file (FIFO, socket or device)"))


def shown(rel: str) -> str:
    """A path as printable text: bytes that are not UTF-8 (surrogate-escaped by os) as `\\xNN`."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"
