"""The supervision loop of a managed run: claim an attempt, submit it, watch it, classify
how it ended, wait, and go again - or stop and say why.

Every decision is taken from the run's record (record.py) and written back before the
next side effect, so a controller that is restarted at any point continues where the
record stands:

- an attempt is claimed (written as `submitting`, with the checkpoint version it will
  restore) before its job is created; a restarted controller that finds a claimed
  attempt looks the job up by its name (`<run>-a<n>`) and creates it only if it does not
  exist, so a crash between the two never yields a second job;
- a new attempt is claimed only after the previous one was seen ended (a terminal
  status): never two attempts at once;
- only the controller holding the record's lease acts; another one waits.

The job service is Azure ML (azureml.py) in the cloud and simulated nodes in the local
rehearsal (jobs.local.managed); both speak observation.py's vocabulary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from jobs.managed.classify import Verdict, classify
from jobs.managed.evidence import Evidence
from jobs.managed.observation import Observation
from jobs.managed.policy import Policy
from jobs.managed.record import (
    Attempt,
    Record,
    RecordConflict,
    RecordStore,
    iso,
    now_utc,
    parse_time,
)


class JobService(Protocol):
    def submit(self, job: str, attempt: int) -> None:
        """Create the training job named `job` (attempt number `attempt`)."""

    def observe(self, job: str) -> Observation | None:
        """The job's state, or None when no job has that name."""

    def cancel(self, job: str) -> None:
        """Ask for the job to be canceled (returns without waiting)."""


MAX_FAILED_LOOKS = 20
"""Consecutive failed looks (Azure ML or storage unreachable) before the controller gives up."""
POLL_AFTER_ERROR_S = 30.0


def attempt_job_name(run: str, number: int) -> str:
    return f"{run}-a{number}"


def open_record(store: RecordStore, run: str, recipe: str, policy: Policy) -> Record:
    """The run's record: created on the first start; reopened (with this policy, counting
    restarts afresh) when a finished run is started again; kept as it is otherwise."""
    record, etag = store.load()
    if record is None:
        try:
            store.create(Record(run=run, recipe=recipe, policy=policy.to_json()))
        except RecordConflict:
            pass  # another controller created it first: fine, it is the same run
        record, etag = store.load()
        assert record is not None
        return record
    record.policy = policy.to_json()
    if record.done:
        record.state, record.reason, record.base_attempt = "running", None, len(record.attempts)
    store.save(record, etag)
    return record


@dataclass
class Supervisor:
    store: RecordStore
    service: JobService
    evidence: Evidence
    controller: str = "local"
    """The controller's own name (its job name in Azure), kept in the record for its cost."""
    echo: Callable[[str], None] = print
    clock: Callable[[], datetime] = now_utc
    sleep: Callable[[float], None] = time.sleep
    said: set[str] = field(default_factory=set)

    # --- the loop -------------------------------------------------------------------

    def start(self, run: str, recipe: str, policy: Policy) -> Record:
        """The controller's entry: create the run's record if there is none, take its lease,
        open it with this policy (open_record), and act until the run is done."""
        if self.store.load()[0] is None:
            try:
                self.store.create(Record(run=run, recipe=recipe, policy=policy.to_json()))
            except RecordConflict:
                pass  # another controller was first
        self._take_lease()
        try:
            open_record(self.store, run, recipe, policy)
            return self._loop()
        finally:
            self.store.release()

    def run(self) -> Record:
        """Act on an opened record until the run is done; returns the final record."""
        self._take_lease()
        try:
            return self._loop()
        finally:
            self.store.release()

    def _loop(self) -> Record:
        failures = 0
        while True:
            try:
                record = self.tick()
                if record.done:
                    return record
                failures = 0
                self.sleep(self.pause(record))
                self.store.renew()
            except RecordConflict as exc:
                self.echo(f"the record changed underneath ({exc}): taking the lease again")
                self.store.release()
                self._take_lease()
            except Exception as exc:  # noqa: BLE001 - Azure or storage trouble: keep supervising, a while
                failures += 1
                if failures > MAX_FAILED_LOOKS:
                    raise
                self.echo(f"look {failures} of {MAX_FAILED_LOOKS} failed ({type(exc).__name__}: {exc}); trying again")
                self.sleep(POLL_AFTER_ERROR_S)
                try:
                    self.store.renew()
                except RecordConflict:
                    self.store.release()
                    self._take_lease()

    def _take_lease(self) -> None:
        while not self.store.acquire():
            self._say_once("lease", "another controller holds this run's lease: waiting for it to stop (at most "
                                    "a minute after it is gone)")
            self.sleep(10)

    def pause(self, record: Record) -> float:
        """Seconds until the next look: the poll interval, or less when a restart is due sooner."""
        poll = record.rules().poll_s
        due = parse_time(record.next_attempt_at)
        if due is not None:
            return max(0.0, min(poll, (due - self.clock()).total_seconds()))
        return poll

    def tick(self) -> Record:
        """One look at the run: at most one side effect (a submit, a cancel), then the record is saved."""
        record, etag = self.store.load()
        if record is None:
            raise RecordConflict(f"no record at {self.store.prefix}: the controller opens it first")
        now = self.clock()
        self._note_controller(record, now)
        if not record.done:
            etag = self._step(record, etag, now)
        self.store.save(record, etag)
        return record

    def _step(self, record: Record, etag: str, now: datetime) -> str:
        current = record.current
        cancel = self.store.cancel_requested()
        if cancel:
            if current is not None and current.state != "ended":
                self.service.cancel(current.job)
                self._end(record, current, Verdict("canceled", f"canceled by {cancel.get('by', 'the user')}"), now,
                          "Canceled")
            record.finish("canceled", f"canceled by {cancel.get('by', 'the user')} at {cancel.get('at', iso(now))}")
            self.echo(f"run {record.run}: {record.reason}")
        elif current is None or current.state == "ended":
            stop = self._stop_reason(record, now)
            if stop:
                record.finish(*stop)
                self.echo(f"run {record.run} {record.state}: {record.reason}")
            elif not self._waiting(record, now):
                return self._claim(record, etag, now)
        elif current.state == "submitting":
            self._submit(current, now)
        else:
            self._watch(record, current, now)
        return etag

    # --- attempts -------------------------------------------------------------------

    def _claim(self, record: Record, etag: str, now: datetime) -> str:
        number = len(record.attempts) + 1
        attempt = Attempt(number=number, job=attempt_job_name(record.run, number), claimed_at=iso(now),
                          nodes=record.rules().nodes, resumed_version=self.evidence.latest_version())
        record.attempts.append(attempt)
        record.next_attempt_at = None
        etag = self.store.save(record, etag)  # the claim is durable before the job exists
        self._submit(attempt, now)
        return etag

    def _submit(self, attempt: Attempt, now: datetime) -> None:
        if self.service.observe(attempt.job) is None:
            self.service.submit(attempt.job, attempt.number)
            source = f"checkpoint {attempt.resumed_version}" if attempt.resumed_version else "the start (no checkpoint yet)"
            self.echo(f"attempt {attempt.number}: submitted {attempt.job}, resuming from {source}")
        else:
            self.echo(f"attempt {attempt.number}: {attempt.job} exists already: watching it")
        attempt.state, attempt.submitted_at = "running", iso(now)

    def _watch(self, record: Record, attempt: Attempt, now: datetime) -> None:
        observation = self.service.observe(attempt.job)
        if observation is None:
            self._end(record, attempt, Verdict("unknown", f"job {attempt.job} no longer exists"), now, "Missing")
            return
        if observation.status != attempt.status:
            self.echo(f"attempt {attempt.number}: {attempt.job} is {observation.status}")
        attempt.status = observation.status
        if observation.started_at and (attempt.started_at is None or observation.started_at < parse_time(attempt.started_at)):
            attempt.started_at = iso(observation.started_at)
        elif observation.running and attempt.started_at is None:
            attempt.started_at = iso(now)
        for state in observation.trouble:
            if state not in attempt.node_events:
                attempt.node_events.append(state)
                self.echo(f"attempt {attempt.number}: a node of {attempt.job} is {state}")
        if not observation.terminal:
            step = self.evidence.last_step(attempt.job)
            attempt.last_step = step if step is not None else attempt.last_step
            return
        verdict = classify(observation, self.evidence.ends(attempt.job), attempt.nodes, attempt.node_events)
        self._end(record, attempt, verdict, observation.ended_at or now, observation.status)

    def _end(self, record: Record, attempt: Attempt, verdict: Verdict, ended: datetime, status: str) -> None:
        policy = record.rules()
        attempt.state, attempt.status, attempt.ended_at = "ended", status, iso(ended)
        attempt.cause, attempt.detail, attempt.exit_code = verdict.cause, verdict.detail, verdict.exit_code
        attempt.retryable = verdict.retryable(policy.retry_on)
        attempt.first_step = verdict.first_step if verdict.first_step is not None else attempt.first_step
        attempt.last_step = verdict.last_step if verdict.last_step is not None else attempt.last_step
        attempt.bad_nodes = list(verdict.bad_nodes)
        attempt.usd = round(policy.attempt_usd(attempt.hours()), 2)
        if attempt.retryable:
            wait = policy.backoff(len(record.attempts) - record.base_attempt)
            record.next_attempt_at = iso(self.clock() + timedelta(seconds=wait))
        self.echo(f"attempt {attempt.number}: {attempt.job} ended {status}: {verdict.cause} ({verdict.detail})"
                  + (f"; bad node(s): {', '.join(_node_text(b) for b in attempt.bad_nodes)}" if attempt.bad_nodes else "")
                  + ("; retryable" if attempt.retryable else "; not retryable"))

    # --- decisions ------------------------------------------------------------------

    def _stop_reason(self, record: Record, now: datetime) -> tuple[str, str] | None:
        current = record.current
        if current is None or len(record.attempts) <= record.base_attempt:
            return None  # nothing yet since the run was (re)started
        policy = record.rules()
        what = f"attempt {current.number} ended {current.cause} ({current.detail})"
        if current.cause == "completed":
            return "succeeded", f"attempt {current.number} completed"
        if current.cause == "canceled":
            return "canceled", f"{what}: a cancel is the user's decision, not retried"
        if not current.retryable:
            return "failed", f"{what}: not retried (managed.retry_on: {', '.join(map(str, policy.retry_on))})"
        restarts = len(record.attempts) - record.base_attempt - 1
        if restarts >= policy.max_restarts:
            return "failed", f"{what}: max restarts reached ({restarts} of managed.max_restarts {policy.max_restarts})"
        if policy.limit_usd is not None:
            spent = record.total_usd(now)
            upcoming = policy.next_attempt_usd(record.hours_run())
            if spent + upcoming > policy.limit_usd:
                return "failed", (f"{what}: over budget: ${spent:,.2f} spent + ${upcoming:,.2f} for one more attempt "
                                  f"exceeds {policy.limit_source or 'the limit'} ${policy.limit_usd:,.2f}")
        return None

    def _waiting(self, record: Record, now: datetime) -> bool:
        due = parse_time(record.next_attempt_at)
        if due is not None and now < due:
            self._say_once(f"wait-{len(record.attempts)}", f"next attempt at {iso(due)} (backoff)")
            return True
        return False

    def _note_controller(self, record: Record, now: datetime) -> None:
        for entry in record.controllers:
            if entry.get("job") == self.controller:
                entry["seen_at"] = iso(now)
                return
        record.controllers.append({"job": self.controller, "started_at": iso(now), "seen_at": iso(now)})

    def _say_once(self, key: str, text: str) -> None:
        if key not in self.said:
            self.said.add(key)
            self.echo(text)


def _node_text(bad: dict) -> str:
    where = bad.get("host") or f"node {bad.get('node')}"
    return f"{where} ({bad.get('why')})"
