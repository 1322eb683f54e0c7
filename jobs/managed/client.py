"""What the user's commands do with a managed run, from the laptop: find its record from a
job's tags, read it (`status`), ask the controller to stop (`cancel`).

A managed run's jobs (its controllers and attempts) carry the tag `managed_run`; the
controller's carry `record`: `<container>/<prefix>/supervision.json` in the stack's
storage account. Reading it takes Storage Blob Data Reader on the checkpoints container;
asking for a cancel takes Contributor (the stack's dataContributors, or the role set by
hand): without it, cancelling the jobs in Azure ML still stops the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import Problem, UserError
from core.outputs import StackOutputs
from jobs.managed.record import RECORD_BLOB, Record, RecordStore

RUN_TAG = "managed_run"
RECORD_TAG = "record"
ROLE_HINT = ("reading a managed run's record takes 'Storage Blob Data Reader' on the stack's checkpoints container "
             "(az role assignment create --role 'Storage Blob Data Reader' --assignee <you> --scope <container id>)")


@dataclass(frozen=True)
class RecordPlace:
    container: str
    prefix: str


def place_from_tags(tags: dict[str, str], run: str | None = None) -> RecordPlace | None:
    """Where the run's record is, from a controller job's `record` tag."""
    text = (tags or {}).get(RECORD_TAG, "")
    container, _, path = text.partition("/")
    if not container or not path.endswith("/" + RECORD_BLOB):
        return None
    return RecordPlace(container, path.removesuffix("/" + RECORD_BLOB))


def store_for(outputs: StackOutputs, place: RecordPlace) -> RecordStore:
    from jobs.runtime import blobio

    container = blobio.container_client(place.container, account_url=outputs.storage.blob_endpoint)
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
                                 "(its job may still be queued or building its environment)")], "no record")
    return record


def request_cancel(outputs: StackOutputs, place: RecordPlace, by: str) -> str | None:
    """Leave the cancel request for the controller; the reason it could not, or None."""
    from azure.core.exceptions import HttpResponseError

    try:
        store_for(outputs, place).request_cancel(by)
    except HttpResponseError as exc:
        return f"could not write the cancel request ({exc.status_code}): {exc.reason}"
    return None
