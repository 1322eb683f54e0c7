"""The job's coordination store: hosted by node 0's launcher, reached by every node's.

Every Azure ML job with more than one process already has a rendezvous host (MASTER_ADDR,
or the MPI variables): node 0. Its launcher's local rank 0 serves a key-value store there,
and local rank 0 of every other node connects to it; the runtime's barriers, the in-job
restart decision and the checkpoint commit bookkeeping run on it (amlhpc.jobs.runtime.coord.agree),
a constant number of operations per node per poll at any node count, instead of every node
listing and reading every other node's blobs.

The server is torch.distributed's `TCPStore` with its libuv backend (PyTorch's default since
2.4, written for jobs of more than 1,024 ranks: PyTorch tutorial "Introduction to Libuv
TCPStore Backend", read 2026-11-28), where torch can be imported; in an image without torch
(amlhpc/images/tensorflow) it is this project's server speaking the same protocol
(amlhpc.jobs.runtime.coord.storewire). AMLHPC_COORD_STORE=torch|stdlib|auto chooses the server
(auto: torch's when importable). The other nodes connect with this project's client whatever
the server (the same protocol), unless AMLHPC_COORD_STORE=torch: their launchers need no torch.

The port is reserved, never probed: node 0's launcher binds it once, as the first thing it
does (before staging opens a single outgoing connection), and hands the bound socket to the
server (TCPStore's `master_listen_fd`). A rehearsal or wrapper that starts the ranks may bind
it even earlier and pass the socket down (AMLHPC_COORD_LISTEN_FD). The port is
AMLHPC_COORD_PORT, default MASTER_PORT + 1 (6106 or 29501 on Azure ML: outside Linux's
ephemeral range 32768-60999, so no outgoing connection is ever given it). The health gate
forms its process group through this store too, so it needs no port of its own.

The store lives exactly as long as node 0's launcher: a new launch has a new, empty store, so
nothing in it can be taken for an earlier launch's. The other nodes' handle (`Reconnecting`)
opens a new connection after one failed: a reset on one node's connection is survived while
node 0 lives (kvstore.call tries again, for kvstore.RECONNECT_GRACE_S). A store unreachable
past that grace means node 0 is gone; the callers end the job (kvstore.StoreLost), as losing
any host does on Azure ML.

Standard library (torch where it is installed): ships into every training image.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.coord.kvstore import RECONNECT_GRACE_S, Store, guarded, is_store_failure
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from amlhpc.jobs.runtime.coord.storewire import StoreClient, StoreServer

log = logging.getLogger("amlhpc.coord")

DEFAULT_MASTER_PORT = 6105
"""Azure ML's MASTER_PORT, used when only a master host is known."""
BACKENDS = ("auto", "torch", "stdlib")
CONNECT_TIMEOUT_S = 900.0
"""How long a node's launcher waits for node 0's store to come up (nodes start minutes apart)."""
OPERATION_TIMEOUT_S = 120.0
"""The longest one store operation may take: past it the store (node 0) is taken for lost."""
BACKLOG = 4096
"""Pending connections the listener queues (every rank's health check connects at once)."""


class CoordinationUnavailable(RuntimeError):
    """The job's store could not be opened (the message says why and what fixes it)."""


def rendezvous_address(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """Where rank 0 listens: MASTER_ADDR/MASTER_PORT (torch.distributed, Azure ML pytorch
    jobs), else Azure ML's MPI variables AZ_BATCH_MASTER_NODE ("host:port") or
    AZ_BATCHAI_MPI_MASTER_NODE ("host")."""
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"], int(environ.get("MASTER_PORT") or DEFAULT_MASTER_PORT)
    node = environ.get("AZ_BATCH_MASTER_NODE", "")
    if node:
        host, _, port = node.partition(":")
        return host, int(port or DEFAULT_MASTER_PORT)
    if environ.get("AZ_BATCHAI_MPI_MASTER_NODE"):
        return environ["AZ_BATCHAI_MPI_MASTER_NODE"], DEFAULT_MASTER_PORT
    return None


@dataclass(frozen=True)
class Endpoint:
    """Where the job's store is (node 0) and how it is chosen."""

    host: str
    port: int
    listen_fd: int | None = None
    """An inherited listening socket (node 0's local rank 0 only)."""
    backend: str = "auto"
    grace_s: float = RECONNECT_GRACE_S
    """How long a node rides out the store unreachable (contract.COORD_GRACE_S)."""


def _number(environ: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    text = (environ.get(name) or "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise RuntimeInputError.single(name, "", f"must be a whole number from {low} to {high}, got {text!r}",
                                       "unset it to use the default, or fix the value in the job's environment")
    return value


def endpoint(environ: Mapping[str, str]) -> Endpoint | None:
    """The job's store from the environment; None when no rendezvous host is known.
    RuntimeInputError names a malformed AMLHPC_COORD_* variable."""
    address = rendezvous_address(environ)
    backend = (environ.get(contract.COORD_STORE) or "auto").strip() or "auto"
    if backend not in BACKENDS:
        raise RuntimeInputError.single(contract.COORD_STORE, "", f"must be one of {', '.join(BACKENDS)}, got {backend!r}",
                                       "unset it (auto: torch's TCPStore where torch is installed)")
    port = _number(environ, contract.COORD_PORT, 1, 65535)
    listen_fd = _number(environ, contract.COORD_LISTEN_FD, 0, 1 << 20)
    grace_s = _number(environ, contract.COORD_GRACE_S, 1, 3600)
    if address is None:
        return None
    if port is None:
        port = address[1] + 1
        if port > 65535:
            raise RuntimeInputError.single(contract.COORD_PORT, "", f"MASTER_PORT {address[1]} leaves no port above it",
                                           f"set {contract.COORD_PORT} to a free port")
    return Endpoint(address[0], port, listen_fd, backend, RECONNECT_GRACE_S if grace_s is None else float(grace_s))


def reserve(port: int = 0, host: str = "") -> socket.socket:
    """A listening socket bound to `port` (0: any) on every interface, IPv4 and IPv6 where the
    host has both. It holds the port until closed; hand it to the store (or to a child
    process) instead of closing it and binding again."""
    if socket.has_dualstack_ipv6() and not host:
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=BACKLOG)
    return socket.create_server((host, port), backlog=BACKLOG)


def _use_torch(backend: str) -> bool:
    if backend == "stdlib":
        return False
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        if backend == "torch":
            raise CoordinationUnavailable(f"{contract.COORD_STORE}=torch, but torch cannot be imported here") from None
        return False
    return True


@dataclass
class JobStore:
    """This node's handle on the job's store: `store` has the Store API (kvstore.Store)."""

    store: Store
    endpoint: Endpoint
    serving: bool
    """Whether this process hosts the store (node 0's local rank 0)."""
    backend: str
    """torch or stdlib."""
    _keep: list[Any] = field(default_factory=list, repr=False)
    """What must live as long as the store (the listening socket, the server)."""

    @property
    def where(self) -> str:
        return f"{self.endpoint.host}:{self.endpoint.port}"

    def close(self) -> None:
        for thing in reversed(self._keep):
            with contextlib.suppress(Exception):
                (getattr(thing, "stop", None) or getattr(thing, "close", None) or (lambda: None))()
        self._keep.clear()


def serve(where: Endpoint, listener: socket.socket | None = None) -> JobStore:
    """Host the job's store (node 0's local rank 0): on `listener`, on the inherited socket, or
    on a socket bound to the endpoint's port now. CoordinationUnavailable names a port in use."""
    if listener is None and where.listen_fd is not None:
        try:
            listener = socket.socket(fileno=where.listen_fd)
        except OSError as exc:
            raise CoordinationUnavailable(f"{contract.COORD_LISTEN_FD}={where.listen_fd} is not a socket this process "
                                          f"inherited ({exc.strerror or exc}): start the ranks with the socket passed "
                                          f"down (pass_fds), or unset it to bind {contract.COORD_PORT}") from None
        with contextlib.suppress(OSError):
            listener.listen(BACKLOG)
    if listener is None:
        try:
            listener = reserve(where.port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise CoordinationUnavailable(f"cannot listen on port {where.port} for the job's coordination store: "
                                              f"{exc.strerror or exc}") from None
            raise CoordinationUnavailable(
                f"port {where.port} on node 0 is in use, so the job's coordination store cannot listen there: set "
                f"{contract.COORD_PORT} to a free port outside the ephemeral range (cat "
                "/proc/sys/net/ipv4/ip_local_port_range), the same on every node") from None
    port = int(listener.getsockname()[1])
    where = Endpoint(where.host, port, None, where.backend)
    if _use_torch(where.backend):
        import torch.distributed as dist

        # The server takes its own duplicate of the socket; ours keeps the port until close().
        server = dist.TCPStore(where.host, port, None, True, timeout=timedelta(seconds=OPERATION_TIMEOUT_S),
                               wait_for_workers=False, master_listen_fd=os.dup(listener.fileno()), use_libuv=True)
        log.info("coordination store: node 0 serves torch's TCPStore (libuv) on port %d", port)
        return JobStore(server, where, True, "torch", [listener, _Holder(server)])
    memory = MemoryStore(timedelta(seconds=OPERATION_TIMEOUT_S))
    server = StoreServer(listener, memory).start()
    log.info("coordination store: node 0 serves the TCPStore protocol (standard library) on port %d", port)
    return JobStore(memory, where, True, "stdlib", [server])


class _Holder:
    """Keeps torch's server object alive until close() (its destruction stops the server)."""

    def __init__(self, server: Any):
        self.server = server

    def close(self) -> None:
        self.server = None


RECONNECT_TIMEOUT_S = 5.0
"""How long one reconnection try waits for node 0's store (kvstore.call tries again within its grace)."""


def _client(where: Endpoint, connect_timeout_s: float) -> Any:
    """One connection to node 0's store: ours, whichever server node 0 runs (the same protocol:
    tests/test_coord_store.py runs one script through each client against each server), so a
    launcher on another node never imports torch (seconds and memory on every node); torch's
    client only when AMLHPC_COORD_STORE=torch asks for it."""
    if where.backend == "torch" and _use_torch(where.backend):
        import torch.distributed as dist

        client = dist.TCPStore(where.host, where.port, None, False, timeout=timedelta(seconds=connect_timeout_s))
        client.set_timeout(timedelta(seconds=OPERATION_TIMEOUT_S))
        return client
    return StoreClient(where.host, where.port, timeout=timedelta(seconds=OPERATION_TIMEOUT_S),
                       connect_timeout=timedelta(seconds=connect_timeout_s))


class Reconnecting:
    """A Store (kvstore.Store) on a connection that is replaced once it failed: an operation
    whose connection broke raises (kvstore.call tries it again), and the next one opens a new
    connection first (`open`, bounded by RECONNECT_TIMEOUT_S). Thread-safe: the launcher's
    threads share it; a connection is replaced once, whichever thread saw it break."""

    def __init__(self, first: Any, open_client: Callable[[], Any], grace_s: float = RECONNECT_GRACE_S):
        self._current: Any | None = first
        self.grace_s = grace_s
        """How long the callers (agree.Channel) try again before taking node 0 for lost."""
        self._open = open_client
        self._lock = threading.Lock()
        self.reconnects = 0

    def _client(self) -> Any:
        with self._lock:
            if self._current is None:
                self._current = self._open()
                self.reconnects += 1
                log.info("coordination store: connected again")
            return self._current

    def _broken(self, client: Any) -> None:
        with self._lock:
            if self._current is client:
                self._current = None
                with contextlib.suppress(Exception):
                    (getattr(client, "close", None) or (lambda: None))()

    def _do(self, name: str, *args: Any) -> Any:
        client = self._client()
        try:
            return getattr(client, name)(*args)
        except Exception as exc:
            if is_store_failure(exc):
                self._broken(client)
            raise

    def set(self, key: str, value: bytes | str) -> None:
        self._do("set", key, value)

    def get(self, key: str) -> bytes:
        return bytes(self._do("get", key))

    def add(self, key: str, amount: int) -> int:
        return int(self._do("add", key, amount))

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes:
        return bytes(self._do("compare_set", key, expected_value, desired_value))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._do("wait", keys, *([timeout] if timeout is not None else []))

    def check(self, keys: list[str]) -> bool:
        return bool(self._do("check", keys))

    def delete_key(self, key: str) -> bool:
        return bool(self._do("delete_key", key))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [bytes(v) for v in self._do("multi_get", keys)]

    def close(self) -> None:
        with self._lock:
            client, self._current = self._current, None
        with contextlib.suppress(Exception):
            (getattr(client, "close", None) or (lambda: None))()


def connect(where: Endpoint, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> JobStore:
    """Reach node 0's store, waiting up to `connect_timeout_s` for it to come up; the handle
    connects again after a broken connection (`Reconnecting`)."""
    with guarded(f"connecting to node 0's coordination store at {where.host}:{where.port}"):
        first = _client(where, connect_timeout_s)
    store = Reconnecting(first, lambda: _client(where, RECONNECT_TIMEOUT_S), grace_s=where.grace_s)
    return JobStore(store, where, False, "torch" if not isinstance(first, StoreClient) else "stdlib", [store])


def open_for_node(environ: Mapping[str, str], node_index: int, node_count: int, world_size: int) -> JobStore | None:
    """Node 0 serves (when the job has more than one process), the other nodes connect; None
    when the job needs no store or knows no rendezvous host. Call it on local rank 0 only."""
    if world_size <= 1 and node_count <= 1:
        return None
    where = endpoint(environ)
    if where is None:
        if node_count > 1:
            log.warning("no rendezvous host (MASTER_ADDR, AZ_BATCH_MASTER_NODE): the nodes cannot coordinate; "
                        "in-job restarts across nodes and shared staging are off")
        return None
    if node_index == 0:
        return serve(where)
    if node_count <= 1:
        return None
    return connect(where)
