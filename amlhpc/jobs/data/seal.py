"""Seal foreign blobs: record a checksum of the stored bytes of every blob under a prefix that has none.

Blobs written by another tool with Put Block List (azcopy and the SDKs for large files)
carry no digest of their bytes: Put Blob makes the service compute Content-MD5, Put Block
List stores whatever the client sends, usually nothing. Staging can then check only each
transfer (range MD5), not the bytes at rest, and warns. Sealing reads such a blob once,
under If-Match on the etag it listed, and records:

1. Content-MD5 (Set Blob Properties, every other content header sent back unchanged,
   learn.microsoft.com/rest/api/storageservices/set-blob-properties, read 2026-11-25),
   so staging and any other reader (azcopy --check-md5) verify the stored bytes;
2. then, conditional on the etag step 1 returned, `amlhpc_stored_sha256` (SHA-256 of the
   stored bytes, what staging checks on CPUs where SHA-256 is faster) and `amlhpc_sealed`
   (when and by whom) added to its metadata.

Each write is conditional on the version that was read, so a blob replaced while it was
being read is never sealed with the old bytes' checksum: it is reported, and a second
run seals the new version. A run killed between the two writes leaves a blob with
Content-MD5, which already counts as sealed. A blob that has a checksum is left alone;
`reseal` names blobs whose checksum is to be recorded again after the user restored their
bytes from the source (never one written by `jobs data upload`: re-upload those).

After sealing, staging verifies these blobs like the uploader's own: a blob whose bytes
change after sealing fails staging, named, and nothing reaches the data directory.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from amlhpc.core import invocation
from amlhpc.jobs.data import remote
from amlhpc.jobs.runtime.base import faultpoints


class SealError(RuntimeError):
    """Some blobs could not be sealed; the message lists them."""


@dataclass
class SealReport:
    blobs: int = 0
    sealed: list[str] = field(default_factory=list)
    already: int = 0
    """Blobs that had a checksum (Content-MD5 or amlhpc_stored_sha256) and were left alone."""
    bytes_read: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"blobs": self.blobs, "sealed": len(self.sealed), "already": self.already,
                "bytes_read": self.bytes_read, "seconds": round(self.seconds, 3), "failures": self.failures}


def _content_settings(props, md5_b64: str):
    import base64

    from azure.storage.blob import ContentSettings

    old = props.content_settings
    return ContentSettings(content_type=old.content_type, content_encoding=old.content_encoding,
                           content_language=old.content_language, content_disposition=old.content_disposition,
                           cache_control=old.cache_control, content_md5=bytearray(base64.b64decode(md5_b64)))


def _seal_one(container, props, sealed_by: str) -> int:
    from azure.core import MatchConditions

    blob = container.get_blob_client(props.name)
    md5_b64, sha_hex, size = remote.stored_digests(container, props.name, props.etag)
    faultpoints.reach("seal.after-read", blob=props.name)
    answer = blob.set_http_headers(_content_settings(props, md5_b64), etag=props.etag,
                                   match_condition=MatchConditions.IfNotModified)
    faultpoints.reach("seal.between-writes", blob=props.name)
    metadata = {**(props.metadata or {}), remote.META_STORED_SHA256: sha_hex, remote.META_SEALED: sealed_by}
    blob.set_blob_metadata(metadata, etag=answer["etag"], match_condition=MatchConditions.IfNotModified)
    return size


def seal_prefix(container, prefix: str, *, reseal: Iterable[str] = (), workers: int = 4) -> SealReport:
    """Seal every blob under `prefix` that has no checksum, and those named in `reseal` (see the module docstring)."""
    started = time.monotonic()
    start = remote.normalize_prefix(prefix)
    again = set(reseal)
    report = SealReport()
    todo = []
    for props in container.list_blobs(name_starts_with=f"{start}/" if start else None, include=["metadata"]):
        if props.name.endswith("/") and not props.size:
            continue  # a folder marker
        report.blobs += 1
        item = remote.RemoteBlob.from_properties(props)
        if props.name in again:
            again.discard(props.name)
            if item.metadata.get(remote.META_UPLOAD_ID):
                report.failures.append(f"{props.name}: written by `jobs data upload`, which records its own checksums; "
                                       "re-upload it instead: "
                                       + invocation.command("jobs", f"data upload LOCAL_DIR --stack STACK --prefix {start} --verify-stored"))
                continue
            todo.append(props)
        elif item.stored_checksum is None:
            todo.append(props)
        else:
            report.already += 1
    report.failures.extend(f"{name}: no such blob under {start}/" for name in sorted(again))
    sealed_by = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} by {remote.who()}"

    def one(props) -> tuple[str, int | None, str | None]:
        try:
            return props.name, _seal_one(container, props, sealed_by), None
        except Exception as exc:  # noqa: BLE001 - collected per blob, reported together
            if remote.is_conflict(exc):
                return props.name, None, "changed while it was being sealed (nothing recorded); run seal again"
            from amlhpc.jobs.data.upload import describe_azure_error

            return props.name, None, describe_azure_error(exc)

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="seal") as pool:
        for name, size, problem in pool.map(one, todo):
            if problem:
                report.failures.append(f"{name}: {problem}")
            else:
                report.sealed.append(name)
                report.bytes_read += size or 0
    report.seconds = time.monotonic() - started
    if report.failures:
        shown = "\n  - ".join(report.failures[:10])
        more = f"\n  ... and {len(report.failures) - 10} more" if len(report.failures) > 10 else ""
        raise SealError(f"{len(report.failures)} blob(s) not sealed ({len(report.sealed)} sealed):\n  - {shown}{more}")
    return report
