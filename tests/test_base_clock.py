"""The runtime's clock seam: the system's by default, a process-wide or per-thread clock when
a simulation installs one."""

from __future__ import annotations

import threading

from amlhpc.jobs.runtime.base import clock


class Fixed:
    def __init__(self, at: float):
        self.at, self.slept = at, []

    def time(self) -> float:
        return self.at

    def monotonic(self) -> float:
        return self.at

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.at += seconds


def test_the_system_clock_by_default():
    assert clock.current() is clock.SYSTEM
    assert abs(clock.time() - __import__("time").time()) < 5


def test_a_thread_clock_applies_to_that_thread_only():
    mine, seen = Fixed(100.0), {}
    with clock.use(mine):
        clock.sleep(2.5)
        other = threading.Thread(target=lambda: seen.setdefault("other", clock.current()))
        other.start()
        other.join()
        assert clock.monotonic() == 102.5 and mine.slept == [2.5]
    assert seen["other"] is clock.SYSTEM and clock.current() is clock.SYSTEM


def test_an_installed_clock_applies_to_every_thread_until_removed():
    shared, seen = Fixed(7.0), {}
    clock.install(shared)
    try:
        worker = threading.Thread(target=lambda: seen.setdefault("t", clock.time()))
        worker.start()
        worker.join()
        assert seen["t"] == 7.0
    finally:
        clock.install(None)
    assert clock.current() is clock.SYSTEM
