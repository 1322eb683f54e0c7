"""A managed run's durable record: every attempt, why it ended, what it cost.

Kept as one JSON blob beside the run's checkpoints, `<checkpoint prefix>/supervision.json`
in the stack's checkpoints container, because:

- it must outlive the controller (a restarted controller reads where the run stood);
- Blob gives the two guarantees the supervision needs. A lease (60 s, renewed on every
  loop) makes one controller at a time the one that acts, so a second controller (a
  restart while the first is still alive) waits instead of submitting; every write also
  carries the blob's ETag (If-Match), so a writer whose lease lapsed fails loudly
  instead of overwriting a newer record;
- it sits next to the checkpoint it describes, under the same prefix and the same access
  rights, and `status` reads it without the controller running.

Job tags were the alternative and were rejected: Azure ML offers no conditional update on
them (last writer wins), they live on jobs that may not exist yet, and their values are
short strings.

A cancel request from the user (`python -m jobs cancel`) goes to a blob of its own,
`supervision-cancel.json`, which needs no lease: the controller reads it on every loop.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from jobs.managed.policy import Policy

SCHEMA = 1
RECORD_BLOB = "supervision.json"
CANCEL_BLOB = "supervision-cancel.json"
LEASE_S = 60
DONE_STATES = ("succeeded", "failed", "canceled")


def now_utc() -> datetime:
    return datetime.now(UTC)


def iso(when: datetime | None) -> str | None:
    return when.astimezone(UTC).isoformat(timespec="seconds") if when else None


def parse_time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def record_name(prefix: str) -> str:
    return f"{prefix.strip('/')}/{RECORD_BLOB}"


def cancel_name(prefix: str) -> str:
    return f"{prefix.strip('/')}/{CANCEL_BLOB}"


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
    first_step: int | None = None
    last_step: int | None = None
    nodes: int = 0
    usd: float | None = None
    node_events: list[str] = field(default_factory=list)
    bad_nodes: list[dict[str, Any]] = field(default_factory=list)

    def hours(self, until: datetime | None = None) -> float:
        """Hours on its nodes: from the start to the end (or `until` while it runs)."""
        start = parse_time(self.started_at)
        end = parse_time(self.ended_at) or until
        return max(0.0, (end - start).total_seconds() / 3600) if start and end else 0.0


@dataclass
class Record:
    run: str
    recipe: str
    policy: dict[str, Any]
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
    schema: int = SCHEMA

    @property
    def done(self) -> bool:
        return self.state in DONE_STATES

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def rules(self) -> Policy:
        return Policy.from_json(self.policy)

    def attempts_usd(self, now: datetime | None = None) -> float:
        policy = self.rules()
        return sum(a.usd if a.usd is not None else policy.attempt_usd(a.hours(now)) for a in self.attempts)

    def controller_usd(self, now: datetime | None = None) -> float:
        policy = self.rules()
        hours = 0.0
        for c in self.controllers:
            start, seen = parse_time(c.get("started_at")), parse_time(c.get("seen_at"))
            if start and seen:
                hours += max(0.0, (seen - start).total_seconds() / 3600)
        return hours * policy.controller_usd_per_hour

    def total_usd(self, now: datetime | None = None) -> float:
        return self.attempts_usd(now) + self.controller_usd(now)

    def hours_run(self) -> float:
        return sum(a.hours() for a in self.attempts)

    def finish(self, state: str, reason: str) -> None:
        self.state, self.reason, self.next_attempt_at = state, reason, None

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
    """The record blob: load, create, save under a lease with an ETag condition."""

    def __init__(self, container, prefix: str):
        self.container = container
        self.prefix = prefix.strip("/")
        self.blob = container.get_blob_client(record_name(self.prefix))
        self.lease = None

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
        try:
            return self.blob.upload_blob(json.dumps(record.to_json(), indent=1).encode(), overwrite=False)["etag"]
        except ResourceExistsError:
            raise RecordConflict(f"{record_name(self.prefix)} exists already") from None

    def save(self, record: Record, etag: str) -> str:
        """Overwrite if nobody else wrote since `etag` (and while holding the lease)."""
        from azure.core import MatchConditions
        from azure.core.exceptions import HttpResponseError, ResourceModifiedError

        record.updated_at = iso(now_utc())
        try:
            return self.blob.upload_blob(json.dumps(record.to_json(), indent=1).encode(), overwrite=True, etag=etag,
                                         match_condition=MatchConditions.IfNotModified, lease=self.lease)["etag"]
        except ResourceModifiedError:
            raise RecordConflict(f"{record_name(self.prefix)} was changed by another writer") from None
        except HttpResponseError as exc:
            if exc.status_code in (409, 412):  # lease missing, lost or held by another
                raise RecordConflict(f"{record_name(self.prefix)}: {exc.error_code or exc.reason}") from None
            raise

    # the lease: one acting controller at a time
    def acquire(self, duration_s: int = LEASE_S) -> bool:
        """Take the lease; False when another controller holds it."""
        from azure.core.exceptions import HttpResponseError

        try:
            self.lease = self.blob.acquire_lease(lease_duration=duration_s)
            return True
        except HttpResponseError as exc:
            if exc.status_code == 409:
                return False
            raise

    def renew(self) -> None:
        from azure.core.exceptions import HttpResponseError

        try:
            self.lease.renew()
        except HttpResponseError as exc:
            self.lease = None
            raise RecordConflict(f"lost the lease on {record_name(self.prefix)}: {exc.error_code or exc.reason}") from None

    def release(self) -> None:
        if self.lease is not None:
            try:
                self.lease.release()
            except Exception:  # noqa: BLE001 - it expires by itself within LEASE_S
                pass
            self.lease = None

    # the user's cancel request
    def request_cancel(self, by: str) -> None:
        self.container.upload_blob(cancel_name(self.prefix), json.dumps({"by": by, "at": iso(now_utc())}).encode(),
                                   overwrite=True)

    def cancel_requested(self) -> dict[str, Any] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return json.loads(self.container.get_blob_client(cancel_name(self.prefix)).download_blob().readall())
        except ResourceNotFoundError:
            return None
