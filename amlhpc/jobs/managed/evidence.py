"""What a run's nodes left in Blob for the supervision: each attempt's end records and
heartbeats (amlhpc.jobs.runtime.coord.nodestatus) and the latest committed checkpoint
(amlhpc.jobs.runtime.checkpoint), all under the run's checkpoint prefix.

Every job can write the checkpoints container, so what is read here is evidence and is
checked before it is believed: an end record or heartbeat counts only when it verifies
with the attempt's own key (the attempt's job name under the run's secret, which the
controller holds in its job definition), belongs to a node the attempt has, and - after
Azure ML requeued the job - was written in the current epoch (its ETag differs from the
one it had when the controller saw the requeue: no clock is compared). Everything refused is
returned with why, for the record. Azure ML's own status comes first anyway
(amlhpc.jobs.managed.classify): a record cannot turn a completed job into a failure, and no
record changes the restart count, the cost limit or the retry rules, which come from the
controller's job definition.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from amlhpc.jobs.runtime.checkpoint import CheckpointStore
from amlhpc.jobs.runtime.checkpoint.settings import VERSIONS_STREAM
from amlhpc.jobs.runtime.coord import nodestatus


class Ends(NamedTuple):
    records: dict[int, dict[str, Any]]
    """node -> end record believed."""
    refused: list[str]
    """Why each other record was not."""
    tampered: frozenset[int]
    """Nodes whose record exists but failed verification (not a vanished host)."""


class Evidence:
    def __init__(self, container, prefix: str, writers: str = "rank0", secret: str | None = None):
        self.container = container
        self.prefix = prefix.strip("/")
        self.stream = self.prefix if writers == "rank0" else f"{self.prefix}/node-0"
        self.secret = secret

    def key(self, job: str) -> str | None:
        """The attempt's evidence key (None: unsigned evidence is believed, for tools without a run secret)."""
        return nodestatus.attempt_key(self.secret, job) if self.secret else None

    def ends(self, job: str, nodes: int, stale: Mapping[str, str] | None = None) -> Ends:
        """The attempt's end records, checked; `stale`: node -> ETag of the records an
        earlier epoch left (stale_marks)."""
        key = self.key(job)
        found: dict[int, dict[str, Any]] = {}
        refused: list[str] = []
        tampered: set[int] = set()
        for node, record in nodestatus.read_ends(self.container, self.prefix, job).items():
            why = None
            if not 0 <= node < nodes:
                why = f"node {node} does not exist in a {nodes}-node attempt"
            elif key and (problem := nodestatus.check_end(key, job, node, record)):
                why = problem
            elif stale and stale.get(str(node)) == str(record.get(nodestatus.ETAG)):
                why = "written before Azure ML requeued the job (an earlier epoch's)"
            if why:
                refused.append(f"end record of node {node} ignored: {why}")
                if 0 <= node < nodes and "earlier epoch" not in why:
                    tampered.add(node)
            else:
                found[node] = record
        return Ends(found, refused, frozenset(tampered))

    def stale_marks(self, job: str) -> dict[str, str]:
        """node -> the ETag of each end record the job has now (taken at a requeue)."""
        return {str(node): str(r.get(nodestatus.ETAG)) for node, r in
                nodestatus.read_ends(self.container, self.prefix, job).items()}

    def heartbeats(self, job: str) -> tuple[dict[int, nodestatus.Heartbeat], list[str]]:
        refused: dict[int, str] = {}
        beats = nodestatus.read_heartbeats(self.container, self.prefix, job, verify=self.key(job), refused=refused)
        return beats, [f"node {node}: {why}" for node, why in sorted(refused.items())]

    def last_step(self, beats: dict[int, nodestatus.Heartbeat]) -> int | None:
        """The furthest step any node of a running attempt reported in its heartbeat."""
        steps = [b.step for b in beats.values() if b.step is not None]
        return max(steps) if steps else None

    def latest_version(self) -> str | None:
        """The committed checkpoint version a new attempt restores (None before the first)."""
        # Versioned checkpoints (every rank's parts, <prefix>/versions) first: a launcher
        # restores them before the folder stream when both exist.
        for stream in (f"{self.prefix}/{VERSIONS_STREAM}", self.stream):
            pointer, _ = CheckpointStore(self.container, stream).pointer()
            if pointer:
                return pointer.get("version")
        return None

