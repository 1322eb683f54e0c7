"""torch.distributed's TCPStore protocol in the standard library: a server and a client.

Where an image has no torch (amlhpc/images/tensorflow), node 0's launcher hosts this server
and the other nodes connect with this client; where it has torch, torch's own `TCPStore`
plays both parts. The two interoperate (tests/test_coord_store.py runs torch's client against
this server and this client against torch's server), so a node's choice never matters.

The protocol, as torch 2.13's client and libuv server speak it (captured on the wire and
checked against torch/csrc/distributed/c10d/TCPStore.cpp and TCPStoreBackend.hpp, read
2026-11-28). Integers are little-endian; a string or a value is a u64 length and its bytes;
every key the client sends is prefixed with "/" (which this server takes off again):

    connect     VALIDATE(0) u32 0x3C85F7CE, then PING(13) u32 nonce   -> u32 nonce
    SET(1)          key value                                          (no answer)
    COMPARE_SET(2)  key expected desired                              -> value
    GET(3)          key                                               -> value (empty: missing)
    ADD(4)          key i64                                           -> i64
    CHECK(5)        u64 n, n keys                                     -> u8 0 ready / 1 not ready
    WAIT(6)         u64 n, n keys                                     -> u8 0, once every key exists
    GETNUMKEYS(7)                                                     -> i64
    DELETE_KEY(8)   key                                               -> i64 keys deleted
    APPEND(9)       key value                                          (no answer)
    MULTI_GET(10)   u64 n, n keys                                     -> n values
    MULTI_SET(11)   u64 n, n x (key value)                             (no answer)
    CANCEL_WAIT(12)                                                   -> u8 1 (after a pending
                                                                         WAIT's u8 0, if it fired)

torch's client sends WAIT before GET and MULTI_GET, so a get of a missing key waits up to
the store's timeout; this client does the same. The server runs one thread with `selectors`
(the job's nodes' launchers are its clients: one connection per node, a few operations per
node per poll), keeps the keys in a `MemoryStore`, and answers a WAIT when the write that
completes it arrives.

Standard library only: ships into every training image.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from amlhpc.jobs.runtime.base import clock
from amlhpc.jobs.runtime.coord.kvstore import StoreTimeout, as_bytes
from amlhpc.jobs.runtime.coord.memstore import MemoryStore

log = logging.getLogger("amlhpc.coord")

MAGIC = 0x3C85F7CE
KEY_PREFIX = "/"
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, MULTI_SET, \
    CANCEL_WAIT, PING = range(14)
READY, NOT_READY = 0, 1
STOP_WAITING, WAIT_CANCELED = 0, 1
_U8, _U32, _U64, _I64 = struct.Struct("<B"), struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")
MAX_VALUE_BYTES = 1 << 30
"""A length beyond this is a client that does not speak the protocol: its connection is closed."""


class ProtocolError(ValueError):
    """A client sent something that is not the TCPStore protocol."""


class _Incomplete(Exception):
    """More bytes are needed to parse the message."""


class _Reader:
    def __init__(self, data: bytearray):
        self.data, self.at = data, 0

    def take(self, count: int) -> bytes:
        if self.at + count > len(self.data):
            raise _Incomplete
        chunk = bytes(self.data[self.at:self.at + count])
        self.at += count
        return chunk

    def u8(self) -> int:
        return _U8.unpack(self.take(1))[0]

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def u64(self) -> int:
        value = _U64.unpack(self.take(8))[0]
        if value > MAX_VALUE_BYTES:
            raise ProtocolError(f"a length of {value} bytes")
        return value

    def i64(self) -> int:
        return _I64.unpack(self.take(8))[0]

    def blob(self) -> bytes:
        return self.take(self.u64())

    def key(self) -> str:
        # Stored as the API names it: the clients' "/" comes off, so node 0's own process can
        # use the same keys on the MemoryStore directly.
        return self.blob().decode("utf-8", "surrogateescape").removeprefix(KEY_PREFIX)

    def keys(self) -> list[str]:
        return [self.key() for _ in range(self.u64())]


def _blob(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value


# --- the server -------------------------------------------------------------------------


@dataclass(eq=False)
class _Client:
    sock: socket.socket
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)
    validated: bool = False
    waiting: list[str] | None = None
    """The keys of this client's pending WAIT."""


class StoreServer:
    """A TCPStore-protocol server on a listening socket, in a daemon thread (see the module docstring)."""

    def __init__(self, listener: socket.socket, store: MemoryStore | None = None):
        self.listener = listener
        self.listener.setblocking(False)
        self.store = store or MemoryStore()
        self._selector = selectors.DefaultSelector()
        self._clients: dict[socket.socket, _Client] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="coord-store-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def start(self) -> StoreServer:
        self._selector.register(self.listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for client in list(self._clients.values()):
            self._drop(client)
        with contextlib.suppress(OSError, KeyError, ValueError):
            self._selector.unregister(self.listener)
        self.listener.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # the loop
    def _serve(self) -> None:
        while not self._stopping.is_set():
            for key, events in self._selector.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(64)
                else:
                    client = key.data
                    if events & selectors.EVENT_READ:
                        self._read(client)
                    if events & selectors.EVENT_WRITE and client.sock in self._clients:
                        self._flush(client)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    log.warning("coordination store: cannot accept a connection: %s", exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = _Client(sock)
            self._clients[sock] = client
            self._selector.register(sock, selectors.EVENT_READ, client)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        client.inbox += data
        try:
            self._handle(client)
        except ProtocolError as exc:
            log.warning("coordination store: dropped a client that does not speak the protocol: %s", exc)
            self._drop(client)

    def _handle(self, client: _Client) -> None:
        while client.inbox and client.sock in self._clients:
            reader = _Reader(client.inbox)
            try:
                self._one(client, reader)
            except _Incomplete:
                return
            del client.inbox[:reader.at]

    def _one(self, client: _Client, reader: _Reader) -> None:
        query = reader.u8()
        if not client.validated:
            if query != VALIDATE or reader.u32() != MAGIC:
                raise ProtocolError("the first message is not the TCPStore validation")
            client.validated = True
            return
        store = self.store
        if query == PING:
            self._send(client, _U32.pack(reader.u32()))
        elif query == SET:
            key, value = reader.key(), reader.blob()
            store.set(key, value)
            self._written(key)
        elif query == COMPARE_SET:
            key, expected, desired = reader.key(), reader.blob(), reader.blob()
            self._send(client, _blob(store.compare_set(key, expected, desired)))
            self._written(key)
        elif query == GET:
            self._send(client, _blob(store.peek(reader.key()) or b""))
        elif query == ADD:
            key, amount = reader.key(), reader.i64()
            try:
                total = store.add(key, amount)
            except ValueError as exc:
                raise ProtocolError(str(exc)) from None
            self._send(client, _I64.pack(total))
            self._written(key)
        elif query == CHECK:
            self._send(client, _U8.pack(READY if store.check(reader.keys()) else NOT_READY))
        elif query == WAIT:
            keys = reader.keys()
            if store.check(keys):
                self._send(client, _U8.pack(STOP_WAITING))
            else:
                client.waiting = keys
        elif query == GETNUMKEYS:
            self._send(client, _I64.pack(store.num_keys()))
        elif query == DELETE_KEY:
            self._send(client, _I64.pack(1 if store.delete_key(reader.key()) else 0))
        elif query == APPEND:
            key, value = reader.key(), reader.blob()
            store.set(key, (store.peek(key) or b"") + value)
            self._written(key)
        elif query == MULTI_GET:
            keys = reader.keys()
            self._send(client, b"".join(_blob(store.peek(k) or b"") for k in keys))
        elif query == MULTI_SET:
            pairs = [(reader.key(), reader.blob()) for _ in range(reader.u64())]
            for key, value in pairs:
                store.set(key, value)
                self._written(key)
        elif query == CANCEL_WAIT:
            client.waiting = None
            self._send(client, _U8.pack(WAIT_CANCELED))
        else:
            raise ProtocolError(f"query type {query} is not one this server answers")

    def _written(self, key: str) -> None:
        for client in list(self._clients.values()):
            if client.waiting and key in client.waiting and self.store.check(client.waiting):
                client.waiting = None
                self._send(client, _U8.pack(STOP_WAITING))

    def _send(self, client: _Client, payload: bytes) -> None:
        client.outbox += payload
        self._flush(client)

    def _flush(self, client: _Client) -> None:
        try:
            while client.outbox:
                sent = client.sock.send(client.outbox)
                del client.outbox[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(client)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.outbox else 0)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.modify(client.sock, events, client)

    def _drop(self, client: _Client) -> None:
        self._clients.pop(client.sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(client.sock)
        with contextlib.suppress(OSError):
            client.sock.close()


# --- the client -------------------------------------------------------------------------


class StoreClient:
    """A TCPStore-protocol client with torch's TCPStore API (one operation at a time; thread-safe).

    `connect_timeout`: how long to keep trying while the server is not up yet (node 0 may
    start minutes after another node); `timeout`: the longest any operation waits, and the
    default of `wait` and `get` for a missing key."""

    def __init__(self, host: str, port: int, *, timeout: timedelta = timedelta(seconds=300),
                 connect_timeout: timedelta | None = None):
        self.host, self.port, self.timeout = host, port, timeout
        self._lock = threading.Lock()
        self._sock = self._connect((connect_timeout or timeout).total_seconds())

    def _connect(self, limit_s: float) -> socket.socket:
        deadline = clock.monotonic() + limit_s
        delay = 0.05
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=min(10.0, max(limit_s, 0.1)))
                break
            except OSError as exc:
                if clock.monotonic() + delay > deadline:
                    raise ConnectionError(f"no coordination store at {self.host}:{self.port} after {limit_s:.0f}s: "
                                          f"{exc}") from None
                clock.sleep(delay)
                delay = min(delay * 2, 1.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.timeout.total_seconds())
        nonce = int.from_bytes(os.urandom(4), "little")
        sock.sendall(_U8.pack(VALIDATE) + _U32.pack(MAGIC) + _U8.pack(PING) + _U32.pack(nonce))
        if _U32.unpack(self._recv(sock, 4))[0] != nonce:
            sock.close()
            raise ConnectionError(f"{self.host}:{self.port} answered the ping with another nonce: not a TCPStore")
        return sock

    @staticmethod
    def _recv(sock: socket.socket, count: int) -> bytes:
        chunks, left = [], count
        while left:
            chunk = sock.recv(left)
            if not chunk:
                raise ConnectionResetError("the coordination store closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _value(self) -> bytes:
        return self._recv(self._sock, _U64.unpack(self._recv(self._sock, 8))[0])

    @staticmethod
    def _key(key: str) -> bytes:
        return _blob((KEY_PREFIX + key).encode("utf-8", "surrogateescape"))

    def _keys(self, keys: Sequence[str]) -> bytes:
        return _U64.pack(len(keys)) + b"".join(self._key(k) for k in keys)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()

    # --- the API --------------------------------------------------------------------------
    def set(self, key: str, value: bytes | str) -> None:
        with self._lock:
            self._sock.sendall(_U8.pack(SET) + self._key(key) + _blob(as_bytes(value)))

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes:
        with self._lock:
            self._sock.sendall(_U8.pack(COMPARE_SET) + self._key(key) + _blob(as_bytes(expected_value))
                               + _blob(as_bytes(desired_value)))
            return self._value()

    def add(self, key: str, amount: int) -> int:
        with self._lock:
            self._sock.sendall(_U8.pack(ADD) + self._key(key) + _I64.pack(int(amount)))
            return _I64.unpack(self._recv(self._sock, 8))[0]

    def check(self, keys: Sequence[str]) -> bool:
        with self._lock:
            self._sock.sendall(_U8.pack(CHECK) + self._keys(keys))
            return _U8.unpack(self._recv(self._sock, 1))[0] == READY

    def delete_key(self, key: str) -> bool:
        with self._lock:
            self._sock.sendall(_U8.pack(DELETE_KEY) + self._key(key))
            return _I64.unpack(self._recv(self._sock, 8))[0] > 0

    def num_keys(self) -> int:
        with self._lock:
            self._sock.sendall(_U8.pack(GETNUMKEYS))
            return _I64.unpack(self._recv(self._sock, 8))[0]

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        with self._lock:
            self._wait(keys, timeout or self.timeout)

    def _wait(self, keys: Sequence[str], timeout: timedelta) -> None:
        sock = self._sock
        sock.sendall(_U8.pack(WAIT) + self._keys(keys))
        sock.settimeout(timeout.total_seconds())
        try:
            answer = _U8.unpack(self._recv(sock, 1))[0]
        except TimeoutError:
            answer = None
        finally:
            sock.settimeout(self.timeout.total_seconds())
        if answer == STOP_WAITING:
            return
        if answer is not None:
            raise ConnectionError(f"the coordination store answered a wait with {answer}")
        # As torch's client: cancel; the server may have fired just before (STOP_WAITING first).
        sock.sendall(_U8.pack(CANCEL_WAIT))
        answer = _U8.unpack(self._recv(sock, 1))[0]
        if answer == STOP_WAITING:
            answer = _U8.unpack(self._recv(sock, 1))[0]
        if answer != WAIT_CANCELED:
            raise ConnectionError(f"the coordination store answered a cancel with {answer}")
        raise StoreTimeout(f"waited {timeout.total_seconds():g}s for store key(s) {', '.join(keys)}")

    def get(self, key: str) -> bytes:
        with self._lock:
            self._wait([key], self.timeout)
            self._sock.sendall(_U8.pack(GET) + self._key(key))
            return self._value()

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        with self._lock:
            self._wait(keys, self.timeout)
            self._sock.sendall(_U8.pack(MULTI_GET) + self._keys(keys))
            return [self._value() for _ in keys]

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        with self._lock:
            body = b"".join(self._key(k) + _blob(as_bytes(v)) for k, v in zip(keys, values, strict=True))
            self._sock.sendall(_U8.pack(MULTI_SET) + _U64.pack(len(keys)) + body)
