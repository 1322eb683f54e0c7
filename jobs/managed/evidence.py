"""What a run's nodes left in Blob for the supervision: each attempt's end records and
heartbeats (jobs.runtime.nodestatus) and the latest committed checkpoint
(jobs.runtime.checkpoint), all under the run's checkpoint prefix."""

from __future__ import annotations

from typing import Any

from jobs.runtime import nodestatus
from jobs.runtime.checkpoint import CheckpointStore


class Evidence:
    def __init__(self, container, prefix: str, writers: str = "rank0"):
        self.container = container
        self.prefix = prefix.strip("/")
        self.stream = self.prefix if writers == "rank0" else f"{self.prefix}/node-0"

    def ends(self, job: str) -> dict[int, dict[str, Any]]:
        """Node index -> end record of the attempt's job (the job name is its run id)."""
        return nodestatus.read_ends(self.container, self.prefix, job)

    def last_step(self, job: str) -> int | None:
        """The furthest step any node of a running attempt reported in its heartbeat."""
        steps = [b.step for b in nodestatus.read_heartbeats(self.container, self.prefix, job).values() if b.step is not None]
        return max(steps) if steps else None

    def latest_version(self) -> str | None:
        """The committed checkpoint version a new attempt restores (None before the first)."""
        pointer, _ = CheckpointStore(self.container, self.stream).pointer()
        return pointer.get("version") if pointer else None
