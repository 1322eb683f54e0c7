"""The blobs under a dataset prefix as the upload and seal commands see them, and who wrote them.

- `list_remote(container, prefix)`: every blob below the prefix with its properties and
  metadata (one listing with metadata); blobs whose name ends in '/' and hold no bytes
  are folder markers and left out.
- `stored_digests(container, blob)`: MD5 (base64, as Content-MD5 holds it) and SHA-256
  (hex) of the blob's stored bytes, read under If-Match on the etag the caller saw, so
  the digests describe exactly that version.
- `writer_of(properties)`: who committed a blob (host, process and upload session from
  the uploader's metadata), for the message of an upload that lost a race.
- `is_conflict(exc)`: whether a write failed because the blob is no longer what the
  writer saw: 412 ConditionNotMet (If-Match), 409 BlobAlreadyExists (If-None-Match: *),
  or 400 InvalidBlockList (another writer's commit discarded this writer's uncommitted
  blocks: Put Block List keeps only the blocks it names, learn.microsoft.com/rest/api/
  storageservices/put-block-list, read 2026-11-25).

The metadata keys the uploader and seal write beside docs/contracts.md section 5's:
    amlhpc_ctime         the source file's change time (ns) at upload: a write that restores the
                         mtime (rsync -a, tar -x) still moves it
    amlhpc_inode         `<device>:<inode>` of the source file at upload
    amlhpc_upload_id     the upload session that committed the blob (16 hex digits), or
                         `verified-<session>` when an upload read an older blob's stored
                         bytes and found them equal to its recorded checksum
    amlhpc_uploaded_by   `<user>@<host> pid <pid>` of that upload
    amlhpc_sealed        `<UTC time> by <user>@<host>`: `jobs data seal` recorded the
                         stored bytes' checksum of a blob another tool wrote
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import socket
from dataclasses import dataclass

META_SIZE, META_SHA256, META_MTIME = "amlhpc_size", "amlhpc_sha256", "amlhpc_mtime"
META_STORED_SHA256 = "amlhpc_stored_sha256"
META_CTIME, META_INODE = "amlhpc_ctime", "amlhpc_inode"
META_UPLOAD_ID = "amlhpc_upload_id"
META_UPLOADED_BY = "amlhpc_uploaded_by"
META_SEALED = "amlhpc_sealed"
VERIFIED_PREFIX = "verified-"
READ_CHUNK = 8 << 20


@dataclass(frozen=True)
class RemoteBlob:
    name: str
    size: int
    etag: str | None
    content_encoding: str | None
    metadata: dict[str, str]
    content_md5: str | None = None
    """Content-MD5 as base64, None when the blob has none."""

    @property
    def gzip(self) -> bool:
        return (self.content_encoding or "").strip().lower() == "gzip"

    @property
    def stored_checksum(self) -> str | None:
        """What the stored bytes can be checked with: 'sha256', 'md5' or None."""
        if self.metadata.get(META_STORED_SHA256):
            return "sha256"
        return "md5" if self.content_md5 else None

    @classmethod
    def from_properties(cls, props) -> RemoteBlob:
        settings = props.content_settings
        md5 = getattr(settings, "content_md5", None)
        return cls(props.name, int(props.size or 0), props.etag, getattr(settings, "content_encoding", None) or None,
                   dict(props.metadata or {}), base64.b64encode(bytes(md5)).decode() if md5 else None)


def normalize_prefix(prefix: str) -> str:
    return prefix.strip().strip("/")


def list_remote(container, prefix: str) -> dict[str, RemoteBlob]:
    """Blobs under `prefix/` with their metadata, by name (empty folder markers left out)."""
    start = normalize_prefix(prefix)
    found = {}
    for props in container.list_blobs(name_starts_with=f"{start}/" if start else None, include=["metadata"]):
        if props.name.endswith("/") and not props.size:
            continue
        found[props.name] = RemoteBlob.from_properties(props)
    return found


def stored_digests(container, name: str, etag: str | None) -> tuple[str, str, int]:
    """(Content-MD5 form of the MD5, SHA-256 hex, bytes) of the stored bytes of `name` at `etag`."""
    from azure.core import MatchConditions

    conditions = {"etag": etag, "match_condition": MatchConditions.IfNotModified} if etag else {}
    stream = container.get_blob_client(name).download_blob(decompress=False, max_concurrency=2, **conditions)
    md5, sha = hashlib.md5(), hashlib.sha256()
    size = 0
    for chunk in stream.chunks():
        md5.update(chunk)
        sha.update(chunk)
        size += len(chunk)
    return base64.b64encode(md5.digest()).decode(), sha.hexdigest(), size


def stored_bytes_match(blob: RemoteBlob, md5_b64: str, sha256_hex: str) -> bool:
    """Whether digests of the stored bytes agree with every checksum the blob records."""
    recorded_sha = blob.metadata.get(META_STORED_SHA256)
    if recorded_sha and recorded_sha.lower() != sha256_hex:
        return False
    if blob.content_md5 and blob.content_md5 != md5_b64:
        return False
    return bool(recorded_sha or blob.content_md5)


def who() -> str:
    """`<user>@<host> pid <pid>`, ASCII only (metadata values travel as HTTP headers)."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        user = str(os.getuid())
    text = f"{user}@{socket.gethostname()} pid {os.getpid()}"
    return text.encode("ascii", "replace").decode().replace("?", "_")


def writer_of(properties) -> str:
    """A phrase naming who committed the blob, from its properties (None: it is gone)."""
    if properties is None:
        return "it was deleted since this upload listed it"
    meta = dict(properties.metadata or {})
    when = properties.last_modified.strftime("%Y-%m-%d %H:%M:%S UTC") if properties.last_modified else "?"
    session = meta.get(META_UPLOAD_ID)
    by = meta.get(META_UPLOADED_BY)
    if session and by:
        return f"upload {session} by {by} committed it at {when}"
    if meta.get(META_SEALED):
        return f"another tool replaced it at {when} (sealed {meta[META_SEALED]})"
    return f"another writer (not this uploader, or an older version of it) replaced it at {when}"


def current_properties(container, name: str):
    """The blob's properties now, None when it does not exist."""
    from azure.core.exceptions import ResourceNotFoundError

    try:
        return container.get_blob_client(name).get_blob_properties()
    except ResourceNotFoundError:
        return None


def is_conflict(exc: BaseException) -> bool:
    """A conditional write refused because the blob changed since it was seen (see the module docstring)."""
    status = getattr(exc, "status_code", None)
    code = str(getattr(exc, "error_code", "") or "")
    code = code.split(".")[-1].replace("_", "").lower()
    return (status == 412 or (status == 409 and code == "blobalreadyexists")
            or (status == 400 and code == "invalidblocklist"))
