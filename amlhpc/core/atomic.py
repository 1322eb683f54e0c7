"""Files and folders that appear whole or not at all, and leave nothing behind when they fail.

A report page or a code snapshot is written next to where it belongs under a temporary name
and renamed into place (a rename within a folder is atomic on POSIX), so a reader never sees
half of one. When writing fails - a full disk, a permission, Ctrl-C - the temporary file or
folder is removed before the error goes on: no `.tmp-*` snapshot or `.report.html.tmp`
stays behind. Pure: the standard library.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path


def write_text(target: Path, text: str) -> Path:
    """Write `text` to `target` through a temporary sibling; nothing is left on failure."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return target


@contextlib.contextmanager
def new_folder(dest: Path) -> Iterator[Path]:
    """A temporary folder beside `dest` to fill; when the block ends it becomes `dest`
    (or is dropped if another process made `dest` first, the content being the same), and
    when the block fails it is removed.

        with atomic.new_folder(snapshot_dir) as tmp:
            shutil.copy2(source, tmp / "file")
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".tmp-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
        try:
            os.rename(tmp, dest)
        except OSError:  # made concurrently with the same content: keep theirs
            if not dest.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
