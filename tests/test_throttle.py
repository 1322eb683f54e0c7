"""amlhpc.jobs.runtime.base.throttle: the shared bandwidth cap."""

from __future__ import annotations

import io
import threading
import time

import pytest

from amlhpc.jobs.runtime.base.throttle import (
    Throttle,
    ThrottledReader,
    mbits_to_bytes_per_s,
    throttled,
)


class FakeClock:
    """A clock that only moves when the throttle sleeps."""

    def __init__(self):
        self.now = 100.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


class TestThrottle:
    def test_long_run_rate_is_the_cap(self):
        """Booking many chunks takes bytes / rate, minus the burst allowance."""
        clock = FakeClock()
        cap = Throttle(1_000_000, burst_bytes=100_000, clock=clock, sleep=clock.sleep)
        for _ in range(100):
            cap.acquire(50_000)
        # 5 MB at 1 MB/s: 5 s, of which the 0.1 s burst may pass at once.
        assert clock.slept == pytest.approx(5.0 - 0.1, abs=1e-6)
        assert cap.total_bytes == 5_000_000

    def test_burst_passes_without_waiting(self):
        clock = FakeClock()
        cap = Throttle(1_000_000, burst_bytes=200_000, clock=clock, sleep=clock.sleep)
        assert cap.acquire(200_000) == 0.0
        assert cap.acquire(100_000) == pytest.approx(0.1)

    def test_idle_time_does_not_bank_more_than_the_burst(self):
        clock = FakeClock()
        cap = Throttle(1_000_000, burst_bytes=100_000, clock=clock, sleep=clock.sleep)
        clock.now += 60  # a minute idle
        cap.acquire(1_100_000)
        assert clock.slept == pytest.approx(1.0)

    def test_chunk_larger_than_burst_is_allowed(self):
        clock = FakeClock()
        cap = Throttle(2_000_000, burst_bytes=1, clock=clock, sleep=clock.sleep)
        assert cap.acquire(8_000_000) == pytest.approx(4.0, rel=1e-6)

    def test_unlimited_never_sleeps(self):
        clock = FakeClock()
        cap = Throttle(None, clock=clock, sleep=clock.sleep)
        for _ in range(10):
            cap.acquire(10**9)
        assert clock.slept == 0 and not cap.limited and cap.total_bytes == 10**10

    def test_megabits(self):
        """Mb/s as azcopy's --cap-mbps: the NDv4 performance article 2300 Mb/s is 287.5 MB/s."""
        assert mbits_to_bytes_per_s(2300) == 287_500_000
        assert Throttle.from_mbits_per_s(2300).mbits_per_s == pytest.approx(2300)
        assert not Throttle.from_mbits_per_s(None).limited

    def test_negative_rate_is_an_error(self):
        with pytest.raises(ValueError, match="positive"):
            Throttle(-1)

    def test_threads_share_one_cap_in_real_time(self):
        """Four threads pushing 4 MB through a 20 MB/s cap take about 0.2 s together, not 0.05 s."""
        cap = Throttle(20_000_000, burst_bytes=64 * 1024)
        start = time.monotonic()

        def push():
            for _ in range(16):
                cap.acquire(62_500)

        threads = [threading.Thread(target=push) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
        assert 0.17 <= elapsed < 1.0


class TestWrappers:
    def test_throttled_iterator_passes_chunks_through(self):
        clock = FakeClock()
        cap = Throttle(1000, burst_bytes=0.001, clock=clock, sleep=clock.sleep)
        assert list(throttled([b"a" * 500, b"b" * 500], cap)) == [b"a" * 500, b"b" * 500]
        assert clock.slept == pytest.approx(1.0, abs=1e-3)

    def test_reader_caps_reads_and_supports_rewind(self):
        clock = FakeClock()
        cap = Throttle(1000, burst_bytes=0.001, clock=clock, sleep=clock.sleep)
        reader = ThrottledReader(io.BytesIO(b"x" * 2000), cap)
        assert reader.read(1000) == b"x" * 1000
        assert reader.tell() == 1000 and reader.seekable()
        reader.seek(0)  # the storage SDK rewinds a body to retry it
        assert len(reader.read()) == 2000
        assert cap.total_bytes == 3000
        assert clock.slept == pytest.approx(3.0, abs=1e-3)
