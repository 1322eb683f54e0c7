"""A local HTTP proxy in front of Azurite that misbehaves like a busy storage account.

For each request it may, at random (seeded):
- drop the connection without answering (a reset the client sees mid-request);
- answer `503 ServerBusy`, as a throttled storage account does;
- forward the request and truncate the response body: all headers (including the full
  Content-Length) and only part of the body, then close the connection;
- forward the request and flip one byte of the body (`corrupt`), as a faulty NIC or
  proxy would, to show that verification catches it;
- forward the request and drip the body (`drip`): all headers, then one byte every
  `drip_interval_s`, forever, as a stuck server does; only a deadline ends it;
- forward the request, let the service apply it, and drop the reply (`lost`): the write
  happened, the client saw a reset and retries, and the retry's answer (409, 412, 404) is
  about its own first try. At random (`lost`) or for the requests a rule picks (`lose`:
  `lose(method, path) -> bool`, e.g. "the PUT of the `latest` pointer"), once per request.

Busy answers carry `Retry-After: <busy_retry_after>` when that is set, and `events`
records (time, method, path, choice) for every request, so a test can check when the
client came back.

Faults are bounded, so a client that retries eventually succeeds: at most `max_faults` in
total and at most `max_per_request` for the same request (method, path and Range), which
keeps the number of retries any one request needs below the retry budgets under test.
`counts` says what was injected, so a test can check the faults really happened.

Usage:
    with FaultProxy(upstream_port, seed=7, drop=0.1, busy=0.1, truncate=0.1) as proxy:
        connection_string = proxy.connection_string(azurite)   # same account, via the proxy
"""

from __future__ import annotations

import http.client
import random
import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

_BUSY_BODY = (b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
              b"<Message>The server is busy.</Message></Error>")


@dataclass
class FaultPlan:
    seed: int = 0
    drop: float = 0.0
    busy: float = 0.0
    truncate: float = 0.0
    corrupt: float = 0.0
    drip: float = 0.0
    lost: float = 0.0
    lose: Callable[[str, str], bool] | None = None
    """Picks requests whose reply is lost after the service applied them (each once)."""
    drip_interval_s: float = 0.5
    busy_retry_after: int | None = None
    max_faults: int = 1000
    max_per_request: int = 2
    truncate_only_blob_reads: bool = True
    """Truncate only GETs of blob content (listings stay whole, as their XML would just fail to parse)."""
    counts: Counter = field(default_factory=Counter)
    events: list = field(default_factory=list)
    _per_request: Counter = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def choose(self, method: str, path: str, headers: dict[str, str]) -> str:
        """'drop', 'busy', 'truncate', 'corrupt', 'drip', 'lost' or 'pass' for this request."""
        choice = self._choose(method, path, headers)
        with self._lock:
            self.events.append((time.monotonic(), method, path.split("?", 1)[0], choice))
        return choice

    def _choose(self, method: str, path: str, headers: dict[str, str]) -> str:
        key = (method, path, headers.get("x-ms-range") or headers.get("range") or "")
        kinds = ("drop", "busy", "truncate", "corrupt", "drip", "lost")
        with self._lock:
            self.counts["requests"] += 1
            if sum(self.counts[k] for k in kinds) >= self.max_faults:
                return "pass"
            if self._per_request[key] >= self.max_per_request:
                return "pass"
            if self.lose is not None and self.lose(method, path) and not self._per_request[("lost", *key)]:
                self._per_request[("lost", *key)] += 1
                self._per_request[key] += 1
                self.counts["lost"] += 1
                return "lost"
            roll = self._rng.random()
            blob_read = method == "GET" and "comp=" not in path and "restype=" not in path
            choice = "pass"
            edge = 0.0
            chances = (self.drop, self.busy, self.truncate, self.corrupt, self.drip, self.lost)
            for kind, chance in zip(kinds, chances, strict=True):
                edge += chance
                if roll < edge:
                    if kind in ("truncate", "corrupt", "drip") and not blob_read and self.truncate_only_blob_reads:
                        return "pass"
                    choice = kind
                    break
            if choice == "pass":
                return "pass"
            self._per_request[key] += 1
            self.counts[choice] += 1
            return choice

    def cut(self, length: int) -> int:
        """Where to truncate a body of `length` bytes (0 <= cut < length)."""
        with self._lock:
            return self._rng.randrange(0, length)


def _read_request(stream) -> tuple[str, str, str, dict[str, str], list[tuple[str, str]], bytes] | None:
    line = stream.readline(65537)
    if not line or line in (b"\r\n", b"\n"):
        return None
    method, target, version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    raw_headers: list[tuple[str, str]] = []
    while True:
        header = stream.readline(65537)
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        raw_headers.append((name.strip(), value.strip()))
    lowered = {k.lower(): v for k, v in raw_headers}
    body = b""
    if "content-length" in lowered:
        body = stream.read(int(lowered["content-length"]))
    elif lowered.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(stream.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                stream.readline()
                break
            chunks.append(stream.read(size))
            stream.readline()
        body = b"".join(chunks)
    return method, target, version, lowered, raw_headers, body


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        upstream: http.client.HTTPConnection | None = None
        self.server.track(self.connection)
        try:
            while True:
                request = _read_request(self.rfile)
                if request is None:
                    return
                method, target, _version, lowered, raw_headers, body = request
                choice = self.server.plan.choose(method, target, lowered)
                if choice == "drop":
                    self._abort()
                    return
                if choice == "busy":
                    retry_after = self.server.plan.busy_retry_after
                    extra = f"Retry-After: {retry_after}\r\n".encode() if retry_after is not None else b""
                    self.wfile.write(b"HTTP/1.1 503 The server is busy.\r\nx-ms-error-code: ServerBusy\r\n" + extra
                                     + b"Content-Type: application/xml\r\nContent-Length: "
                                     + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY)
                    self.wfile.flush()
                    continue
                if upstream is None:
                    upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=60)
                    upstream.connect()
                    self.server.track(upstream.sock)
                headers = {k: v for k, v in raw_headers if k.lower() not in ("transfer-encoding",)}
                if body or method in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                upstream.request(method, target, body=body or None, headers=headers)
                response = upstream.getresponse()
                payload = response.read()
                if choice == "lost":  # applied upstream; the client never hears of it
                    self._abort()
                    return
                head = [f"HTTP/1.1 {response.status} {response.reason}"]
                for name, value in response.getheaders():
                    if name.lower() in ("transfer-encoding", "connection") or (
                            name.lower() == "content-length" and method != "HEAD"):
                        continue  # a HEAD's Content-Length is the blob's size: passed on as it is
                    head.append(f"{name}: {value}")
                if method != "HEAD":
                    head.append(f"Content-Length: {len(payload)}")
                if choice == "corrupt" and payload:
                    flipped = bytearray(payload)
                    flipped[self.server.plan.cut(len(payload))] ^= 0x10
                    payload = bytes(flipped)
                if choice == "drip" and payload:
                    head.append("Connection: close")
                    self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
                    self.wfile.flush()
                    for byte in range(len(payload) - 1):  # never the last byte: the body never ends
                        if self.server.stopping.wait(self.server.plan.drip_interval_s):
                            return
                        self.wfile.write(payload[byte:byte + 1])
                        self.wfile.flush()
                    self.server.stopping.wait()
                    return
                if choice == "truncate" and len(payload) > 1:
                    head.append("Connection: close")
                    cut = self.server.plan.cut(len(payload))
                    self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload[:cut])
                    self.wfile.flush()
                    self._abort()
                    return
                self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
                self.wfile.flush()
        except (ConnectionError, OSError, http.client.HTTPException):
            return
        finally:
            if upstream is not None:
                upstream.close()

    def _abort(self) -> None:
        # SO_LINGER 0: close with a reset, as a dropped connection looks to the client.
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:
            pass
        self.connection.close()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream_port: int, plan: FaultPlan):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream_port = upstream_port
        self.plan = plan
        self._sockets: set[socket.socket] = set()
        self._sockets_lock = threading.Lock()
        self.stopping = threading.Event()

    def track(self, sock: socket.socket) -> None:
        with self._sockets_lock:
            self._sockets.add(sock)

    def close_all(self) -> None:
        """Close every client and upstream socket, so Azurite is not left holding keep-alives."""
        with self._sockets_lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class FaultProxy:
    """Run the proxy on a free local port in a background thread."""

    def __init__(self, upstream_port: int, **plan):
        self.plan = FaultPlan(**plan)
        self._server = _Server(upstream_port, self.plan)
        self._thread = threading.Thread(target=self._server.serve_forever, name="faultproxy", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def counts(self) -> Counter:
        return self.plan.counts

    def connection_string(self, azurite) -> str:
        """`azurite`'s connection string, pointed at this proxy."""
        return azurite.connection_string.replace(f"127.0.0.1:{azurite.port}/", f"127.0.0.1:{self.port}/")

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._server.close_all()
