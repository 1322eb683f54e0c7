"""Staging's Blob reads on the standard library's HTTP client: listing pages and ranged GETs.

Why not the storage SDK on this path: a small GET costs 3.5-3.9 client CPU-ms through
`download_blob`, 2.3-2.9 through the SDK's pipeline and about 0.5 on `http.client` with
a persistent connection (measured on 2 cores against Azurite, bench/RESULTS.md), and
listing through the SDK deserialises every property of every blob (30-40 us a blob). A
node staging 20,000 small files, or listing a million, feels both. Writes (uploads,
checkpoints) stay on the SDK.

- `Reader(container_url, auth, retry)`: one per container, shared by threads; each thread
  keeps its own keep-alive connection.
- Auth: `SasAuth` for a connection string (Azurite): a read+list container SAS made with
  the account key by the SDK's `generate_container_sas`, remade before it expires;
  `BearerAuth` for Azure: an Entra ID token for https://storage.azure.com/.default from the
  node's credential (its managed identity), refreshed before it expires. Neither the SAS
  nor the token is ever part of a message: URLs are shown without their query.
- Retries, per request, with `blobio.RetrySettings`' budget and backoff: connection errors
  before an answer, 408, 429, 500, 502, 503 and 504. A `Retry-After` header is obeyed (up
  to `max_retry_after_s`). A body that breaks off is asked for again, the same range or
  page, up to the `read` budget; after that it is `TransientError` for the caller.
- Deadline: a read of a body returns after at most one socket read (`read_timeout_s`
  without a byte aborts it) and the deadline is checked between reads, so a server that
  drips a byte every few seconds cannot hold a request past the deadline.

Standard library plus azure-storage-blob (for the SAS) / azure-identity (for the token).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable
from email.utils import formatdate
from urllib.parse import quote, urlencode, urlsplit

from amlhpc.jobs.runtime.base import clock
from amlhpc.jobs.runtime.base.contract import BLOB_READ_SAS as READ_SAS_VARIABLE
from amlhpc.jobs.runtime.blob import blobio

API_VERSION = "2025-11-05"
"""x-ms-version of every request (Blob REST API; Azurite 3.37 accepts it)."""
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
READ_PIECE = 1 << 20
"""Largest piece asked of the socket at once while reading a body."""
TOKEN_SCOPE = "https://storage.azure.com/.default"


class BlobReadError(Exception):
    """A request failed for good. `status`/`code` as the service answered; never holds a secret."""

    def __init__(self, message: str, status: int = 0, code: str = "", transient: bool = False):
        super().__init__(message)
        self.status = status
        self.code = code
        self.transient = transient


class TransientError(BlobReadError):
    """Worth another try by the caller: a body cut short, retries used up on a flaky link."""

    def __init__(self, message: str, status: int = 0, code: str = ""):
        super().__init__(message, status, code, transient=True)


class DeadlineExceeded(Exception):
    """The caller's deadline passed while a request was under way."""


class Deadline:
    """A point in clock.monotonic() (amlhpc.jobs.runtime.base.clock); None-safe helpers for code that may have no deadline."""

    def __init__(self, seconds: float | None):
        self.at = clock.monotonic() + seconds if seconds is not None else None
        self.seconds = seconds

    def remaining(self) -> float | None:
        return None if self.at is None else self.at - clock.monotonic()

    def passed(self) -> bool:
        return self.at is not None and clock.monotonic() >= self.at

    def check(self, what: str) -> None:
        if self.passed():
            raise DeadlineExceeded(f"the staging deadline of {self.seconds:.0f}s passed while {what}")


NO_DEADLINE = Deadline(None)


# ------------------------------------------------------------------ auth


class SasAuth:
    """A container SAS (read, list) signed with the connection string's account key."""

    VALID_S = 6 * 3600.0

    def __init__(self, account: str, key: str, container: str):
        self._account, self._key, self._container = account, key, container
        self._lock = threading.Lock()
        self._query = ""
        self._renew_at = 0.0

    def apply(self, headers: dict[str, str]) -> str:
        """Add headers, return the query string to append (without '?')."""
        with self._lock:
            if time.time() >= self._renew_at:
                self._query = _container_read_sas(self._account, self._key, self._container, self.VALID_S)
                self._renew_at = time.time() + self.VALID_S / 2
            return self._query


def _container_read_sas(account: str, key: str, container: str, valid_s: float) -> str:
    """A read+list SAS of `container`, valid from 5 minutes ago for `valid_s` seconds."""
    from datetime import UTC, datetime, timedelta

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    now = datetime.now(UTC)
    return generate_container_sas(account, container, account_key=key,
                                  permission=ContainerSasPermissions(read=True, list=True),
                                  start=now - timedelta(minutes=5), expiry=now + timedelta(seconds=valid_s))


class StaticSasAuth:
    """A SAS given whole (contract.BLOB_READ_SAS: the launcher's, read-only, for the training)."""

    def __init__(self, query: str):
        self._query = query.lstrip("?")

    def apply(self, headers: dict[str, str]) -> str:
        return self._query


def read_sas(environ, container: str, valid_s: float = 24 * 3600.0) -> str | None:
    """A read+list SAS of `container` signed with the connection string's key, None without one:
    what the launcher gives the training in place of the key (contract.BLOB_READ_SAS)."""
    connection_string = environ.get(blobio.CONNECTION_STRING_VARIABLE) or None
    if not connection_string:
        return None
    parts = blobio.parse_connection_string(connection_string)
    if not parts.account_name or not parts.account_key:
        return None
    return _container_read_sas(parts.account_name, parts.account_key, container, valid_s)


class BearerAuth:
    """An Entra ID token from an azure-identity credential, refreshed 5 minutes before it expires."""

    def __init__(self, credential):
        self._credential = credential
        self._lock = threading.Lock()
        self._token = ""
        self._expires = 0.0

    def apply(self, headers: dict[str, str]) -> str:
        with self._lock:
            if time.time() > self._expires - 300:
                token = self._credential.get_token(TOKEN_SCOPE)
                self._token, self._expires = token.token, float(token.expires_on)
            headers["Authorization"] = f"Bearer {self._token}"
        # The service wants a request date with a token; one second of resolution is plenty.
        headers["x-ms-date"] = formatdate(usegmt=True)
        return ""


def auth_from_env(container: str, account_url: str | None, env) -> tuple[str, SasAuth | StaticSasAuth | BearerAuth]:
    """(container URL, auth): Azurite through the connection-string variable (or the read-only SAS
    the launcher gives the training instead), else Azure with the credential."""
    connection_string = env.get(blobio.CONNECTION_STRING_VARIABLE) or None
    if connection_string:
        parts = blobio.parse_connection_string(connection_string)
        if not parts.account_name or not parts.account_key:
            raise blobio.BlobConfigError("the Blob connection string has no AccountName/AccountKey; staging reads "
                                         "with a SAS made from the key")
        return f"{parts.blob_endpoint}/{container}", SasAuth(parts.account_name, parts.account_key, container)
    given = env.get(READ_SAS_VARIABLE) or None
    if given and account_url:  # the training under Azurite: the launcher's read-only SAS, never the key
        return f"{blobio.safe_endpoint(account_url)}/{container}", StaticSasAuth(given)
    if not account_url:
        raise blobio.BlobConfigError(
            f"no Blob endpoint for container {container!r}: give the account URL (the stack output "
            f"storage.blobEndpoint) or set {blobio.CONNECTION_STRING_VARIABLE} for Azurite")
    if not account_url.startswith("https://"):
        # A bearer token sent over plain http can be read and replayed by anyone on the path
        # (azure-core's BearerTokenCredentialPolicy refuses non-TLS URLs for the same reason).
        raise blobio.BlobConfigError(f"account URL {blobio.safe_endpoint(account_url)!r} must start with https://: "
                                     "an Entra ID token is never sent over plain http (Azurite: set "
                                     f"{blobio.CONNECTION_STRING_VARIABLE})")
    return f"{blobio.safe_endpoint(account_url)}/{container}", BearerAuth(blobio.credential_from_env(env))


# ------------------------------------------------------------------ the reader


class Reader:
    """Reads one container (see the module docstring). Thread-safe."""

    def __init__(self, container_url: str, auth, retry: blobio.RetrySettings | None = None,
                 sleep: Callable[[float], None] = clock.sleep,
                 connect: Callable[[], http.client.HTTPConnection] | None = None):
        """`connect`: makes this thread's connection (None: http.client to the URL's host; a
        simulation passes its own, amlhpc.sim.wire)."""
        split = urlsplit(container_url)
        self.container_url = container_url.rstrip("/")
        self.shown_url = blobio.safe_endpoint(container_url)
        self._https = split.scheme == "https"
        self._host = split.hostname or ""
        self._port = split.port or (443 if self._https else 80)
        self._path = split.path.rstrip("/")
        if isinstance(auth, BearerAuth) and not self._https:
            raise blobio.BlobConfigError(f"{self.shown_url}: an Entra ID token is never sent over plain http; "
                                         "use the account's https:// endpoint")
        self.auth = auth
        self.retry = retry or blobio.RetrySettings()
        self._sleep = sleep
        self._connect = connect
        self._local = threading.local()
        self._all: set[http.client.HTTPConnection] = set()
        self._all_lock = threading.Lock()
        self._ssl = ssl.create_default_context() if self._https else None

    # -- connections
    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._connect is not None:
                conn = self._connect()
            elif self._https:
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=self.retry.connection_timeout_s,
                                                   context=self._ssl)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self.retry.connection_timeout_s)
            self._local.conn = conn
            with self._all_lock:
                self._all.add(conn)
        if conn.sock is None:
            self._open(conn)
        return conn

    def _open(self, conn: http.client.HTTPConnection) -> None:
        """Connect `conn` with the read timeout, and Nagle off: a request's small writes go out at once."""
        conn.connect()
        conn.sock.settimeout(self.retry.read_timeout_s)
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = list(self._all), set()
        for conn in conns:
            conn.close()

    # -- one request with retries; returns the response with its body unread
    def _request(self, path_query: str, headers: dict[str, str], what: str,
                 deadline: Deadline, method: str = "GET") -> http.client.HTTPResponse:
        counts = {"total": 0, "connect": 0, "status": 0}
        fresh_retry_used = False
        while True:
            deadline.check(what)
            sent = dict(headers)
            sent["x-ms-version"] = API_VERSION
            query = self.auth.apply(sent)
            url = path_query + (("&" if "?" in path_query else "?") + query if query else "")
            reused = getattr(self._local, "conn", None) is not None and self._local.conn.sock is not None
            try:
                conn = self._connection()
                conn.request(method, url, headers=sent)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                if reused and not fresh_retry_used:
                    fresh_retry_used = True  # a keep-alive the server had closed: once more, at once
                    continue
                if isinstance(exc, socket.timeout | TimeoutError):
                    reason = f"no answer within {self.retry.read_timeout_s:.0f}s"
                else:
                    reason = f"{type(exc).__name__}: {exc}"
                self._retry_or_raise(counts, "connect", None, what, reason, deadline)
                continue
            fresh_retry_used = True
            if response.status in (200, 206):
                return response
            body = _read_small(response)
            code = response.getheader("x-ms-error-code") or ""
            if response.status in RETRY_STATUSES:
                after = blobio.parse_retry_after(response.getheader("Retry-After"))
                self._retry_or_raise(counts, "status", after, what,
                                     f"HTTP {response.status} {code or response.reason}", deadline)
                continue
            raise BlobReadError(_describe_status(response.status, code, body, what), response.status, code)

    def _retry_or_raise(self, counts: dict[str, int], kind: str, retry_after: float | None, what: str,
                        reason: str, deadline: Deadline) -> None:
        counts["total"] += 1
        counts[kind] += 1
        budget = self.retry.connect if kind == "connect" else self.retry.status
        if counts["total"] > self.retry.total or counts[kind] > budget:
            raise TransientError(f"{what}: gave up after {counts['total']} retries: {reason}")
        wait = self.retry.backoff_s(counts["total"] - 1, retry_after_s=retry_after)
        remaining = deadline.remaining()
        if remaining is not None and wait >= remaining:
            deadline.check(what)  # raises once the deadline is near enough to have passed
            wait = max(remaining, 0.0)
        self._sleep(wait)

    # -- the two operations
    def list_page(self, prefix: str, marker: str | None = None, include_metadata: bool = False,
                  max_results: int = 5000, deadline: Deadline = NO_DEADLINE) -> bytes:
        """One page of List Blobs (the service's XML) for `prefix`, continuing at `marker`."""
        params = {"restype": "container", "comp": "list", "maxresults": str(max_results)}
        if prefix:
            params["prefix"] = prefix
        if marker:
            params["marker"] = marker
        if include_metadata:
            params["include"] = "metadata"
        what = f"listing {self.shown_url}"
        return self._read(f"{self._path}?{urlencode(params, quote_via=quote)}", {}, None, what, deadline)[0]

    def head(self, blob: str, etag: str | None = None, deadline: Deadline = NO_DEADLINE) -> http.client.HTTPMessage:
        """The blob's properties and metadata (Get Blob Properties), as response headers."""
        headers = {"If-Match": etag} if etag else {}
        response = self._request(f"{self._path}/{quote(blob, safe='/~')}", headers, f"blob {blob!r} properties",
                                 deadline, method="HEAD")
        response.read()
        return response.msg

    def get(self, blob: str, offset: int, length: int, etag: str | None = None, range_md5: bool = False,
            deadline: Deadline = NO_DEADLINE) -> tuple[bytes, http.client.HTTPMessage]:
        """Bytes [offset, offset+length) of `blob` and the response headers; the body is read in
        full and checked for length. With `etag`, a blob replaced since listing fails (412)."""
        headers = {"x-ms-range": f"bytes={offset}-{offset + length - 1}"}
        if etag:
            headers["If-Match"] = etag
        if range_md5:
            headers["x-ms-range-get-content-md5"] = "true"
        what = f"blob {blob!r} bytes {offset}+{length}"
        return self._read(f"{self._path}/{quote(blob, safe='/~')}", headers, length, what, deadline)

    def _read(self, path_query: str, headers: dict[str, str], length: int | None, what: str,
              deadline: Deadline) -> tuple[bytes, http.client.HTTPMessage]:
        """A GET and its whole body. A body that breaks off is asked for again (the same range
        under the same If-Match, or the same page), up to the `read` budget: one reset costs
        that request, not the whole file's attempt. A connection left mid-body is never reused."""
        for attempt in range(1 + self.retry.read):
            response = self._request(path_query, headers, what, deadline)
            try:
                return read_body(response, length, deadline, what), response.msg
            except DeadlineExceeded:
                self._drop_connection()
                raise
            except TransientError:
                self._drop_connection()
                if attempt == self.retry.read:
                    raise
        raise AssertionError("unreachable")


def read_body(response: http.client.HTTPResponse, length: int | None, deadline: Deadline, what: str) -> bytes:
    """The whole body, one socket read at a time, checking the deadline between reads."""
    pieces: list[bytes] = []
    got = 0
    expected = response.length if length is None else length
    try:
        while expected is None or got < expected:
            deadline.check(what)
            piece = response.read1(READ_PIECE if expected is None else min(READ_PIECE, expected - got))
            if not piece:
                if expected is None:
                    break
                raise TransientError(f"{what}: the body broke off after {got} of {expected} bytes")
            pieces.append(piece)
            got += len(piece)
        if not response.isclosed():
            response.read()  # read1 leaves a finished response open; this releases the connection for the next request
    except (OSError, http.client.HTTPException) as exc:
        raise TransientError(f"{what}: reading the body failed after {got} bytes ({type(exc).__name__})") from None
    if length is not None and got != length:
        raise TransientError(f"{what}: got {got} bytes, asked for {length}")
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _read_small(response: http.client.HTTPResponse) -> bytes:
    try:
        return response.read(64 << 10)
    except (OSError, http.client.HTTPException):
        return b""
    finally:
        if not response.isclosed():
            response.close()


def _describe_status(status: int, code: str, body: bytes, what: str) -> str:
    if status == 403:
        return (f"{what}: access denied ({code or 'HTTP 403'}): the node's identity needs 'Storage Blob Data "
                "Reader' on the account")
    if status == 404:
        return f"{what}: not found ({code or 'HTTP 404'})"
    if status == 412:
        return f"{what}: the blob changed while it was being staged (etag mismatch); re-run staging"
    message = ""
    start, end = body.find(b"<Message>"), body.find(b"</Message>")
    if 0 <= start < end:
        message = body[start + 9:end].decode("utf-8", "replace").splitlines()[0][:200]
    return f"{what}: HTTP {status} {code}{': ' + message if message else ''}"
