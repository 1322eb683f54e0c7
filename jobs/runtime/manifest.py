"""The record of finished files that lets staging resume (one JSON line per file).

A line is appended after a file was verified and renamed into place, so a record always
describes a complete file; a line cut short by SIGKILL fails to parse and is ignored.
Each writer node has its own file (`manifest-node<k>.jsonl`, so nodes filling one shared
directory never append to the same file), and reading unions them all, so a re-run with
a different node count still skips everything finished. A file is finished when its
record names the same blob with the same etag (or the same SHA-256 from the metadata)
and the file on disk has the recorded size; `verify=True` re-hashes it as well.

`adoptable` covers the gap between rename and record: a complete file under its final
name whose size and SHA-256 match the blob's metadata is recorded instead of fetched.

Standard library only: ships into the training image.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from jobs.runtime.fetch import BlobEntry


class Manifest:
    """Finished files of one input, one JSON line per file; one file per writer node.

    Lines are appended after the rename, so a record always describes a complete file. A
    line cut short by SIGKILL fails to parse and is ignored. Reading unions every node's
    manifest, so a re-run with a different node count still skips everything finished.
    """

    def __init__(self, staging_dir: Path, node_index: int):
        self.directory = staging_dir
        self.path = staging_dir / f"manifest-node{node_index}.jsonl"
        self.records: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        for path in sorted(staging_dir.glob("manifest-node*.jsonl")):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    record = json.loads(line)
                    self.records[record["path"]] = record
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue
        self._file = None

    def finished(self, entry: BlobEntry, rel: str, final: Path, verify: bool) -> bool:
        record = self.records.get(rel)
        if not record or record.get("blob") != entry.name:
            return False
        same_blob = (entry.expected_sha256 and record.get("sha256") == entry.expected_sha256) or \
            (entry.etag is not None and record.get("etag") == entry.etag)
        if not same_blob:
            return False
        try:
            if final.stat().st_size != record.get("size"):
                return False
        except FileNotFoundError:
            return False
        return not verify or sha256_of(final) == record.get("sha256")

    def record(self, entry: BlobEntry, rel: str, size: int, sha256: str) -> None:
        record = {"path": rel, "blob": entry.name, "etag": entry.etag, "size": size, "sha256": sha256,
                  "written": round(time.time(), 3)}
        line = json.dumps(record, sort_keys=True)
        with self._lock:
            if self._file is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._file.write(line + "\n")
            self._file.flush()
            self.records[rel] = record

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def adoptable(entry: BlobEntry, final: Path) -> str | None:
    """SHA-256 of a complete file already under its final name (a run killed before recording it)."""
    if entry.expected_size is None or entry.expected_sha256 is None:
        return None
    try:
        if final.stat().st_size != entry.expected_size:
            return None
    except FileNotFoundError:
        return None
    sha = sha256_of(final)
    return sha if sha == entry.expected_sha256 else None
