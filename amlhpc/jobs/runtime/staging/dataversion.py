"""Dataset versions: the layout `jobs data upload` writes (amlhpc.jobs.data.versions) and
staging reads, as Azure ML's data assets are named: a dataset name and a version number.

Under a dataset's prefix `<name>/`:

    <name>/v<k>/<path>.gz           the files of version k, written once, never overwritten
    <name>/_versions/<k>.uploading  version k is being written (JSON: session, who, started);
                                    created first (create-only), deleted after its manifest
    <name>/_versions/<k>.json       version k's manifest: written last (create-only), so a
                                    version with a manifest is complete and never changes

The manifest is the dataset's listing: staging reads it instead of every node listing the
files (docs/data.md). Up to PART_ROWS files it holds them inline (one GET):

    {"format": "amlhpc-dataset-version 1", "dataset": name, "version": k, "prefix": "<name>/v<k>/",
     "created": UTC time, "session": upload session, "bytes": stored bytes, "digest": 16 hex,
     "files": [[blob name, stored size, etag, content encoding, Content-MD5, {amlhpc_* metadata}], ...]}

`digest` is the SHA-256 (first 16 hex digits) of the canonical JSON of `files`: what every
node of a job agrees on before it stages (stager._agree), and what a reader checks the
manifest against.

A larger version's manifest is an index of parts, so that a node reads the parts that hold its
share and not the whole listing (a row is ~250 bytes: a 10 M-file manifest read whole by each
of 1,000 nodes would be 2.5 TB from one blob):

    <name>/_parts/<k>/<digest>-<i>.json   {"format": "amlhpc-dataset-part 1", "dataset", "version",
                                            "part": i, "files": [rows, in name order]}
    <name>/_versions/<k>.json             {"format": "amlhpc-dataset-version 2", ..., "files": count,
                                            "parts": [[blob, its size, files, stored bytes, largest
                                                       file, digest]]}

Parts are written (create-only) before the index, in name order (part i's names all precede
part i+1's); each part's `digest` is its rows' digest, and the index's `digest` is that of its
`parts` list, so it still names exactly one set of files. Parts live outside `_versions/`: the
listing every node makes of it stays one short page. A version number is the next integer above every manifest and marker;
two uploads that pick the same number meet at the marker's create-only write, and the
second takes the next.

Standard library only: ships into the training image.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amlhpc.jobs.runtime.blob.fetch import BlobEntry

FORMAT = "amlhpc-dataset-version 1"
INDEX_FORMAT = "amlhpc-dataset-version 2"
PART_FORMAT = "amlhpc-dataset-part 1"
VERSIONS_DIR = "_versions"
PARTS_DIR = "_parts"
PART_ROWS = 4_000
"""Files a manifest holds inline, and the rows of one part of a larger one (~1 MB)."""
MARKER_SUFFIX = ".uploading"
MANIFEST_SUFFIX = ".json"
_NAME = re.compile(r"^(\d{1,9})(\.uploading|\.json)$")


class VersionError(ValueError):
    """A manifest that is not one (the message names the blob and what is wrong)."""


def versions_prefix(dataset_prefix: str) -> str:
    """`<name>/_versions/` for a dataset prefix given with or without slashes."""
    return f"{dataset_prefix.strip('/')}/{VERSIONS_DIR}/"


def data_prefix(dataset_prefix: str, version: int) -> str:
    """`<name>/v<k>` (no trailing slash): where version k's files live."""
    return f"{dataset_prefix.strip('/')}/v{version}"


def marker_name(dataset_prefix: str, version: int) -> str:
    return f"{versions_prefix(dataset_prefix)}{version}{MARKER_SUFFIX}"


def manifest_name(dataset_prefix: str, version: int) -> str:
    return f"{versions_prefix(dataset_prefix)}{version}{MANIFEST_SUFFIX}"


def part_name(dataset_prefix: str, version: int, digest: str, index: int) -> str:
    """`<name>/_parts/<k>/<digest>-<i>.json`: the index's digest in the name, so a resumed upload
    whose listing changed writes its own parts and never meets an earlier attempt's."""
    return f"{dataset_prefix.strip('/')}/{PARTS_DIR}/{version}/{digest}-{index:06d}.json"


@dataclass
class Versions:
    """What `<name>/_versions/` holds: committed versions (their manifest blobs) and versions being written."""

    committed: dict[int, tuple[str, int, str | None]] = field(default_factory=dict)
    """version -> (manifest blob, size, etag)."""
    writing: dict[int, str] = field(default_factory=dict)
    """version -> marker blob (versions with a marker and no manifest)."""

    @property
    def latest(self) -> int | None:
        return max(self.committed) if self.committed else None

    @property
    def next(self) -> int:
        return max([0, *self.committed, *self.writing]) + 1

    @property
    def empty(self) -> bool:
        return not self.committed and not self.writing

    def describe(self) -> str:
        done = ", ".join(map(str, sorted(self.committed))) or "none"
        busy = f"; being written: {', '.join(map(str, sorted(self.writing)))}" if self.writing else ""
        return f"committed versions: {done}{busy}"


def parse_listing(dataset_prefix: str, items: list[tuple[str, int, str | None]]) -> Versions:
    """Versions from the (name, size, etag) of the blobs under `<name>/_versions/`; others ignored."""
    cut = len(versions_prefix(dataset_prefix))
    found = Versions()
    markers: dict[int, str] = {}
    for name, size, etag in items:
        match = _NAME.match(name[cut:])
        if not match:
            continue
        version = int(match.group(1))
        if match.group(2) == MANIFEST_SUFFIX:
            found.committed[version] = (name, size, etag)
        else:
            markers[version] = name
    found.writing = {v: name for v, name in markers.items() if v not in found.committed}
    return found


FileRow = list[Any]
"""[blob name, stored size, etag, content encoding, Content-MD5 (base64), {metadata}]."""


def files_digest(files: list[FileRow]) -> str:
    canonical = json.dumps(files, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def build_manifest(dataset: str, version: int, prefix: str, files: list[FileRow], *, created: str,
                   session: str) -> dict[str, Any]:
    """An inline manifest (format 1): every row in one document."""
    files = sorted(files, key=lambda row: row[0])
    return {"format": FORMAT, "dataset": dataset, "version": version, "prefix": prefix, "created": created,
            "session": session, "bytes": sum(int(row[1]) for row in files), "files": files,
            "digest": files_digest(files)}


def build_version(dataset: str, version: int, prefix: str, files: list[FileRow], *, created: str,
                  session: str, part_rows: int | None = None) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """The manifest to write last, and the parts (blob name, body) to write before it: none up
    to `part_rows` files (inline), else `part_rows` (default PART_ROWS) rows a part in name order."""
    part_rows = part_rows or PART_ROWS
    files = sorted(files, key=lambda row: row[0])
    if len(files) <= part_rows:
        return build_manifest(dataset, version, prefix, files, created=created, session=session), []
    chunks = [files[i:i + part_rows] for i in range(0, len(files), part_rows)]
    bodies = [json.dumps({"format": PART_FORMAT, "dataset": dataset, "version": version, "part": i, "files": rows},
                         ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
              for i, rows in enumerate(chunks)]
    refs: list[list[Any]] = [["", len(body), len(rows), sum(int(r[1]) for r in rows), max(int(r[1]) for r in rows),
                              files_digest(rows)] for body, rows in zip(bodies, chunks, strict=True)]
    digest = _parts_digest(refs)
    for i, ref in enumerate(refs):
        ref[0] = part_name(dataset, version, digest, i)
    index = {"format": INDEX_FORMAT, "dataset": dataset, "version": version, "prefix": prefix, "created": created,
             "session": session, "bytes": sum(int(ref[3]) for ref in refs), "files": len(files), "parts": refs,
             "digest": digest}
    return index, [(str(ref[0]), body) for ref, body in zip(refs, bodies, strict=True)]


def _parts_digest(refs: list[list[Any]]) -> str:
    """The index's digest: over each part's [size, files, bytes, largest, digest] (not its blob
    name, which holds the digest)."""
    return files_digest([ref[1:] for ref in refs])


@dataclass(frozen=True)
class PartRef:
    """One part of an index manifest: where it is and what it must hold."""

    blob: str
    size: int
    """The part blob's size (what one GET reads)."""
    files: int
    bytes: int
    largest: int
    """The stored size of its largest file: bounds how far a node's share can pass its mean."""
    digest: str


@dataclass(frozen=True)
class Manifest:
    """A committed version as staging uses it: its files inline, or the parts that hold them."""

    dataset: str
    version: int
    prefix: str
    """`<name>/v<k>/`: the files' common prefix."""
    digest: str
    entries: list[BlobEntry]
    """Every file (inline manifests); empty when `parts` holds them."""
    bytes: int
    parts: tuple[PartRef, ...] = ()
    files: int = 0
    """How many files the version holds."""


def _load(data: bytes, blob: str, what: str) -> Any:
    try:
        return json.loads(data.decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VersionError(f"{blob} is not a dataset {what} (not JSON: {exc})") from None


def _rows(doc: dict[str, Any], blob: str) -> list[FileRow]:
    files = doc.get("files")
    if not isinstance(files, list) or not all(isinstance(r, list) and len(r) == 6 for r in files):
        raise VersionError(f"{blob}: 'files' is not a list of [name, size, etag, encoding, md5, metadata] rows")
    return files


def _entries(rows: list[FileRow]) -> list[BlobEntry]:
    return [BlobEntry(str(r[0]), int(r[1]), r[2] or None, r[3] or None, r[4] or None) for r in rows]


def parse_manifest(data: bytes, blob: str) -> Manifest:
    """The manifest in `data` (read from `blob`), its digest checked; VersionError naming what is wrong."""
    doc = _load(data, blob, "manifest")
    kind = doc.get("format") if isinstance(doc, dict) else None
    if kind not in (FORMAT, INDEX_FORMAT):
        raise VersionError(f"{blob} is not a dataset manifest (format {kind!r}, expected {FORMAT!r} or {INDEX_FORMAT!r})")
    changed = "the manifest was changed after its upload; upload the dataset again as a new version"
    head = (str(doc.get("dataset", "")), int(doc.get("version", 0)), str(doc.get("prefix", "")))
    if kind == INDEX_FORMAT:
        return _parse_index(doc, blob, head, changed)
    files = _rows(doc, blob)
    digest = files_digest(files)
    if digest != doc.get("digest"):
        raise VersionError(f"{blob}: its files do not match its digest ({digest} != {doc.get('digest')!r}): {changed}")
    entries = _entries(files)
    return Manifest(*head, digest, entries, sum(e.size for e in entries), files=len(entries))


def _parse_index(doc: dict[str, Any], blob: str, head: tuple[str, int, str], changed: str) -> Manifest:
    refs = doc.get("parts")
    shape = [str, int, int, int, int, str]
    if not isinstance(refs, list) or not refs or not all(
            isinstance(r, list) and len(r) == len(shape) and all(isinstance(v, t) for v, t in zip(r, shape, strict=True))
            for r in refs):
        raise VersionError(f"{blob}: 'parts' is not a list of [blob, size, files, bytes, largest, digest] rows")
    digest = _parts_digest(refs)
    if digest != doc.get("digest"):
        raise VersionError(f"{blob}: its parts do not match its digest ({digest} != {doc.get('digest')!r}): {changed}")
    parts = tuple(PartRef(*r) for r in refs)
    return Manifest(*head, digest, [], sum(p.bytes for p in parts), parts, sum(p.files for p in parts))


def parse_part(data: bytes, part: PartRef, manifest: Manifest) -> list[BlobEntry]:
    """The files of `part` of `manifest`, checked against the index (VersionError naming the part)."""
    doc = _load(data, part.blob, "manifest part")
    if not isinstance(doc, dict) or doc.get("format") != PART_FORMAT or doc.get("version") != manifest.version:
        raise VersionError(f"{part.blob} is not a part of version {manifest.version}'s manifest "
                           f"(format {doc.get('format') if isinstance(doc, dict) else None!r})")
    rows = _rows(doc, part.blob)
    digest = files_digest(rows)
    if digest != part.digest or len(rows) != part.files:
        raise VersionError(f"{part.blob}: its files do not match the index ({len(rows)} rows, digest {digest}; the "
                           f"index says {part.files}, {part.digest}): the part was changed after its upload; upload "
                           "the dataset again as a new version")
    return _entries(rows)


def read_manifest(get: Callable[[str, int, str | None], bytes], versions: Versions, version: int) -> Manifest:
    """Read and check version `version`'s manifest (or index) with `get(blob, size, etag)` (one GET)."""
    blob, size, etag = versions.committed[version]
    return parse_manifest(get(blob, size, etag), blob)
