"""The supervision loop of a managed run: claim an attempt, submit it, watch it, classify
how it ended, wait, and go again - or stop and say why.

Every decision is taken from the run's record (record.py) and the controller's own rules
(policy.py, from its job definition), and written back before the next side effect, so a
controller that is restarted at any point continues where the record stands:

- an attempt is claimed (written as `submitting`, with the checkpoint version it will
  restore) before its job is created; a restarted controller that finds a claimed
  attempt looks the job up by its name (`<run>-a<n>`) and creates it only if it does not
  exist, so a crash between the two never yields a second job;
- a new attempt is claimed only after the previous one was seen ended (a terminal
  status): never two attempts at once;
- only the controller holding the record's lease acts; another one waits;
- a cancel request is honoured before anything else, and checked again right before a
  job is created: once a cancel is asked, no controller creates a job.

While an attempt runs, each look also enforces what cannot wait for its end: the cost
limit (spent plus the cost of the time to the next checkpoint), the queue timeout (and,
after a lost node, a cluster whose capacity answer is short of the attempt's nodes), a job
Azure ML leaves Paused/Unknown/NotResponding, and names stragglers.

Shrink-and-continue (policy.shrink_nodes, from managed.min_nodes): after an attempt lost a
node (node_failure, preempted), an attempt that cannot get its nodes (queue timeout, or the
capacity answer) is followed by one on the next smaller count, down to the smallest, and
only then by one on the next cluster; every other restart asks for the full count again
(it grows back when the capacity is there). The record says each attempt's count and why. A look that fails
(Azure ML or storage unreachable) is retried with a capped backoff, without end: the
record is unchanged meanwhile, and the attempt is never left unsupervised because an
outage lasted. A job Azure ML refuses for good (HTTP 400/404/409/422 on its creation) ends
its attempt at once as bad input.

Named fault points (amlhpc.jobs.runtime.base.faultpoints) sit at every step, for tests and rehearsals.

The job service is Azure ML (azureml.py) in the cloud and simulated nodes in the local
rehearsal (amlhpc.jobs.local.managed); both speak observation.py's vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from amlhpc.jobs.managed import codeasset, stragglers
from amlhpc.jobs.managed.causes import Why
from amlhpc.jobs.managed.classify import Verdict, classify
from amlhpc.jobs.managed.codeasset import CodeAsset, CodeChanged
from amlhpc.jobs.managed.evidence import Evidence
from amlhpc.jobs.managed.observation import Observation
from amlhpc.jobs.managed.policy import Policy, Target
from amlhpc.jobs.managed.record import (
    Attempt,
    Record,
    RecordConflict,
    RecordStore,
    iso,
    now_utc,
    parse_time,
)
from amlhpc.jobs.runtime.base import clock as clocks
from amlhpc.jobs.runtime.base import contract, faultpoints
from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of
from amlhpc.jobs.runtime.checkpoint.trust import keys_json, pins_document, pins_json


class JobService(Protocol):
    def submit(self, job: str, attempt: int, target: Target, environment: dict[str, str]) -> None:
        """Create the training job named `job` (attempt number `attempt`) on `target`."""

    def observe(self, job: str) -> Observation | None:
        """The job's state, or None when no job has that name."""

    def cancel(self, job: str) -> None:
        """Ask for the job to be canceled (returns without waiting)."""

    def refusal(self, exc: BaseException) -> str | None:
        """Why the service refused a submit for good, or None when the failure may pass."""


REQUEUED_FROM = frozenset({"Running", "Finalizing", "NotResponding"})
"""A job seen in one of these and then back in the queue (or preparing) was requeued by Azure ML."""
NODE_LOSS = ("node_failure", "preempted")
"""Causes that took a node away: after one, an attempt that cannot get its nodes may shrink."""


def attempt_job_name(run: str, number: int) -> str:
    return f"{run}-a{number}"


def permanent_failure(exc: BaseException) -> bool:
    """A failed look that waiting cannot fix: the controller's identity lacks a right."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    return isinstance(exc, ClientAuthenticationError) or (isinstance(exc, HttpResponseError)
                                                          and getattr(exc, "status_code", None) == 403)


@dataclass(frozen=True)
class Resume:
    """An explicit `submit --managed --resume`: reopens a finished run once."""

    token: str
    at: str
    """When it was asked: cancel requests made before are set aside."""


def new_record(run: str, recipe: str, policy: Policy, code: CodeAsset | None = None) -> Record:
    """A run's first record, with its code asset's content hash when the controller has one."""
    return Record(run=run, recipe=recipe, policy=policy.to_json(), code=codeasset.recorded(code) if code else None)


def open_record(store: RecordStore, run: str, recipe: str, policy: Policy, resume: Resume | None = None,
                echo: Callable[[str], None] = print, code: CodeAsset | None = None) -> Record:
    """The run's record: created on the first start (with `code`'s content hash); reopened by
    an explicit resume (once, counting restarts afresh and setting earlier cancel requests
    aside); kept as it is otherwise - a finished run stays finished for every other controller."""
    record, etag = store.load()
    if record is None:
        try:
            store.create(new_record(run, recipe, policy, code))
        except RecordConflict:
            pass  # another controller created it first: fine, it is the same run
        record, etag = store.load()
        assert record is not None
    if resume is None or resume.token in record.resumes:
        return record
    request = store.cancel_request()
    if request and request["id"] not in record.cancels_handled and str(request.get("at", "")) <= resume.at:
        record.cancels_handled.append(request["id"])
    record.resumes.append(resume.token)
    if record.done:
        echo(f"run {run}: resumed after it {record.state} ({record.reason})")
        record.state, record.reason, record.base_attempt, record.target = "running", None, len(record.attempts), 0
        record.preemptions, record.next_nodes, record.shrink_reason, record.node_lost = 0, None, None, None
    record.policy = policy.to_json()
    assert etag is not None, "a stored blob always has an ETag"
    store.save(record, etag)
    return record


@dataclass
class Supervisor:
    store: RecordStore
    service: JobService
    evidence: Evidence
    policy: Policy
    """The rules, from the controller's own job definition: never reloaded from the record."""
    controller: str = "local"
    """The controller's own name (its job name in Azure), kept in the record for its cost."""
    resume: Resume | None = None
    echo: Callable[[str], None] = print
    code: CodeAsset | None = None
    """The code asset the attempts run (the controller's own): checked against the record's
    content hash before each attempt is created (None: not checked, for local tools)."""
    clock: Callable[[], datetime] = now_utc
    sleep: Callable[[float], None] = clocks.sleep
    said: set[str] = field(default_factory=set)
    renewed: float = 0.0

    # --- the loop -------------------------------------------------------------------

    def start(self, run: str, recipe: str) -> Record:
        """The controller's entry: create the run's record if there is none, take its lease,
        open it (open_record), and act until the run is done."""
        if self.store.load()[0] is None:
            try:
                self.store.create(new_record(run, recipe, self.policy, self.code))
            except RecordConflict:
                pass  # another controller was first

        def body() -> Record:
            open_record(self.store, run, recipe, self.policy, self.resume, self.echo, self.code)
            return self._loop()

        return self._leased(body)

    def run(self) -> Record:
        """Act on an opened record until the run is done; returns the final record."""
        return self._leased(self._loop)

    def _leased(self, body: Callable[[], Record]) -> Record:
        self._take_lease()
        try:
            result = body()
        except faultpoints.Crash:
            raise  # a dead process releases nothing: its lease lapses, as a killed controller's does
        except BaseException:
            self.store.release()
            raise
        self.store.release()
        return result

    def _loop(self) -> Record:
        failures = 0
        while True:
            try:
                record = self.tick()
                if record.done:
                    return record
                failures = 0
                self._wait(self.pause(record))
            except RecordConflict as exc:
                self.echo(f"the record changed underneath ({exc}): taking the lease again")
                self.store.release()
                self._take_lease()
            except Exception as exc:
                if permanent_failure(exc):
                    raise
                failures += 1
                wait = self.policy.outage_wait(failures)
                self.echo(f"look failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                          f"{failures} in a row, the record is unchanged; looking again in {wait:.0f}s")
                self._wait(wait)

    def _wait(self, seconds: float) -> None:
        """Sleep, renewing the lease often enough that it never lapses meanwhile (the lease
        runs in real time at the service, whatever clock the controller is given)."""
        step = max(1.0, self.policy.lease_s / 3)
        remaining = seconds
        while True:
            chunk = min(remaining, step)
            self.sleep(chunk)
            remaining -= chunk
            if remaining <= 0 or clocks.monotonic() - self.renewed >= step:
                self._renew()
            if remaining <= 0:
                return

    def _renew(self) -> None:
        self.renewed = clocks.monotonic()
        try:
            self.store.renew()
        except RecordConflict:
            self.store.release()
            self._take_lease()
        except Exception as exc:  # noqa: BLE001 - storage down: the next write's ETag check still guards the record
            self._say_once(f"renew-{type(exc).__name__}", f"could not renew the lease ({type(exc).__name__}); going on")

    def _take_lease(self) -> None:
        while not self.store.acquire():
            self._say_once("lease", "another controller holds this run's lease: waiting for it to stop (at most "
                                    f"{self.policy.lease_s}s after it is gone)")
            self.sleep(min(10.0, self.policy.lease_s / 4))

    def pause(self, record: Record) -> float:
        """Seconds until the next look: the poll interval, or less when a restart is due sooner."""
        due = parse_time(record.next_attempt_at)
        if due is not None:
            return max(0.0, min(self.policy.poll_s, (due - self.clock()).total_seconds()))
        return self.policy.poll_s

    def tick(self) -> Record:
        """One look at the run: at most one side effect (a submit, a cancel), then the record is saved."""
        record, etag = self.store.load()
        if record is None:
            raise RecordConflict(f"no record at {self.store.prefix}: the controller opens it first")
        assert etag is not None, "a stored blob always has an ETag"
        now = self.clock()
        self._note_controller(record, now)
        if not record.done:
            etag = self._step(record, etag, now)
        self._save(record, etag)
        return record

    def _save(self, record: Record, etag: str) -> str:
        faultpoints.reach("controller.record.write", run=record.run, attempts=len(record.attempts))
        record.policy = self.policy.to_json()  # what this controller obeys, for readers; never read back
        return self.store.save(record, etag)

    def _step(self, record: Record, etag: str, now: datetime) -> str:
        current = record.current
        request = self._cancel_request(record)
        if request:
            self._honour_cancel(record, current, request, now)
        elif current is None or current.state == "ended":
            stop = self._stop_reason(record, now)
            if stop:
                record.finish(*stop)
                self.echo(f"run {record.run} {record.state}: {record.reason}")
            elif self._waiting(record, now):
                faultpoints.reach("controller.backoff", attempt=len(record.attempts))
            else:
                return self._claim(record, etag, now)
        elif current.state == "submitting":
            self._submit(record, current, now)
        else:
            return self._watch(record, current, etag, now)
        return etag

    # --- cancel ---------------------------------------------------------------------

    def _cancel_request(self, record: Record) -> dict[str, Any] | None:
        request = self.store.cancel_request()
        return request if request and request["id"] not in record.cancels_handled else None

    def _honour_cancel(self, record: Record, current: Attempt | None, request: dict[str, Any], now: datetime) -> None:
        faultpoints.reach("controller.cancel", attempt=current.number if current else 0)
        who = f"canceled by {request.get('by') or 'the user'} at {request.get('at') or iso(now)}"
        if current is not None and current.state != "ended":
            if current.state == "running" or self.service.observe(current.job) is not None:
                self.service.cancel(current.job)
            self._end(record, current, Verdict(Why.CANCELED, who), now, "Canceled")
        record.cancels_handled.append(request["id"])
        record.finish("canceled", who)
        self.echo(f"run {record.run}: {who}")

    # --- attempts -------------------------------------------------------------------

    def _claim(self, record: Record, etag: str, now: datetime) -> str:
        number = len(record.attempts) + 1
        faultpoints.reach("controller.claim", attempt=number)
        target = self.policy.target(record.target)
        nodes = min(record.next_nodes or target.nodes, target.nodes)
        attempt = Attempt(number=number, job=attempt_job_name(record.run, number), claimed_at=iso(now),
                          nodes=nodes, full_nodes=target.nodes, cluster=target.cluster, target=record.target,
                          shrunk=record.shrink_reason if nodes < target.nodes else None,
                          usd_per_hour=nodes * target.usd_per_node_hour)
        checked = self.evidence.checked(*_pointer_bounds(record))
        attempt.resumed_version = checked.version
        attempt.restore_pin = pins_document(checked.pins)
        self._note_ignored(attempt, checked.refused)
        previous = record.current
        if previous is not None and previous.full_nodes and previous.nodes < previous.full_nodes <= nodes:
            self.echo(f"attempt {number} asks for all {nodes} nodes again (attempt {previous.number} ran on "
                      f"{previous.nodes}): it shrinks again only if they cannot be had")
        record.attempts.append(attempt)
        record.next_attempt_at, record.next_nodes, record.shrink_reason = None, None, None
        etag = self._save(record, etag)  # the claim is durable before the job exists
        faultpoints.reach("controller.claimed", attempt=number)
        self._submit(record, attempt, now)
        return etag

    def _submit(self, record: Record, attempt: Attempt, now: datetime) -> None:
        request = self._cancel_request(record)
        if request:  # asked between the claim and now: the job is never created
            self._honour_cancel(record, attempt, request, now)
            return
        if self.service.observe(attempt.job) is None:
            target = replace(self.policy.target(attempt.target), nodes=attempt.nodes)
            environment = {contract.EVIDENCE_KEY: key} if (key := self.evidence.key(attempt.job)) else {}
            if key and attempt.restore_pin is not None:
                environment[contract.RESTORE_PIN] = pins_json(attempt.restore_pin)
                environment[contract.EARLIER_KEYS] = keys_json(
                    {a.job: k for a in record.attempts if a.job != attempt.job and (k := self.evidence.key(a.job))})
            if self.code is not None:
                try:
                    codeasset.check(self.code, record.code)
                except CodeChanged as exc:
                    self.echo(f"attempt {attempt.number}: not created: {exc}")
                    self._end(record, attempt, Verdict(Why.BAD_INPUT, str(exc)), now, "NotCreated")
                    record.finish("failed", str(exc))  # no retry rule runs code nobody submitted
                    return
            try:
                self.service.submit(attempt.job, attempt.number, target, environment)
            except Exception as exc:
                refused = self.service.refusal(exc)
                if refused is None:
                    raise  # may pass: the claim stands, the next look creates the job
                self._end(record, attempt, Verdict(Why.BAD_INPUT, refused), now, "NotCreated")
                return
            faultpoints.reach("controller.submitted", attempt=attempt.number)
            source = f"checkpoint {attempt.resumed_version}" if attempt.resumed_version else "the start (no checkpoint yet)"
            size = f"{attempt.nodes} of {attempt.full_nodes} nodes (shrunk)" if attempt.shrunk else f"{attempt.nodes} node(s)"
            self.echo(f"attempt {attempt.number}: submitted {attempt.job} on {target.cluster or 'its cluster'}, "
                      f"{size}, resuming from {source}")
        else:
            self.echo(f"attempt {attempt.number}: {attempt.job} exists already: watching it")
        attempt.state, attempt.submitted_at = "running", iso(now)
        attempt.queued_since = attempt.submitted_at

    def _watch(self, record: Record, attempt: Attempt, etag: str, now: datetime) -> str:
        observation = self.service.observe(attempt.job)
        if observation is None:
            self._end(record, attempt, Verdict(Why.UNKNOWN, f"job {attempt.job} no longer exists"), now, "Missing")
            return etag
        self._follow_status(attempt, observation, now)
        if observation.capacity is not None:
            attempt.capacity = observation.capacity
        for state in observation.trouble:
            if state not in attempt.epoch_events:
                attempt.epoch_events.append(state)
                self.echo(f"attempt {attempt.number}: a node of {attempt.job} is {state}")
            if state not in attempt.node_events:
                attempt.node_events.append(state)
        if observation.terminal:
            ends = self.evidence.ends(attempt.job, attempt.nodes, attempt.stale_ends)
            self._note_ignored(attempt, ends.refused)
            verdict = classify(observation, ends.records, attempt.nodes, attempt.epoch_events, ends.tampered,
                               attempt.last_step)
            if attempt.stopping is not None and observation.status == "Canceled":
                verdict = _stopped(attempt.stopping)  # the controller's own cancel, its record write lost
            self._end(record, attempt, verdict, observation.ended_at or now, observation.status)
            return etag
        if attempt.stopping is not None:  # stopped by a controller that died before the cancel went out
            return self._stop(record, attempt, _stopped(attempt.stopping), etag, now)
        self._note_commit(record, attempt, now)
        beats, refused = self.evidence.heartbeats(attempt.job)
        self._note_ignored(attempt, refused)
        step = self.evidence.last_step(beats)
        attempt.last_step = step if step is not None else attempt.last_step
        for named in stragglers.look(attempt, beats, self.policy.straggler_factor, self.policy.straggler_looks, now):
            self.echo(f"attempt {attempt.number}: {stragglers.describe(named)}")
        stop = self._must_stop(record, attempt, observation, now) or self._silent_nodes(attempt, observation, beats, now)
        faultpoints.reach("controller.watch", attempt=attempt.number, status=observation.status)
        if stop is not None:
            return self._stop(record, attempt, stop, etag, now)
        return etag

    def _stop(self, record: Record, attempt: Attempt, verdict: Verdict, etag: str, now: datetime) -> str:
        """The controller ends a running attempt itself (budget, queue timeout, stall, a silent
        node): its verdict is in the record before the job is canceled, so a controller that
        dies anywhere after leaves an attempt the next one ends with the same cause (a cancel
        again, idempotent; or a Canceled job taken for this stop, not for the user's cancel)."""
        if attempt.stopping is None:
            attempt.stopping = {"cause": str(verdict.cause), "detail": verdict.detail,
                                "bad_nodes": [dict(b) for b in verdict.bad_nodes]}
            etag = self._save(record, etag)
            faultpoints.reach("controller.stopping", attempt=attempt.number, cause=verdict.cause)
        self.service.cancel(attempt.job)
        self._end(record, attempt, verdict, now, "Canceled")
        return etag

    def _silent_nodes(self, attempt: Attempt, observation: Observation, beats: dict[int, Any],
                      now: datetime) -> Verdict | None:
        """Azure ML says Running, but a node's heartbeat has not changed for policy.silent_node_s
        (or, once any node wrote one, a node never wrote one for that long): its launcher is
        frozen or its host gone, and no peer's watchdog ended the job. Measured on this
        controller's clock between its own looks (a heartbeat's time is the storage service's,
        never compared with this clock); the nodes are named to distrust."""
        limit = self.policy.silent_node_s
        if not limit or observation.status != "Running":
            if not observation.running:
                attempt.beats_seen, attempt.beats_since = {}, None  # requeued or not started: judged afresh
            return None
        for node, beat in beats.items():
            seen = attempt.beats_seen.get(str(node))
            mark = f"{iso(beat.written)} {beat.step} {beat.age_s}"  # a new write changes one of them
            if beat.state == "ended":
                attempt.beats_seen[str(node)] = [mark, ""]
            elif seen is None or seen[0] != mark:
                attempt.beats_seen[str(node)] = [mark, iso(now) or ""]
        if not beats:
            return None
        attempt.beats_since = attempt.beats_since or iso(now)
        silent: list[tuple[int, float]] = []
        for node in range(attempt.nodes):
            seen = attempt.beats_seen.get(str(node))
            if seen is not None and not seen[1]:
                continue  # its launcher ended: the job's end is near
            since = parse_time(seen[1] if seen is not None else attempt.beats_since)
            age = (now - since).total_seconds() if since else 0.0
            if age > limit:
                silent.append((node, age))
        if not silent:
            return None
        named = ", ".join(f"node {n} ({beats[n].host if n in beats else 'no heartbeat yet'}) for {age:.0f}s"
                          for n, age in silent)
        bad = tuple({"node": n, **({"host": beats[n].host} if n in beats and beats[n].host else {}),
                     "why": "heartbeat stopped"} for n, _ in silent)
        return Verdict(Why.NODE_FAILURE, f"Azure ML reports {observation.status} but no new heartbeat came from {named} "
                                         f"(managed.silent_node_s {limit:g}): its launcher is frozen or its host gone",
                       bad_nodes=bad)

    def _follow_status(self, attempt: Attempt, observation: Observation, now: datetime) -> None:
        previous = attempt.status
        if observation.status != previous:
            self.echo(f"attempt {attempt.number}: {attempt.job} is {observation.status}")
            if previous in REQUEUED_FROM and (observation.queued or observation.status == "Preparing"):
                attempt.requeued_at.append(iso(now))
                attempt.epoch_events = []
                attempt.stale_ends = self.evidence.stale_marks(attempt.job, attempt.stale_ends)
                attempt.queued_since = iso(now)
                self.echo(f"attempt {attempt.number}: Azure ML requeued {attempt.job} (epoch {len(attempt.requeued_at) + 1}): "
                          "its end is classified from what happens from now on")
        attempt.status = observation.status
        started = parse_time(attempt.started_at)
        if observation.started_at and (started is None or observation.started_at < started):
            attempt.started_at = iso(observation.started_at)
        elif observation.running and attempt.started_at is None:
            attempt.started_at = iso(now)
        attempt.stalled_since = (attempt.stalled_since or iso(now)) if observation.stalled else None

    def _must_stop(self, record: Record, attempt: Attempt, observation: Observation, now: datetime) -> Verdict | None:
        """What ends a running attempt before Azure ML does: the cost limit, the queue
        timeout, a status that stays Paused/Unknown/NotResponding."""
        over = self._over_budget(record, attempt, now)
        if over:
            return Verdict(Why.BUDGET, over)
        policy = self.policy
        queued = parse_time(attempt.queued_since)
        if policy.queue_timeout_s and observation.queued and queued and (now - queued).total_seconds() > policy.queue_timeout_s:
            return Verdict(Why.QUEUE_TIMEOUT, f"queued {(now - queued).total_seconds():.0f}s on "
                                            f"{attempt.cluster or 'its cluster'} (managed.queue_timeout_s "
                                            f"{policy.queue_timeout_s:g})")
        short = self._short_of_nodes(record, attempt) if observation.queued else None
        if short:
            return Verdict(Why.QUEUE_TIMEOUT, short)
        stalled = parse_time(attempt.stalled_since)
        if stalled and (now - stalled).total_seconds() > policy.stall_s:
            return Verdict(Why.STALLED, f"Azure ML reported {observation.status} for {(now - stalled).total_seconds():.0f}s "
                                      f"(managed.stall_s {policy.stall_s:g})")
        return None

    def _short_of_nodes(self, record: Record, attempt: Attempt) -> str | None:
        """Why a queued attempt will not get its nodes, when the run may shrink instead: a node
        was lost and the cluster's capacity answer is below the attempt's count."""
        capacity = attempt.capacity
        if record.node_lost is None or capacity is None or capacity >= attempt.nodes or \
                self.policy.smaller(attempt.nodes, capacity) is None:
            return None
        return (f"{attempt.cluster or 'its cluster'} can give at most {capacity} node(s) now (its maxNodes less its "
                f"unusable nodes), {attempt.nodes} asked: not waiting in the queue")

    def _over_budget(self, record: Record, attempt: Attempt, now: datetime) -> str | None:
        """Cancel now when what was spent plus the cost of the time to the next checkpoint
        would pass the limit (the work after the last checkpoint is lost either way)."""
        policy = self.policy
        if policy.limit_usd is None:
            return None
        spent = record.total_usd(policy.controller_usd_per_hour, now)
        ahead_s = self._to_next_checkpoint(attempt, now)
        rate = (attempt.usd_per_hour or 0.0) + policy.controller_usd_per_hour
        ahead = rate * ahead_s / 3600
        if spent + ahead <= policy.limit_usd:
            return None
        return (f"over budget while running: ${spent:,.2f} spent (queued and preparing time included) + "
                f"${ahead:,.2f} until the next checkpoint (in {ahead_s:.0f}s) would pass "
                f"{policy.limit_source or 'the limit'} ${policy.limit_usd:,.2f}")

    def _note_commit(self, record: Record, attempt: Attempt, now: datetime) -> None:
        """Keep when this controller first saw the latest checkpoint version (its own clock:
        never compared with another's); a forged or replayed pointer is noted and ignored."""
        checked = self.evidence.checked(*_pointer_bounds(record))
        self._note_ignored(attempt, checked.refused)
        version = checked.version
        if version and (not attempt.commit_seen or attempt.commit_seen[0] != version):
            digests = [p.manifest_sha256 for p in checked.pins.values() if p.version == version and p.manifest_sha256]
            attempt.commit_seen = [version, iso(now) or "", *digests[:1]]

    def _to_next_checkpoint(self, attempt: Attempt, now: datetime) -> float:
        interval = self.policy.checkpoint_interval_s
        if not interval:
            return self.policy.poll_s  # no checkpoint rhythm known: only the next look matters
        started = parse_time(attempt.started_at)
        if started is None:
            return interval  # not training yet: its first checkpoint is a full interval away
        seen = parse_time(attempt.commit_seen[1]) if attempt.commit_seen and attempt.commit_seen[0] != \
            attempt.resumed_version else None
        since = max(started, seen) if seen else started
        return max(0.0, interval - (now - since).total_seconds())

    def _end(self, record: Record, attempt: Attempt, verdict: Verdict, ended: datetime, status: str) -> None:
        """Every end of an attempt comes here: seen ended and classified, stopped by this
        controller (budget, queue timeout, stall, a silent node), canceled by the user, refused
        by Azure ML, or gone; the `controller.ended` fault point sits before the record write."""
        faultpoints.reach("controller.ended", attempt=attempt.number, cause=verdict.cause)
        policy = self.policy
        attempt.state, attempt.status, attempt.ended_at = "ended", status, iso(ended)
        attempt.cause, attempt.detail, attempt.exit_code = verdict.cause, verdict.detail, verdict.exit_code
        attempt.retryable = verdict.retryable(policy.retry_on)
        attempt.first_step = verdict.first_step if verdict.first_step is not None else attempt.first_step
        attempt.last_step = verdict.last_step if verdict.last_step is not None else attempt.last_step
        attempt.bad_nodes = list(verdict.bad_nodes)
        attempt.usd = round((attempt.usd_per_hour or 0.0) * attempt.charged_hours(), 2)
        self._move_on(record, attempt)
        if attempt.retryable:
            wait = policy.backoff(len(record.attempts) - record.base_attempt)
            record.next_attempt_at = iso(self.clock() + timedelta(seconds=wait))
        self.echo(f"attempt {attempt.number}: {attempt.job} ended {status}: {verdict.cause} ({verdict.detail})"
                  + (f"; bad node(s): {', '.join(_node_text(b) for b in attempt.bad_nodes)}" if attempt.bad_nodes else "")
                  + ("; retryable" if attempt.retryable else "; not retryable"))
        for named in attempt.stragglers:
            self.echo(f"attempt {attempt.number}: {stragglers.describe(named)}")

    def _move_on(self, record: Record, attempt: Attempt) -> None:
        """The next attempt's cluster and count. Fewer nodes on the same cluster after a lost
        node, when this attempt could not get its nodes or the cluster's capacity answer is
        short of the full count (while policy.shrink_nodes has a count that fits); else one
        cluster on after a queue timeout, or after enough preemptions (which shrinking does not
        cure, so they move on first)."""
        lost = _node_lost(attempt)
        if lost:
            record.node_lost = lost
        elif attempt.started_at and attempt.nodes >= (attempt.full_nodes or attempt.nodes):
            record.node_lost = None  # it ran on the full count: the capacity was there
        last = len(self.policy.targets) - 1
        if attempt.cause == "preempted":
            record.preemptions += 1
        why = None
        if attempt.cause == "preempted" and record.preemptions >= self.policy.fallback_after_preemptions \
                and record.target < last:
            why = f"{record.preemptions} preemption(s) (managed.fallback_after_preemptions)"
        elif self._shrink(record, attempt):
            return
        elif attempt.cause == "queue_timeout":
            why = "the queue timeout"
        if why and record.target < last:
            record.target, record.preemptions = record.target + 1, 0
            nxt = self.policy.target(record.target)
            self.echo(f"after {why} on {attempt.cluster or 'its cluster'}, the next attempt goes to {nxt.cluster} "
                      f"({nxt.priority}, ${nxt.usd_per_hour:,.2f}/h)")

    def _shrink(self, record: Record, attempt: Attempt) -> bool:
        """Shrink-and-continue: after a lost node, the next attempt's count when this one could
        not get its nodes (one allowed count below its own, within the capacity answer), or
        when the cluster's capacity answer at its last look is short of the full count (the
        largest allowed count within it). False when neither applies or no count fits."""
        if record.node_lost is None or not attempt.retryable:
            return False
        full, capacity, where = attempt.full_nodes or attempt.nodes, attempt.capacity, attempt.cluster or "its cluster"
        if attempt.cause == "queue_timeout":
            nodes = self.policy.smaller(attempt.nodes, capacity)
            why = f"attempt {attempt.number} could not get {attempt.nodes} node(s) on {where}: {attempt.detail}"
        elif capacity is not None and capacity < full:
            nodes = self.policy.smaller(full, capacity)
            why = (f"{where} could give at most {capacity} node(s) at attempt {attempt.number}'s last look (its "
                   "maxNodes less its unusable nodes)")
        else:
            return False
        if nodes is None:
            return False
        record.next_nodes, record.shrink_reason = nodes, f"after {record.node_lost}, {why}"
        self.echo(f"shrink-and-continue: the next attempt runs on {nodes} of {full} nodes on {where} (managed.min_nodes "
                  f"{min(self.policy.shrink_nodes)}), keeping the command's global batch; a versioned checkpoint "
                  f"reshards into it ({why})")
        return True

    # --- decisions ------------------------------------------------------------------

    def _stop_reason(self, record: Record, now: datetime) -> tuple[str, str] | None:
        current = record.current
        if current is None or len(record.attempts) <= record.base_attempt:
            return None  # nothing yet since the run was (re)started
        policy = self.policy
        what = f"attempt {current.number} ended {current.cause} ({current.detail})"
        if current.cause == "completed":
            return "succeeded", f"attempt {current.number} completed"
        if current.cause == "canceled":
            return "canceled", f"{what}: a cancel is the user's decision, not retried"
        if current.cause == "budget":
            return "failed", what
        if not current.retryable:
            return "failed", f"{what}: not retried (managed.retry_on: {', '.join(map(str, policy.retry_on))})"
        restarts = len(record.attempts) - record.base_attempt - 1
        if restarts >= policy.max_restarts:
            return "failed", f"{what}: max restarts reached ({restarts} of managed.max_restarts {policy.max_restarts})"
        if policy.limit_usd is not None:
            spent = record.total_usd(policy.controller_usd_per_hour, now)
            upcoming = policy.next_attempt_usd(record.node_hours_run(), policy.target(record.target))
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

    def _note_ignored(self, attempt: Attempt, refused: list[str]) -> None:
        for why in refused:
            if why not in attempt.ignored_evidence:
                attempt.ignored_evidence.append(why)
                self.echo(f"attempt {attempt.number}: {why}")

    def _say_once(self, key: str, text: str) -> None:
        if key not in self.said:
            self.said.add(key)
            self.echo(text)


def _pointer_bounds(record: Record) -> tuple[list[str], str | None, dict[str, str]]:
    """(the run's attempts, which alone may sign its checkpoint pointer; the newest version
    the record saw committed, behind which the pointer never moves; version -> manifest digest
    of the versions seen, from their signed pointers)."""
    seen = [v for a in record.attempts for v in (a.resumed_version, a.commit_seen[0] if a.commit_seen else None) if v]
    digests: dict[str, str] = {}
    for a in record.attempts:
        for pin in (a.restore_pin or {}).values():
            if pin.get("version") and pin.get("manifestSha256"):
                digests[str(pin["version"])] = str(pin["manifestSha256"])
        if len(a.commit_seen) > 2 and a.commit_seen[2]:
            digests[a.commit_seen[0]] = a.commit_seen[2]
    return [a.job for a in record.attempts], max(seen, key=sequence_of, default=None), digests


def _node_lost(attempt: Attempt) -> str | None:
    """How the attempt lost a node, if it did: it ended so, or Azure ML requeued it after one
    of its nodes was preempted or became unusable (and it then waited in the queue)."""
    if attempt.cause in NODE_LOSS:
        return f"attempt {attempt.number} lost a node ({attempt.cause}: {(attempt.detail or '')[:200]})"
    gone = sorted({"preempted", "unusable"}.intersection(attempt.node_events))
    if attempt.requeued_at and gone:
        return f"attempt {attempt.number} lost a node (a node was {' and '.join(gone)}, then Azure ML requeued the job)"
    return None


def _stopped(stopping: dict[str, Any]) -> Verdict:
    """The verdict a controller recorded before it canceled the attempt (Attempt.stopping)."""
    return Verdict(Why(stopping.get("cause") or Why.UNKNOWN), str(stopping.get("detail") or ""),
                   bad_nodes=tuple(stopping.get("bad_nodes") or ()))


def _node_text(bad: dict) -> str:
    where = bad.get("host") or f"node {bad.get('node')}"
    return f"{where} ({bad.get('why')})"
