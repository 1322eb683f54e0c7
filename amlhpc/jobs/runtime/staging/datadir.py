"""Where each blob lands below the data directory, and keeping that directory equal to the dataset.

- `local_paths(prefix, entries)`: the path below the data directory of every blob: the
  name below the prefix, `.gz` dropped for blobs that are inflated (Content-Encoding gzip;
  a foreign `archive.tar.gz` stored as it is keeps its name), empty segments dropped
  (`dir//b` is `dir/b`, and a blob named `dirlike/` that holds data is `dirlike`). Refused, naming the blobs: a name that would leave the directory (`..`,
  `.`), that a filesystem cannot hold (NUL, a segment over 255 bytes), two blobs that land
  on one path (`a.bin` and `a.bin.gz`, `dir//b` and `dir/b`) and a blob that lands where
  another needs a directory (`x` and `x/y`). Every process refuses the same listing the
  same way, so no node stages half of a dataset that cannot be staged.
- `files_below(data_dir)`: what is there now (path -> size), in one walk.
- `remove_stale(data_dir, present, keep)`: delete what the dataset no longer has (a blob
  deleted since the last run, files of another node's share after the node count
  changed) and the directories left empty, so after staging the directory holds the
  dataset (or the node's share of it) and nothing else.

Standard library only: ships into the training image.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from itertools import repeat
from operator import attrgetter, getitem, itemgetter
from pathlib import Path

from amlhpc.jobs.runtime.blob.fetch import BlobEntry

MAX_SEGMENT_BYTES = 255
"""NAME_MAX of Linux filesystems (ext4, xfs, tmpfs, NFS, BeeGFS)."""


class PathProblems(ValueError):
    """Blobs that cannot be staged as files; `problems` holds one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


def local_paths(prefix: str, entries: Sequence[BlobEntry], limit: int = 20) -> list[str]:
    """Path below the data directory of each entry (same order); PathProblems when some cannot be.
    A million names take under a second: cut by C-level slicing when all or none end in
    `.gz`, checked for odd names all at once (joined), one set for collisions."""
    rels = _below(len(prefix), list(map(attrgetter("name"), entries)), entries)
    problems: list[str] = []
    long = MAX_SEGMENT_BYTES // 4  # a segment over 255 bytes needs at least 64 characters
    if _any_suspect(rels, long):
        for k, rel in enumerate(rels):
            # Empty, '.' or hidden segments, a leading or trailing '/', NUL, long names: a closer look.
            if "/." in rel or "//" in rel or rel[:1] in "/." or rel[-1:] == "/" or "\0" in rel or len(rel) > long:
                rels[k] = _normalize(rel, entries[k].name, prefix, problems)
    unique = set(rels)
    if len(unique) != len(rels):
        owner: dict[str, str] = {}
        for rel, entry in zip(rels, entries, strict=True):
            first = owner.setdefault(rel, entry.name)
            if first != entry.name and rel:
                problems.append(f"blobs {first!r} and {entry.name!r} both stage to {rel!r}; rename or delete one of them")
    problems.extend(_file_dir_conflicts(rels, unique, entries))
    if problems:
        more = [f"... and {len(problems) - limit} more"] if len(problems) > limit else []
        raise PathProblems(problems[:limit] + more)
    return rels


def _below(cut: int, names: list[str], entries: Sequence[BlobEntry]) -> list[str]:
    """Each name without its first `cut` characters, and without a final `.gz` when it is inflated."""
    named = sum(map(str.endswith, names, repeat(".gz")))
    encodings = list(map(attrgetter("content_encoding"), entries))
    if named == 0 or (named == len(names) and encodings.count("gzip") == len(names)):
        # The usual dataset (all uploaded by jobs data upload, or none gzip-named): one slice for all, in C.
        return list(map(getitem, names, repeat(slice(cut, -3 if named else None))))
    return [name[cut:-3] if entry.gzip and name.endswith(".gz") else name[cut:] for name, entry in zip(names, entries,
                                                                                                       strict=True)]


_AS_SEPARATORS = bytes(0x2F if c in (0, 0x2F) else 0x2E if c == 0x2E else 0x78 for c in range(256))
"""NUL and '/' as '/', '.' as itself, every other byte as 'x' (UTF-8 puts no ASCII inside a character)."""


def _any_suspect(rels: list[str], long: int) -> bool:
    """Whether any path needs a closer look, tested on all of them joined (C-speed searches)
    rather than one by one: the usual dataset has none."""
    if not rels:
        return False
    joined = "\0".join(["", *rels, ""])
    if joined.count("\0") != len(rels) + 1 or max(map(len, rels)) > long:
        return True  # a NUL in a name, or a name long enough to need a look
    # Paths between NULs: '//' is an empty path, a leading or trailing '/' or an empty segment
    # ('\0\0', '\0/', '/\0', '//'); '/.' a leading '.' or a segment that starts with one.
    seen = joined.encode("utf-8", "surrogatepass").translate(_AS_SEPARATORS)
    return b"//" in seen or b"/." in seen


def _normalize(rel: str, blob: str, prefix: str, problems: list[str]) -> str:
    segments = [s for s in rel.split("/") if s]
    if any(s in (".", "..") for s in segments):
        problems.append(f"blob {blob!r} has a '.' or '..' segment and would leave the data directory; rename it")
    elif "\0" in rel:
        problems.append(f"blob {blob!r} has a NUL character, which no file name may hold; rename it")
    elif any(len(s.encode()) > MAX_SEGMENT_BYTES for s in segments):
        problems.append(f"blob {blob!r} has a path segment longer than {MAX_SEGMENT_BYTES} bytes; rename it")
    elif not segments:
        problems.append(f"blob {blob!r} has no file name below the prefix {prefix!r}; rename it")
    else:
        return "/".join(segments)
    return ""


def _file_dir_conflicts(rels: list[str], unique: set[str], entries: Sequence[BlobEntry]) -> list[str]:
    """A file where another blob needs a directory, named by both blobs."""
    parents = set(map(itemgetter(0), map(str.rpartition, rels, repeat("/"))))
    parents.discard("")
    if not parents & unique:
        for parent in list(parents):  # ancestors too: 'x' conflicts with 'x/y/z'
            while "/" in parent:
                parent = parent.rpartition("/")[0]
                parents.add(parent)
        if not parents & unique:
            return []
    directories: dict[str, str] = {}
    for rel, entry in zip(rels, entries, strict=True):
        parent = rel.rpartition("/")[0]
        while parent and parent not in directories:
            directories[parent] = entry.name
            parent = parent.rpartition("/")[0]
    owner = {rel: entry.name for rel, entry in zip(rels, entries, strict=True)}
    return [f"blob {owner[rel]!r} stages to a file where blob {directories[rel]!r} needs a directory; rename one of them"
            for rel in owner if rel in directories]


def files_below(data_dir: Path) -> dict[str, int]:
    """Every file below `data_dir` (symlinks included, as names to remove): path -> size."""
    found: dict[str, int] = {}
    stack = [("", str(data_dir))]
    while stack:
        rel_dir, full = stack.pop()
        try:
            entries = os.scandir(full)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for item in entries:
                rel = f"{rel_dir}{item.name}"
                if item.is_dir(follow_symlinks=False):
                    stack.append((rel + "/", item.path))
                else:
                    try:
                        found[rel] = item.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        continue
    return found


def remove_stale(data_dir: Path, present: dict[str, int], keep: Collection[str]) -> list[str]:
    """Delete files of `present` not in `keep`, then the directories left empty; returns what was deleted."""
    removed = []
    parents: set[str] = set()
    for rel in present:
        if rel not in keep:
            try:
                os.unlink(data_dir / rel)
            except FileNotFoundError:
                pass
            removed.append(rel)
            parent = rel.rpartition("/")[0]
            while parent:
                parents.add(parent)
                parent = parent.rpartition("/")[0]
    for rel in sorted(parents, key=lambda p: -p.count("/")):
        try:
            os.rmdir(data_dir / rel)
        except OSError:
            pass  # not empty: it holds files of the dataset
    return removed
