"""The record of finished files that lets staging resume.

One line per finished file, appended after the file was verified and renamed into place,
so a record always describes a complete file. Lines are written in batches (every
`flush_every` records or `flush_s` seconds, and at the end), never rewritten per file;
a line cut short by SIGKILL fails to parse and is ignored, and files finished but not yet
recorded when a run is killed are adopted by the next run after a check (`adoptable`).

Format (`manifest-node<k>.tsv`, one file per writer node, so nodes filling one shared
directory never append to the same file; reading unions them all, so a re-run with a
different node count still skips everything finished):

    # amlhpc-manifest 2
    <path>\\t<blob>\\t<etag>\\t<size>\\t<stored digest>

`path` and `blob` escape backslash, tab, newline and carriage return (`\\\\`, `\\t`, `\\n`,
`\\r`), so any blob name fits on one line; the stored digest is the blob's
amlhpc_stored_sha256 or Content-MD5. A file of plain lines (no escapes, none cut short)
is read all at once, split and converted in C, else line by line (about 1 us a line); the
JSON lines of earlier versions (`manifest-node<k>.jsonl`) are still read.

A file is finished when its record names the same blob with the same etag or stored
digest and the file on disk has the recorded size; `verify=True` re-hashes it against
the blob's amlhpc_sha256 as well.

Standard library only: ships into the training image.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from itertools import repeat
from pathlib import Path
from typing import TextIO

from amlhpc.jobs.runtime.blob.fetch import BlobEntry

HEADER = "# amlhpc-manifest 2\n"
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}

Record = tuple[str, str, int, str]
"""(blob, etag, size, stored digest); '' for a missing etag or digest."""


def escape(text: str) -> str:
    return text.translate(_ESCAPES)


def unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, chars = [], iter(text)
    for c in chars:
        out.append(_UNESCAPES.get(next(chars, ""), "") if c == "\\" else c)
    return "".join(out)


def _load_tsv(text: str, records: dict[str, Record]) -> None:
    """All lines at once when every one is a plain record (no escapes, five fields, a
    number for the size): the usual file, split and converted in C; else line by line."""
    lines = text.split("\n")
    if lines[0].startswith("#"):
        del lines[0]  # the header
    if lines and not lines[-1]:
        del lines[-1]  # after the last newline
    if not lines:
        return
    plain = "\\" not in text and "\n#" not in text and list(map(str.count, lines, repeat("\t"))).count(4) == len(lines)
    if plain:
        fields = "\t".join(lines).split("\t")
        try:
            sizes = list(map(int, fields[3::5]))
        except ValueError:
            plain = False
    if not plain:
        _load_tsv_lines(lines, records)
        return
    records.update(zip(fields[0::5], zip(fields[1::5], fields[2::5], sizes, fields[4::5], strict=True), strict=True))


def _load_tsv_lines(lines: list[str], records: dict[str, Record]) -> None:
    for line in lines:
        fields = line.split("\t")
        if len(fields) != 5 or line.startswith("#"):
            continue  # a comment, or a line cut short by a kill
        try:
            size = int(fields[3])
        except ValueError:
            continue
        records[unescape(fields[0])] = (unescape(fields[1]), fields[2], size, fields[4])


def _load_jsonl(text: str, records: dict[str, Record]) -> None:
    for line in text.splitlines():
        try:
            doc = json.loads(line)
            records[doc["path"]] = (doc["blob"], doc.get("etag") or "", int(doc["size"]), "")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue


class Manifest:
    """Finished files of one input (see the module docstring)."""

    def __init__(self, staging_dir: Path, node_index: int, flush_every: int = 256, flush_s: float = 2.0):
        self.directory = staging_dir
        self.path = staging_dir / f"manifest-node{node_index}.tsv"
        self.flush_every, self.flush_s = flush_every, flush_s
        self.records: dict[str, Record] = {}
        self.lines_in_own_file = 0
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._last_flush = time.monotonic()
        self._file: TextIO | None = None
        for path in sorted(staging_dir.glob("manifest-node*.jsonl")):
            _load_jsonl(path.read_text(errors="replace"), self.records)
        for path in sorted(staging_dir.glob("manifest-node*.tsv")):
            text = path.read_text(encoding="utf-8", errors="replace")
            if path == self.path:
                self.lines_in_own_file = text.count("\n")
            _load_tsv(text, self.records)

    def finished(self, entry: BlobEntry, rel: str, size_on_disk: int | None) -> bool:
        """Whether `rel` (now `size_on_disk` bytes, None when absent) is `entry`, complete."""
        record = self.records.get(rel)
        if record is None or size_on_disk is None or record[0] != entry.name or record[2] != size_on_disk:
            return False
        return bool((entry.etag and record[1] == entry.etag) or (record[3] and record[3] == entry.identity))

    def record(self, entry: BlobEntry, rel: str, size: int) -> None:
        line = f"{escape(rel)}\t{escape(entry.name)}\t{entry.etag or ''}\t{size}\t{entry.identity or ''}\n"
        with self._lock:
            self.records[rel] = (entry.name, entry.etag or "", size, entry.identity or "")
            self._pending.append(line)
            if len(self._pending) >= self.flush_every or time.monotonic() - self._last_flush >= self.flush_s:
                self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._file is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.exists()
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            if fresh:
                self._file.write(HEADER)
        self._file.write("".join(self._pending))
        self._file.flush()
        self.lines_in_own_file += len(self._pending)
        self._pending.clear()
        self._last_flush = time.monotonic()

    def should_compact(self, live_count: int) -> bool:
        """When most lines of this node's file are superseded or stale (and it is worth a rewrite)."""
        return self.lines_in_own_file >= max(1024, 2 * live_count)

    def compact(self, live: dict[str, BlobEntry]) -> None:
        """Rewrite this node's file once, keeping the records of `live` paths (path -> entry)
        that this node holds; call it when `should_compact`."""
        keep = [f"{escape(rel)}\t{escape(r[0])}\t{r[1]}\t{r[2]}\t{r[3]}\n" for rel, r in self.records.items()
                if rel in live and r[0] == live[rel].name]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(HEADER + "".join(keep), encoding="utf-8")
        tmp.replace(self.path)
        self.lines_in_own_file = len(keep) + 1

    def close(self) -> None:
        with self._lock:
            self._flush()
            if self._file is not None:
                self._file.close()
                self._file = None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def adoptable(entry: BlobEntry, final: Path, size_on_disk: int | None) -> bool:
    """A complete file already under its final name (a run killed before recording it):
    its size and SHA-256 match the blob's amlhpc_size and amlhpc_sha256."""
    if entry.expected_size is None or entry.expected_sha256 is None or size_on_disk != entry.expected_size:
        return False
    try:
        return sha256_of(final) == entry.expected_sha256
    except OSError:
        return False
