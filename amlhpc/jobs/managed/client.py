"""What the user's commands do with a managed run, from the laptop: find its record from a
job's tags, read it and its controllers (`status`), stop it (`cancel`).

A managed run's jobs (its controllers and attempts) carry the tags `managed_run` and
`record`: `<container>/<prefix>/supervision.json` in the stack's storage account (the
supervision container). Reading it takes Storage Blob Data Reader on that container;
asking for a cancel takes Contributor (the submitters have both): without it, cancelling
the jobs in Azure ML still stops the run.

`cancel` leaves no attempt unsupervised, whatever runs meanwhile: it first writes the
cancel request (no controller creates a job once it exists: each checks right before
creating), then cancels every controller job of the run - the first, resumed
(`<run>-c<hex>`) and revived ones, from the names registered beside the record and the
record's own list - and waits until each has ended, and only then reads the record and
cancels every attempt not seen ended, claimed ones included (a job created between the
request and the controller's end is found here). Last, it finishes the record as
`canceled` itself when no controller holds the lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from amlhpc.core.errors import Problem, UserError
from amlhpc.core.outputs import StackOutputs
from amlhpc.jobs.managed.observation import TERMINAL
from amlhpc.jobs.managed.record import RECORD_BLOB, Record, RecordStore, iso, now_utc
from amlhpc.jobs.runtime.base import faultpoints

RUN_TAG = "managed_run"
RECORD_TAG = "record"
ROLE_HINT = ("reading a managed run's record takes 'Storage Blob Data Reader' on the stack's supervision container "
             "(az role assignment create --role 'Storage Blob Data Reader' --assignee <you> --scope <container id>)")
CONTROLLERS_STOP_S = 300.0
"""How long `cancel` waits for the run's controllers to end before sweeping the attempts anyway."""


@dataclass(frozen=True)
class RecordPlace:
    container: str
    prefix: str


def place_from_tags(tags: dict[str, str], run: str | None = None) -> RecordPlace | None:
    """Where the run's record is, from a controller's or an attempt's `record` tag."""
    text = (tags or {}).get(RECORD_TAG, "")
    container, _, path = text.partition("/")
    if not container or not path.endswith("/" + RECORD_BLOB):
        return None
    return RecordPlace(container, path.removesuffix("/" + RECORD_BLOB))


def store_for(outputs: StackOutputs, place: RecordPlace) -> RecordStore:
    from amlhpc.jobs.runtime.blob import blobio

    container = blobio.container_client(place.container, account_url=outputs.coordination_endpoint())
    return RecordStore(container, place.prefix)


def read(outputs: StackOutputs, place: RecordPlace) -> Record:
    """The run's record; UserError with the missing role or the missing record."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    try:
        record, _ = store_for(outputs, place).load()
    except ClientAuthenticationError as exc:
        raise UserError([Problem("Azure credentials", "blob", str(exc).splitlines()[0][:200], "run `az login`")],
                        "not logged in to Azure") from None
    except HttpResponseError as exc:
        if exc.status_code == 403:
            raise UserError([Problem(f"{outputs.storage.account}/{place.container}", place.prefix,
                                     "access denied to the managed run's record", ROLE_HINT)], "access denied") from None
        raise
    if record is None:
        raise UserError([Problem(f"{outputs.storage.account}/{place.container}", f"{place.prefix}/{RECORD_BLOB}",
                                 "no record yet", "the controller writes it when it starts: look again in a minute "
                                 "(its job may still be queued)")], "no record")
    return record


def controllers(store: RecordStore, record: Record | None, run: str) -> list[str]:
    """Every controller job of the run: the first, resumed and revived ones, oldest first."""
    names = [run, *store.controller_jobs(), *(c.get("job") for c in (record.controllers if record else []))]
    return [n for n in dict.fromkeys(names) if n and n != "local"]


def _status(jobs: Any, name: str) -> str | None:
    from azure.core.exceptions import ResourceNotFoundError

    from amlhpc.jobs.managed.azureml import enum_value

    try:
        return enum_value(jobs.get(name).status)
    except ResourceNotFoundError:
        return None


def controller_statuses(jobs: Any, store: RecordStore, record: Record | None, run: str) -> dict[str, str | None]:
    return {name: _status(jobs, name) for name in controllers(store, record, run)}


def cancel_run(jobs: Any, store: RecordStore, run: str, by: str, echo: Callable[[str], None] = print,
               wait_s: float = CONTROLLERS_STOP_S, sleep: Callable[[float], None] = time.sleep,
               poll_s: float = 5.0) -> list[str]:
    """Stop a managed run (see the module docstring for the order and why); `jobs` is
    azure-ai-ml's JobOperations (get, begin_cancel). Returns the jobs it canceled."""
    from azure.core.exceptions import ResourceNotFoundError

    request = store.request_cancel(by)
    faultpoints.reach("cancel.requested", run=run)
    canceled: list[str] = []
    record, _ = store.load()
    names = controllers(store, record, run)
    for name in names:
        if _status(jobs, name) not in (None, *TERMINAL):
            jobs.begin_cancel(name)
            canceled.append(name)
            echo(f"cancelled controller {name}")
    deadline = time.monotonic() + wait_s
    while True:
        alive = [n for n in names if _status(jobs, n) not in (None, *TERMINAL)]
        if not alive or time.monotonic() > deadline:
            break
        sleep(poll_s)
    if alive:
        echo(f"note: controller(s) {', '.join(alive)} still running after {wait_s:.0f}s: each honours the request")
    faultpoints.reach("cancel.stopped", run=run)
    record, _ = store.load()
    for attempt in (record.attempts if record else []):
        if attempt.state == "ended":
            continue
        try:
            if _status(jobs, attempt.job) not in (None, *TERMINAL):
                jobs.begin_cancel(attempt.job)
                canceled.append(attempt.job)
                echo(f"cancelled attempt {attempt.job}")
        except ResourceNotFoundError:
            pass
    _finish_canceled(store, request, by)
    return canceled


def _finish_canceled(store: RecordStore, request: str, by: str) -> None:
    """Write the cancel into the record when no controller holds the lease (one that does honours the request)."""
    if not store.acquire(15):
        return
    try:
        record, etag = store.load()
        if record is None or etag is None or request in record.cancels_handled:
            return
        now = iso(now_utc())
        for attempt in record.attempts:
            if attempt.state != "ended":
                attempt.state, attempt.status, attempt.ended_at = "ended", "Canceled", now
                attempt.cause, attempt.retryable, attempt.detail = "canceled", False, f"canceled by {by}"
        record.cancels_handled.append(request)
        if not record.done:
            record.finish("canceled", f"canceled by {by} at {now}")
        store.save(record, etag)
    finally:
        store.release()
