"""A controller that cannot be orphaned: something in Azure replaces a controller that died.

The first controller of a run creates an Azure ML schedule for it (`amlhpc-revive-<run>`,
every `REVIVE_EVERY_MIN` minutes, on the controller cluster, as the controller identity)
whose job runs `python -m amlhpc.jobs.managed.revive` with the controller's own settings. Each
firing looks at the run's record in the supervision container:

- the run is done: nothing to do (the last controller removes the schedule; a firing
  that finds the run done removes it too);
- a controller holds the record's lease (renewed every loop): it is alive;
- a controller job of the run is still starting (queued, preparing): wait for it;
- a controller job runs but its lease lapsed and it has not written the record for three
  lease periods: it hangs - cancel it;
- otherwise the controller is gone (its node lost, its job canceled, a crash): take the
  lease for a moment (so two firings never both act), check the newest controller job's
  code asset against the content hash the run's record kept (codeasset.py: a rewritten
  asset ends the run, `CodeChanged` in the record, and starts nothing), start a copy of the newest
  controller job under a new name (`<run>-c<hex>`, registered beside the record, so
  `status` and `cancel` see it), and let the lease go. The new controller reads the
  record and continues; a copy never reopens a finished or canceled run (only an
  explicit `--resume` does, once).

Why a schedule and not the attempt's own nodes: the nodes' identity may not submit jobs
(least privilege: a job must not be able to start controllers), and a node that stopped its
training because the controller died would throw away the work a new controller would have
resumed. The schedule needs nothing running between firings but a scaled-to-zero cluster,
and it outlives every controller. Time to replace a dead controller: the lease
(`managed.lease_s`, 60 s) plus up to one schedule interval plus the controller cluster's
node start. The local rehearsal runs the same `revive()` every second against Azurite.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from amlhpc.jobs.managed import codeasset
from amlhpc.jobs.managed.codeasset import CodeAsset, CodeChanged
from amlhpc.jobs.managed.observation import QUEUED, TERMINAL
from amlhpc.jobs.managed.record import RecordStore, now_utc, parse_time
from amlhpc.jobs.runtime.base import faultpoints

REVIVE_EVERY_MIN = 10
"""Minutes between the schedule's firings (each takes a controller-cluster node for about a minute)."""
HUNG_AFTER_LEASES = 3
"""A running controller job that held no lease and wrote nothing for this many lease periods hangs."""

log = logging.getLogger("amlhpc.revive")


class ControllerLauncher(Protocol):
    def status(self, job: str) -> str | None:
        """The controller job's Azure ML status (None: no such job)."""

    def cancel(self, job: str) -> None:
        """Cancel a hung controller job."""

    def start(self, run: str, previous: str) -> str:
        """Start a copy of the controller job `previous` under a new name; returns that name."""


def schedule_name(run: str) -> str:
    return f"amlhpc-revive-{run}"[:250]


def controller_name(run: str) -> str:
    return f"{run}-c{secrets.token_hex(2)}"


def _alive(store: RecordStore, launcher: ControllerLauncher, run: str, echo: Callable[[str], None],
           now: Callable[[], datetime], act: bool) -> bool:
    """Whether a controller job of the run is starting or running (from a fresh listing of the
    registered controllers). With `act`, one that hangs is canceled."""
    record, _ = store.load()
    names = store.controller_jobs() or [run]
    seen: dict[str, datetime | None] = dict(store.controllers_registered())
    seen.update({str(c.get("job")): parse_time(c.get("seen_at")) for c in (record.controllers if record else [])})
    for name in names:
        status = launcher.status(name)
        if status is None or status in TERMINAL:
            continue
        if status in QUEUED or status in ("Preparing", "CancelRequested"):
            echo(f"run {run}: controller {name} is {status}: waiting for it")
            return True
        last = seen.get(name)
        if last is not None and (now() - last).total_seconds() < HUNG_AFTER_LEASES * store.lease_s:
            return True  # between two renewals
        if not act:
            return True
        echo(f"run {run}: controller {name} is {status} but holds no lease and wrote nothing for "
             f"{HUNG_AFTER_LEASES} lease periods: canceling it")
        launcher.cancel(name)
    return False


def revive(store: RecordStore, launcher: ControllerLauncher, run: str, echo: Callable[[str], None] = log.info,
           now: Callable[[], datetime] = now_utc, code_of: Callable[[str], CodeAsset] | None = None) -> str | None:
    """One look at one run; the name of the controller started, or None. `code_of`: the code
    asset a controller job runs, checked against the record's content hash before a copy of
    that job starts (None: not checked, for local tools).

    The controllers are listed again once the lease is held: two overlapping checks both saw
    none alive, the first took the lease, started one and let the lease go; the second, taking
    the lease after it, must see that one (the defect: it started a second controller, which held a
    controller-cluster node for the whole run)."""
    record, _ = store.load()
    if record is None or record.done:
        return None
    if store.lease_held():
        return None
    if _alive(store, launcher, run, echo, now, act=True):
        return None
    faultpoints.reach("revive.listed", run=run)
    if not store.acquire(15):
        return None  # another firing, or a controller that just started, was faster
    try:
        if _alive(store, launcher, run, echo, now, act=False):
            return None  # another check started one between our look and our lease
        names = store.controller_jobs() or [run]
        if code_of is not None and _code_changed(store, code_of(names[-1]), run, echo):
            return None
        new = launcher.start(run, names[-1])
        store.add_controller(new, f"revived: no controller held the lease (after {names[-1]})")
        echo(f"run {run}: no controller holds its record's lease: started {new}")
        return new
    finally:
        store.release()


def _code_changed(store: RecordStore, code: CodeAsset, run: str, echo: Callable[[str], None]) -> bool:
    """Whether the code a revived controller would run differs from the run's: the run then
    ends, failed, with why in its record (the lease is held)."""
    record, etag = store.load()
    if record is None or etag is None:
        return False
    try:
        codeasset.check(code, record.code)
    except CodeChanged as exc:
        record.finish("failed", str(exc))
        store.save(record, etag)
        echo(f"run {run}: no controller started: {exc}")
        return True
    return False


# --- in Azure ------------------------------------------------------------------------


class AzureControllerLauncher:
    """Controller jobs through azure-ai-ml: copies of the newest one."""

    def __init__(self, ml_client):
        self.ml_client = ml_client

    def status(self, job: str) -> str | None:
        from azure.core.exceptions import ResourceNotFoundError

        from amlhpc.jobs.managed.azureml import enum_value

        try:
            return enum_value(self.ml_client.jobs.get(job).status)
        except ResourceNotFoundError:
            return None

    def cancel(self, job: str) -> None:
        self.ml_client.jobs.begin_cancel(job)

    def start(self, run: str, previous: str) -> str:
        entity = self.ml_client.jobs.get(previous)
        entity.name = controller_name(run)
        entity.display_name = f"{run} managed run (controller, revived)"
        entity.tags = {**(entity.tags or {}), "revived_from": previous}
        self.ml_client.jobs.create_or_update(entity, experiment_name=entity.experiment_name)
        return entity.name


def revival_schedule(controller: Any, run: str, every_minutes: int = REVIVE_EVERY_MIN):
    """The schedule that runs the revival check for `run`: the controller job's code,
    environment, settings, cluster and identity, with the revival command. Azure ML
    schedules create pipeline jobs (a command job there is a private preview of azure-ai-ml
    1.35's JobSchedule), so the check is the one step of a pipeline."""
    from azure.ai.ml import command
    from azure.ai.ml.entities import JobSchedule, PipelineJob, RecurrenceTrigger

    check = command(
        name="revive", display_name=f"{run} revival check", code=controller.code,
        command="python -m amlhpc.jobs.managed.revive", environment=controller.environment,
        environment_variables=dict(controller.environment_variables or {}), compute=controller.compute,
        identity=controller.identity, instance_count=1)
    pipeline = PipelineJob(
        jobs={"revive": check}, compute=controller.compute, experiment_name=controller.experiment_name,
        display_name=f"{run} revival check", tags={"managed_run": run, "role": "revival"},
        description=f"aml-hpc managed run {run}: starts a new controller when none holds the record's lease")
    return JobSchedule(name=schedule_name(run), trigger=RecurrenceTrigger(frequency="minute", interval=every_minutes),
                       create_job=pipeline, display_name=f"{run} revival", tags={"managed_run": run})


def ensure_schedule(ml_client, controller: Any, run: str) -> None:
    """Create the run's revival schedule unless it exists."""
    from azure.core.exceptions import ResourceNotFoundError

    try:
        ml_client.schedules.get(schedule_name(run))
        return
    except ResourceNotFoundError:
        pass
    ml_client.schedules.begin_create_or_update(revival_schedule(controller, run)).result()


def remove_schedule(ml_client, run: str) -> None:
    """Disable, then delete, the run's revival schedule (a finished run needs none)."""
    from azure.core.exceptions import ResourceNotFoundError

    try:
        ml_client.schedules.begin_disable(schedule_name(run)).result()
        ml_client.schedules.begin_delete(schedule_name(run)).result()
    except ResourceNotFoundError:
        pass


def main() -> int:
    """`python -m amlhpc.jobs.managed.revive`: one revival check, as the schedule's job."""
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    from amlhpc.jobs.managed.settings import code_asset, connect, settings_from_env

    try:
        settings = settings_from_env(os.environ)
    except ValueError as exc:
        print(f"revive: {exc}", file=sys.stderr)
        return 2
    ml_client, store, _ = connect(settings)
    record, _ = store.load()
    if record is not None and record.done:
        remove_schedule(ml_client, settings["run"])
        return 0
    revive(store, AzureControllerLauncher(ml_client), settings["run"],
           code_of=lambda job: code_asset(ml_client, ml_client.jobs.get(job).code))
    return 0


if __name__ == "__main__":
    sys.exit(main())
