"""Dataset versions: the layout `jobs data upload` writes (amlhpc.jobs.data.versions) and
staging reads, as Azure ML's data assets are named: a dataset name and a version number.

Under a dataset's prefix `<name>/`:

    <name>/v<k>/<path>.gz           the files of version k, written once, never overwritten
    <name>/_versions/<k>.uploading  version k is being written (JSON: session, who, started);
                                    created first (create-only), deleted after its manifest
    <name>/_versions/<k>.json       version k's manifest: written last (create-only), so a
                                    version with a manifest is complete and never changes

The manifest is the dataset's listing: staging reads it with one GET instead of every node
listing the files (docs/data.md). Its JSON:

    {"format": "amlhpc-dataset-version 1", "dataset": name, "version": k, "prefix": "<name>/v<k>/",
     "created": UTC time, "session": upload session, "bytes": stored bytes, "digest": 16 hex,
     "files": [[blob name, stored size, etag, content encoding, Content-MD5, {amlhpc_* metadata}], ...]}

`digest` is the SHA-256 (first 16 hex digits) of the canonical JSON of `files`: what every
node of a job agrees on before it stages (stager._agree), and what a reader checks the
manifest against. A version number is the next integer above every manifest and marker;
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
VERSIONS_DIR = "_versions"
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
    files = sorted(files, key=lambda row: row[0])
    return {"format": FORMAT, "dataset": dataset, "version": version, "prefix": prefix, "created": created,
            "session": session, "bytes": sum(int(row[1]) for row in files), "files": files,
            "digest": files_digest(files)}


@dataclass(frozen=True)
class Manifest:
    """A committed version as staging uses it."""

    dataset: str
    version: int
    prefix: str
    """`<name>/v<k>/`: the files' common prefix."""
    digest: str
    entries: list[BlobEntry]
    bytes: int


def parse_manifest(data: bytes, blob: str) -> Manifest:
    """The manifest in `data` (read from `blob`), its digest checked; VersionError naming what is wrong."""
    try:
        doc = json.loads(data.decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VersionError(f"{blob} is not a dataset manifest (not JSON: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise VersionError(f"{blob} is not a dataset manifest (format {doc.get('format') if isinstance(doc, dict) else None!r}, "
                           f"expected {FORMAT!r})")
    files = doc.get("files")
    if not isinstance(files, list) or not all(isinstance(r, list) and len(r) == 6 for r in files):
        raise VersionError(f"{blob}: 'files' is not a list of [name, size, etag, encoding, md5, metadata] rows")
    digest = files_digest(files)
    if digest != doc.get("digest"):
        raise VersionError(f"{blob}: its files do not match its digest ({digest} != {doc.get('digest')!r}): the manifest "
                           "was changed after its upload; upload the dataset again as a new version")
    entries = [BlobEntry(str(r[0]), int(r[1]), r[2] or None, r[3] or None, r[4] or None) for r in files]
    return Manifest(str(doc.get("dataset", "")), int(doc.get("version", 0)), str(doc.get("prefix", "")), digest,
                    entries, sum(e.size for e in entries))


def read_manifest(get: Callable[[str, int, str | None], bytes], versions: Versions, version: int) -> Manifest:
    """Read and check version `version`'s manifest with `get(blob, size, etag)` (one GET)."""
    blob, size, etag = versions.committed[version]
    return parse_manifest(get(blob, size, etag), blob)
