"""A launcher's pulse on the job's coordination store, beside its Blob heartbeat.

The watchdog takes a peer whose Blob heartbeat stopped for `hang_s` for frozen: its launcher
can no longer stop its own training, so the nodes that still run stop the job. A heartbeat is
also late when Blob throttles: each write is retried through 503s, and a live launcher's
heartbeats land seconds apart (the recovery benchmark's `throttle` scenario: 11-16 s against a
10 s `hang_s` in 3 of 5 runs, and a healthy peer ended the job). Allowing for this node's own
Blob time narrows that (watchdog.Guard.blob_lag_s) but cannot close it: a peer may be throttled
more than this node.

The job's store (node 0's launcher, over TCP, no Blob) tells the two apart. Each node's
watchdog adds 1 to its own counter once a look interval while its look loop turns (a look
held in Blob's retries is turning; a frozen process is not, nor a look thread stopped outside
a look for `hang_s`). Once a peer's Blob heartbeat has been silent for half of `hang_s`, the
same pulse thread also reads that peer's counter, and the peer counts as alive while a change
of it was seen within the last `hang_s` / 2. A first reading proves nothing (a frozen peer's
counter is there too): only a change does, so a frozen launcher is named exactly when it was
without the store. The look thread only asks what the pulse thread saw, so a store that stops
answering (node 0 frozen) never holds a look.

Scale: one `add` per node per look interval on node 0's store (`hang_s` / 6, 1-60 s: at 1,000
nodes and a 10 s `hang_s`, 600 a second; at a 20-minute `hang_s`, 17), and reads only of peers
already half-silent in Blob: none on a healthy job, at any node count. A store that fails is no
evidence (node 0 lost ends the job by its own rule): the Blob verdict stands.

Standard library: ships in the image.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("amlhpc.watchdog")

KEY = "watchdog/alive"


class StoreLiveness:
    """One node's pulse on the job's store, and what it has seen of its peers' pulses.
    `pulse` runs on its own thread; `suspect` and `alive` on the look thread."""

    def __init__(self, channel: Any, node: int, window_s: float, clock: Callable[[], float]):
        self.channel, self.node, self.window_s, self.clock = channel, node, window_s, clock
        self._lock = threading.Lock()
        self._suspects: frozenset[int] = frozenset()
        self._seen: dict[int, tuple[int, float | None]] = {}
        """Peer -> (its counter as last read, when a change of it was seen: None before one was)."""
        self.failed: str | None = None
        """Why the store stopped answering, once it did: no pulse or reading after that."""

    def _count(self, node: int, amount: int) -> int | None:
        if self.failed:
            return None
        try:
            return self.channel.count(f"{KEY}/{node}", amount)
        except Exception as exc:  # noqa: BLE001 - the store's loss has its own rule; the Blob verdict stands
            self.failed = f"{type(exc).__name__}: {exc}"
            log.warning("watchdog: the job's store stopped answering (%s): peers are judged on Blob alone", self.failed)
            return None

    def suspect(self, nodes: set[int]) -> None:
        """The peers whose Blob heartbeat is half-silent now; the others' readings are dropped
        (a heartbeat that came back starts a new reading at its next silence)."""
        with self._lock:
            self._suspects = frozenset(nodes)
            self._seen = {n: seen for n, seen in self._seen.items() if n in nodes}

    def pulse(self) -> None:
        """This node's beat, then one reading of each suspect's counter."""
        self._count(self.node, 1)
        with self._lock:
            suspects = self._suspects
        for node in sorted(suspects):
            value = self._count(node, 0)
            now = self.clock()
            with self._lock:
                if node not in self._suspects:
                    continue
                seen = self._seen.get(node)
                if value is None:
                    self._seen.pop(node, None)
                elif seen is None:
                    self._seen[node] = (value, None)
                elif seen[0] != value:
                    self._seen[node] = (value, now)

    def alive(self, node: int) -> bool:
        """Whether a change of the peer's counter was seen within the window."""
        with self._lock:
            seen = self._seen.get(node)
        return seen is not None and seen[1] is not None and self.clock() - seen[1] < self.window_s
