"""A managed run's durable record: every attempt, why it ended, what it cost.

Kept in the stack's `supervision` container (stack outputs storage.containers), under the
run's checkpoint prefix:

    <prefix>/supervision.json          the record (ETag-guarded writes under a lease)
    <prefix>/cancel.json               the user's latest cancel request
    <prefix>/controllers/<job name>    one empty blob per controller job started for the run

The container is writable by the controller identity and the submitters only: the jobs'
compute identity can at most read it, so no job can edit a record, a cancel request or a
lease (the checkpoints container, which every job can write, holds only evidence:
amlhpc.jobs.managed.evidence). Blob gives the guarantees the supervision needs:

- a lease (60 s in Azure, renewed on every loop) makes one controller at a time the one
  that acts, and shows whether a controller is alive (amlhpc.jobs.managed.revive replaces one
  whose lease lapsed); every write carries the blob's ETag (If-Match), so a writer whose
  lease lapsed fails loudly instead of overwriting a newer record;
- it outlives every controller and `status` reads it without one.

Job tags were the alternative and were rejected: Azure ML offers no conditional update on
them (last writer wins), they live on jobs that may not exist yet, and their values are
short strings.

A cancel is a state of the record: a request (`cancel.json`, needing no lease) carries an
id; the controller that sees an id not yet handled cancels the running attempt and
finishes the record `canceled`, and every controller started later finds it so. Only an
explicit `submit --managed --resume` reopens it (its token, applied once, sets the
requests made before it aside).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, overload

from amlhpc.jobs.managed.policy import Policy
from amlhpc.jobs.runtime.base import clock
from amlhpc.jobs.runtime.blob.writes import holds

SCHEMA = 2
RECORD_BLOB = "supervision.json"
CANCEL_BLOB = "cancel.json"
CONTROLLERS_FOLDER = "controllers"
LEASE_S = 60
DONE_STATES = ("succeeded", "failed", "canceled")


def now_utc() -> datetime:
    return datetime.fromtimestamp(clock.time(), UTC)


@overload
def iso(when: datetime) -> str: ...
@overload
def iso(when: datetime | None) -> str | None: ...
def iso(when: datetime | None) -> str | None:
    return when.astimezone(UTC).isoformat(timespec="milliseconds") if when else None


def parse_time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def record_name(prefix: str) -> str:
    return f"{prefix.strip('/')}/{RECORD_BLOB}"


def cancel_name(prefix: str) -> str:
    return f"{prefix.strip('/')}/{CANCEL_BLOB}"


def controllers_folder(prefix: str) -> str:
    return f"{prefix.strip('/')}/{CONTROLLERS_FOLDER}/"


def hours_between(start: datetime | None, end: datetime | None) -> float:
    return max(0.0, (end - start).total_seconds() / 3600) if start and end else 0.0


@dataclass
class Attempt:
    number: int
    job: str
    state: str = "submitting"
    """submitting (claimed, maybe not created yet), running (created), ended."""
    claimed_at: str | None = None
    submitted_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    status: str | None = None
    cause: str | None = None
    retryable: bool | None = None
    detail: str | None = None
    exit_code: int | None = None
    resumed_version: str | None = None
    """The checkpoint version that was latest when the attempt was submitted (it restores it)."""
    restore_pin: dict[str, dict[str, str | None]] | None = None
    """Stream -> {"version", "manifestSha256"} the controller checked at the claim: what the
    attempt may restore (AMLHPC_RESTORE_PIN; None: claimed before pins existed)."""
    first_step: int | None = None
    last_step: int | None = None
    nodes: int = 0
    """The nodes it asked for (fewer than `full_nodes` when shrunk)."""
    full_nodes: int = 0
    """Its cluster's count in the recipe (0: written before shrinking existed; same as nodes)."""
    shrunk: str | None = None
    """Why it runs on fewer nodes than `full_nodes` (None: it does not)."""
    capacity: int | None = None
    """The nodes its cluster could give a job at the last look, by the service's answer (None: not said)."""
    cluster: str = ""
    target: int = 0
    """Index of its cluster in the policy's targets."""
    usd_per_hour: float | None = None
    """What the attempt's nodes cost together per hour, fixed at its claim (its own node count)."""
    usd: float | None = None
    node_events: list[str] = field(default_factory=list)
    """Every trouble state a node of the job was seen in (history)."""
    epoch_events: list[str] = field(default_factory=list)
    """The same, since Azure ML last requeued the job: what classification reads."""
    requeued_at: list[str] = field(default_factory=list)
    """When the controller saw Azure ML put the job back in its queue (each starts an epoch)."""
    stale_ends: dict[str, str] = field(default_factory=dict)
    """The marks (signature, or ETag when unsigned) of every end record the job had when each
    requeue began an epoch -> its node: a record carrying one is an earlier epoch's, re-uploaded
    or not (amlhpc.jobs.managed.evidence)."""
    commit_seen: list[str] = field(default_factory=list)
    """[checkpoint version, when this controller first saw it committed, its manifest's digest
    when the pointer carried one]: the checkpoint rhythm, and a version to fall back on."""
    queued_since: str | None = None
    stalled_since: str | None = None
    bad_nodes: list[dict[str, Any]] = field(default_factory=list)
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    """Nodes named persistently slower than their peers: node, host, factor, at, step."""
    slow_looks: dict[str, list[Any]] = field(default_factory=dict)
    """node -> [consecutive slow looks, the step last counted]: the straggler's evidence so far."""
    ignored_evidence: list[str] = field(default_factory=list)
    """Node records the controller refused (unsigned, forged, another epoch's), with why."""
    stopping: dict[str, Any] | None = None
    """The controller's own verdict on a running attempt it stops (cause, detail, bad_nodes),
    written before the job is canceled: a controller that dies between the cancel and its
    record write leaves a Canceled job whose end is still its stop, never the user's cancel."""
    beats_seen: dict[str, list[str]] = field(default_factory=dict)
    """node -> [its heartbeat's service time, when this controller first saw that heartbeat]:
    how long a node's heartbeat has not changed, on the controller's own clock."""
    beats_since: str | None = None
    """When this controller first saw any heartbeat of the attempt (a node without one is judged from then)."""

    def hours(self, until: datetime | None = None) -> float:
        """Hours on its nodes: from the start to the end (or `until` while it runs)."""
        return hours_between(parse_time(self.started_at), parse_time(self.ended_at) or until)

    def charged_hours(self, until: datetime | None = None) -> float:
        """Hours charged against the limit: from its submission (queue and preparing included)."""
        start = parse_time(self.submitted_at) or parse_time(self.started_at)
        return hours_between(start, parse_time(self.ended_at) or until)



@dataclass
class Record:
    run: str
    recipe: str
    policy: dict[str, Any]
    """The acting controller's rules, for people reading the record; never read back."""
    state: str = "running"
    reason: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    next_attempt_at: str | None = None
    controllers: list[dict[str, Any]] = field(default_factory=list)
    """{"job", "started_at", "seen_at"}: each controller that acted on the run (for its cost)."""
    base_attempt: int = 0
    """Attempts before the run was last (re)started: restarts are counted from here."""
    target: int = 0
    """Where the next attempt runs: an index into the policy's targets."""
    preemptions: int = 0
    """Preemptions on the current target (reset when the run moves on)."""
    next_nodes: int | None = None
    """Nodes the next attempt asks for when shrunk (None: its cluster's full count)."""
    shrink_reason: str | None = None
    """Why the next attempt is shrunk (copied into its `shrunk`)."""
    node_lost: str | None = None
    """The lost node that lets a run shrink ("attempt 2: node_failure ..."); cleared once an
    attempt runs on its full count."""
    cancels_handled: list[str] = field(default_factory=list)
    """Ids of cancel requests honoured, or set aside by an explicit resume."""
    resumes: list[str] = field(default_factory=list)
    """Tokens of the explicit resumes applied (each once)."""
    code: dict[str, str] | None = None
    """The run's code asset and its content hash when the run was created ({"asset", "sha256"};
    amlhpc.jobs.managed.codeasset): every attempt and revival is checked against it."""
    schema: int = SCHEMA

    @property
    def done(self) -> bool:
        return self.state in DONE_STATES

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def attempts_usd(self, now: datetime | None = None) -> float:
        total = 0.0
        for a in self.attempts:
            total += a.usd if a.usd is not None else (a.usd_per_hour or 0.0) * a.charged_hours(now)
        return total

    def controller_usd(self, rate: float) -> float:
        hours = sum(hours_between(parse_time(c.get("started_at")), parse_time(c.get("seen_at")))
                    for c in self.controllers)
        return hours * rate

    def total_usd(self, rate: float, now: datetime | None = None) -> float:
        return self.attempts_usd(now) + self.controller_usd(rate)

    def node_hours_run(self) -> float:
        """Hours on nodes, times the nodes: the work done, whatever count each attempt ran on."""
        return sum(a.hours() * a.nodes for a in self.attempts)

    def finish(self, state: str, reason: str) -> None:
        self.state, self.reason, self.next_attempt_at = state, reason, None

    def rules(self) -> Policy:
        """The rules as recorded - for display only (a controller uses its own)."""
        return Policy.from_json(self.policy)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"supervision record schema {data.get('schema')!r} is not {SCHEMA}: written by another "
                             "version of aml-hpc")
        attempts = [Attempt(**{k: v for k, v in a.items() if k in Attempt.__dataclass_fields__})
                    for a in data.get("attempts", [])]
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "attempts"}
        return cls(**fields, attempts=attempts)


class RecordConflict(RuntimeError):
    """The record changed underneath, or the lease is held by someone else."""


class RecordStore:
    """The run's blobs in the supervision container: the record (load, create, save under a
    lease with an ETag condition), the cancel request and the controllers' names."""

    def __init__(self, container, prefix: str, lease_s: int = LEASE_S):
        self.container = container
        self.prefix = prefix.strip("/")
        self.blob = container.get_blob_client(record_name(self.prefix))
        self.lease = None
        self.lease_s = lease_s

    def load(self) -> tuple[Record | None, str | None]:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            download = self.blob.download_blob()
        except ResourceNotFoundError:
            return None, None
        return Record.from_json(json.loads(download.readall())), download.properties.etag

    def create(self, record: Record) -> str:
        """Write a new record; RecordConflict when one exists already."""
        from azure.core.exceptions import ResourceExistsError

        record.created_at = record.updated_at = iso(now_utc())
        payload = json.dumps(record.to_json(), indent=1).encode()
        try:
            return self.blob.upload_blob(payload, overwrite=False)["etag"]
        except ResourceExistsError:
            etag = holds(self.container, record_name(self.prefix), payload)  # our own write, its reply lost
            if etag is not None:
                return etag
            raise RecordConflict(f"{record_name(self.prefix)} exists already") from None

    def save(self, record: Record, etag: str) -> str:
        """Overwrite if nobody else wrote since `etag` (and while holding the lease)."""
        from azure.core import MatchConditions
        from azure.core.exceptions import HttpResponseError, ResourceModifiedError

        record.updated_at = iso(now_utc())
        payload = json.dumps(record.to_json(), indent=1).encode()
        try:
            return self.blob.upload_blob(payload, overwrite=True, etag=etag,
                                         match_condition=MatchConditions.IfNotModified, lease=self.lease)["etag"]
        except HttpResponseError as exc:
            if not isinstance(exc, ResourceModifiedError) and exc.status_code not in (409, 412):
                raise
            # A 412 after a reply that never came is our own write: the record holds exactly it.
            written = holds(self.container, record_name(self.prefix), payload)
            if written is not None:
                return written
            if isinstance(exc, ResourceModifiedError):
                raise RecordConflict(f"{record_name(self.prefix)} was changed by another writer") from None
            # The storage SDK sets error_code on every error it raises; azure-core's class does not declare it.
            code = getattr(exc, "error_code", None)
            raise RecordConflict(f"{record_name(self.prefix)}: {code or exc.reason}") from None  # the lease

    # the lease: one acting controller at a time, and the sign that one is alive
    def acquire(self, duration_s: int | None = None) -> bool:
        """Take the lease; False when another controller holds it."""
        from azure.core.exceptions import HttpResponseError

        try:
            self.lease = self.blob.acquire_lease(lease_duration=duration_s or self.lease_s)
            return True
        except HttpResponseError as exc:
            if exc.status_code == 409:
                return False
            raise

    def renew(self) -> None:
        from azure.core.exceptions import HttpResponseError

        if self.lease is None:
            raise RecordConflict(f"no lease on {record_name(self.prefix)}")
        try:
            self.lease.renew()
        except HttpResponseError as exc:
            if exc.status_code in (400, 409, 412):  # expired and taken, or lost
                self.lease = None
                raise RecordConflict(f"lost the lease on {record_name(self.prefix)}: {exc.error_code or exc.reason}") from None
            raise

    def release(self) -> None:
        if self.lease is not None:
            try:
                self.lease.release()
            except Exception:  # noqa: BLE001 - it expires by itself within the lease time
                pass
            self.lease = None

    def lease_held(self) -> bool:
        """Whether some controller holds the record's lease now (the service's view)."""
        lease = self.blob.get_blob_properties().lease
        return getattr(lease, "state", None) == "leased" and getattr(lease, "status", None) == "locked"

    # the user's cancel request
    def request_cancel(self, by: str) -> str:
        """Leave a cancel request; returns its id."""
        request_id = secrets.token_hex(8)
        request = {"id": request_id, "by": by, "at": iso(now_utc())}
        self.container.upload_blob(cancel_name(self.prefix), json.dumps(request).encode(), overwrite=True)
        return request_id

    def cancel_request(self) -> dict[str, Any] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            request = json.loads(self.container.get_blob_client(cancel_name(self.prefix)).download_blob().readall())
        except ResourceNotFoundError:
            return None
        return request if isinstance(request, dict) and request.get("id") else None

    # the controller jobs started for the run (the first, resumed ones, revived ones)
    def add_controller(self, job: str, why: str) -> None:
        self.container.upload_blob(controllers_folder(self.prefix) + job, b"", overwrite=True,
                                   metadata={"why": why[:200], "at": iso(now_utc()) or ""})

    def controllers_registered(self) -> dict[str, datetime]:
        """Their names, oldest first, with when each was registered (service time)."""
        folder = controllers_folder(self.prefix)
        found = sorted((b.last_modified, b.name[len(folder):]) for b in self.container.list_blobs(name_starts_with=folder))
        return {name: when for when, name in found}

    def controller_jobs(self) -> list[str]:
        """Their names, oldest first."""
        return list(self.controllers_registered())
