"""Where a restore may write: only inside its folder, whatever a manifest says.

A manifest lives in a container every job of the workspace can write (the compute identity
holds Blob Data Contributor on it), so its paths are input from a lower principal: an
absolute path, a `..` segment, or a path through a symlink that leads out of the folder would
let one job write files anywhere another job's node can. Each is refused with
UnsafeCheckpoint naming the manifest, the path and why; nothing of that version is written.
"""

from __future__ import annotations

import re
from pathlib import Path

from amlhpc.jobs.runtime.checkpoint.errors import UnsafeCheckpoint

_DRIVE = re.compile(r"^[A-Za-z]:")
FIX = ("this run's uploader never writes such a manifest: another job wrote into this run's prefix. Restore an "
       "older version (delete the `latest` pointer's version) and restrict who may write the prefix")


def checked_relative(path: object, where: str) -> str:
    """`path` if it is a plain relative path ('a/b.pt'), else UnsafeCheckpoint."""
    if not isinstance(path, str) or not path:
        raise UnsafeCheckpoint(f"{where}: file path {path!r} is not a non-empty string; refused. {FIX}")
    if "\x00" in path or "\\" in path:
        raise UnsafeCheckpoint(f"{where}: file path {path!r} holds a NUL or a backslash; refused. {FIX}")
    if path.startswith("/") or _DRIVE.match(path):
        raise UnsafeCheckpoint(f"{where}: file path {path!r} is absolute; refused. {FIX}")
    parts = path.split("/")
    if ".." in parts:
        raise UnsafeCheckpoint(f"{where}: file path {path!r} has a '..' segment (it would leave the checkpoint "
                               f"folder); refused. {FIX}")
    if any(part in ("", ".") for part in parts):
        raise UnsafeCheckpoint(f"{where}: file path {path!r} has an empty or '.' segment; refused. {FIX}")
    return path


def target_in(folder: Path, path: object, where: str) -> Path:
    """The file `path` names inside `folder`; UnsafeCheckpoint when it would resolve outside
    (absolute, '..', or a symlink on the way that leads out) or is itself a symlink."""
    relative = checked_relative(path, where)
    root = folder.resolve()
    target = folder / relative
    parent = target.parent.resolve()
    if parent != root and root not in parent.parents:
        raise UnsafeCheckpoint(f"{where}: file path {relative!r} resolves to {parent}, outside {root} (a symlink on the "
                               f"way leads out); refused. {FIX}")
    if target.is_symlink():
        raise UnsafeCheckpoint(f"{where}: {target} is a symlink; a restore never writes through one; refused. {FIX}")
    return target


def checked_blob(name: object, data_prefix: str, where: str) -> str:
    """A blob name a manifest gives for a file: inside this stream's data folder, no '..'."""
    if not isinstance(name, str) or not name.startswith(data_prefix):
        raise UnsafeCheckpoint(f"{where}: blob {name!r} is outside this stream's data folder {data_prefix!r}; "
                               f"refused. {FIX}")
    checked_relative(name[len(data_prefix):], where)
    return name
