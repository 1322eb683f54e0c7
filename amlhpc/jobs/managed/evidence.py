"""What a run's nodes left in Blob for the supervision: each attempt's end records and
heartbeats (amlhpc.jobs.runtime.coord.nodestatus) and the latest committed checkpoint
(amlhpc.jobs.runtime.checkpoint), all under the run's checkpoint prefix. The checkpoint
pointer (`latest`) is signed too and believed only when one of the run's attempts signed it
and it does not move back behind a version the controller already saw (latest()).

Every job can write the checkpoints container, so what is read here is evidence and is
checked before it is believed: an end record or heartbeat counts only when it verifies
with the attempt's own key (the attempt's job name under the run's secret, which the
controller holds in its job definition), belongs to a node the attempt has, and - after
Azure ML requeued the job - is not one an earlier epoch left. At each requeue the controller
marks the signature (MAC) of every end record the job has, adding to the marks of earlier
requeues; a record whose signature is marked is an earlier epoch's, however it came back. An
ETag alone would not do: re-uploading the same bytes (any job can write the container) gives
the blob a new ETag, and the earlier epoch's record would be believed. No clock is
compared. A genuine new record identical to an earlier epoch's, field for field, is set aside
too: the controller then goes by Azure ML's status alone. Everything refused is
returned with why, for the record. Azure ML's own status comes first anyway
(amlhpc.jobs.managed.classify): a record cannot turn a completed job into a failure, and no
record changes the restart count, the cost limit or the retry rules, which come from the
controller's job definition.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from amlhpc.jobs.runtime.checkpoint import CheckpointStore
from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of
from amlhpc.jobs.runtime.checkpoint.settings import VERSIONS_STREAM
from amlhpc.jobs.runtime.checkpoint.trust import MANIFEST_DIGEST, Pin
from amlhpc.jobs.runtime.coord import nodestatus


class Ends(NamedTuple):
    records: dict[int, dict[str, Any]]
    """node -> end record believed."""
    refused: list[str]
    """Why each other record was not."""
    tampered: frozenset[int]
    """Nodes whose record exists but failed verification (not a vanished host)."""


class Checked(NamedTuple):
    version: str | None
    """The version a new attempt restores (the stream it resumes from)."""
    pins: dict[str, Pin]
    """Stream -> what a new attempt may restore from it (AMLHPC_RESTORE_PIN)."""
    refused: list[str]
    """Why each refused pointer was refused."""


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
        """The attempt's end records, checked; `stale`: the marks of the records earlier
        epochs left (stale_marks; a record's signature, or its ETag when unsigned -> its node)."""
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
            elif stale and (_mark(record) in stale or stale.get(str(node)) == str(record.get(nodestatus.ETAG))):
                why = "written before Azure ML requeued the job (an earlier epoch's)"
            if why:
                refused.append(f"end record of node {node} ignored: {why}")
                if 0 <= node < nodes and "earlier epoch" not in why:
                    tampered.add(node)
            else:
                found[node] = record
        return Ends(found, refused, frozenset(tampered))

    def stale_marks(self, job: str, earlier: Mapping[str, str] | None = None) -> dict[str, str]:
        """The marks of every end record the job has now (taken at a requeue), added to
        `earlier` (the marks of earlier requeues): mark -> node."""
        marks = {k: v for k, v in (earlier or {}).items() if not k.isdigit()}  # node -> ETag: an older record's form
        marks.update({_mark(r): str(node) for node, r in nodestatus.read_ends(self.container, self.prefix, job).items()})
        return marks

    def heartbeats(self, job: str) -> tuple[dict[int, nodestatus.Heartbeat], list[str]]:
        refused: dict[int, str] = {}
        beats = nodestatus.read_heartbeats(self.container, self.prefix, job, verify=self.key(job), refused=refused)
        return beats, [f"node {node}: {why}" for node, why in sorted(refused.items())]

    def last_step(self, beats: dict[int, nodestatus.Heartbeat]) -> int | None:
        """The furthest step any node of a running attempt reported in its heartbeat."""
        steps = [b.step for b in beats.values() if b.step is not None]
        return max(steps) if steps else None

    def latest_version(self, attempts: Collection[str] = (), floor: str | None = None,
                       digests: Mapping[str, str] | None = None) -> str | None:
        """The committed checkpoint version a new attempt restores (None before the first, or
        when the pointer is refused and no version was seen before: checked() says why)."""
        return self.checked(attempts, floor, digests).version

    def latest(self, attempts: Collection[str] = (), floor: str | None = None,
               digests: Mapping[str, str] | None = None) -> tuple[str | None, list[str]]:
        """(the committed checkpoint version a new attempt restores, why a pointer was refused)."""
        found = self.checked(attempts, floor, digests)
        return found.version, found.refused

    def checked(self, attempts: Collection[str] = (), floor: str | None = None,
                digests: Mapping[str, str] | None = None) -> Checked:
        """Each checkpoint stream's pointer, checked, and what a new attempt may restore from it.

        With the run's secret a pointer counts only when one of the run's `attempts` signed it
        (nodestatus.sign_pointer) and - for the stream the run resumes from (the versioned one
        when it has a pointer, else the folder stream) - it does not name a version older than
        `floor` (the newest this controller already saw committed: `latest` never moves back, so
        an older one is a genuine pointer uploaded again). A refused pointer pins `floor` when
        its manifest's digest is known (`digests`: version -> digest, from the pointers seen
        before), else nothing: the attempt starts that stream fresh."""
        pins: dict[str, Pin] = {}
        refused: list[str] = []
        version: str | None = None
        primary = True
        # Versioned checkpoints (every rank's parts, <prefix>/versions) first: a launcher
        # restores them before the folder stream when both exist.
        for stream in (f"{self.prefix}/{VERSIONS_STREAM}", self.stream):
            pointer, _ = CheckpointStore(self.container, stream).pointer()
            if not pointer:
                pins[stream] = Pin(None)
                continue
            named = str(pointer.get("version"))
            why = None
            if self.secret:
                why = nodestatus.check_pointer(lambda job: nodestatus.attempt_key(self.secret or "", job), attempts,
                                               pointer)
            if why is None and primary and floor and sequence_of(named) >= 0 and sequence_of(named) < sequence_of(floor):
                why = f"it names {named}, older than {floor} already seen committed (a replayed pointer)"
            if why is None:
                digest = pointer.get(MANIFEST_DIGEST)
                pins[stream] = Pin(named, digest if isinstance(digest, str) else None)
            else:
                kept = floor if primary and floor and (digests or {}).get(floor) else None
                pins[stream] = Pin(kept, (digests or {}).get(kept) if kept else None)
                refused.append(f"checkpoint pointer {stream}/latest ignored: {why}" +
                               (f"; {kept}, seen committed before, is restored" if kept else ""))
            if primary:
                version = pins[stream].version
            primary = False
        return Checked(version, pins, refused)


def _mark(record: Mapping[str, Any]) -> str:
    """What identifies an end record across re-uploads: its signature; an unsigned one's ETag."""
    mac = record.get(nodestatus.MAC)
    return f"mac:{mac}" if isinstance(mac, str) else f"etag:{record.get(nodestatus.ETAG)}"
