"""What a checkpoint folder holds right now: regular files with size and mtime.

Symlinks and temporary names (ours, `*.amlhpc-tmp`, and a writer's `x.tmp` before its rename)
are never part of a snapshot, so an upload never follows a link out of the folder and never
catches a file half-written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TMP_SUFFIX = ".amlhpc-tmp"
SKIPPED_SUFFIXES = (TMP_SUFFIX, ".tmp")


@dataclass(frozen=True)
class LocalFile:
    path: str
    """Relative, '/'-separated."""
    size: int
    mtime_ns: int


def scan(folder: Path, exclude: frozenset[str] = frozenset()) -> dict[str, LocalFile]:
    """Regular files under `folder` (top-level names in `exclude` left out)."""
    files: dict[str, LocalFile] = {}
    if not folder.is_dir():
        return files
    for root, dirs, names in os.walk(folder):
        if Path(root) == folder:
            dirs[:] = [d for d in dirs if d not in exclude]
            names = [n for n in names if n not in exclude]
        dirs.sort()
        for name in sorted(names):
            if name.endswith(SKIPPED_SUFFIXES):
                continue
            full = Path(root) / name
            try:
                st = full.lstat()
            except FileNotFoundError:
                continue  # deleted while we walked: not part of this snapshot
            if not full.is_symlink() and full.is_file():
                rel = full.relative_to(folder).as_posix()
                files[rel] = LocalFile(rel, st.st_size, st.st_mtime_ns)
    return files


def signature(files: Mapping[str, LocalFile]) -> tuple:
    return tuple(sorted((f.path, f.size, f.mtime_ns) for f in files.values()))
