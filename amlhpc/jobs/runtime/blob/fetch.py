"""Download one blob to one file: ranged GETs, inflate, verify every byte, then rename.

How one file is fetched (`Fetcher.fetch`):

1. Blobs written by `jobs data upload` as several gzip members (amlhpc.jobs.runtime.blob.gzmembers)
   are fetched as runs of whole members, a window of ranged GETs ahead; the stored bytes
   are hashed in order while the members inflate in parallel on the inflate pool and are
   written at their offsets. One large file then inflates on every core.
2. Every other blob (one gzip stream, a plain blob, a blob uploaded before members
   existed) is fetched as ranges of `range_bytes`, a window of them in flight on the HTTP
   pool, consumed strictly in order: hashed, inflated when gzip-encoded (isal; output in
   bounded pieces, so a 1000x compressible range cannot blow up memory) and written. A
   blob of one range is fetched by the calling thread itself (no hand-off).
   Each range GET carries the etag seen at listing time (If-Match), so a blob replaced
   mid-download fails instead of mixing two versions.
3. Verification, where it is cheap (the stored bytes are ~5x fewer than the output):
   - a digest of the stored bytes: `amlhpc_stored_sha256` (SHA-256, written by our
     uploader) or the blob's Content-MD5 (which the service checked on upload), whichever
     this CPU hashes faster (SHA-256 with SHA extensions, else MD5); a blob with neither
     (written by another tool with Put Block List) is read in ranges of at most 4 MiB
     with `x-ms-range-get-content-md5`, so the service's MD5 of each range checks the
     transfer, not the bytes at rest; the report counts such files;
   - gzip's own CRC-32 and length of every member's output (checked by the inflater);
   - the total output size against `amlhpc_size`, and a plain blob's length;
   - optionally (`verify_sha256`) the SHA-256 of the output against `amlhpc_sha256`.
   Together these check every byte from the uploader's compressor to the file.
4. Only then is the partial file renamed to its final name (same filesystem, atomic), so
   a final name never holds a partial or corrupt file, whatever kills the process.

Retries: every request runs under blobhttp's retry budget (503 ServerBusy with its
Retry-After, timeouts, dropped connections). On top of that a whole blob is fetched again
when a body breaks off, a connection fails beyond the budget, or the bytes fail
verification (once: a second identical failure means the blob itself is bad, and the
error names it). The staging deadline ends everything at once.

Standard library plus isal (zlib when isal is missing).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import os
import re
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, wait
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from xml.sax.saxutils import escape as xml_escape

from amlhpc.jobs.runtime.base import clock
from amlhpc.jobs.runtime.base.throttle import UNLIMITED, Throttle
from amlhpc.jobs.runtime.blob import gzmembers
from amlhpc.jobs.runtime.blob.blobhttp import (
    NO_DEADLINE,
    BlobReadError,
    Deadline,
    DeadlineExceeded,
    TransientError,
)

# isal's inflate is 2-3x zlib's; the image ships it, a bare Python may not (gzmembers picks).
_inflate_lib = gzmembers.zlib_impl
INFLATE_LIBRARY = gzmembers.INFLATE_LIBRARY

GZIP_WBITS = 16 + zlib.MAX_WBITS
MAX_PIECE_BYTES = 16 << 20
"""Largest piece of decompressed output held at once per file."""
FEED_BYTES = 4 << 20
"""Largest piece of stored bytes handed to the inflater at once."""
RANGE_MD5_LIMIT = 4 << 20
"""The service returns a range's MD5 only for ranges up to 4 MiB (Get Blob, x-ms-range-get-content-md5)."""


class FetchError(RuntimeError):
    """A blob could not be staged. The message names the blob and what to do."""

    def __init__(self, blob: str, message: str, transient: bool = False):
        super().__init__(f"blob {blob!r}: {message}")
        self.blob = blob
        self.transient = transient


class IntegrityError(FetchError):
    """The bytes do not verify: corrupt gzip, size or checksum mismatch."""


_META_PATTERNS: dict[bytes, re.Pattern] = {}


def _meta_pattern(key: bytes) -> re.Pattern:
    pattern = _META_PATTERNS.get(key)
    if pattern is None:
        pattern = _META_PATTERNS[key] = re.compile(b"<" + re.escape(key) + b">([^<]*)</" + re.escape(key) + b">")
    return pattern


class BlobEntry(NamedTuple):
    """What listing told us about one blob (a tuple: a million of them must stay cheap).

    `metadata` is the blob's metadata as the List Blobs answer holds it (`<key>value</key>`
    ...), read one key at a time when needed: parsing it for every blob of a large listing
    would cost more than the rest of the listing."""

    name: str
    size: int
    """Stored (possibly compressed) bytes."""
    etag: str | None = None
    content_encoding: str | None = None
    content_md5: str | None = None
    """The blob's Content-MD5, base64 as the service gives it."""
    metadata: bytes = b""

    def meta(self, key: str) -> str | None:
        """One metadata value (None when absent or empty)."""
        if not self.metadata:
            return None
        found = _meta_pattern(key.encode()).search(self.metadata)
        if not found or not found.group(1):
            return None
        value = found.group(1).decode("utf-8")
        return html.unescape(value) if "&" in value else value

    @property
    def expected_size(self) -> int | None:
        """Uncompressed size from amlhpc_size metadata."""
        return _int(self.meta("amlhpc_size"))

    @property
    def expected_sha256(self) -> str | None:
        """SHA-256 (hex) of the uncompressed bytes from amlhpc_sha256 metadata."""
        value = self.meta("amlhpc_sha256")
        return value.lower() if value else None

    @property
    def stored_sha256(self) -> str | None:
        """SHA-256 (hex) of the stored bytes from amlhpc_stored_sha256 metadata."""
        value = self.meta("amlhpc_stored_sha256")
        return value.lower() if value else None

    @property
    def members(self) -> str | None:
        """amlhpc_members: the gzip members' compressed sizes (amlhpc.jobs.runtime.blob.gzmembers)."""
        return self.meta(gzmembers.META_MEMBERS)

    @property
    def member_bytes(self) -> int | None:
        return _int(self.meta(gzmembers.META_MEMBER_BYTES))

    @property
    def gzip(self) -> bool:
        """Whether the blob is inflated when staged: it says it is gzip-encoded (Content-Encoding),
        whatever its name; a foreign `archive.tar.gz` without that is staged as it is stored."""
        return (self.content_encoding or "").strip().lower() == "gzip"

    @property
    def local_name(self) -> str:
        """The name on disk: `.gz` dropped from a blob that is inflated, kept on one that is not."""
        return self.name[:-3] if self.gzip and self.name.endswith(".gz") else self.name

    @property
    def identity(self) -> str | None:
        """A digest of the stored bytes, when the blob has one: the same digest means the same blob."""
        return self.stored_sha256 or self.content_md5

    @classmethod
    def with_metadata(cls, name: str, size: int, metadata: dict[str, str] | None = None, **fields) -> BlobEntry:
        """An entry from a metadata dict (the SDK's form) rather than the listing's XML."""
        raw = b"".join(b"<%s>%s</%s>" % (k.encode(), xml_escape(str(v)).encode(), k.encode())
                       for k, v in (metadata or {}).items())
        return cls(name, size, metadata=raw, **fields)

    @classmethod
    def from_properties(cls, props) -> BlobEntry:
        """From an azure.storage.blob BlobProperties (listed with include=['metadata'])."""
        settings = props.content_settings
        md5 = getattr(settings, "content_md5", None)
        return cls.with_metadata(props.name, int(props.size or 0), props.metadata, etag=props.etag,
                                 content_encoding=getattr(settings, "content_encoding", None) or None,
                                 content_md5=base64.b64encode(bytes(md5)).decode() if md5 else None)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


@dataclass(frozen=True)
class FetchResult:
    name: str
    path: str | Path
    bytes_in: int
    """Stored bytes of the final, successful attempt."""
    bytes_out: int
    attempts: int
    bytes_retried: int
    """Bytes downloaded by attempts that were thrown away."""
    verified: str
    """What checked the bytes (`Checks.label`), for the report."""


class Gunzip:
    """Streaming gzip decoder: feed() stored bytes, get uncompressed pieces; finish() checks the end.

    Zero bytes after the last member are padding and accepted, as GNU gzip accepts them
    (tape and block devices pad files with zeros; `gzip -t` of such a file succeeds, checked
    with gzip 1.12); any other byte there is refused as trailing garbage."""

    def __init__(self, blob: str):
        self.blob = blob
        self._decoder = _inflate_lib.decompressobj(wbits=GZIP_WBITS)
        self._member_has_input = False
        self._padding = False
        self.members = 0

    def feed(self, data: bytes | memoryview) -> Iterator[bytes]:
        """Yield decompressed pieces of at most MAX_PIECE_BYTES for `data`."""
        if len(data) > FEED_BYTES:
            # The inflater hands back what it did not consume as a copy: feeding a large buffer
            # whole would copy its tail once per output piece.
            view = memoryview(data)
            for start in range(0, len(view), FEED_BYTES):
                yield from self.feed(view[start:start + FEED_BYTES])
            return
        while data:
            if self._padding or (self.members and not self._member_has_input and data[0] == 0):
                self._check_padding(data)
                return
            self._member_has_input = True
            try:
                piece = self._decoder.decompress(data, MAX_PIECE_BYTES)
            except gzmembers.ZLIB_ERRORS as exc:
                raise IntegrityError(self.blob, f"gzip data is corrupt ({exc})") from None
            if piece:
                yield piece
            if self._decoder.eof:
                # A gzip file may hold several members back to back (ours, pigz, appends).
                self.members += 1
                data = self._decoder.unused_data
                self._decoder = _inflate_lib.decompressobj(wbits=GZIP_WBITS)
                self._member_has_input = False
            else:
                data = self._decoder.unconsumed_tail

    def _check_padding(self, data: bytes | memoryview) -> None:
        self._padding = True
        if bytes(data).strip(b"\0"):
            raise IntegrityError(self.blob, "gzip data is followed by bytes that are neither a gzip member nor zero "
                                 "padding (trailing garbage)")

    def finish(self) -> bytes:
        if self._member_has_input and not self._decoder.eof:
            tail = self._decoder.flush()
            if not self._decoder.eof:
                raise IntegrityError(self.blob, "gzip stream ends early (truncated blob or upload)")
            return tail
        if self.members == 0:
            raise IntegrityError(self.blob, "is marked gzip but holds no gzip data")
        return b""


@functools.cache
def sha256_is_faster() -> bool:
    """Whether this CPU hashes SHA-256 faster than MD5 (true with SHA extensions: EPYC, Sapphire Rapids)."""
    sample = bytes(range(256)) * 4096

    def rate(name: str) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            hashlib.new(name, sample).digest()
            best = min(best, time.perf_counter() - start)
        return best

    return rate("sha256") < rate("md5")


class Checks:
    """The checks one attempt runs (see the module docstring, point 3)."""

    def __init__(self, entry: BlobEntry, output_sha256: bool, range_md5: bool = False):
        self.entry = entry
        self.expected_size = entry.expected_size
        md5, stored_sha256 = entry.content_md5, entry.stored_sha256
        self.expected: str | None
        if stored_sha256 and (sha256_is_faster() or not md5):
            self.kind, self.expected = "sha256", stored_sha256
        elif md5:
            self.kind, self.expected = "md5", md5
        else:
            self.kind, self.expected = ("range-md5" if range_md5 else "none"), None
        self.stored = hashlib.new(self.kind) if self.expected else None
        self.expected_sha256 = entry.expected_sha256
        self.output = hashlib.sha256() if output_sha256 and self.expected_sha256 else None

    @property
    def label(self) -> str:
        parts = {"sha256": "stored SHA-256", "md5": "Content-MD5", "range-md5": "range MD5 (transfer only)",
                 "none": "nothing (empty blob)"}[self.kind]
        if self.entry.gzip:
            parts += " + gzip CRC-32"
        if self.output is not None:
            parts += " + SHA-256"
        return parts

    def verify(self, written: int) -> None:
        entry, expected_size = self.entry, self.expected_size
        if expected_size is not None and written != expected_size:
            raise IntegrityError(entry.name, f"size mismatch: got {written} bytes, metadata amlhpc_size says "
                                 f"{expected_size}")
        if self.stored is not None and self.expected is not None:
            got = self.stored.hexdigest() if self.kind == "sha256" else base64.b64encode(self.stored.digest()).decode()
            if got != self.expected:
                what = "amlhpc_stored_sha256" if self.kind == "sha256" else "Content-MD5"
                raise IntegrityError(entry.name, f"{what} mismatch: the stored bytes differ from what was uploaded "
                                     f"(got {got[:16]}..., expected {self.expected[:16]}...)")
        if (self.output is not None and self.expected_sha256 is not None
                and self.output.hexdigest() != self.expected_sha256):
            raise IntegrityError(entry.name, f"checksum mismatch: SHA-256 {self.output.hexdigest()[:16]}... but "
                                 f"metadata amlhpc_sha256 says {self.expected_sha256[:16]}...")
        if not entry.gzip and expected_size is None and written != entry.size:
            raise FetchError(entry.name, f"got {written} of {entry.size} bytes", transient=True)


META_KEYS = ("amlhpc_size", "amlhpc_sha256", "amlhpc_stored_sha256", gzmembers.META_MEMBERS,
             gzmembers.META_MEMBER_BYTES)
"""The metadata staging reads."""


def with_headers(entry: BlobEntry, headers, keys: tuple[str, ...] = META_KEYS) -> BlobEntry:
    """`entry` with the metadata `keys` a Get Blob / Get Blob Properties answer carries
    (x-ms-meta-<key>). Only these are looked up: http.client's headers are slow to walk."""
    found = {key: value for key in keys if (value := headers.get("x-ms-meta-" + key)) is not None}
    return BlobEntry.with_metadata(entry.name, entry.size, found, etag=entry.etag,
                                   content_encoding=entry.content_encoding, content_md5=entry.content_md5)


def file_matches_stored(path: str | Path, entry: BlobEntry) -> bool:
    """Whether a file holds exactly the blob's stored bytes (a blob staged as it is stored), by
    the stored SHA-256 when the blob has one, else its Content-MD5."""
    digest = hashlib.sha256() if entry.stored_sha256 else hashlib.md5()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(MAX_PIECE_BYTES):
                digest.update(chunk)
    except OSError:
        return False
    if entry.stored_sha256:
        return digest.hexdigest() == entry.stored_sha256
    return base64.b64encode(digest.digest()).decode() == entry.content_md5


def member_plan(entry: BlobEntry) -> tuple[list[int], int, int] | None:
    """(members' compressed sizes, member bytes, total) when the blob can be inflated in parallel, else None."""
    index, member_bytes, total = entry.members, entry.member_bytes, entry.expected_size
    if not (index and member_bytes and total is not None and entry.gzip):
        return None
    try:
        sizes = gzmembers.decode_index(index)
    except gzmembers.MemberError:
        return None
    count = max(1, -(-total // member_bytes))
    if len(sizes) != count or sum(sizes) != entry.size or count < 2:
        return None  # an index that does not add up: the stream path still verifies every member
    return sizes, member_bytes, total


class Fetcher:
    """Fetches blobs of one container; shares the HTTP and inflate pools and a bandwidth cap.

    range_bytes: stored bytes per ranged GET. window: ranged GETs in flight per file.
    attempts_transient / attempts_integrity: whole-blob attempts for network failures beyond
    the retry budget / for bytes that fail verification. on_bytes(stored, uncompressed):
    progress, called from worker threads.
    """

    def __init__(self, reader, http_pool: Executor, inflate_pool: Executor | None = None, *,
                 range_bytes: int = 8 << 20, window: int = 4, throttle: Throttle = UNLIMITED,
                 attempts_transient: int = 4, attempts_integrity: int = 2, retry_pause_s: float = 1.0,
                 verify_sha256: bool = False, deadline: Deadline = NO_DEADLINE,
                 on_bytes: Callable[[int, int], None] | None = None):
        self.reader = reader
        self.pool = http_pool
        self.inflate_pool = inflate_pool or http_pool
        self.range_bytes = range_bytes
        self.window = max(1, window)
        self.throttle = throttle
        self.attempts_transient = attempts_transient
        self.attempts_integrity = attempts_integrity
        self.retry_pause_s = retry_pause_s
        self.verify_sha256 = verify_sha256
        self.deadline = deadline
        self.on_bytes = on_bytes or (lambda stored, out: None)
        # What the one-stream path reads from a GET's answer: sizes, the stored digest (a sealed foreign
        # blob may have it and no Content-MD5), the output's SHA-256 when asked.
        self._stream_keys = ("amlhpc_size", "amlhpc_stored_sha256", *(("amlhpc_sha256",) if verify_sha256 else ()))

    def fetch(self, entry: BlobEntry, final_path: str | Path, partial_path: str | Path) -> FetchResult:
        """Fetch `entry` to `final_path` via `partial_path` (same filesystem; see the module docstring)."""
        transient_left, integrity_left = self.attempts_transient, self.attempts_integrity
        attempts, wasted = 0, 0
        while True:
            attempts += 1
            got = [0]
            try:
                stored, written, label = self._attempt(entry, final_path, partial_path, got)
                return FetchResult(entry.name, final_path, stored, written, attempts, wasted, label)
            except DeadlineExceeded:
                _unlink(partial_path)
                raise
            except IntegrityError:
                _unlink(partial_path)
                wasted += got[0]
                integrity_left -= 1
                if integrity_left <= 0:
                    raise
            except (FetchError, BlobReadError) as exc:
                _unlink(partial_path)
                wasted += got[0]
                if not exc.transient:
                    raise exc if isinstance(exc, FetchError) else FetchError(entry.name, _describe(exc)) from None
                transient_left -= 1
                if transient_left <= 0:
                    raise FetchError(entry.name, f"gave up after {attempts} attempts: {_describe(exc)}") from None
            except OSError as exc:  # our side: disk full, scratch gone
                _unlink(partial_path)
                raise FetchError(entry.name, f"cannot write {exc.filename or partial_path}: {exc.strerror or exc}") from None
            pause = self.retry_pause_s * attempts
            remaining = self.deadline.remaining()
            if remaining is not None:
                pause = min(pause, max(remaining, 0.0))
            clock.sleep(pause)
            self.deadline.check(f"fetching blob {entry.name!r}")

    def _attempt(self, entry: BlobEntry, final_path: str | Path, partial_path: str | Path, got: list[int]) -> tuple[int, int, str]:
        if not entry.metadata and entry.gzip and entry.size > self.range_bytes:
            # Listing leaves metadata out (a million blobs list faster without it); a large blob's
            # member index decides how it is fetched, so ask for it first.
            entry = with_headers(entry, self.reader.head(entry.name, etag=entry.etag, deadline=self.deadline))
        members = member_plan(entry)
        if members is not None:
            checks = Checks(entry, self.verify_sha256)
            written = self._members(entry, *members, checks, partial_path, got)
        else:
            written, checks = self._stream(entry, partial_path, got)
        checks.verify(written)
        try:
            os.replace(partial_path, final_path)
        except FileNotFoundError:
            Path(final_path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(partial_path, final_path)
        return got[0], written, checks.label

    # -- ranged GETs
    def _get(self, entry: BlobEntry, offset: int, length: int, range_md5: bool):
        self.throttle.acquire(length)
        data, headers = self.reader.get(entry.name, offset, length, etag=entry.etag, range_md5=range_md5,
                                        deadline=self.deadline)
        if range_md5:
            sent = headers.get("Content-MD5")
            if not sent:
                raise IntegrityError(entry.name, f"range {offset}+{length} came without the MD5 it was asked for")
            if base64.b64encode(hashlib.md5(data).digest()).decode() != sent:
                raise IntegrityError(entry.name, f"range {offset}+{length} does not match the MD5 the service sent")
        return data, headers

    def _in_order(self, entry: BlobEntry, ranges: list[tuple[int, int]], range_md5: bool, got: list[int],
                  window: int | None = None):
        """Yield each range's (bytes, headers) in order, up to `window` GETs ahead on the HTTP pool."""
        window = window or self.window
        if len(ranges) == 1:
            data, headers = self._get(entry, *ranges[0], range_md5)
            got[0] += len(data)
            yield data, headers
            return
        pending: deque[Future] = deque()
        following = iter(ranges)
        try:
            for offset, length in following:
                pending.append(self.pool.submit(self._get, entry, offset, length, range_md5))
                if len(pending) >= window:
                    break
            while pending:
                data, headers = pending.popleft().result()
                for offset, length in following:
                    pending.append(self.pool.submit(self._get, entry, offset, length, range_md5))
                    break
                got[0] += len(data)
                yield data, headers
        finally:
            for future in pending:
                future.cancel()

    # -- one stream, inflated in order
    def _stream(self, entry: BlobEntry, partial_path: str | Path, got: list[int]) -> tuple[int, Checks]:
        # Nothing known to check the stored bytes with: the service's MD5 of each range (<= 4 MiB).
        range_md5 = not entry.content_md5 and not entry.stored_sha256
        step = min(self.range_bytes, RANGE_MD5_LIMIT) if range_md5 else self.range_bytes
        ranges = [(o, min(step, entry.size - o)) for o in range(0, entry.size, step)]
        gunzip = Gunzip(entry.name) if entry.gzip else None
        checks: Checks | None = None
        written = 0
        ranged = self._in_order(entry, ranges, range_md5, got)
        with open(partial_path, "wb") as out, closing(ranged):
            for data, headers in ranged:
                if checks is None:  # the first answer carries the blob's metadata
                    checks = Checks(with_headers(entry, headers, self._stream_keys) if not entry.metadata else entry,
                                    self.verify_sha256, range_md5)
                if checks.stored is not None:
                    checks.stored.update(data)
                produced = 0
                for piece in (gunzip.feed(data) if gunzip else (data,)):
                    if checks.output is not None:
                        checks.output.update(piece)
                    out.write(piece)
                    produced += len(piece)
                written += produced
                self.on_bytes(len(data), produced)
            if checks is None:  # an empty blob: nothing was fetched
                checks = Checks(entry, self.verify_sha256, range_md5)
            if gunzip:
                tail = gunzip.finish()
                if tail:
                    if checks.output is not None:
                        checks.output.update(tail)
                    out.write(tail)
                    written += len(tail)
                    self.on_bytes(0, len(tail))
        return written, checks

    # -- many members, inflated in parallel
    def _members(self, entry: BlobEntry, sizes: list[int], member_bytes: int, total: int, checks: Checks,
                 partial_path: str | Path, got: list[int]) -> int:
        runs = _runs(sizes, member_bytes, total, self.range_bytes)
        workers = getattr(self.inflate_pool, "_max_workers", 2) or 2
        per_run = max(1, len(sizes) // len(runs))
        # Enough GETs ahead that every inflate thread has members waiting, and no more.
        window = max(self.window, -(-2 * workers // per_run))
        fd = os.open(partial_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        inflating: deque[Future] = deque()
        written = 0
        ranged = self._in_order(entry, [(run[0], run[1]) for run in runs], False, got, window)
        try:
            os.ftruncate(fd, total)
            for run, (data, _) in zip(runs, ranged, strict=True):
                if checks.stored is not None:
                    checks.stored.update(data)  # in order, on this thread, while members inflate elsewhere
                view = memoryview(data)
                for member in run[2]:  # one task per member: the unit of parallel work
                    inflating.append(self.inflate_pool.submit(self._inflate_member, fd, entry, view, member))
                while len(inflating) > 2 * workers:
                    written += inflating.popleft().result()
            while inflating:
                written += inflating.popleft().result()
        finally:
            ranged.close()
            for future in inflating:
                future.cancel()
            wait(inflating)  # never close the file under a running pwrite
            os.close(fd)
        if checks.output is not None:  # the deep check needs the output in order: read it back
            with open(partial_path, "rb") as handle:
                while chunk := handle.read(MAX_PIECE_BYTES):
                    checks.output.update(chunk)
        return written

    def _inflate_member(self, fd: int, entry: BlobEntry, view: memoryview, member: tuple) -> int:
        index, start, length, out_offset, out_length = member
        try:
            out = gzmembers.inflate_member(view[start:start + length], out_length, entry.name, index)
        except gzmembers.MemberError as exc:
            raise IntegrityError(entry.name, str(exc).split(": ", 1)[1]) from None
        os.pwrite(fd, out, out_offset)
        self.on_bytes(length, len(out))
        return len(out)


def _runs(sizes: list[int], member_bytes: int, total: int, range_bytes: int) -> list[tuple]:
    """Consecutive members grouped into runs of about `range_bytes` stored bytes, one GET each:
    (offset, length, [(member index, start in run, length, output offset, output length)])."""
    runs: list[tuple] = []
    offset = 0
    current: list[tuple] = []
    run_start = run_length = 0
    for index, size in enumerate(sizes):
        if current and run_length + size > range_bytes:
            runs.append((run_start, run_length, current))
            current, run_start, run_length = [], offset, 0
        out_offset = index * member_bytes
        current.append((index, run_length, size, out_offset, min(member_bytes, total - out_offset)))
        run_length += size
        offset += size
    runs.append((run_start, run_length, current))
    return runs


def _describe(exc: BaseException) -> str:
    text = str(exc)
    # blobhttp's messages start with what was requested ("blob 'x' bytes 0+5: ..."): keep the reason.
    if isinstance(exc, BlobReadError) and ": " in text:
        text = text.split(": ", 1)[1] if text.startswith("blob ") else text
    if isinstance(exc, BlobReadError) and exc.status == 404:
        return "not found (deleted after listing?); re-run staging"
    if isinstance(exc, TransientError | BlobReadError):
        return text
    if isinstance(exc, FetchError):
        return text.split(": ", 1)[1] if ": " in text else text
    return f"{type(exc).__name__}: {text[:300]}"


def _unlink(path: str | os.PathLike) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
