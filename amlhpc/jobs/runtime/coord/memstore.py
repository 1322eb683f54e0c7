"""`MemoryStore`: torch.distributed's Store API in one process, with HashStore's semantics,
in the standard library.

It is the state behind this project's TCPStore-protocol server (amlhpc.jobs.runtime.coord.storewire) and
a store for tests and simulations where torch is absent. The semantics follow torch's
HashStore (torch/csrc/distributed/c10d/HashStore.cpp, read 2026-11-28), and the tests check
both give the same answers to the same sequence of calls:

- `compare_set(key, expected, desired)`: sets `desired` when the key is missing and `expected`
  is empty, or when the key holds `expected`; answers the value the key holds afterwards,
  except that a missing key with a non-empty `expected` is left missing and `expected` is
  answered;
- `add(key, n)`: the key holds a decimal integer (a missing key counts as 0); answers the sum;
- `get(key)` / `multi_get(keys)` wait up to the store's timeout for a missing key;
- `check(keys)`: whether every key exists (an empty list: True);
- `delete_key(key)`: whether a key was deleted.

Waiting happens on a condition variable: a `wait` is woken by the write that completes it.

Standard library only: ships into every training image.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta

from amlhpc.jobs.runtime.coord.kvstore import StoreTimeout, as_bytes

DEFAULT_TIMEOUT = timedelta(seconds=300)
"""torch's default store timeout."""


class MemoryStore:
    """A thread-safe in-process store (see the module docstring)."""

    def __init__(self, timeout: timedelta = DEFAULT_TIMEOUT):
        self.timeout = timeout
        self._data: dict[str, bytes] = {}
        self._changed = threading.Condition()

    # --- writes ---------------------------------------------------------------------------
    def set(self, key: str, value: bytes | str) -> None:
        with self._changed:
            self._data[key] = as_bytes(value)
            self._changed.notify_all()

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes:
        expected, desired = as_bytes(expected_value), as_bytes(desired_value)
        with self._changed:
            current = self._data.get(key)
            if (current is None and not expected) or (current is not None and current == expected):
                self._data[key] = desired
                self._changed.notify_all()
                return desired
            return expected if current is None else current

    def add(self, key: str, amount: int) -> int:
        with self._changed:
            current = self._data.get(key)
            try:
                value = (int(current) if current is not None else 0) + int(amount)
            except ValueError:
                raise ValueError(f"store key {key!r} does not hold an integer") from None
            self._data[key] = str(value).encode()
            self._changed.notify_all()
            return value

    def delete_key(self, key: str) -> bool:
        with self._changed:
            return self._data.pop(key, None) is not None

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        with self._changed:
            for key, value in zip(keys, values, strict=True):
                self._data[key] = as_bytes(value)
            self._changed.notify_all()

    # --- reads ----------------------------------------------------------------------------
    def check(self, keys: Sequence[str]) -> bool:
        with self._changed:
            return all(k in self._data for k in keys)

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        limit = (timeout or self.timeout).total_seconds()
        with self._changed:
            if not self._changed.wait_for(lambda: all(k in self._data for k in keys), timeout=limit):
                missing = [k for k in keys if k not in self._data]
                raise StoreTimeout(f"waited {limit:g}s for store key(s) {', '.join(missing)}")

    def get(self, key: str) -> bytes:
        self.wait([key])
        with self._changed:
            return self._data.get(key, b"")

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        self.wait(list(keys))
        with self._changed:
            return [self._data.get(k, b"") for k in keys]

    def num_keys(self) -> int:
        with self._changed:
            return len(self._data)

    # --- what the wire server needs -------------------------------------------------------
    def peek(self, key: str) -> bytes | None:
        """The value, or None when missing (never waits)."""
        with self._changed:
            return self._data.get(key)

    @property
    def condition(self) -> threading.Condition:
        return self._changed
