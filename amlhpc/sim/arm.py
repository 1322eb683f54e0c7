"""Azure ML behind Azure Resource Manager, simulated: the calls the managed controller makes.

`ArmService` holds the workspace's jobs, schedules and cluster nodes, and Resource
Manager's throttling: a token bucket per principal and operation type (reads, writes,
deletes; a POST action such as listNodes or cancel counts as a write), and one for the
whole subscription at 15 times those (amlhpc.sim.limits.ArmLimits, from Learn "Understand
how Azure Resource Manager throttles requests"). Past a bucket the answer is 429 with a
Retry-After of the seconds until a token is back. Every call is counted per principal,
per operation type and per virtual second.

`MLClient` is the part of azure-ai-ml's MLClient the project calls (amlhpc/jobs/managed:
azureml.py, client.py, revive.py): `jobs.get / create_or_update / begin_cancel / list`,
`jobs._runs_operations.get_run`, `compute.list_nodes`, and `schedules.get /
begin_create_or_update / begin_disable / begin_delete`. Its requests retry as azure-core's
RetryPolicy does with its defaults (retry_total 10, connect 3, read 3, status 3; 408, 429,
500, 502, 503, 504 retried for GET, PUT and DELETE, and any answer with Retry-After for
every method; the wait is the Retry-After when there is one, else 0.8 x 2^(n-1) s from the
second retry on, at most 120 s), on virtual time; a 429 that outlives them is raised as
HttpResponseError with status 429, as azure-core raises it.

A job's life is the scenario's: `on_create` callbacks see each new job (a controller job
starts a simulated controller there); `ArmService.set_status` moves it on. A canceled job
goes CancelRequested, then Canceled `cancel_s` later.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

from amlhpc.sim.blobclient import _Response
from amlhpc.sim.blobservice import Peak, Reply
from amlhpc.sim.limits import ArmLimits, TokenBucket
from amlhpc.sim.scheduler import Simulation

TERMINAL = ("Completed", "Failed", "Canceled", "NotResponding")
RETRY_STATUSES = (408, 429, 500, 502, 503, 504)
SAFE_METHODS = ("GET", "PUT", "DELETE", "HEAD")


@dataclass
class SimJob:
    name: str
    entity: Any
    status: str = "Queued"
    created_at: float = 0.0
    history: list[tuple[float, str]] = field(default_factory=list)
    canceled_by: str | None = None


class ArmService:
    def __init__(self, sim: Simulation, limits: ArmLimits, cancel_s: float = 30.0):
        self.sim = sim
        self.limits = limits
        self.cancel_s = cancel_s
        self.jobs: dict[str, SimJob] = {}
        self.schedules: dict[str, Any] = {}
        self.nodes: dict[str, list[Any]] = {}
        self.on_create: list[Callable[[SimJob], None]] = []
        self.on_status: list[Callable[[SimJob, str], None]] = []
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self.calls: dict[str, Peak] = {}
        self.by_kind: Counter[str] = Counter()
        self.throttled: Counter[str] = Counter()
        self.per_second: Counter[int] = Counter()

    # --- throttling ---------------------------------------------------------------------
    def _bucket(self, key: tuple[str, str], kind: str, factor: float = 1.0) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            rate, capacity = self.limits.bucket(kind)
            bucket = self._buckets[key] = TokenBucket(rate * factor, capacity * factor, self.sim.now)
        return bucket

    def request(self, principal: str, kind: str, op: str, apply: Callable[[], Any]) -> tuple[Reply, Any]:
        """One call, at its arrival: (429 reply, None) when throttled, else (200, apply())."""
        now = self.sim.now
        self.calls.setdefault(principal, Peak()).add(int(now))
        self.by_kind[kind] += 1
        self.per_second[int(now)] += 1
        mine = self._bucket((principal, kind), kind)
        everyone = self._bucket(("*subscription*", kind), kind, self.limits.subscription_factor)
        if not mine.available(now) or not everyone.available(now):
            self.throttled[principal] += 1
            wait = max(mine.wait_s(now), everyone.wait_s(now))
            self.sim.note(principal, "arm", f"{op} -> 429")
            return Reply(429, "TooManyRequests", f"The request was throttled: {kind} limit for this principal.",
                         {"Retry-After": str(max(1, int(wait + 0.999)))}), None
        mine.take(now)
        everyone.take(now)
        self.sim.note(principal, "arm", op)
        return Reply(200), apply()

    # --- the workspace ------------------------------------------------------------------
    def create_job(self, entity: Any) -> SimJob:
        name = entity.name
        job = self.jobs.get(name)
        if job is not None:
            job.entity = copy.copy(entity)
            return job
        job = self.jobs[name] = SimJob(name, copy.copy(entity), "Queued", self.sim.now, [(self.sim.now, "Queued")])
        for callback in list(self.on_create):
            callback(job)
        return job

    def set_status(self, name: str, status: str) -> None:
        job = self.jobs[name]
        if job.status in TERMINAL or job.status == status:
            return
        job.status = status
        job.history.append((self.sim.now, status))
        self.sim.note("azureml", "job", f"{name} -> {status}")
        for callback in list(self.on_status):
            callback(job, status)

    def cancel_job(self, name: str, by: str) -> None:
        job = self.jobs.get(name)
        if job is None or job.status in TERMINAL:
            return
        job.canceled_by = by
        self.set_status(name, "CancelRequested")

        def finish() -> None:
            self.sim.sleep(self.cancel_s)
            self.set_status(name, "Canceled")
        self.sim.spawn(f"cancel-{name}", finish)

    def live(self, predicate: Callable[[SimJob], bool] = lambda job: True) -> list[SimJob]:
        return [job for job in self.jobs.values() if job.status not in TERMINAL and predicate(job)]


class _Poller:
    def __init__(self, value: Any = None):
        self._value = value

    def result(self, timeout: float | None = None) -> Any:
        return self._value

    def done(self) -> bool:
        return True

    def wait(self, timeout: float | None = None) -> None:
        return None


class _Client:
    """One principal's view: latency, the retry policy, errors."""

    def __init__(self, service: ArmService, principal: str, latency_s: tuple[float, float]):
        self.service, self.principal, self.latency_s = service, principal, latency_s

    def call(self, method: str, kind: str, op: str, apply: Callable[[], Any]) -> Any:
        sim = self.service.sim
        budget = {"total": 10, "connect": 3, "read": 3, "status": 3}
        history = 0
        while True:
            sim.sleep(sim.rng.uniform(*self.latency_s))
            reply, value = self.service.request(self.principal, kind, op, apply)
            if reply.ok:
                return value
            retry_after = reply.headers.get("Retry-After")
            if not retry_after and (reply.status not in RETRY_STATUSES or method not in SAFE_METHODS):
                raise self.error(reply)
            budget["total"] -= 1
            budget["status"] -= 1
            history += 1
            remaining = [v for v in budget.values() if v]
            if remaining and min(remaining) < 0:
                raise self.error(reply)
            if retry_after:
                sim.sleep(float(retry_after))
            elif history > 1:
                sim.sleep(min(120.0, 0.8 * 2 ** (history - 1)))

    @staticmethod
    def error(reply: Reply) -> HttpResponseError:
        response = _Response(reply, "https://management.azure.com/", content_type="application/json")
        kind = ResourceNotFoundError if reply.status == 404 else HttpResponseError
        return kind(message=reply.message, response=response)


def _not_found(what: str) -> ResourceNotFoundError:
    reply = Reply(404, "ResourceNotFound", f"{what} was not found.")
    return ResourceNotFoundError(message=reply.message,
                                 response=_Response(reply, "https://management.azure.com/",
                                                    content_type="application/json"))


class _Jobs:
    def __init__(self, client: _Client):
        self._client = client
        self._runs_operations = _Runs(client)

    def get(self, name: str) -> Any:
        service = self._client.service

        def apply() -> Any:
            job = service.jobs.get(name)
            if job is None:
                return None
            entity = copy.copy(job.entity)
            entity.status = job.status
            return entity
        found = self._client.call("GET", "read", f"jobs.get {name}", apply)
        if found is None:
            raise _not_found(f"job {name}")
        return found

    def create_or_update(self, job: Any, *, experiment_name: str | None = None, **_options: Any) -> Any:
        service = self._client.service
        entity = copy.copy(job)
        if experiment_name:
            entity.experiment_name = experiment_name
        created = self._client.call("PUT", "write", f"jobs.create_or_update {entity.name}",
                                    lambda: service.create_job(entity))
        result = copy.copy(created.entity)
        result.status = created.status
        return result

    def begin_cancel(self, name: str, **_options: Any) -> _Poller:
        service = self._client.service

        def apply() -> bool:
            if name not in service.jobs:
                return False
            service.cancel_job(name, self._client.principal)
            return True
        if not self._client.call("POST", "write", f"jobs.begin_cancel {name}", apply):
            raise _not_found(f"job {name}")
        return _Poller()

    def list(self, *, parent_job_name: str | None = None, tag: str | None = None, **_options: Any) -> Iterator[Any]:
        service = self._client.service

        def apply() -> list[Any]:
            found = []
            for job in service.jobs.values():
                entity = copy.copy(job.entity)
                entity.status = job.status
                if tag is None or tag in (getattr(entity, "tags", None) or {}):
                    found.append(entity)
            return found
        return iter(self._client.call("GET", "read", "jobs.list", apply))


class _Runs:
    def __init__(self, client: _Client):
        self._client = client

    def get_run(self, name: str) -> Any:
        service = self._client.service

        def apply() -> Any:
            job = service.jobs.get(name)
            if job is None:
                return None
            started = next((t for t, s in job.history if s == "Running"), None)
            ended = next((t for t, s in job.history if s in TERMINAL), None)
            return SimpleNamespace(error=None, start_time_utc=started, end_time_utc=ended, warnings=[])
        found = self._client.call("GET", "read", f"runs.get_run {name}", apply)
        if found is None:
            raise _not_found(f"run {name}")
        return found


class _Compute:
    def __init__(self, client: _Client):
        self._client = client

    def list_nodes(self, name: str, **_options: Any) -> Iterator[Any]:
        service = self._client.service
        return iter(self._client.call("POST", "write", f"compute.list_nodes {name}",
                                      lambda: list(service.nodes.get(name, []))))


class _Schedules:
    def __init__(self, client: _Client):
        self._client = client

    def get(self, name: str) -> Any:
        found = self._client.call("GET", "read", f"schedules.get {name}",
                                  lambda: self._client.service.schedules.get(name))
        if found is None:
            raise _not_found(f"schedule {name}")
        return found

    def begin_create_or_update(self, schedule: Any, **_options: Any) -> _Poller:
        schedules = self._client.service.schedules
        self._client.call("PUT", "write", f"schedules.create {schedule.name}",
                          lambda: schedules.__setitem__(schedule.name, schedule))
        return _Poller(schedule)

    def begin_disable(self, name: str, **_options: Any) -> _Poller:
        found = self.get(name)
        self._client.call("POST", "write", f"schedules.disable {name}", lambda: setattr(found, "is_enabled", False))
        return _Poller(found)

    def begin_delete(self, name: str, **_options: Any) -> _Poller:
        schedules = self._client.service.schedules
        if not self._client.call("DELETE", "delete", f"schedules.delete {name}",
                                 lambda: schedules.pop(name, None) is not None):
            raise _not_found(f"schedule {name}")
        return _Poller()


class MLClient:
    """azure-ai-ml's MLClient, as far as the project calls it (see the module docstring)."""

    def __init__(self, service: ArmService, principal: str, latency_s: tuple[float, float] = (0.05, 0.2)):
        client = _Client(service, principal, latency_s)
        self.jobs = _Jobs(client)
        self.compute = _Compute(client)
        self.schedules = _Schedules(client)
