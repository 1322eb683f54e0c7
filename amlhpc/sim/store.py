"""torch.distributed's Store on virtual time: a job's rendezvous store for 1,000 simulated nodes.

A job's nodes can coordinate through the TCPStore that node 0 hosts (torchrun's c10d
rendezvous uses one; its libuv server has been PyTorch's default since 2.4). `StoreServer`
is that store's state and its server; `Store` is one client's handle, with the Store API
of torch.distributed (2.x): `set`, `get`, `add`, `compare_set`, `wait`, `check`,
`delete_key`, `num_keys`, `multi_get`, `multi_set`, `append`, `list_keys`, `queue_push`,
`queue_pop`, `queue_len`, `set_timeout` / `timeout`, `clone`, `has_extended_api`, with
HashStore's and TCPStore's semantics (tests/sim/test_sim_store.py runs the same calls
against torch's in-process HashStore):

- values are bytes (a str is stored UTF-8 encoded); `get`, `wait` and `multi_get` block
  until every key exists or the store's timeout passes (`DistStoreError("Wait timeout")`,
  torch's own class when torch is imported, else a RuntimeError class of the same name);
- `add` treats a missing key as 0 and keeps the number as its decimal text (a value that
  is not a number raises ValueError); `compare_set(key, expected, desired)` sets `desired`
  when the key holds `expected`, or is missing and `expected` is empty, and returns
  `desired`; else it returns the current value, or `expected` for a missing key;
- a blocked call parks its task on virtual time and is woken by the write that completes it.

Costs: each call is one round trip to node 0 (`latency_s`, drawn from the seed) and is
served in arrival order by one server thread that handles `ops_per_s` calls a second (a
queue, never a refusal: TCPStore does not throttle). Calls are counted per node, per
operation and per virtual second. When the host is killed every call fails as a lost
connection does (DistNetworkError, or a RuntimeError of that name without torch). `drops`
makes one node's nth call fail so while the host lives (a connection reset on one node),
either before the store applied it (`Drop(n, "request")`: the request was lost) or after
(`Drop(n, "reply")`: applied, its answer lost, as a reset after the server wrote), which is
what makes a retried `add` count twice. `partitions` cuts one node off from the store for a
while, node 0 alive (`Partition(start_s, end_s)`, virtual time): every call the node makes
meanwhile goes unanswered and fails after `Partition.timeout_s` (the client's connect
timeout, jobstore.RECONNECT_TIMEOUT_S), never applied; the node's calls after its end are
served again. Longer than kvstore.RECONNECT_GRACE_S, it makes that node take node 0 for lost.
"""

from __future__ import annotations

import sys
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import timedelta

from amlhpc.sim.blobservice import Peak
from amlhpc.sim.scheduler import Node, Simulation, Task

DEFAULT_TIMEOUT = timedelta(seconds=300)


class DistStoreError(RuntimeError):
    """torch.distributed.DistStoreError's stand-in (the same name: the runtime's kvstore.guarded
    recognises torch's errors by their class names)."""


class DistNetworkError(RuntimeError):
    """torch.distributed.DistNetworkError's stand-in (see DistStoreError)."""


def _errors() -> tuple[type[RuntimeError], type[RuntimeError]]:
    """torch's DistStoreError and DistNetworkError when torch is loaded (code under test catches
    those), else stand-ins of the same shape."""
    dist = sys.modules.get("torch.distributed")
    store = getattr(dist, "DistStoreError", None) if dist is not None else None
    network = getattr(dist, "DistNetworkError", None) if dist is not None else None
    return store or DistStoreError, network or DistNetworkError


def _bytes(value: str | bytes | bytearray) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


@dataclass(frozen=True)
class Drop:
    """One node's call whose connection drops (see the module docstring)."""

    call: int
    """The node's nth store call (from 1)."""
    lost: str = "request"
    """request: lost before the store applied it; reply: applied, the answer lost."""

    def __post_init__(self) -> None:
        if self.lost not in ("request", "reply"):
            raise ValueError(f"Drop.lost must be request or reply, got {self.lost!r}")


@dataclass(frozen=True)
class Partition:
    """One node cut off from the store, node 0 alive (see the module docstring)."""

    start_s: float
    end_s: float
    timeout_s: float = 5.0
    """How long one call waits before it fails (jobstore.RECONNECT_TIMEOUT_S)."""

    def covers(self, now: float) -> bool:
        return self.start_s <= now < self.end_s


@dataclass
class _Waiter:
    task: Task
    keys: tuple[str, ...]


@dataclass
class StoreServer:
    """The store node 0 hosts (see the module docstring)."""

    sim: Simulation
    host: Node | None = None
    latency_s: tuple[float, float] = (0.0002, 0.001)
    ops_per_s: float = 100_000.0
    data: dict[str, bytes] = field(default_factory=dict)
    queues: dict[str, deque[bytes]] = field(default_factory=dict)
    waiters: list[_Waiter] = field(default_factory=list)
    busy_until: float = 0.0
    ops: Counter[str] = field(default_factory=Counter)
    per_node: dict[str, Peak] = field(default_factory=dict)
    served: Peak = field(default_factory=Peak)
    drops: dict[str, Drop] = field(default_factory=dict)
    """Node name -> its call whose connection drops (once): a reset between one node and the
    store while node 0 is alive, before or after the store applied the call."""
    calls: Counter[str] = field(default_factory=Counter)
    dropped: list[str] = field(default_factory=list)
    """The drops that fired ("node-1 call 7: reply lost")."""
    partitions: dict[str, Partition] = field(default_factory=dict)
    """Node name -> when it is cut off from the store (node 0 alive)."""
    cut: Counter[str] = field(default_factory=Counter)
    """Node name -> its calls that went unanswered in a partition."""
    _losing: set[int] = field(default_factory=set)
    """The tasks whose current call's reply is to be lost."""

    def client(self, timeout: timedelta = DEFAULT_TIMEOUT) -> Store:
        return Store(self, timeout)

    @property
    def down(self) -> bool:
        return self.host is not None and self.host.dead

    def _arrive(self, op: str, keys: str = "") -> None:
        """One round trip and the server's queue, on virtual time (traced as `store`)."""
        sim = self.sim
        task = sim.current()
        who = task.node.name if task is not None and task.node is not None else "world"
        if sim.trace.enabled:
            sim.note(task, "store", f"{op} {keys}".rstrip())
        if self.down:
            sim.sleep(sim.rng.uniform(*self.latency_s))
            raise _errors()[1](f"Connection reset by peer (the store's host {self.host.name} is gone)")  # type: ignore[union-attr]
        partition = self.partitions.get(who)
        if partition is not None and partition.covers(sim.now):
            self.cut[who] += 1
            sim.sleep(partition.timeout_s)
            sim.note(task if task is not None else "world", "fault",
                     f"{who} is cut off from the store: {op} {keys} went unanswered")
            raise _errors()[1](f"Connection timed out after {partition.timeout_s:g}s (no route to the store's host)")
        self.calls[who] += 1
        self._losing.discard(id(task))  # a call that raised before its reply takes no drop along
        drop = self.drops.get(who)
        if drop is not None and drop.call == self.calls[who]:
            self.dropped.append(f"{who} call {drop.call} ({op}): {drop.lost} lost")
            if drop.lost == "reply":
                self._losing.add(id(task))
            else:
                sim.sleep(sim.rng.uniform(*self.latency_s))
                sim.note(task if task is not None else "world", "fault",
                         f"the store connection of {who} dropped before {op} {keys} reached the store")
                raise _errors()[1]("Connection reset by peer")
        half = sim.rng.uniform(*self.latency_s) / 2
        sim.sleep(half)
        start = max(sim.now, self.busy_until)
        self.busy_until = start + 1.0 / self.ops_per_s
        self.ops[op] += 1
        self.per_node.setdefault(who, Peak()).add(int(sim.now))
        self.served.add(int(start))
        wait = self.busy_until - sim.now
        if wait > 0:
            sim.sleep(wait)
        if self.down:
            raise _errors()[1](f"Connection reset by peer (the store's host {self.host.name} is gone)")

    def _reply(self) -> None:
        sim = self.sim
        sim.sleep(sim.rng.uniform(*self.latency_s) / 2)
        task = sim.current()
        if id(task) in self._losing:
            self._losing.discard(id(task))
            sim.note(task if task is not None else "world", "fault",
                     "the store connection dropped after the store applied the call: its reply is lost")
            raise _errors()[1]("Connection reset by peer")

    def _changed(self) -> None:
        ready = [w for w in self.waiters if all(k in self.data for k in w.keys)]
        for waiter in ready:
            self.waiters.remove(waiter)
            self.sim.wake(waiter.task)

    def _wait_for(self, keys: tuple[str, ...], timeout_s: float) -> None:
        """Park until every key exists (the server answers then), or raise at the timeout."""
        sim = self.sim
        deadline = sim.now + timeout_s
        while not all(k in self.data for k in keys):
            if self.down:
                raise _errors()[1](f"Connection reset by peer (the store's host {self.host.name} is gone)")  # type: ignore[union-attr]
            remaining = deadline - sim.now
            if remaining <= 0:
                raise _errors()[0]("Wait timeout")
            task = sim.current()
            assert task is not None
            waiter = _Waiter(task, keys)
            self.waiters.append(waiter)
            woken = sim.park(remaining)
            if not woken and waiter in self.waiters:
                self.waiters.remove(waiter)


class Store:
    """One handle on a StoreServer, with torch.distributed.Store's API (see the module docstring)."""

    def __init__(self, server: StoreServer, timeout: timedelta = DEFAULT_TIMEOUT):
        self._server = server
        self._timeout = timeout

    @property
    def timeout(self) -> timedelta:
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout

    def clone(self) -> Store:
        return Store(self._server, self._timeout)

    def has_extended_api(self) -> bool:
        return True

    def _seconds(self, timeout: timedelta | None) -> float:
        return (timeout or self._timeout).total_seconds()

    def set(self, key: str, value: str | bytes) -> None:
        server = self._server
        server._arrive("set", key)
        server.data[key] = _bytes(value)
        server._changed()
        server._reply()

    def get(self, key: str) -> bytes:
        server = self._server
        server._arrive("get", key)
        server._wait_for((key,), self._seconds(None))
        value = server.data[key]
        server._reply()
        return value

    def add(self, key: str, amount: int) -> int:
        server = self._server
        server._arrive("add", key)
        current = server.data.get(key, b"0")
        try:
            total = int(current.decode()) + int(amount)
        except (UnicodeDecodeError, ValueError):
            raise ValueError("stoll") from None
        server.data[key] = str(total).encode()
        server._changed()
        server._reply()
        return total

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        server = self._server
        server._arrive("compare_set", key)
        expected, desired = _bytes(expected_value), _bytes(desired_value)
        current = server.data.get(key)
        if (current is None and not expected) or (current is not None and current == expected):
            server.data[key] = desired
            server._changed()
            answer = desired
        else:
            answer = expected if current is None else current
        server._reply()
        return answer

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        server = self._server
        server._arrive("wait", ",".join(keys))
        server._wait_for(tuple(keys), self._seconds(timeout))
        server._reply()

    def check(self, keys: list[str]) -> bool:
        server = self._server
        server._arrive("check", ",".join(keys))
        found = all(k in server.data for k in keys)
        server._reply()
        return found

    def delete_key(self, key: str) -> bool:
        server = self._server
        server._arrive("delete_key", key)
        found = server.data.pop(key, None) is not None
        server._reply()
        return found

    def num_keys(self) -> int:
        server = self._server
        server._arrive("num_keys")
        count = len(server.data)
        server._reply()
        return count

    def list_keys(self) -> list[str]:
        server = self._server
        server._arrive("list_keys")
        keys = list(server.data)
        server._reply()
        return keys

    def multi_get(self, keys: list[str]) -> list[bytes]:
        server = self._server
        server._arrive("multi_get", ",".join(keys))
        server._wait_for(tuple(keys), self._seconds(None))
        values = [server.data[k] for k in keys]
        server._reply()
        return values

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        server = self._server
        server._arrive("multi_set", ",".join(keys))
        for key, value in zip(keys, values, strict=True):
            server.data[key] = _bytes(value)
        server._changed()
        server._reply()

    def append(self, key: str, value: str | bytes) -> None:
        server = self._server
        server._arrive("append", key)
        server.data[key] = server.data.get(key, b"") + _bytes(value)
        server._changed()
        server._reply()

    def queue_push(self, key: str, value: str | bytes) -> None:
        server = self._server
        server._arrive("queue_push", key)
        server.queues.setdefault(key, deque()).append(_bytes(value))
        server.data[key] = b""  # a waiter on the queue's key is released by a push, as in torch
        server._changed()
        server._reply()

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        server = self._server
        server._arrive("queue_pop", key)
        deadline = server.sim.now + self._seconds(None)
        while not server.queues.get(key):
            if not block:
                raise _errors()[0]("queue is empty")
            server.data.pop(key, None)
            server._wait_for((key,), max(0.0, deadline - server.sim.now))
        value = server.queues[key].popleft()
        server._reply()
        return value

    def queue_len(self, key: str) -> int:
        server = self._server
        server._arrive("queue_len", key)
        length = len(server.queues.get(key, ()))
        server._reply()
        return length
