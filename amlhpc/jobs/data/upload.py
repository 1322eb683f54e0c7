"""Upload a local dataset directory to Blob, gzip-compressed, resumable.

Every file under LOCAL_DIR becomes the blob `<prefix>/<relative path>.gz` with
`Content-Encoding: gzip` and the metadata of docs/contracts.md section 5: `amlhpc_size`
(uncompressed bytes), `amlhpc_sha256` (of the uncompressed bytes), `amlhpc_mtime` (the
source's mtime in ns) and `amlhpc_stored_sha256` (of the stored, compressed bytes). Staging
(amlhpc/jobs/runtime/staging/stager.py) decompresses, drops the `.gz` and verifies every byte, so a round
trip is byte-exact. Every file is compressed, even one already compressed (a `.tar.gz` is
stored as `.tar.gz.gz` and staged back to `.tar.gz`): one rule keeps the round trip exact,
and gzip at isal's speed costs little on incompressible input.

A file larger than one member (8 MiB by default, `--member-mib`) is compressed as
independent gzip members of that many uncompressed bytes (amlhpc.jobs.runtime.blob.gzmembers), with
their compressed sizes in `amlhpc_members`: still one valid gzip file for any reader, and
staging inflates the members of one large file on every core.

Verification, the same scheme staging checks (amlhpc.jobs.runtime.blob.fetch): every Put Block and Put
Blob carries the MD5 of its body, which the service checks before it stores anything; the
committed blob's Content-MD5 is the MD5 of the whole stored stream (set on Put Block List,
computed by the service on Put Blob) and `amlhpc_stored_sha256` its SHA-256, so a reader
checks the stored bytes end to end with whichever digest its CPU computes faster, and
gzip's CRC-32 and length check the output.

Files are compressed in parallel (one file per worker thread; isal's deflate releases the
GIL) and streamed: a file is read, hashed and compressed in pieces, and the compressed
stream is sent as 8 MiB blocks (Put Block, several in flight per file) committed at the
end (Put Block List) with its metadata, so a blob appears complete or not at all and a
file never has to fit in memory. A file whose compressed form fits in one block goes up in
a single Put Blob.

Two writers (two uploads of one prefix, from one machine or two): every upload session
has its own random id, and its block ids carry it (`amlhpc-<session>-<index>`), so no
upload can stage a block under another's id. The commit is conditional on what the
listing showed: `If-None-Match: *` for a blob that was not there, `If-Match: <etag>` for
one that was. So of two uploads of one blob the first to commit wins whole, and the other
fails, naming the winner (session, host, pid, time from the winner's metadata), leaving
nothing of its own: a committed blob's bytes and its checksums always come from the same
writer, and at most one of the two exits 0 for that blob. The commit is the only step
that changes the blob; the steps before it (amlhpc.jobs.runtime.base.faultpoints names each one) leave
nothing a reader sees.

Resume: blobs already under the prefix are listed with their metadata first. A file is
skipped when its blob has the same `amlhpc_size`, `amlhpc_mtime`, `amlhpc_ctime` and
`amlhpc_inode` and was committed by an upload that could not interleave
(`amlhpc_upload_id`): a file rewritten with its size and mtime restored (rsync -a, tar -x,
a file system with coarse mtimes) has a new change time. When any of the three differs (a
fresh checkout, a copy, a blob of an upload that recorded no change time) the file is
hashed and, if `amlhpc_sha256` matches, only the blob's metadata is refreshed (conditional
on its etag too); anything else is uploaded again. `checksum` (`--checksum`) hashes every
file whatever its times say. A blob of an earlier uploader version (no `amlhpc_upload_id`: its fixed block ids
let two uploads mix their blocks) has its stored bytes read and compared with the
checksums it records: equal, it is marked verified and treated as above; different, it is
uploaded again. So a re-run repairs what a lost or failed upload left, without
`--rewrite`. `verify_stored` (`--verify-stored`) reads every blob that way, which repairs a
blob whose bytes changed after its upload (what staging refuses with "mismatch").
Blobs with no local file are reported and left alone: an upload never deletes data.
`--rewrite` uploads every file again.

Nothing is skipped in silence: symbolic links are followed (amlhpc.jobs.data.walk), and what
cannot be uploaded (a link loop, a dangling link, a FIFO, an unreadable file) is in the
report's `skipped`, with its reason; the command exits 1 for it unless `--allow-skips`.

Compression level: isal levels 0-3 (fast, the default 1) or zlib levels 4-9 (smaller
output, 10-30x slower). bench/RESULTS.md has the measurements behind the default.
"""

from __future__ import annotations

import base64
import hashlib
import mimetypes
import os
import secrets
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from amlhpc.jobs.data import remote
from amlhpc.jobs.data.remote import (  # re-exported: the CLI and tests use the uploader's names
    META_CTIME,
    META_INODE,
    META_MTIME,
    META_SHA256,
    META_SIZE,
    META_STORED_SHA256,
    META_UPLOAD_ID,
    META_UPLOADED_BY,
    RemoteBlob,
    list_remote,
    normalize_prefix,
)
from amlhpc.jobs.data.walk import LocalFile, Skipped, Walk
from amlhpc.jobs.data.walk import scan as walk_scan
from amlhpc.jobs.data.walk import shown as walk_shown
from amlhpc.jobs.runtime.base import clock, faultpoints
from amlhpc.jobs.runtime.base import workers as pools
from amlhpc.jobs.runtime.base.throttle import UNLIMITED, Throttle
from amlhpc.jobs.runtime.blob import gzmembers

try:
    from isal import isal_zlib

    HAVE_ISAL = True
except ImportError:  # pragma: no cover - isal is locked; this keeps a bare environment working
    isal_zlib = None  # type: ignore[assignment]
    HAVE_ISAL = False

GZIP_WBITS = 16 + zlib.MAX_WBITS
DEFAULT_LEVEL = 1
"""isal level 1: see bench/RESULTS.md (compression levels) for the measurement."""
READ_BYTES = 4 << 20
BLOCK_BYTES = 8 << 20
BLOCKS_IN_FLIGHT = 3
"""Put Block requests in flight per file: overlap the network with compressing the next block."""

Action = Literal["upload", "skip", "check", "verify"]


class UploadError(RuntimeError):
    """Some files could not be uploaded; the message lists them, `report` (when set) says what was done."""

    def __init__(self, message: str, report: UploadReport | None = None):
        super().__init__(message)
        self.report = report


class UploadConflict(UploadError):
    """Another writer changed the blob after this upload saw it; the message names the writer."""


def compressor(level: int):
    """A gzip compressobj: isal for levels 0-3 (zlib's level 1 when isal is missing), zlib for 4-9."""
    if not 0 <= level <= 9:
        raise ValueError(f"compression level {level} is outside 0-9")
    if level <= 3:
        if HAVE_ISAL:
            return isal_zlib.compressobj(level, isal_zlib.DEFLATED, GZIP_WBITS)
        return zlib.compressobj(max(level, 1), zlib.DEFLATED, GZIP_WBITS)
    return zlib.compressobj(level, zlib.DEFLATED, GZIP_WBITS)


def compressor_name(level: int) -> str:
    if level <= 3:
        return f"isal level {level}" if HAVE_ISAL else f"zlib level {max(level, 1)} (isal missing)"
    return f"zlib level {level}"


def scan_all(local_dir: Path) -> Walk:
    """Regular files under `local_dir` (following symlinks), sorted, and what was skipped, with why."""
    return walk_scan(local_dir)


def blob_name(prefix: str, rel: str) -> str:
    prefix = normalize_prefix(prefix)
    return f"{prefix}/{rel}.gz" if prefix else f"{rel}.gz"


def same_stat(local: LocalFile, remote_blob: RemoteBlob) -> bool:
    """Whether the blob records the file's mtime, change time and inode (see the module docstring)."""
    meta = remote_blob.metadata
    return (meta.get(META_MTIME) == str(local.mtime_ns) and meta.get(META_CTIME) == str(local.ctime_ns)
            and meta.get(META_INODE) == local.inode)


def stat_metadata(local: LocalFile) -> dict[str, str]:
    return {META_MTIME: str(local.mtime_ns), META_CTIME: str(local.ctime_ns), META_INODE: local.inode}


def decide(local: LocalFile, remote_blob: RemoteBlob | None, verify_stored: bool = False,
           checksum: bool = False) -> Action:
    """upload (missing, changed or unverifiable), skip (same size, mtime, change time and inode,
    written by an upload that cannot interleave), check (same size, any of those differs, or
    `checksum`: hash the file), verify (read the stored bytes first: an older uploader's blob,
    or `verify_stored`)."""
    if remote_blob is None or not remote_blob.gzip:
        return "upload"
    meta = remote_blob.metadata
    if meta.get(META_SIZE) != str(local.size) or not meta.get(META_SHA256) or remote_blob.stored_checksum is None:
        return "upload"
    if verify_stored or not meta.get(META_UPLOAD_ID):
        return "verify"
    return "skip" if same_stat(local, remote_blob) and not checksum else "check"


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ_BYTES):
            digest.update(chunk)
            if on_bytes:
                on_bytes(len(chunk))
    return digest.hexdigest()


@dataclass
class UploadReport:
    files: int = 0
    uploaded: int = 0
    unchanged: int = 0
    refreshed: int = 0
    """Same content, new mtime: only the metadata was updated."""
    verified: int = 0
    """Blobs whose stored bytes were read and found equal to their checksums (older uploads, --verify-stored)."""
    repaired: int = 0
    """Of the uploaded: blobs whose stored bytes differed from their checksums."""
    bytes_in: int = 0
    """Uncompressed bytes read from uploaded files."""
    bytes_stored: int = 0
    """Compressed bytes sent."""
    seconds: float = 0.0
    remote_only: list[str] = field(default_factory=list)
    """Blobs under the prefix with no local file (left alone)."""
    failures: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    """Of the failures: files another writer committed first (named in the message)."""
    skipped: list[Skipped] = field(default_factory=list)
    """Entries the walk met and could not upload (a link loop, a dangling link, ...), with the reason."""
    session: str = ""

    @property
    def ratio(self) -> float:
        return self.bytes_in / self.bytes_stored if self.bytes_stored else 0.0

    @property
    def mb_per_s(self) -> float:
        """Uncompressed MB/s through compress + upload."""
        return self.bytes_in / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, object]:
        return {"files": self.files, "uploaded": self.uploaded, "unchanged": self.unchanged, "refreshed": self.refreshed,
                "verified": self.verified, "repaired": self.repaired, "bytes_in": self.bytes_in, "bytes_stored": self.bytes_stored, "ratio": round(self.ratio, 3),
                "seconds": round(self.seconds, 3), "mb_per_s": round(self.mb_per_s, 2),
                "remote_only": len(self.remote_only), "failures": self.failures,
                "conflicts": self.conflicts, "skipped": [{"path": x.rel, "reason": x.reason} for x in self.skipped], "session": self.session}


class Progress:
    """Callbacks the uploader reports through (the CLI draws a rich bar from them)."""

    def start(self, files: int, total_bytes: int) -> None: ...

    def advance(self, uncompressed: int, stored: int) -> None: ...

    def file_done(self, rel: str, action: str) -> None: ...


def block_id(session: str, index: int) -> str:
    """The id of block `index` of one upload session: unique to the session, one length for all
    (the service wants every block id of a blob the same length)."""
    return base64.b64encode(f"amlhpc-{session}-{index:08d}".encode()).decode()


def new_session() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True)
class Seen:
    """What the listing showed of a blob: the commit is conditional on it."""

    etag: str | None
    """None: the blob did not exist (commit with If-None-Match: *)."""

    def conditions(self) -> dict:
        from azure.core import MatchConditions

        if self.etag is None:
            return {"match_condition": MatchConditions.IfMissing}
        return {"etag": self.etag, "match_condition": MatchConditions.IfNotModified}


class _FileUploader:
    def __init__(self, container, level: int, http: Executor, throttle: Throttle, progress: Progress,
                 session: str, block_bytes: int = BLOCK_BYTES, member_bytes: int = gzmembers.DEFAULT_MEMBER_BYTES):
        self.container = container
        self.level = level
        self.http = http
        self.throttle = throttle
        self.progress = progress
        self.session = session
        self.uploaded_by = remote.who()
        self.block_bytes = block_bytes
        self.member_bytes = member_bytes

    def _stage(self, blob, block: str, data: bytes) -> int:
        self.throttle.acquire(len(data))
        try:
            blob.stage_block(block, data, length=len(data), validate_content=True)
        except Exception as exc:
            if getattr(exc, "status_code", None) == 400 and str(getattr(exc, "error_code", "")) in FOREIGN_BLOCKS:
                raise UploadError(foreign_blocks_message(blob.blob_name)) from None
            raise
        faultpoints.reach("upload.after-stage-block", blob=blob.blob_name, session=self.session, block=block)
        return len(data)

    def upload(self, local: LocalFile, name: str, seen: Seen) -> tuple[int, int]:
        """Compress and upload one file, committing only if the blob is still what `seen` says;
        returns (uncompressed bytes, stored bytes)."""
        blob = self.container.get_blob_client(name)
        writer = gzmembers.MemberWriter(self.level, gzmembers.member_size_for(local.size, self.member_bytes),
                                        compressobj=lambda: compressor(self.level))
        digests = _Digests()
        stream = _BlockStream(blob, self)
        try:
            with open(local.path, "rb") as f:
                before = os.fstat(f.fileno())
                while chunk := f.read(READ_BYTES):
                    digests.source(chunk)
                    stream.add(digests.stored(writer.feed(chunk)), len(chunk))
                stream.add(digests.stored(writer.finish()), 0)
                after = os.fstat(f.fileno())
            if digests.read != local.size or (before.st_size, before.st_mtime_ns, before.st_ctime_ns) != (
                    after.st_size, after.st_mtime_ns, after.st_ctime_ns):
                raise UploadError(f"{local.rel}: changed while it was being uploaded; re-run the upload when it is stable")
            metadata = {META_SIZE: str(digests.read), META_SHA256: digests.sha256.hexdigest(),
                        **stat_metadata(local), META_STORED_SHA256: digests.stored_sha256.hexdigest(),
                        META_UPLOAD_ID: self.session, META_UPLOADED_BY: self.uploaded_by}
            if len(writer.sizes) > 1:
                metadata[gzmembers.META_MEMBER_BYTES] = str(writer.member_bytes)
                metadata[gzmembers.META_MEMBERS] = gzmembers.encode_index(writer.sizes)
            with _conflict_named(self.container, name, f"{local.rel}: not uploaded (nothing of this upload was kept)"):
                stream.commit(local.rel, metadata, digests.stored_md5.digest(), seen)
            faultpoints.reach("upload.after-commit", blob=name, session=self.session)
        finally:
            stream.cancel()
        return digests.read, stream.stored


FOREIGN_BLOCKS = ("InvalidBlobOrBlock", "InvalidBlockId", "BlobErrorCode.INVALID_BLOB_OR_BLOCK")


def foreign_blocks_message(name: str) -> str:
    """What a Put Block refused for leftover blocks means, and what to do (Put Block: every block id
    of one blob has one length; uncommitted blocks expire after 7 days; learn.microsoft.com/rest/
    api/storageservices/put-block and put-block-list, read 2026-11-28)."""
    return (f"blob {name!r} holds uncommitted blocks whose ids have another length than this uploader's, left by "
            "another tool or an older uploader that stopped before its commit; Azure refuses new blocks of another "
            "id length (400 InvalidBlobOrBlock) until those are discarded, which it does when the blob is next "
            "committed or deleted, or 7 days after they were staged. Upload the dataset as a new version (new blob "
            "names, drop --resume), or discard them by committing the blob (e.g. `az storage blob upload --overwrite` "
            "of any file to that name, then `az storage blob delete`) and re-run")


class _Digests:
    """SHA-256 of the source; SHA-256 and MD5 of the stored stream."""

    def __init__(self):
        self.sha256, self.stored_sha256, self.stored_md5 = hashlib.sha256(), hashlib.sha256(), hashlib.md5()
        self.read = 0

    def source(self, chunk: bytes) -> None:
        self.read += len(chunk)
        self.sha256.update(chunk)

    def stored(self, data: bytes) -> bytes:
        self.stored_sha256.update(data)
        self.stored_md5.update(data)
        return data


class _BlockStream:
    """The compressed stream of one blob: Put Block per full block (several in flight), then
    Put Block List; or a single Put Blob when it never fills a block."""

    def __init__(self, blob, uploader: _FileUploader):
        self.blob, self.up = blob, uploader
        self.buf = bytearray()
        self.block_ids: list[str] = []
        self.pending: list[Future] = []
        self.stored = 0

    def add(self, data: bytes, uncompressed: int) -> None:
        self.buf += data
        self.up.progress.advance(uncompressed, len(data))
        while len(self.buf) >= self.up.block_bytes:
            self._send(bytes(self.buf[: self.up.block_bytes]))
            del self.buf[: self.up.block_bytes]

    def _send(self, data: bytes) -> None:
        while len(self.pending) >= BLOCKS_IN_FLIGHT:
            self.stored += self.pending.pop(0).result()
        block = block_id(self.up.session, len(self.block_ids))
        self.block_ids.append(block)
        self.pending.append(self.up.http.submit(self.up._stage, self.blob, block, data))

    def commit(self, rel: str, metadata: dict[str, str], md5: bytes, seen: Seen) -> None:
        from azure.storage.blob import BlobBlock, ContentSettings

        settings = ContentSettings(content_type=mimetypes.guess_type(rel)[0] or "application/octet-stream",
                                   content_encoding="gzip", content_md5=bytearray(md5))
        if not self.block_ids:
            data = bytes(self.buf)
            self.up.throttle.acquire(len(data))
            faultpoints.reach("upload.before-commit", blob=self.blob.blob_name, session=self.up.session)
            # validate_content: the body's MD5 goes with it and the service checks it before storing.
            self.blob.upload_blob(data, length=len(data), overwrite=True, content_settings=settings, metadata=metadata,
                                  validate_content=True, max_concurrency=1, **seen.conditions())
            self.stored += len(data)
            return
        if self.buf:
            self._send(bytes(self.buf))
        for future in self.pending:
            self.stored += future.result()
        self.pending.clear()
        faultpoints.reach("upload.before-commit", blob=self.blob.blob_name, session=self.up.session)
        # The commit is what makes the new content visible, all at once, and only if the blob is
        # still what the listing showed; each block's MD5 was checked by the service when it was
        # staged, so the whole stream's MD5 is recorded here.
        self.blob.commit_block_list([BlobBlock(block_id=b) for b in self.block_ids], content_settings=settings,
                                    metadata=metadata, **seen.conditions())

    def cancel(self) -> None:
        for future in self.pending:
            future.cancel()


@contextmanager
def _conflict_named(container, name: str, what: str) -> Iterator[None]:
    """A write or read refused because the blob changed since it was listed becomes UploadConflict,
    naming who changed it (from the blob's metadata now)."""
    try:
        yield
    except Exception as exc:
        if not remote.is_conflict(exc):
            raise
        raise UploadConflict(f"{what}: blob {name!r} changed after this upload saw it "
                             f"({remote.writer_of(remote.current_properties(container, name))}); "
                             "re-run to compare it with your file") from None


def _verify_stored(container, blob: RemoteBlob, rel: str) -> bool:
    """Whether the blob's stored bytes equal the checksums it records (read under its etag)."""
    with _conflict_named(container, blob.name, f"{rel}: not checked"):
        md5_b64, sha_hex, _ = remote.stored_digests(container, blob.name, blob.etag)
    return remote.stored_bytes_match(blob, md5_b64, sha_hex)


def _set_metadata(container, blob: RemoteBlob, changes: dict[str, str], rel: str) -> RemoteBlob:
    """The blob's metadata with `changes`, if it is still the version `blob` describes."""
    from azure.core import MatchConditions

    metadata = {**blob.metadata, **changes}
    with _conflict_named(container, blob.name, f"{rel}: metadata not updated"):
        answer = container.get_blob_client(blob.name).set_blob_metadata(metadata, etag=blob.etag,
                                                                         match_condition=MatchConditions.IfNotModified)
    return RemoteBlob(blob.name, blob.size, answer.get("etag", blob.etag), blob.content_encoding, metadata,
                      blob.content_md5)


NAME_MAX_CHARS = 1024
NAME_MAX_SEGMENTS = 254
"""Azure's blob name limits (learn.microsoft.com/rest/api/storageservices/naming-and-referencing-containers--
blobs--and-metadata, read 2026-11-28): at most 1,024 characters and 254 path segments, and no
control characters (0x00-0x1F, U+0081, ...). Azurite accepts such names; Azure refuses them
with 400 only at the write, so they are checked before any byte moves."""


class NameLimitError(UploadError):
    """Blob names Azure would refuse; nothing was uploaded (bad input, exit 2)."""


def name_problem(name: str) -> str | None:
    """Why Azure refuses the blob name `name`, or None."""
    if len(name) > NAME_MAX_CHARS:
        return f"its blob name is {len(name):,} characters, over Azure's {NAME_MAX_CHARS:,}"
    segments = name.count("/") + 1
    if segments > NAME_MAX_SEGMENTS:
        return f"its blob name has {segments} path segments, over Azure's {NAME_MAX_SEGMENTS}"
    bad = next((c for c in name if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F), None)
    if bad is not None:
        return f"its name holds the control character U+{ord(bad):04X}, which Azure refuses in blob names"
    return None


def check_names(prefix: str, files: Iterable[LocalFile]) -> None:
    """NameLimitError naming every file whose blob name under `prefix` Azure would refuse."""
    problems = [f"{walk_shown(f.rel)}: {problem}" for f in files
                if (problem := name_problem(blob_name(prefix, f.rel))) is not None]
    if problems:
        shown = "\n  - ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise NameLimitError(f"{len(problems)} file(s) would get blob names Azure refuses (nothing was uploaded); "
                             f"rename them or shorten the prefix:\n  - {shown}{more}")


def upload_directory(container, local_dir: Path, prefix: str, *, workers: int | None = None, level: int = DEFAULT_LEVEL,
                     throttle: Throttle = UNLIMITED, progress: Progress | None = None,
                     block_bytes: int = BLOCK_BYTES, files: Iterable[LocalFile] | None = None,
                     member_bytes: int = gzmembers.DEFAULT_MEMBER_BYTES, rewrite: bool = False,
                     verify_stored: bool = False, skipped: Iterable[Skipped] | None = None,
                     session: str | None = None, checksum: bool = False) -> UploadReport:
    """Upload `local_dir` under `prefix` (see the module docstring); raises UploadError listing failures.
    `files`/`skipped`: a walk already made (the CLI's); `session`: this upload's id (default: random)."""
    progress = progress or Progress()
    started = clock.monotonic()
    if files is None:
        walked = walk_scan(local_dir)
        local_files, skipped = walked.files, walked.skipped
    else:
        local_files = list(files)
    session = session or new_session()
    check_names(prefix, local_files)
    remote_blobs = list_remote(container, prefix)
    report = UploadReport(files=len(local_files), skipped=list(skipped or ()), session=session)
    names = {f.rel: blob_name(prefix, f.rel) for f in local_files}
    report.remote_only = sorted(set(remote_blobs) - set(names.values()))
    actions = {f.rel: "upload" if rewrite else decide(f, remote_blobs.get(names[f.rel]), verify_stored, checksum)
               for f in local_files}
    work = [f for f in local_files if actions[f.rel] != "skip"]
    report.unchanged = len(local_files) - len(work)
    faultpoints.reach("upload.after-list", prefix=prefix, session=session)
    progress.start(len(work), sum(f.size for f in work))
    workers = workers or max(2, os.cpu_count() or 2)
    lock = threading.Lock()

    def count(**fields: int) -> None:
        with lock:
            for key, value in fields.items():
                setattr(report, key, getattr(report, key) + value)

    def handle(local: LocalFile) -> str:
        name = names[local.rel]
        known = remote_blobs.get(name)
        action = actions[local.rel]
        repaired = 0
        if action == "verify":
            assert known is not None  # verify and check are only planned for blobs the listing found
            if _verify_stored(container, known, local.rel):
                count(verified=1)
                if not known.metadata.get(META_UPLOAD_ID):  # an older upload's blob: mark it read and found whole
                    known = _set_metadata(container, known, {META_UPLOAD_ID: remote.VERIFIED_PREFIX + session}, local.rel)
                action = "skip" if same_stat(local, known) and not checksum else "check"
                if action == "skip":
                    return "verified"
            else:
                action, repaired = "upload", 1  # its bytes and its checksums disagree: this upload repairs it
        if action == "check":
            assert known is not None
            sha = sha256_file(local.path, lambda n: progress.advance(n, 0))
            if sha == known.metadata.get(META_SHA256):
                # Same bytes: record the new times so the next run skips without hashing.
                faultpoints.reach("upload.before-refresh", blob=name, session=session)
                if same_stat(local, known):  # --checksum on a file whose times say unchanged: it is
                    count(unchanged=1)
                    return "unchanged"
                _set_metadata(container, known, stat_metadata(local), local.rel)
                count(refreshed=1)
                return "refreshed"
        read, stored = uploader.upload(local, name, Seen(known.etag if known else None))
        count(uploaded=1, bytes_in=read, bytes_stored=stored, repaired=repaired)
        return "uploaded"

    with pools.pool(max(4, workers * BLOCKS_IN_FLIGHT), "put-block") as http, \
            pools.pool(workers, "gzip") as pool:
        uploader = _FileUploader(container, level, http, throttle, progress, session, block_bytes, member_bytes)
        queue = iter(sorted(work, key=lambda f: -f.size))  # big files first: a shorter tail
        futures: dict[Future, LocalFile] = {}
        try:
            while True:
                # A bounded number of files queued at once, however many the directory holds.
                while len(futures) < 4 * workers:
                    local = next(queue, None)
                    if local is None:
                        break
                    futures[pool.submit(handle, local)] = local
                if not futures:
                    break
                done, _ = wait(futures, return_when=FIRST_COMPLETED)
                for future in done:
                    local = futures.pop(future)
                    try:
                        progress.file_done(local.rel, future.result())
                    except UploadConflict as exc:
                        report.failures.append(str(exc))
                        report.conflicts.append(local.rel)
                    except UploadError as exc:
                        report.failures.append(str(exc))
                    except Exception as exc:  # noqa: BLE001 - collected per file, reported together
                        report.failures.append(f"{local.rel}: {describe_azure_error(exc)}")
        except KeyboardInterrupt:
            for future in futures:
                future.cancel()
            raise
    report.seconds = clock.monotonic() - started
    if report.failures:
        shown = "\n  - ".join(report.failures[:10])
        more = f"\n  ... and {len(report.failures) - 10} more" if len(report.failures) > 10 else ""
        raise UploadError(f"{len(report.failures)} of {len(work)} files failed (the others are uploaded; re-run to "
                          f"retry only what is missing):\n  - {shown}{more}", report)
    return report


def describe_azure_error(exc: BaseException) -> str:
    """One line for an SDK error, without request headers (which could carry a SAS)."""
    status = getattr(exc, "status_code", None)
    code = getattr(exc, "error_code", None)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    if type(exc).__name__ == "ClientAuthenticationError" or status == 403:
        return ("access denied: your identity needs 'Storage Blob Data Contributor' on the datasets account "
                "(add your object id to aml-hpc:storage.dataContributors in Pulumi.<stack>.yaml, then `pulumi up`)")
    tag = ", ".join(str(x) for x in (status, code) if x)
    return f"{type(exc).__name__}{f' ({tag})' if tag else ''}: {first}"
