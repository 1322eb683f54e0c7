"""What fixes a blob staging refused: the command to run, by who wrote the blob.

A blob whose bytes fail verification cannot be fixed by staging again: the stored bytes
themselves differ from the checksums recorded with them. What fixes it depends on who
wrote it, which its metadata says (one Get Blob Properties per refused blob, only after a
failure):

- `jobs data upload` (amlhpc_size / amlhpc_upload_id): upload it again from the dataset's
  directory with `--verify-stored`, which reads every blob's stored bytes and uploads
  again those that differ from their checksums (a plain re-run compares sizes and times
  and would skip it);
- another tool, sealed by `jobs data seal` (amlhpc_sealed): the bytes changed after the
  seal; restore the blob from its source, then record its checksum again with
  `jobs data seal --reseal`;
- another tool, never sealed: restore it from its source (and seal the dataset, so the
  next change is caught at rest, not only in transfer).

Standard library only: ships into the training image.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from amlhpc.jobs.runtime.blob.blobhttp import BlobReadError, DeadlineExceeded

SHOWN = 5
"""Refused blobs named one by one; the commands cover the rest of the prefix anyway."""


def origin(headers) -> str:
    """'upload', 'sealed' or 'foreign', from a Get Blob Properties answer's metadata headers."""
    if headers.get("x-ms-meta-amlhpc_upload_id") or headers.get("x-ms-meta-amlhpc_size"):
        return "upload"
    return "sealed" if headers.get("x-ms-meta-amlhpc_sealed") else "foreign"


def advice(reader, spec, corrupt: Sequence) -> list[str]:
    """Lines naming the command that fixes each kind of refused blob in `corrupt` (BlobEntry)."""
    if not corrupt:
        return []
    prefix = spec.prefix.strip("/")
    kinds: dict[str, list[str]] = {}
    for entry in corrupt[:SHOWN]:
        try:
            kind = origin(reader.head(entry.name))
        except (BlobReadError, DeadlineExceeded):
            kind = "unknown"
        kinds.setdefault(kind, []).append(entry.name)
    lines = []
    if "upload" in kinds:
        lines.append(f"to repair blobs written by `jobs data upload` ({_names(kinds['upload'])}), run from the "
                     f"directory they were uploaded from: python -m amlhpc.jobs data upload LOCAL_DIR --stack STACK --prefix "
                     f"{shlex.quote(prefix)} --verify-stored (it reads each blob's stored bytes and uploads again those "
                     "that differ from their checksums)")
    if "sealed" in kinds:
        reseal = " ".join(f"--reseal {shlex.quote(name)}" for name in kinds["sealed"])
        lines.append(f"blobs {_names(kinds['sealed'])} changed after `jobs data seal` recorded their checksums: restore "
                     f"them from their source, then run: python -m amlhpc.jobs data seal --stack STACK --prefix "
                     f"{shlex.quote(prefix)} {reseal}")
    for kind in ("foreign", "unknown"):
        if kind in kinds:
            lines.append(f"blobs {_names(kinds[kind])} were written by another tool without a checksum: restore them "
                         f"from their source, then seal the dataset so a change at rest is caught: python -m amlhpc.jobs data "
                         f"seal --stack STACK --prefix {shlex.quote(prefix)}")
    return lines


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)
