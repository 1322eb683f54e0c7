"""Download one blob to one file: ranged GETs in parallel, gunzip in order, verify, then rename.

How one file is fetched (`Fetcher.fetch`):

1. The blob is cut into ranges of `range_bytes`; up to `window` of them are requested at
   once on a shared pool of HTTP threads (so one large blob still fills the pipe), each
   with the etag seen at listing time (`If-Match`), so a blob replaced mid-download
   fails instead of mixing two versions.
2. Ranges are consumed strictly in order: gunzipped when the blob is gzip-encoded
   (isal's inflate, zlib's when isal is missing; multi-member streams are handled; output
   is produced in bounded pieces, so a 1000x compressible range cannot blow up memory),
   hashed (SHA-256) and written to a partial file outside the data directory.
3. The result is verified: the uncompressed size and SHA-256 from the blob's metadata
   (`amlhpc_size`, `amlhpc_sha256`, written by `jobs data upload`) when present, else the
   blob's Content-MD5 for plain blobs; gzip's own CRC-32 and length trailer always. The
   SHA-256 can be turned off (`verify_sha256=False`) on CPUs without SHA instructions,
   where it costs more than inflating; size, CRC-32 and the etag still hold then.
4. Only then is the partial file renamed to its final name (same filesystem, atomic), so
   a final name never holds a partial or corrupt file, whatever kills the process.

Downloads use `download_blob(..., decompress=False)`: the SDK's transparent decoding of
gzip-encoded blobs breaks ranged reads (each range would be decoded on its own).

Retries: every request runs under the client's storage retry policy (503 ServerBusy,
timeouts, dropped connections). On top of that a whole blob is fetched again when a
body arrives short, a connection fails beyond the policy's budget, or the bytes fail
verification (once: a second identical failure means the blob itself is bad, and the
error names it).

Standard library plus azure-storage-blob / azure-core and, when present, isal.
"""

from __future__ import annotations

import hashlib
import os
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from jobs.runtime.throttle import UNLIMITED, Throttle

try:  # isal's inflate is 2-3x zlib's; the image ships it, a bare Python may not.
    from isal import isal_zlib as _inflate_lib

    INFLATE_LIBRARY = "isal"
except ImportError:  # pragma: no cover - exercised only where isal is absent
    _inflate_lib = zlib  # type: ignore[assignment]
    INFLATE_LIBRARY = "zlib"

GZIP_WBITS = 16 + zlib.MAX_WBITS
MAX_PIECE_BYTES = 16 << 20
"""Largest piece of decompressed output held at once per file."""


class FetchError(RuntimeError):
    """A blob could not be staged. The message names the blob and what to do."""

    def __init__(self, blob: str, message: str, transient: bool = False):
        super().__init__(f"blob {blob!r}: {message}")
        self.blob = blob
        self.transient = transient


class IntegrityError(FetchError):
    """The bytes do not verify: corrupt gzip, size or checksum mismatch."""


@dataclass(frozen=True)
class BlobEntry:
    """What listing told us about one blob."""

    name: str
    size: int
    """Stored (possibly compressed) bytes."""
    etag: str | None = None
    content_encoding: str | None = None
    content_md5: bytes | None = None
    expected_size: int | None = None
    """Uncompressed size from amlhpc_size metadata."""
    expected_sha256: str | None = None
    """SHA-256 (hex) of the uncompressed bytes from amlhpc_sha256 metadata."""

    @property
    def gzip(self) -> bool:
        return (self.content_encoding or "").strip().lower() == "gzip" or self.name.endswith(".gz")

    @property
    def local_name(self) -> str:
        """The name on disk: `.gz` dropped when we decompress."""
        return self.name[:-3] if self.gzip and self.name.endswith(".gz") else self.name

    @classmethod
    def from_properties(cls, props) -> BlobEntry:
        """From an azure.storage.blob BlobProperties (listed with include=['metadata'])."""
        metadata = props.metadata or {}
        settings = props.content_settings
        size_text = metadata.get("amlhpc_size")
        try:
            expected_size = int(size_text) if size_text not in (None, "") else None
        except ValueError:
            expected_size = None
        md5 = getattr(settings, "content_md5", None)
        return cls(
            name=props.name,
            size=int(props.size or 0),
            etag=props.etag,
            content_encoding=getattr(settings, "content_encoding", None),
            content_md5=bytes(md5) if md5 else None,
            expected_size=expected_size,
            expected_sha256=(metadata.get("amlhpc_sha256") or "").lower() or None,
        )


@dataclass(frozen=True)
class FetchResult:
    name: str
    path: Path
    bytes_in: int
    """Stored bytes of the final, successful attempt."""
    bytes_out: int
    sha256: str
    attempts: int
    bytes_retried: int
    """Bytes downloaded by attempts that were thrown away."""


class Gunzip:
    """Streaming gzip decoder: feed() stored bytes, get uncompressed pieces; finish() checks the end."""

    def __init__(self, blob: str):
        self.blob = blob
        self._decoder = _inflate_lib.decompressobj(wbits=GZIP_WBITS)
        self._member_has_input = False
        self.members = 0

    def feed(self, data: bytes):
        """Yield decompressed pieces of at most MAX_PIECE_BYTES for `data`."""
        while data:
            self._member_has_input = True
            try:
                piece = self._decoder.decompress(data, MAX_PIECE_BYTES)
            except (zlib.error, _inflate_lib.error) as exc:
                raise IntegrityError(self.blob, f"gzip data is corrupt ({exc}); re-upload it with "
                                     "`python -m jobs data upload`") from None
            if piece:
                yield piece
            if self._decoder.eof:
                # A gzip file may hold several members back to back (pigz, appends).
                self.members += 1
                data = self._decoder.unused_data
                self._decoder = _inflate_lib.decompressobj(wbits=GZIP_WBITS)
                self._member_has_input = False
            else:
                data = self._decoder.unconsumed_tail

    def finish(self) -> bytes:
        if self._member_has_input and not self._decoder.eof:
            tail = self._decoder.flush()
            if not self._decoder.eof:
                raise IntegrityError(self.blob, "gzip stream ends early (truncated blob or upload); re-upload it")
            return tail
        if self.members == 0:
            raise IntegrityError(self.blob, "is marked gzip but holds no gzip data")
        return b""


def _is_transient(exc: BaseException) -> bool:
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceModifiedError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(exc, (ResourceNotFoundError, ClientAuthenticationError, ResourceModifiedError)):
        return False
    if isinstance(exc, (ServiceRequestError, ServiceResponseError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, HttpResponseError):
        status = getattr(exc, "status_code", None) or 0
        # The SDK's chunk reader wraps a short body in HttpResponseError without a status.
        return status == 0 or status == 408 or status >= 500
    return False


class Fetcher:
    """Fetches blobs of one container; shares an HTTP thread pool and a bandwidth cap.

    range_bytes: size of one ranged GET (stored bytes).
    window: ranged GETs in flight per file.
    attempts_transient: whole-blob attempts for network failures beyond the retry policy.
    attempts_integrity: whole-blob attempts when the bytes fail verification.
    on_bytes(stored, uncompressed): progress callback, called from worker threads.
    """

    def __init__(self, container_client, http_pool: ThreadPoolExecutor, *, range_bytes: int = 8 << 20,
                 window: int = 4, throttle: Throttle = UNLIMITED, attempts_transient: int = 4,
                 attempts_integrity: int = 2, retry_pause_s: float = 1.0, verify_sha256: bool = True,
                 on_bytes: Callable[[int, int], None] | None = None):
        self.container = container_client
        self.pool = http_pool
        self.range_bytes = range_bytes
        self.window = max(1, window)
        self.throttle = throttle
        self.attempts_transient = attempts_transient
        self.attempts_integrity = attempts_integrity
        self.retry_pause_s = retry_pause_s
        self.verify_sha256 = verify_sha256
        self.on_bytes = on_bytes or (lambda stored, out: None)

    # -- one ranged GET (runs on the HTTP pool)
    def _get(self, blob_client, entry: BlobEntry, offset: int, length: int) -> bytes:
        from azure.core import MatchConditions

        self.throttle.acquire(length)
        conditions = {"etag": entry.etag, "match_condition": MatchConditions.IfNotModified} if entry.etag else {}
        stream = blob_client.download_blob(offset=offset, length=length, decompress=False, max_concurrency=1,
                                           **conditions)
        data = stream.readall()
        if len(data) != length:
            raise FetchError(entry.name, f"range {offset}+{length} returned {len(data)} bytes", transient=True)
        return data

    def fetch(self, entry: BlobEntry, final_path: Path, partial_path: Path) -> FetchResult:
        """Fetch `entry` to `final_path` via `partial_path` (see the module docstring)."""
        transient_left, integrity_left = self.attempts_transient, self.attempts_integrity
        attempts, wasted = 0, 0
        while True:
            attempts += 1
            got = [0]
            try:
                result = self._attempt(entry, final_path, partial_path, got)
                return FetchResult(result[0], final_path, result[1], result[2], result[3], attempts, wasted)
            except IntegrityError:
                _unlink(partial_path)
                wasted += got[0]
                integrity_left -= 1
                if integrity_left <= 0:
                    raise
            except FetchError as exc:
                _unlink(partial_path)
                wasted += got[0]
                if not exc.transient:
                    raise
                transient_left -= 1
                if transient_left <= 0:
                    raise FetchError(entry.name, f"gave up after {attempts} attempts: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - classified below, re-raised with the blob's name
                _unlink(partial_path)
                wasted += got[0]
                if not _is_transient(exc):
                    raise FetchError(entry.name, _describe(exc)) from None
                transient_left -= 1
                if transient_left <= 0:
                    raise FetchError(entry.name, f"gave up after {attempts} attempts: {_describe(exc)}") from None
            time.sleep(self.retry_pause_s * attempts)

    def _attempt(self, entry: BlobEntry, final_path: Path, partial_path: Path, got: list[int]) -> tuple[str, int, int, str]:
        blob_client = self.container.get_blob_client(entry.name)
        ranges = [(o, min(self.range_bytes, entry.size - o)) for o in range(0, entry.size, self.range_bytes)]
        gunzip = Gunzip(entry.name) if entry.gzip else None
        digest = hashlib.sha256() if self.verify_sha256 else None
        md5 = hashlib.md5() if (entry.content_md5 and not entry.gzip) else None
        written = 0
        partial_path.parent.mkdir(parents=True, exist_ok=True)
        pending: list[Future] = []
        try:
            with open(partial_path, "wb") as out:
                next_range = 0
                for _ in range(min(self.window, len(ranges))):
                    pending.append(self.pool.submit(self._get, blob_client, entry, *ranges[next_range]))
                    next_range += 1
                while pending:
                    data = pending.pop(0).result()
                    if next_range < len(ranges):
                        pending.append(self.pool.submit(self._get, blob_client, entry, *ranges[next_range]))
                        next_range += 1
                    got[0] += len(data)
                    if md5 is not None:
                        md5.update(data)
                    pieces = gunzip.feed(data) if gunzip else (data,)
                    produced = 0
                    for piece in pieces:
                        if digest is not None:
                            digest.update(piece)
                        out.write(piece)
                        produced += len(piece)
                    written += produced
                    self.on_bytes(len(data), produced)
                if gunzip:
                    tail = gunzip.finish()
                    if tail:
                        if digest is not None:
                            digest.update(tail)
                        out.write(tail)
                        written += len(tail)
                        self.on_bytes(0, len(tail))
        finally:
            for future in pending:
                future.cancel()
        sha = digest.hexdigest() if digest is not None else ""
        self._verify(entry, written, sha, md5)
        final_path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial_path, final_path)
        return entry.name, got[0], written, sha

    @staticmethod
    def _verify(entry: BlobEntry, written: int, sha: str, md5) -> None:
        if entry.expected_size is not None and written != entry.expected_size:
            raise IntegrityError(entry.name, f"size mismatch: got {written} bytes, metadata amlhpc_size says "
                                 f"{entry.expected_size}; re-upload it with `python -m jobs data upload`")
        if entry.expected_sha256 and sha and sha != entry.expected_sha256:
            raise IntegrityError(entry.name, f"checksum mismatch: SHA-256 {sha[:16]}... but metadata amlhpc_sha256 "
                                 f"says {entry.expected_sha256[:16]}...; re-upload it with `python -m jobs data upload`")
        if md5 is not None and md5.digest() != entry.content_md5:
            raise IntegrityError(entry.name, "Content-MD5 mismatch: the stored bytes differ from what was uploaded")
        if not entry.gzip and entry.expected_size is None and written != entry.size:
            raise FetchError(entry.name, f"got {written} of {entry.size} bytes", transient=True)


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    reason = getattr(exc, "reason", None) or type(exc).__name__
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if type(exc).__name__ == "ResourceModifiedError":
        return "the blob changed while it was being staged (etag mismatch); re-run staging"
    if type(exc).__name__ == "ResourceNotFoundError":
        return "not found (deleted after listing?); re-run staging"
    if type(exc).__name__ == "ClientAuthenticationError":
        return ("access denied: the node's identity needs 'Storage Blob Data Reader' on the account "
                f"({first[:200]})")
    return f"{reason}{f' (HTTP {status})' if status else ''}: {first[:300]}"


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
