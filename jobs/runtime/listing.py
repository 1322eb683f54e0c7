"""List a dataset's blobs fast: the List Blobs XML parsed straight into `BlobEntry` tuples.

A node staging a million small files lists them first (200 pages of 5,000), and every
process of the job derives the same assignment from that listing, so listing is on the
critical path of every job start. The storage SDK turns each blob into a model object
through its generic deserializer (30-40 us a blob, about as long as the rest of
staging's per-file work); here a page is cut at `</Blob>` and each blob's few fields are
found with `bytes.find` (about 5 us a blob), which bench/staging.py measures and
tests/test_listing.py holds against the SDK's own parse of a recorded page.

What is read, per blob (List Blobs response, learn.microsoft.com/rest/api/storageservices/
list-blobs, read 2026-11-23): Name (`Encoded="true"` names are percent-encoded, others
may hold character references such as `&#xD;`), Etag, Content-Length, Content-Encoding,
Content-MD5, and the metadata when the page has it (staging lists without: a third of the
bytes of a page, and it reads a blob's metadata from the answer to its GET). The fast path
takes each field with one regular-expression pass over the page, the four passes lining
up blob by blob because the service writes these elements for every blob in a fixed
order; a page that does not line up is parsed blob by blob instead. Folder markers (names
ending in '/', `hdi_isfolder=true` metadata, `ResourceType` directory on accounts with a
hierarchical namespace) are skipped.

Standard library only (the pages come from jobs.runtime.blobhttp).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable
from functools import partial
from operator import itemgetter
from urllib.parse import unquote

from jobs.runtime.fetch import BlobEntry

_SKIP = rb"[^<]*(?:<(?!%s)[^<]*)*"
"""Text and elements up to (not including) the given tag, without backtracking."""
# One match per blob: the service writes these elements for every blob, in this order (Name;
# Properties: Creation-Time, Last-Modified, Etag, [ResourceType], Content-Length, Content-Type,
# Content-Encoding, Content-Language, Content-CRC64, Content-MD5, ...), so one pass over a page
# finds them all. The skip to Etag cannot cross into the next blob.
_BLOB = re.compile(rb'<Blob><Name( Encoded="true")?>([^<]*)</Name>' + _SKIP % rb"Etag>|/Blob>"
                   + rb"<Etag>([^<]*)</Etag>(?:<ResourceType>[^<]*</ResourceType>)?"
                   rb"<Content-Length>(\d+)</Content-Length>"
                   rb"(?:<Content-Type>[^<]*</Content-Type>|<Content-Type ?/>)?"
                   rb"(?:<Content-Encoding>([^<]*)</Content-Encoding>|<Content-Encoding ?/>)?"
                   rb"(?:<Content-Language>[^<]*</Content-Language>|<Content-Language ?/>)?"
                   rb"(?:<Content-CRC64>[^<]*</Content-CRC64>|<Content-CRC64 ?/>)?"
                   rb"(?:<Content-MD5>([^<]*)</Content-MD5>|<Content-MD5 ?/>)?")
_METAS = re.compile(rb"</Properties>(?:<Metadata>(" + _SKIP % rb"/Metadata>" + rb")</Metadata>)?")
_FOLDER = b"<hdi_isfolder>true</hdi_isfolder>"
_GZIP = "gzip"


class ListingError(ValueError):
    """A page is not a List Blobs answer (the message says where it broke)."""


def _text(raw: bytes) -> str:
    text = raw.decode("utf-8")
    return html.unescape(text) if "&" in text else text


def _name(encoded: bytes, raw: bytes) -> str:
    return unquote(raw.decode("utf-8")) if encoded else _text(raw)


def parse_page(page: bytes, with_metadata: bool | None = None) -> tuple[list[BlobEntry], str | None]:
    """(entries in page order, next marker or None) for one List Blobs page. `with_metadata`:
    whether the listing asked for metadata (None: look; False saves a pass over the page)."""
    start = page.find(b"<Blobs>")
    if start < 0:
        if b"<Blobs/>" in page or b"<Blobs />" in page:
            return [], _marker(page)
        raise ListingError("no <Blobs> element: not a List Blobs answer")
    body = page[start:page.rfind(b"</Blobs>")]
    if body.find(b"<ResourceType>", 0, body.find(b"</Blob>")) >= 0:
        return _parse_page_slowly(body), _marker(page)  # a hierarchical namespace: folders are listed too
    blobs = _BLOB.findall(body)
    count = body.count(b"<Blob>")
    if with_metadata is None:
        with_metadata = b"<Metadata>" in body
    metas = _METAS.findall(body) if with_metadata else [b""] * len(blobs)
    lined_up = len(blobs) == count == len(metas)
    if lined_up and not (all(map(itemgetter(4), blobs)) and all(map(itemgetter(5), blobs))):
        # A blob without Content-Encoding or Content-MD5: make sure none sat where the pattern did not look.
        lined_up = (sum(1 for b in blobs if b[4]) == body.count(b"<Content-Encoding>")
                    and sum(1 for b in blobs if b[5]) == body.count(b"<Content-MD5>"))
    if not lined_up:
        return _parse_page_slowly(body), _marker(page)  # an unexpected layout: element by element
    names = _names(blobs)
    encodings = [_GZIP if b[4] == b"gzip" else (b[4].decode() if b[4] else None) for b in blobs]
    # tuple.__new__ straight from C: BlobEntry(...) or _make would run a Python call per blob.
    entries = list(map(_new_entry, zip(
        names, [int(b[3]) for b in blobs], [b[2].decode() for b in blobs], encodings,
        [b[5].decode() if b[5] else None for b in blobs], metas, strict=True)))
    if any(name.endswith("/") for name in names) or any(metas):
        entries = [e for e in entries if not (e.name.endswith("/") or (e.metadata and _FOLDER in e.metadata))]
    return entries, _marker(page)


_new_entry = partial(tuple.__new__, BlobEntry)


def _names(blobs: list[tuple[bytes, ...]]) -> list[str]:
    """Every blob's name: decoded in one call when none is percent-encoded or holds a
    character reference (the usual page), else one by one."""
    raw = b"\0".join(map(itemgetter(1), blobs))  # NUL cannot appear in XML text
    if any(map(itemgetter(0), blobs)) or b"&" in raw:
        return [_name(b[0], b[1]) for b in blobs]
    return raw.decode("utf-8").split("\0") if blobs else []


def _field(chunk: bytes, tag: bytes, start: int) -> bytes | None:
    """The text of `<tag>...</tag>` in `chunk` from `start`, None when absent or empty."""
    i = chunk.find(b"<" + tag + b">", start)
    if i < 0:
        return None
    i += len(tag) + 2
    return chunk[i:chunk.index(b"<", i)] or None


def _parse_page_slowly(body: bytes) -> list[BlobEntry]:
    """Blob by blob, each field found wherever it is in the blob's element."""
    entries: list[BlobEntry] = []
    for chunk in body[7:].split(b"</Blob>"):
        if not chunk.strip():
            continue
        try:
            i = chunk.index(b"<Name") + 5
            close = chunk.index(b">", i)
            name = _name(b'Encoded="true"' in chunk[i:close], chunk[close + 1:chunk.index(b"</Name>", close)])
            props = chunk.index(b"<Properties>", close)
            end = chunk.index(b"</Properties>", props)
            size = int(_field(chunk[:end], b"Content-Length", props) or 0)
            etag, encoding, md5, kind = (_field(chunk[:end], tag, props)
                                         for tag in (b"Etag", b"Content-Encoding", b"Content-MD5", b"ResourceType"))
        except ValueError:
            raise ListingError(f"a <Blob> element without Name/Properties near {chunk[:120]!r}") from None
        meta_at = chunk.find(b"<Metadata>", end)
        meta = chunk[meta_at + 10:chunk.index(b"</Metadata>", meta_at)] if meta_at >= 0 else b""
        if name.endswith("/") or _FOLDER in meta or kind == b"directory":
            continue
        entries.append(BlobEntry(name, size, etag.decode() if etag else None, encoding.decode() if encoding else None,
                                 md5.decode() if md5 else None, meta))
    return entries


def _marker(page: bytes) -> str | None:
    i = page.rfind(b"<NextMarker>")
    if i < 0:
        return None
    i += 12
    marker = page[i:page.index(b"<", i)]
    return _text(marker) if marker else None


def list_all(fetch_page: Callable[[str | None], bytes], with_metadata: bool | None = None) -> list[BlobEntry]:
    """Every entry, following NextMarker; `fetch_page(marker)` returns one page."""
    entries: list[BlobEntry] = []
    marker: str | None = None
    while True:
        page_entries, marker = parse_page(fetch_page(marker), with_metadata)
        entries.extend(page_entries)
        if not marker:
            return entries


def list_pages(pages: Iterable[bytes], with_metadata: bool | None = None) -> list[BlobEntry]:
    """Every entry of recorded or generated pages (tests, benchmarks)."""
    entries: list[BlobEntry] = []
    for page in pages:
        entries.extend(parse_page(page, with_metadata)[0])
    return entries
