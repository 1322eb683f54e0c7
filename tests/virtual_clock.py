"""The runtime's clock (amlhpc.jobs.runtime.base.clock), virtual: sleeping advances it at once.
Install it with `clock.use(VirtualClock())`."""

from __future__ import annotations


class VirtualClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
