"""What the local tools keep on disk, and how it stays bounded.

- `.rehearsal/<name>/`: one folder per rehearsal name (node code copies, scratch with the
  staged data, reports). A name is reused by the next rehearsal of that name (which
  resumes); beyond the `KEEP_REHEARSALS` most recently used names, older folders are
  removed when a rehearsal starts (their checkpoints stay in Blob; only the staged copy
  is lost, and staging fetches it again).
- `.scratch/code-snapshots/<hash>/`: the code a job uploads, one per content hash; the
  `KEEP_SNAPSHOTS` most recently used stay.
- `.scratch/local-data/`: the profiles' generated datasets, one per recipe input.
- `.azurite/`: the rehearsal's Blob data, kept so a dataset is uploaded once.

`make clean` removes all of them (and caches); nothing here touches `.pulumi-state/`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from amlhpc.core import project

REHEARSALS = project.root() / ".rehearsal"
SNAPSHOTS = project.scratch() / "code-snapshots"
KEEP_REHEARSALS = 5
KEEP_SNAPSHOTS = 10


def touch(folder: Path) -> None:
    """Mark `folder` as just used (pruning goes by modification time)."""
    if folder.is_dir():
        os.utime(folder)


def prune(parent: Path, keep: int, current: Path | None = None) -> list[Path]:
    """Remove all but the `keep` most recently used folders under `parent` (never `current`)."""
    if not parent.is_dir():
        return []
    folders = [p for p in parent.iterdir() if p.is_dir() and not p.is_symlink()]
    if current is not None:
        folders = [p for p in folders if p.resolve() != current.resolve()]
        keep -= 1
    folders.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    removed = folders[max(keep, 0):]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    return removed
