"""List a dataset's blobs fast: the List Blobs XML parsed straight into `BlobEntry` tuples.

A node staging a million small files lists them first (200 pages of 5,000), and every
process of the job derives the same assignment from that listing, so listing is on the
critical path of every job start. The storage SDK turns each blob into a model object
through its generic deserializer (30-40 us a blob, about as long as the rest of
staging's per-file work); here one regular-expression pass over a page finds every blob's
fields and the entries are built from the columns in C (about 3 us a blob in all, a
second of it the pass), which bench/listing.py measures and tests/test_listing.py holds
against the SDK's own parse of a recorded page.

What is read, per blob (List Blobs response, learn.microsoft.com/rest/api/storageservices/
list-blobs, read 2026-11-23): Name (`Encoded="true"` names are percent-encoded, others
may hold character references such as `&#xD;`), Etag, Content-Length, Content-Encoding,
Content-MD5, and the metadata when the page has it (staging lists without: a third of the
bytes of a page, and it reads a blob's metadata from the answer to its GET). The fast path
matches once per `<Blob>`, taking the fields in the fixed order the service writes them;
a blob laid out otherwise, or a Content-Encoding or Content-MD5 found where the pattern
did not look, sends the page blob by blob instead. Folder markers (empty blobs whose names
end in '/', `hdi_isfolder=true` metadata, `ResourceType` directory on accounts with a
hierarchical namespace) are skipped; a blob named like a folder that holds bytes is data
and kept (amlhpc.jobs.runtime.staging.datadir says where it lands). A listing is built with the garbage collector paused (see
`_collector_paused`).

Standard library only (the pages come from amlhpc.jobs.runtime.blob.blobhttp).
"""

from __future__ import annotations

import gc
import html
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from urllib.parse import unquote

from amlhpc.jobs.runtime.blob.fetch import BlobEntry

_SKIP = rb"[^<]*+(?:<(?!%s)[^<]*+)*+"
"""Text and elements up to (not including) the given tag, without backtracking."""
_USUAL_HEAD = rb"<Properties><Creation-Time>[^<]*+</Creation-Time><Last-Modified>[^<]*+</Last-Modified>"
"""What the service writes between Name and Etag (the recorded pages): cheaper to match than to skip."""


def _optional(tag: bytes, capture: bool = False) -> bytes:
    """`<tag>text</tag>`, `<tag/>` or nothing; an empty alternative costs the engine less than `?`."""
    text = rb"([^<]*+)" if capture else rb"[^<]*+"
    return rb"(?:<%s>%s</%s>|<%s ?/>|)" % (tag, text, tag, tag)


# One match per <Blob>: the service writes these elements for every blob, in this order (Name;
# Properties: Creation-Time, Last-Modified, Etag, [ResourceType], Content-Length, Content-Type,
# Content-Encoding, Content-Language, Content-CRC64, Content-MD5, ...), so one pass over a page
# finds them all. A blob laid out otherwise still matches, by the empty alternative: all its
# fields come back empty (Content-Length is never empty), which sends the page blob by blob.
# The skip to Etag cannot cross into the next blob, so every <Blob> has exactly one match.
_BLOB = re.compile(rb'<Blob>(?:<Name( Encoded="true"|)>([^<]*+)</Name>(?:' + _USUAL_HEAD + rb"|"
                   + _SKIP % rb"Etag>|/?Blob>" + rb")<Etag>([^<]*+)</Etag>(?:<ResourceType>[^<]*+</ResourceType>|)"
                   rb"<Content-Length>(\d++)</Content-Length>" + _optional(b"Content-Type")
                   + _optional(b"Content-Encoding", capture=True) + _optional(b"Content-Language")
                   + _optional(b"Content-CRC64") + _optional(b"Content-MD5", capture=True) + rb"|)")
_METAS = re.compile(rb"</Properties>(?:<Metadata>(" + _SKIP % rb"/Metadata>" + rb")</Metadata>)?")
_FOLDER = b"<hdi_isfolder>true</hdi_isfolder>"
_GZIP = "gzip"
_ENCODINGS = {"": None, "gzip": _GZIP}
"""Content-Encoding as read -> as kept: empty is None, and a million "gzip"s share one string."""
_EMPTY_IS_NONE = {"": None}
_new_entry = partial(tuple.__new__, BlobEntry)


class ListingError(ValueError):
    """A page is not a List Blobs answer (the message says where it broke)."""


def _text(raw: bytes) -> str:
    text = raw.decode("utf-8")
    return html.unescape(text) if "&" in text else text


def _name(encoded: bytes | bool, raw: bytes) -> str:
    """`encoded`: the Encoded attribute's match (bytes) or whether it was present."""
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
    if with_metadata is None:
        with_metadata = b"<Metadata>" in body
    metas = _METAS.findall(body) if with_metadata else [b""] * len(blobs)
    if not blobs:
        return [], _marker(page)
    encoded, raw_names, etags, sizes, encodings, md5s = zip(*blobs, strict=True)
    lined_up = b"" not in sizes and len(metas) == len(blobs)
    if lined_up and (b"" in encodings or b"" in md5s):
        # A blob without Content-Encoding or Content-MD5: make sure none sat where the pattern did not look.
        lined_up = (len(encodings) - encodings.count(b"") == body.count(b"<Content-Encoding>")
                    and len(md5s) - md5s.count(b"") == body.count(b"<Content-MD5>"))
    if not lined_up:
        return _parse_page_slowly(body), _marker(page)  # an unexpected layout: element by element
    names = _names(encoded, raw_names)
    encoding_texts, md5_texts = _texts(encodings), _texts(md5s)
    # tuple.__new__ straight from C: BlobEntry(...) or _make would run a Python call per blob.
    entries = list(map(_new_entry, zip(
        names, map(int, sizes), _texts(etags), map(_ENCODINGS.get, encoding_texts, encoding_texts),
        map(_EMPTY_IS_NONE.get, md5_texts, md5_texts), metas, strict=True)))
    if any(name.endswith("/") for name in names) or any(metas):
        entries = [e for e in entries if not ((e.name.endswith("/") and not e.size) or (e.metadata and _FOLDER in e.metadata))]
    return entries, _marker(page)


def _texts(raw: tuple[bytes, ...]) -> list[str]:
    """Each field decoded, in one call for all of them (NUL cannot appear in XML text)."""
    return b"\0".join(raw).decode("utf-8").split("\0")


def _names(encoded: tuple[bytes, ...], raw: tuple[bytes, ...]) -> list[str]:
    """Every blob's name: decoded in one call when none is percent-encoded or holds a
    character reference (the usual page), else one by one."""
    joined = b"\0".join(raw)
    if any(encoded) or b"&" in joined:
        return [_name(e, r) for e, r in zip(encoded, raw, strict=True)]
    return joined.decode("utf-8").split("\0")


def _field(chunk: bytes, tag: bytes, start: int) -> bytes | None:
    """The text of `<tag>...</tag>` in `chunk` from `start`, None when absent or empty."""
    i = chunk.find(b"<" + tag + b">", start)
    if i < 0:
        return None
    i += len(tag) + 2
    return chunk[i:chunk.index(b"<", i)] or None


_BLOB_PREFIX = re.compile(rb"<BlobPrefix>.*?</BlobPrefix>", re.S)
"""A listing with a delimiter names virtual folders between the blobs: no blobs themselves."""


def _parse_page_slowly(body: bytes) -> list[BlobEntry]:
    """Blob by blob, each field found wherever it is in the blob's element."""
    entries: list[BlobEntry] = []
    if b"<BlobPrefix>" in body:
        body = _BLOB_PREFIX.sub(b"", body)
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
        if (name.endswith("/") and not size) or _FOLDER in meta or kind == b"directory":
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
    with _collector_paused():
        while True:
            page_entries, marker = parse_page(fetch_page(marker), with_metadata)
            entries.extend(page_entries)
            if not marker:
                return entries


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a listing is built, as it was after. Entries
    hold no containers, so they make no cycle, yet a full collection rescans every entry
    built so far, and CPython runs one whenever the objects that outlived the younger
    generations grew by a quarter since the last (Include/internal/pycore_gc.h, 3.11):
    a million entries cost about a second of collections (bench/listing.py). Paused, they
    are scanned once or twice after, whatever the listing's size."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
