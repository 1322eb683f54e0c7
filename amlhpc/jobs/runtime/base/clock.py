"""Time, through one seam: what the runtime's coordination code reads and waits on.

Production code calls `clock.monotonic()`, `clock.time()` and `clock.sleep(s)` from here
instead of the `time` module. By default they are the system's. A simulation (amlhpc/sim)
installs a clock of its own, virtual time with a per-node offset, for the whole process
(`install`) or for one thread, the thread that plays one node (`use`), so the same code runs
1,000 simulated nodes in one process and a fault fires at a step, never at a wall-clock time.

Rules that keep code right under any clock:
- ages and deadlines come from `monotonic()` (a node's wall clock may step back or jump);
- `time()` is for records other processes read (when it was written), never for ordering;
- waiting is `sleep()`, so a simulated clock can advance instead of the process stalling.
"""

from __future__ import annotations

import contextlib
import threading
import time as _time
from collections.abc import Iterator
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (may step: never use it to order or to time)."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start that never go back."""

    def sleep(self, seconds: float) -> None:
        """Wait this long (a virtual clock advances instead)."""


class SystemClock:
    """The operating system's clocks."""

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    def sleep(self, seconds: float) -> None:
        _time.sleep(max(0.0, seconds))


SYSTEM = SystemClock()
_process: Clock = SYSTEM
_thread = threading.local()


def current() -> Clock:
    """This thread's clock, else the process's."""
    return getattr(_thread, "clock", None) or _process


def install(clock: Clock | None) -> None:
    """Make `clock` the process's clock (None: the system's again)."""
    global _process
    _process = clock or SYSTEM


@contextlib.contextmanager
def use(clock: Clock) -> Iterator[Clock]:
    """Run the block on `clock` in this thread only (threads it starts use the process's)."""
    previous = getattr(_thread, "clock", None)
    _thread.clock = clock
    try:
        yield clock
    finally:
        _thread.clock = previous


def time() -> float:
    return current().time()


def monotonic() -> float:
    return current().monotonic()


def sleep(seconds: float) -> None:
    current().sleep(seconds)
