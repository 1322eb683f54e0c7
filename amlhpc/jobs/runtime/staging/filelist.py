"""Per-rank file lists (`AMLHPC_FILE_LIST_<NAME>`): which staged files a rank reads.

A list is a JSON array of paths relative to the data directory, in order, e.g.
`["univ_ics_2019-03_a10000_000.tfrecord", "validation/x.tfrecord"]`. JSON because a
blob name may hold any character, newlines included, and a line-per-path text file
breaks on those; every language the training code is written in reads JSON.

    from amlhpc.jobs.runtime.staging import filelist
    paths = filelist.read(os.environ["AMLHPC_FILE_LIST_COSMO"])

Standard library only: ships into the training image (the workloads import it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path


def write(path: Path, names: Iterable[str]) -> None:
    """Write the list through a temporary name, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(list(names), ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def read(path: str | os.PathLike) -> list[str]:
    """The paths of a list written by `write`; ValueError naming the file when it is not one."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        names = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a staging file list (a JSON array of paths): {exc.msg}") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: not a staging file list (a JSON array of paths)")
    return names
