"""The key-value store the nodes of a job coordinate through: what the runtime asks of it, and
how its failures read.

The store is torch.distributed's Store API (`set`, `get`, `add`, `compare_set`, `wait`,
`check`, `delete_key`, `multi_get`; pytorch.org/docs/stable/distributed.html "Distributed
Key-Value Store", read 2026-11-28). What implements it:

- in a job, the job's own store (amlhpc.jobs.runtime.coord.jobstore): torch's `TCPStore`
  hosted by node 0's launcher, or this project's standard-library server speaking the same
  protocol (amlhpc.jobs.runtime.coord.storewire) where the image has no torch;
- in one process (tests, a simulation of 1,000 nodes): torch's `HashStore`, or
  `MemoryStore` (amlhpc.jobs.runtime.coord.memstore) with the same semantics.

Code that coordinates takes any object with these methods and never constructs one itself.
It uses `check` before `get` (torch's `get` and `multi_get` wait for a missing key until the
store's timeout), `compare_set(key, "", value)` to create a key only once (the store answers
the value that won), and `add(key, 0)` to read a counter.

A transport error is not yet node 0 lost: a connection reset on one node, a reply lost in a
switch, a store busy past one timeout happen while node 0 lives, and a node that took one for
node 0 gone would end alone while the others restart (a split decision). `call` retries the
operation, after capped, jittered backoff on the runtime's clock (a handle that reconnects,
jobstore.Reconnecting, opens a new connection on the next try), for `RECONNECT_GRACE_S`
measured from when the first failed try began. Only a store unreachable that long is node 0's
launcher gone (it hosts the store): `StoreLost`, naming how long and how often it tried,
which ends the job with a clear cause (amlhpc.jobs.runtime.base.exit_codes.ExitCode.NODE_LOST),
as losing any host does on Azure ML.

Retrying is safe because every operation the runtime does is idempotent under a lost reply
(the store applied it, the answer never came, the retry applies it again): `set` writes the
same value; `compare_set(key, "", value)` answers the stored value, which is this node's own
when the first try created it; `check`, `get`, `multi_get` and `wait` read; `delete_key` of
a key already deleted answers False, which no caller relies on. `add(key, n)` with n != 0 is
not: a retried add can count twice. Every counter the runtime keeps is therefore a hint,
never a proof: each party that counts also publishes its own key, and whoever acts on a count
that reached its target first confirms it with one `check` of those keys (agree.Channel.
all_present; agree.Barrier, restart.JobAgreement, the uploader's staged parts). An
over-count costs one extra `check`; a count can never fall short, as every party's add is
retried until it is applied. Per-node keys alone would make every poll carry N keys; the
counter keeps a poll one 8-byte `add(key, 0)` at any node count.

`guarded` turns the errors of one attempt (connecting, which has its own long wait) into
StoreLost without retrying.

Standard library only: ships into every training image.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from amlhpc.jobs.runtime.base import clock

log = logging.getLogger("amlhpc.coord")

T = TypeVar("T")

RECONNECT_GRACE_S = 30.0
"""How long the store may stay unreachable before it is taken for node 0 gone. Long enough to
ride out what happens while node 0 lives (a TCP reset, a NIC or switch flap, a reconnect, a
server paused by a busy host: seconds), short enough that the job ends well before the
training's collectives time out (NCCL's default is 10 min) and before agree_s (20 s to 300 s)
runs out many times over, so the managed run resubmits promptly."""
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
"""The backoff between tries doubles from FIRST_BACKOFF_S up to this cap, each wait drawn from
its upper half (jitter: the nodes that lost node 0 at once do not come back in step)."""


class Store(Protocol):
    """torch.distributed's Store API, the part the runtime uses."""

    def set(self, key: str, value: bytes | str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def add(self, key: str, amount: int) -> int: ...

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes: ...

    def wait(self, keys: list[str], timeout: timedelta = ...) -> None: ...

    def check(self, keys: list[str]) -> bool: ...

    def delete_key(self, key: str) -> bool: ...

    def multi_get(self, keys: list[str]) -> list[bytes]: ...


class StoreLost(RuntimeError):
    """The job's store stayed unreachable past the grace: node 0's launcher, which hosts it, is gone."""


class StoreTimeout(TimeoutError):
    """What was waited for in the store did not happen in time."""


_TORCH_ERRORS = ("DistError", "DistNetworkError", "DistStoreError")


def is_store_failure(exc: BaseException) -> bool:
    if isinstance(exc, (OSError, EOFError)):  # ConnectionError, TimeoutError, socket errors
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    # torch's client raises DistNetworkError / DistStoreError (RuntimeError subclasses) when
    # the server is gone or a read times out.
    return bool(names & set(_TORCH_ERRORS)) or (isinstance(exc, RuntimeError)
                                                 and type(exc).__module__.startswith("torch"))


@contextlib.contextmanager
def guarded(what: str) -> Iterator[None]:
    """Turn the store's transport errors inside the block into StoreLost naming `what`, at
    once (no retry: for a step that waits on its own, as connecting does)."""
    try:
        yield
    except (StoreLost, StoreTimeout):
        raise
    except Exception as exc:
        if not is_store_failure(exc):
            raise
        raise StoreLost(f"{what}: the job's coordination store stopped answering ({type(exc).__name__}: "
                        f"{_first_line(exc)}): node 0's launcher, which hosts it, is gone") from exc


def call(what: str, operation: Callable[[], T], *, grace_s: float = RECONNECT_GRACE_S,
         rng: random.Random | None = None) -> T:
    """`operation()` (one or more idempotent store calls), tried again after a transport error
    until the store has been unreachable for `grace_s`; then StoreLost naming `what`, how long
    and how many tries (see the module docstring). Other errors, and StoreTimeout, pass."""
    failing_since: float | None = None
    tries, backoff = 0, FIRST_BACKOFF_S
    while True:
        began = clock.monotonic()
        try:
            return operation()
        except (StoreLost, StoreTimeout):
            raise
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            tries += 1
            failing_since = began if failing_since is None else failing_since
            waited = clock.monotonic() - failing_since
            if waited >= grace_s:
                raise StoreLost(f"{what}: the job's coordination store stopped answering for {waited:.0f}s "
                                f"({tries} tries, the last {type(exc).__name__}: {_first_line(exc)}): node 0's "
                                "launcher, which hosts it, is gone") from exc
            if tries == 1:
                log.warning("%s: the job's coordination store did not answer (%s: %s); trying again for up to %.0fs",
                            what, type(exc).__name__, _first_line(exc), grace_s)
            pause = min(backoff, grace_s - waited) * (rng or random).uniform(0.5, 1.0)
            clock.sleep(pause)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def encode(document: Any) -> bytes:
    """A JSON document as a store value (compact, sorted: equal documents are equal bytes)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def decode(raw: bytes | str | None) -> Any:
    """A store value written by `encode`; None for an empty or unreadable one."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)

