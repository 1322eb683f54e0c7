"""Large files as independent gzip members, so staging inflates one file on many cores.

One gzip stream inflates on one core (about 0.3 GB/s of output on these CosmoFlow-like
volumes with isal), so a single large file stages at that rate however many cores a node
has. `jobs data upload` therefore compresses a file larger than one member as a sequence
of gzip members of `member_bytes` uncompressed bytes each (the last one shorter). That is
still one valid gzip file: gzip readers decompress concatenated members as one stream
(RFC 1952 section 2.2, "a gzip file consists of a series of members"). The compressed
size of every member goes into the blob's metadata, so staging knows where each member
starts without reading the file, fetches runs of whole members with ranged GETs and
inflates them in parallel, each member checked by its own CRC-32 and length trailer.

Metadata (docs/contracts.md section 5):
    amlhpc_member_bytes  uncompressed bytes per member (every member but the last)
    amlhpc_members       base64 of the members' compressed sizes, little-endian uint32

Blob metadata holds at most 8 KiB (Set Blob Metadata, learn.microsoft.com/rest/api/
storageservices/set-blob-metadata, read 2026-11-23), so a file never gets more than
MAX_MEMBERS members: a larger file gets larger members (`member_size_for`).

Standard library plus isal (zlib when isal is missing).
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Callable
from typing import Protocol, cast

try:  # isal's deflate and inflate are 2-3x zlib's; the image ships it.
    from isal import isal_zlib as _zlib

    INFLATE_LIBRARY = "isal"
except ImportError:  # pragma: no cover - only where isal is absent
    # zlib has the API isal_zlib mirrors; mypy only allows one module per name without the annotation
    # that would turn every use into Any.
    _zlib = zlib  # type: ignore[misc]
    INFLATE_LIBRARY = "zlib"

zlib_impl = _zlib
"""isal_zlib where installed, else zlib: the deflate and inflate every blob module uses."""
ZLIB_ERRORS: tuple[type[Exception], ...] = (zlib.error, cast("type[Exception]", _zlib.error))
"""What a corrupt stream raises. isal's stubs declare `error` as an instance, hence the cast."""


class Compressor(Protocol):
    """What zlib's and isal's compressobj() return, as far as a member writer uses it."""

    def compress(self, data: bytes | memoryview, /) -> bytes: ...
    def flush(self) -> bytes: ...

GZIP_WBITS = 16 + zlib.MAX_WBITS
DEFAULT_MEMBER_BYTES = 8 << 20
"""8 MiB of input per member: ~1.7 MiB stored at CosmoFlow's ratio, many members per GB."""
MAX_MEMBERS = 1024
"""1024 sizes are 5.5 KB of base64: room left under the 8 KiB metadata limit."""
META_MEMBER_BYTES = "amlhpc_member_bytes"
META_MEMBERS = "amlhpc_members"


class MemberError(ValueError):
    """A member does not inflate to what the index says (corrupt data or a wrong index)."""


def member_size_for(file_bytes: int, member_bytes: int = DEFAULT_MEMBER_BYTES) -> int:
    """Member size for a file: `member_bytes`, or larger (whole MiB) so there are at most MAX_MEMBERS."""
    needed = -(-file_bytes // MAX_MEMBERS)
    if needed <= member_bytes:
        return member_bytes
    return -(-needed // (1 << 20)) * (1 << 20)


def encode_index(sizes: list[int]) -> str:
    return base64.b64encode(struct.pack(f"<{len(sizes)}I", *sizes)).decode("ascii")


def decode_index(text: str) -> list[int]:
    """Compressed member sizes; MemberError when the text is not a valid index."""
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise MemberError("amlhpc_members is not base64") from None
    if not raw or len(raw) % 4:
        raise MemberError("amlhpc_members does not hold whole uint32 sizes")
    sizes = list(struct.unpack(f"<{len(raw) // 4}I", raw))
    if any(s < 18 for s in sizes):  # a gzip member is at least a 10-byte header and an 8-byte trailer
        raise MemberError("amlhpc_members names a member shorter than a gzip header and trailer")
    return sizes


class MemberWriter:
    """Compress a stream into members: feed() uncompressed bytes, get compressed bytes back."""

    def __init__(self, level: int, member_bytes: int, compressobj: Callable[[], Compressor] | None = None):
        self.member_bytes = member_bytes
        self._new: Callable[[], Compressor] = compressobj or (
            lambda: _zlib.compressobj(level, _zlib.DEFLATED, GZIP_WBITS))
        self._comp: Compressor | None = None
        self._in_member = 0
        self._member_stored = 0
        self.sizes: list[int] = []

    def feed(self, data: bytes) -> bytes:
        out = []
        view = memoryview(data)
        while len(view):
            if self._comp is None:
                self._comp = self._new()
                self._in_member = self._member_stored = 0
            take = min(len(view), self.member_bytes - self._in_member)
            piece = self._comp.compress(view[:take])
            self._member_stored += len(piece)
            out.append(piece)
            self._in_member += take
            view = view[take:]
            if self._in_member == self.member_bytes:
                out.append(self._close_member())
        return b"".join(out)

    def _close_member(self) -> bytes:
        assert self._comp is not None, "a member is open"
        tail = self._comp.flush()
        self.sizes.append(self._member_stored + len(tail))
        self._comp = None
        return tail

    def finish(self) -> bytes:
        """The last member's end (an empty file still becomes one empty member)."""
        if self._comp is None and self.sizes:
            return b""
        if self._comp is None:
            self._comp = self._new()
            self._member_stored = 0
        return self._close_member()


def inflate_member(data: bytes | memoryview, expected: int, blob: str, index: int) -> bytes:
    """Exactly one gzip member -> its bytes; its CRC-32 and length trailer are checked by the
    inflater, its length against the index, and nothing may follow it."""
    decoder = _zlib.decompressobj(wbits=GZIP_WBITS)
    try:
        out = decoder.decompress(data, expected + 1)
    except ZLIB_ERRORS as exc:
        raise MemberError(f"blob {blob!r}: member {index} is corrupt ({exc})") from None
    if not decoder.eof:
        if len(out) > expected:
            raise MemberError(f"blob {blob!r}: member {index} inflates to more than the {expected} bytes the index says")
        raise MemberError(f"blob {blob!r}: member {index} ends early (truncated)")
    if decoder.unused_data:
        raise MemberError(f"blob {blob!r}: member {index} is followed by {len(decoder.unused_data)} stray bytes")
    if len(out) != expected:
        raise MemberError(f"blob {blob!r}: member {index} holds {len(out)} bytes, the index says {expected}")
    return out
