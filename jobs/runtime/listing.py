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
Content-MD5 and the metadata our uploader writes (docs/contracts.md section 5). Folder
markers (names ending in '/', or metadata `hdi_isfolder=true` on accounts with a
hierarchical namespace) are skipped.

Standard library only (the pages come from jobs.runtime.blobhttp).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable
from urllib.parse import unquote

from jobs.runtime.fetch import BlobEntry

_METADATA_ITEM = re.compile(rb"<([^<>/\s]+)>([^<]*)</\1>")
_WANTED = {b"amlhpc_size", b"amlhpc_sha256", b"amlhpc_stored_sha256", b"amlhpc_members", b"amlhpc_member_bytes",
           b"hdi_isfolder"}


class ListingError(ValueError):
    """A page is not a List Blobs answer (the message says where it broke)."""


def _text(raw: bytes) -> str:
    text = raw.decode("utf-8")
    return html.unescape(text) if "&" in text else text


def _field(chunk: bytes, tag: bytes, start: int) -> bytes | None:
    """The text of `<tag>...</tag>` in `chunk` from `start`, None when absent or empty."""
    i = chunk.find(b"<" + tag + b">", start)
    if i < 0:
        return None
    i += len(tag) + 2
    return chunk[i:chunk.index(b"<", i)] or None


def parse_page(page: bytes) -> tuple[list[BlobEntry], str | None]:
    """(entries in page order, next marker or None) for one List Blobs page."""
    start = page.find(b"<Blobs>")
    if start < 0:
        if page.find(b"<Blobs/>") >= 0 or page.find(b"<Blobs />") >= 0:
            return [], _marker(page)
        raise ListingError("no <Blobs> element: not a List Blobs answer")
    end = page.rfind(b"</Blobs>")
    entries: list[BlobEntry] = []
    append = entries.append
    for chunk in page[start + 7:end].split(b"</Blob>"):
        if not chunk:
            continue
        try:
            i = chunk.index(b"<Name") + 5
            close = chunk.index(b">", i)
            raw_name = chunk[close + 1:chunk.index(b"</Name>", close)]
            name = unquote(raw_name.decode("utf-8")) if b'Encoded="true"' in chunk[i:close] else _text(raw_name)
            props = chunk.index(b"<Properties>", close)
            size = int(_field(chunk, b"Content-Length", props) or 0)
            etag = _field(chunk, b"Etag", props)
            encoding = _field(chunk, b"Content-Encoding", props)
            md5 = _field(chunk, b"Content-MD5", props)
            meta_at = chunk.find(b"<Metadata>", props)
        except ValueError:
            raise ListingError(f"a <Blob> element without Name/Properties near {chunk[:120]!r}") from None
        meta: dict[bytes, bytes] = {}
        if meta_at >= 0:
            meta = {k: v for k, v in _METADATA_ITEM.findall(chunk, meta_at, chunk.find(b"</Metadata>", meta_at))
                    if k in _WANTED}
            if meta.get(b"hdi_isfolder") == b"true":
                continue
        if name.endswith("/"):
            continue
        append(BlobEntry.from_listing(name, size, etag, encoding, md5, meta))
    return entries, _marker(page)


def _marker(page: bytes) -> str | None:
    i = page.rfind(b"<NextMarker>")
    if i < 0:
        return None
    i += 12
    marker = page[i:page.index(b"<", i)]
    return _text(marker) if marker else None


def list_all(fetch_page: Callable[[str | None], bytes]) -> list[BlobEntry]:
    """Every entry, following NextMarker; `fetch_page(marker)` returns one page."""
    entries: list[BlobEntry] = []
    marker: str | None = None
    while True:
        page_entries, marker = parse_page(fetch_page(marker))
        entries.extend(page_entries)
        if not marker:
            return entries


def list_pages(pages: Iterable[bytes]) -> list[BlobEntry]:
    """Every entry of recorded or generated pages (tests, benchmarks)."""
    entries: list[BlobEntry] = []
    for page in pages:
        entries.extend(parse_page(page)[0])
    return entries
