"""A bandwidth cap shared by the threads of one process: staging downloads, checkpoint uploads.

The NDv4 performance article caps each checkpoint writer (`azcopy --cap-mbps 2300`, 8 writers x 2300 Mb/s <
the account's 20 Gb/s ingress) so a node never drives the storage account into throttling;
staging can be capped the same way when several jobs share an account's egress.

`Throttle` is a token bucket driven by a virtual clock: every `acquire(n)` books `n` bytes
at the configured rate and sleeps until the booking is due. Bookings larger than the burst
are allowed (they simply wait longer), so callers never have to split their chunks, and
the long-run rate never exceeds the cap however many threads share the bucket. The sleep
happens outside the lock, so threads book in arrival order and wait concurrently.

Units: the public constructors take megabits per second (Mb/s, 10^6 bits), as azcopy's
`--cap-mbps` and the checkpoint contract's `cap_mbps` do; internally bytes per second.

Standard library only: this module ships into the training image.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO


def mbits_to_bytes_per_s(mbits_per_s: float) -> float:
    """Mb/s (10^6 bits) -> bytes/s."""
    return mbits_per_s * 1e6 / 8


_NEGLIGIBLE_S = 1e-9
"""Waits below this are rounding noise in the virtual clock, not a reason to sleep."""


class Throttle:
    """Caps the byte rate of everything that calls `acquire` on the same instance.

    rate_bytes_per_s: the cap; None or 0 means unlimited (acquire returns at once).
    burst_bytes: how far ahead of the rate an idle bucket may let callers go (default: a
        quarter second of traffic, at least 1 MiB), so short pauses are not wasted.
    """

    def __init__(self, rate_bytes_per_s: float | None, burst_bytes: float | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        if rate_bytes_per_s is not None and rate_bytes_per_s < 0:
            raise ValueError(f"bandwidth cap must be positive or unlimited, got {rate_bytes_per_s} bytes/s")
        self.rate = float(rate_bytes_per_s) if rate_bytes_per_s else 0.0
        self.burst = float(burst_bytes) if burst_bytes is not None else max(self.rate / 4, 1 << 20)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        # When everything booked so far has passed at the cap; callers may run up to
        # `burst` bytes ahead of it.
        self._next_free = clock()
        self.total_bytes = 0
        self.total_wait_s = 0.0

    @classmethod
    def from_mbits_per_s(cls, mbits_per_s: float | None, **kwargs) -> Throttle:
        """A cap given in Mb/s (None or 0: unlimited)."""
        return cls(mbits_to_bytes_per_s(mbits_per_s) if mbits_per_s else None, **kwargs)

    @property
    def limited(self) -> bool:
        return self.rate > 0

    @property
    def mbits_per_s(self) -> float | None:
        return self.rate * 8 / 1e6 if self.rate else None

    def acquire(self, nbytes: int) -> float:
        """Book `nbytes` and wait until they may pass; returns the seconds waited."""
        if nbytes <= 0:
            return 0.0
        if not self.rate:
            with self._lock:
                self.total_bytes += nbytes
            return 0.0
        with self._lock:
            now = self._clock()
            # An idle bucket does not bank credit beyond `burst`: bookings start no earlier than now.
            self._next_free = max(self._next_free, now) + nbytes / self.rate
            wait = self._next_free - now - self.burst / self.rate
            self.total_bytes += nbytes
            if wait > _NEGLIGIBLE_S:
                self.total_wait_s += wait
        if wait > _NEGLIGIBLE_S:
            self._sleep(wait)
            return wait
        return 0.0


UNLIMITED = Throttle(None)
"""A shared no-op cap (still counts bytes)."""


def throttled(chunks: Iterable[bytes], throttle: Throttle) -> Iterator[bytes]:
    """Yield `chunks`, each only once the cap lets its bytes pass."""
    for chunk in chunks:
        throttle.acquire(len(chunk))
        yield chunk


class ThrottledReader:
    """A read-only file object whose reads are capped: hand it to `upload_blob(data=...)`.

    Seeking is passed through so the storage SDK can rewind the body on a retry; bytes
    that are read again are paid for again, which is what the wire sees.
    """

    def __init__(self, raw: BinaryIO, throttle: Throttle):
        self._raw = raw
        self._throttle = throttle

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._throttle.acquire(len(data))
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._raw.seekable()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> ThrottledReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
