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

A store that stops answering is node 0's launcher gone (it hosts the store): `StoreLost`,
which ends the job with a clear cause (amlhpc.jobs.runtime.base.exit_codes.ExitCode.NODE_LOST), as losing any
host does on Azure ML. `guarded` turns the errors of torch's client and of the sockets of ours
into it.

Standard library only: ships into every training image.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Protocol


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
    """The job's store stopped answering: node 0's launcher, which hosts it, is gone."""


class StoreTimeout(TimeoutError):
    """What was waited for in the store did not happen in time."""


_TORCH_ERRORS = ("DistError", "DistNetworkError", "DistStoreError")


def _is_store_failure(exc: BaseException) -> bool:
    if isinstance(exc, (OSError, EOFError)):  # ConnectionError, TimeoutError, socket errors
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    # torch's client raises DistNetworkError / DistStoreError (RuntimeError subclasses) when
    # the server is gone or a read times out.
    return bool(names & set(_TORCH_ERRORS)) or (isinstance(exc, RuntimeError)
                                                 and type(exc).__module__.startswith("torch"))


@contextlib.contextmanager
def guarded(what: str) -> Iterator[None]:
    """Turn the store's transport errors inside the block into StoreLost naming `what`."""
    try:
        yield
    except (StoreLost, StoreTimeout):
        raise
    except Exception as exc:
        if not _is_store_failure(exc):
            raise
        raise StoreLost(f"{what}: the job's coordination store stopped answering ({type(exc).__name__}: "
                        f"{_first_line(exc)}): node 0's launcher, which hosts it, is gone") from exc


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

