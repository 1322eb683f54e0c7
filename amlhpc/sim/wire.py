"""The Blob REST wire for staging's stdlib path: a connection that talks to the simulated service.

Staging reads Blob on `http.client` (amlhpc.jobs.runtime.blob.blobhttp.Reader: List Blobs
pages, Get Blob Properties, ranged Get Blob). The Reader takes a connection factory
(`connect=`); `Connection` here is what it gets in a simulation: `request()` records the
call, `getresponse()` sends it through the world's network (one attempt - the Reader
retries by itself) and answers as the service's REST API does: status, `x-ms-error-code`,
the headers the Reader reads (ETag, Content-Length, Content-Range, Content-MD5, Content-
Encoding, x-ms-meta-*, Retry-After) and, for a listing, the List Blobs XML in the
service's element order (what amlhpc.jobs.runtime.blob.listing's fast path expects). A
lost reply or a partition surfaces as the socket error a real connection raises.
"""

from __future__ import annotations

import base64
import email.message
import hashlib
import html
from email.utils import format_datetime
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from amlhpc.jobs.runtime.blob.blobio import RetrySettings
from amlhpc.sim.blobclient import STATUS_REASONS
from amlhpc.sim.blobservice import Reply
from amlhpc.sim.network import Dropped, Network, Unreachable


class Anonymous:
    """The Reader's auth for the simulated account: nothing to add (the simulation checks no identity)."""

    def apply(self, headers: dict[str, str]) -> str:
        return ""


class _Socket:
    def settimeout(self, _value: float) -> None:
        return None

    def setsockopt(self, *_args: Any) -> None:
        return None


class Response:
    """Enough of http.client.HTTPResponse for the Reader."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status = status
        self.reason = STATUS_REASONS.get(status, "Error")
        self.msg = email.message.Message()
        for key, value in headers.items():
            self.msg[key] = value
        self._body = body
        self._at = 0
        self.length: int | None = len(body)
        self._closed = False

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.msg.get(name, default)

    def read(self, amount: int | None = None) -> bytes:
        end = len(self._body) if amount is None else min(len(self._body), self._at + amount)
        piece, self._at = self._body[self._at:end], end
        self.length = len(self._body) - self._at
        if self._at >= len(self._body):
            self._closed = True
        return piece

    def read1(self, amount: int = -1) -> bytes:
        return self.read(None if amount < 0 else amount)

    def isclosed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True


class Connection:
    """One keep-alive connection of a Reader to the simulated account (see the module docstring)."""

    def __init__(self, network: Network, account: str, retry: RetrySettings):
        self.network, self.account, self.retry = network, account, retry
        self.sock: _Socket | None = None
        self._pending: tuple[str, str, dict[str, str]] | None = None

    def connect(self) -> None:
        self.sock = _Socket()

    def close(self) -> None:
        self.sock = None

    def request(self, method: str, url: str, headers: dict[str, str] | None = None) -> None:
        self._pending = (method, url, dict(headers or {}))

    def getresponse(self) -> Response:
        if self._pending is None:
            raise OSError("getresponse() without request()")
        method, url, headers = self._pending
        self._pending = None
        split = urlsplit(url)
        container, _, blob = split.path.lstrip("/").partition("/")
        blob = unquote(blob)
        query = {k: v[0] for k, v in parse_qs(split.query).items()}
        try:
            if query.get("comp") == "list":
                reply = self.network.send(self.account, "list_blobs", container=container, retry=self.retry,
                                          prefix=query.get("prefix", ""), marker=query.get("marker"),
                                          max_results=int(query.get("maxresults", "5000")),
                                          delimiter=query.get("delimiter"), metadata="metadata" in query.get("include", ""))
                return self._listing(reply, container)
            if method == "HEAD":
                reply = self.network.send(self.account, "get_properties", container=container, blob=blob,
                                          retry=self.retry, if_match=headers.get("If-Match"))
                return self._blob(reply, b"", head=True)
            offset, length = 0, None
            ranged = headers.get("x-ms-range") or headers.get("Range")
            if ranged:
                first, _, last = ranged.removeprefix("bytes=").partition("-")
                offset, length = int(first), int(last) - int(first) + 1
            reply = self.network.send(self.account, "get_blob", container=container, blob=blob, retry=self.retry,
                                      offset=offset, length=length, if_match=headers.get("If-Match"))
            body = reply.value if reply.ok else b""
            return self._blob(reply, body, md5=headers.get("x-ms-range-get-content-md5") == "true")
        except Unreachable as exc:
            self.sock = None
            raise ConnectionRefusedError(str(exc)) from None
        except Dropped as exc:
            self.sock = None
            if exc.applied:
                raise ConnectionResetError(str(exc)) from None
            raise TimeoutError(str(exc)) from None

    # --- answers ------------------------------------------------------------------------
    @staticmethod
    def _error(reply: Reply) -> Response:
        body = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{reply.code}</Code>'
                f"<Message>{html.escape(reply.message)}</Message></Error>").encode()
        return Response(reply.status, {"x-ms-error-code": reply.code, "Content-Type": "application/xml",
                                       "Content-Length": str(len(body)), **reply.headers}, body)

    def _blob(self, reply: Reply, body: bytes, head: bool = False, md5: bool = False) -> Response:
        if not reply.ok:
            return self._error(reply) if not head else Response(reply.status, {"x-ms-error-code": reply.code,
                                                                                **reply.headers}, b"")
        props: dict[str, Any] = reply.value if head else (reply.props or {})
        content = props["content"]
        headers = {"ETag": props["etag"], "Last-Modified": format_datetime(props["last_modified"], usegmt=True),
                   "Content-Length": str(props["size"] if head else len(body)), "x-ms-blob-type": "BlockBlob",
                   "Content-Type": content.get("content_type") or "application/octet-stream"}
        if content.get("content_encoding"):
            headers["Content-Encoding"] = content["content_encoding"]
        if content.get("content_md5") and (head or reply.status == 200):
            headers["Content-MD5"] = base64.b64encode(bytes(content["content_md5"])).decode()
        if md5 and reply.status == 206:
            headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()
        for key, value in (props["metadata"] or {}).items():
            headers[f"x-ms-meta-{key}"] = value
        return Response(reply.status, headers, b"" if head else body)

    def _listing(self, reply: Reply, container: str) -> Response:
        if not reply.ok:
            return self._error(reply)
        page = reply.value
        parts = [f'<?xml version="1.0" encoding="utf-8"?><EnumerationResults ServiceEndpoint="https://{self.account}'
                 f'.blob.core.windows.net/" ContainerName="{html.escape(container)}">']
        if page["prefix"]:
            parts.append(f"<Prefix>{html.escape(page['prefix'])}</Prefix>")
        if page["marker"]:
            parts.append(f"<Marker>{html.escape(page['marker'])}</Marker>")
        parts.append("<Blobs>")
        for item in page["items"]:
            if "prefix" in item:
                parts.append(f"<BlobPrefix><Name>{html.escape(item['prefix'])}</Name></BlobPrefix>")
                continue
            parts.append(_blob_xml(item, page["metadata"]))
        parts.append("</Blobs>")
        parts.append(f"<NextMarker>{html.escape(page['next_marker'])}</NextMarker>" if page["next_marker"]
                     else "<NextMarker />")
        parts.append("</EnumerationResults>")
        body = "".join(parts).encode()
        return Response(200, {"Content-Type": "application/xml", "Content-Length": str(len(body))}, body)


def _blob_xml(item: dict[str, Any], with_metadata: bool) -> str:
    content = item["content"]
    md5 = content.get("content_md5")

    def element(tag: str, value: str | None) -> str:
        return f"<{tag}>{html.escape(value)}</{tag}>" if value else f"<{tag} />"
    lease = item["lease"]
    fields = [
        f"<Blob><Name>{html.escape(item['name'])}</Name><Properties>",
        f"<Creation-Time>{format_datetime(item['creation_time'], usegmt=True)}</Creation-Time>",
        f"<Last-Modified>{format_datetime(item['last_modified'], usegmt=True)}</Last-Modified>",
        f"<Etag>{item['etag'].strip(chr(34))}</Etag>",
        f"<Content-Length>{item['size']}</Content-Length>",
        element("Content-Type", content.get("content_type") or "application/octet-stream"),
        element("Content-Encoding", content.get("content_encoding")),
        element("Content-Language", content.get("content_language")),
        "<Content-CRC64 />",
        element("Content-MD5", base64.b64encode(bytes(md5)).decode() if md5 else None),
        element("Cache-Control", content.get("cache_control")),
        element("Content-Disposition", content.get("content_disposition")),
        "<BlobType>BlockBlob</BlobType><AccessTier>Hot</AccessTier><AccessTierInferred>true</AccessTierInferred>",
        f"<LeaseStatus>{lease['status']}</LeaseStatus><LeaseState>{lease['state']}</LeaseState>",
        f"<LeaseDuration>{lease['duration']}</LeaseDuration>" if lease["duration"] else "",
        "<ServerEncrypted>true</ServerEncrypted></Properties>",
    ]
    if with_metadata:
        meta = "".join(f"<{k}>{html.escape(v)}</{k}>" for k, v in item["metadata"].items())
        fields.append(f"<Metadata>{meta}</Metadata>" if meta else "<Metadata />")
    fields.append("<OrMetadata /></Blob>")
    return "".join(fields)
