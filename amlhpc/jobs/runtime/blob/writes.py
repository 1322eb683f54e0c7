"""Writes that survive a lost reply, and deletes in batches.

A lost reply: Azure applied a write, but its answer never reached the client (a reset, a
timeout); the SDK's retry policy sends the write again, and the second answer is about the
first: 409 BlobAlreadyExists for a create-only write, 412 ConditionNotMet for one
conditional on the ETag the first write just changed. Taken at its word, such an answer says
"another writer" when the writer was us. So after a 409 or 412 the caller reads the blob back
(`read_back`) and counts the write as done when the blob holds what it wrote.

Deletes: `delete_many` sends Blob Batch requests of at most 256 deletes each (the service's
limit per batch: Microsoft Learn, "Blob Batch" REST reference, read 2026-11-28), so a prune or
a commit's clean-up of N records costs N/256 requests, not N. A blob already gone counts as
deleted (a delete whose reply was lost and retried answers 404).

Standard library plus azure-storage-blob: ships in the image.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

BATCH_MAX = 256
"""Subrequests in one Blob Batch request (the service refuses more)."""


class BatchDeleteFailed(RuntimeError):
    """A delete of a batch failed for another reason than the blob being gone already."""


def read_back(container, name: str) -> tuple[bytes, str] | None:
    """The blob's content and ETag, or None when it does not exist."""
    from azure.core.exceptions import ResourceNotFoundError

    try:
        downloader = container.get_blob_client(name).download_blob()
        return downloader.readall(), downloader.properties.etag
    except ResourceNotFoundError:
        return None


def holds(container, name: str, payload: bytes) -> str | None:
    """The blob's ETag when it holds exactly `payload` (our write landed), else None."""
    found = read_back(container, name)
    return found[1] if found is not None and found[0] == payload else None


def _batches(names: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(names), size):
        yield names[start:start + size]


def delete_many(container, names: Iterable[str], batch: int = BATCH_MAX) -> int:
    """Delete `names` (deduplicated), `batch` per request; returns how many were there to delete.
    BatchDeleteFailed names the first blob that could not be deleted and why."""
    unique = sorted(set(names))
    deleted = 0
    for chunk in _batches(unique, max(1, min(batch, BATCH_MAX))):
        if len(chunk) == 1:  # a batch of one is a plain delete, one request either way
            from azure.core.exceptions import ResourceNotFoundError

            try:
                container.delete_blob(chunk[0])
                deleted += 1
            except ResourceNotFoundError:
                pass
            continue
        answers = container.delete_blobs(*chunk, raise_on_any_failure=False)
        for name, answer in zip(chunk, answers, strict=False):
            status = getattr(answer, "status_code", 202)
            if status in (200, 202):
                deleted += 1
            elif status != 404:
                raise BatchDeleteFailed(f"deleting {name} failed: {status} {getattr(answer, 'reason', '')}".rstrip())
    return deleted
