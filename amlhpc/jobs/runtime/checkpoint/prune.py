"""Retention: keep the newest `keep` committed versions, delete what nothing references.

Safe against an upload or a commit running at the same time (the uploader's own retention
pass, and `python -m amlhpc.jobs.runtime.checkpoint prune` by hand), because it reads in this order:

1. the data blobs (what it may delete);
2. the pending records (every data folder an upload in progress writes or reuses: one listing,
   the leases are in each record's metadata);
3. the manifests, then the `latest` pointer.

An uploader writes its pending record before the part, and removes it only after the
manifest and the pointer that reference the part are written. So a part seen in (1) is
referenced by a record that (2) still sees, or by a manifest that (3) sees: it is never
deleted from under a version being uploaded or committed (the defect this ordering fixes:
a prune during an upload deleted the new version's parts, the version was committed
unrestorable, and retention then removed the good ones).

Committed versions beyond `keep` go first (manifests, then their unreferenced blobs), never the
one `latest` names. A manifest newer than `latest` is a commit in progress, or the leftover of a
committer killed between its manifest and its pointer: it is kept while it has pending records
or is younger than the store's `stale_pending_s`. Age, not the pending records alone, because a
commit may stage, write its manifest and move the pointer between this pass's reads of the
pending records and of the pointer (the defect: such a commit looked like a dead committer's
leftover, and prune deleted the version `latest` then named). The pointer is read once more
right before anything is deleted, and a version it names is never deleted. Pending records
older than `stale_pending_s` belong to uploaders that are gone, and those of a version already
committed to a committer stopped before it withdrew them: both are deleted (the blobs of the
latter stay referenced by its manifest). Deletes go 256 to a request (Blob Batch).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Protocol

from amlhpc.jobs.runtime.base import clock, faultpoints
from amlhpc.jobs.runtime.blob.writes import delete_many
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError
from amlhpc.jobs.runtime.checkpoint.pending import Pending
from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of


class Stream(Protocol):
    """What retention needs of a stream (store.CheckpointStore, which calls prune())."""

    container: Any
    stream: str
    stale_pending_s: float

    def data_prefix(self, version: str | None = None) -> str: ...

    def data_containers(self) -> list[Any]: ...

    def pendings(self) -> dict[str, dict[int, Pending]]: ...

    def is_stale(self, pending: Pending) -> bool: ...

    def pending_name(self, version: str, node: int | None = None) -> str: ...

    def pointer(self) -> tuple[dict[str, Any] | None, str | None]: ...

    def manifest(self, version: str) -> Any: ...

    def manifest_name(self, version: str) -> str: ...

log = logging.getLogger("amlhpc.checkpoint")


def _manifests(store: Stream) -> dict[str, datetime | None]:
    """Versions that have a manifest -> when it was written (service time), oldest first."""
    prefix = f"{store.stream}/manifests/"
    found = {b.name[len(prefix):-len(".json")]: b.last_modified
             for b in store.container.list_blobs(name_starts_with=prefix) if b.name.endswith(".json")}
    return {v: found[v] for v in sorted(found, key=lambda v: (sequence_of(v), v))}


def _young(store: Stream, written: datetime | None) -> bool:
    return written is None or clock.time() - written.timestamp() <= store.stale_pending_s


def prune(store: Stream, keep: int) -> tuple[list[str], int]:
    """Returns (deleted versions, deleted data blobs)."""
    keep = max(keep, 1)
    # Striped parts lie in several accounts (store.py): each account's data blobs. A blob name a
    # kept manifest references is kept in every account (a part's name is unique to its version).
    data = [(container, b.name) for container in store.data_containers()
            for b in container.list_blobs(name_starts_with=store.data_prefix())]
    faultpoints.reach("checkpoint.prune-listed")
    leases: list[Pending] = []
    live_pending: set[str] = set()
    stale: list[Pending] = []
    pendings = store.pendings()
    for version, nodes in pendings.items():
        for record in nodes.values():
            if store.is_stale(record):
                log.info("checkpoint retention: pending record of %s by node %d is stale (its uploader is gone)",
                         version, record.node)
                stale.append(record)
                continue
            live_pending.add(version)
            leases.append(record)
    manifests = _manifests(store)
    pointer, _ = store.pointer()
    if stale:
        delete_many(store.container, [store.pending_name(r.version, r.node) for r in stale])
    if pointer is None:
        # Nothing committed yet: never touch a first upload's parts.
        return [], 0
    versions = list(manifests)
    head = sequence_of(pointer["version"])
    leftover_leases = [store.pending_name(v, n) for v in live_pending & set(versions) if sequence_of(v) <= head
                       for n in pendings.get(v, {})]  # committed: the committer stopped before withdrawing them
    committed = [v for v in versions if sequence_of(v) <= head]
    in_progress = [v for v in versions if sequence_of(v) > head and (v in live_pending or _young(store, manifests[v]))]
    kept = set(committed[-keep:]) | {pointer["version"]} | set(in_progress)
    dropped = [v for v in versions if v not in kept]
    referenced: set[str] = set()
    untrusted: list[str] = []
    for version in kept:
        try:
            manifest = store.manifest(version)
        except CheckpointError as exc:
            untrusted.append(f"{version} ({exc})")
            continue
        if manifest is not None:
            referenced.update(f["blob"] for f in manifest.files)
    if untrusted:
        # A kept version's manifest was rewritten by another writer: which blobs its genuine
        # manifest referenced is unknown (its own folder, or parts reused from older versions),
        # so no data blob is deleted while it is kept; retention resumes once it is dropped.
        log.warning("checkpoint retention: kept version %s cannot be read as committed; no data blob deleted "
                    "this time", "; ".join(untrusted))
    unreferenced = [] if untrusted else [(container, name) for container, name in data
                                         if name not in referenced and not any(r.leases_blob(name) for r in leases)]
    faultpoints.reach("checkpoint.prune-decided")
    now, _ = store.pointer()
    if now is None or now["version"] != pointer["version"]:
        # A commit landed while this pass read: decide again next time rather than on stale reads.
        log.info("checkpoint retention: `latest` moved to %s during the pass; nothing deleted this time",
                 now and now["version"])
        return [], 0
    if leftover_leases:
        delete_many(store.container, leftover_leases)
    delete_many(store.container, [store.manifest_name(v) for v in dropped])
    deleted = 0
    for container in store.data_containers():
        deleted += delete_many(container, [name for c, name in unreferenced if c is container])
    if dropped or deleted:
        log.info("checkpoint retention: %d old version(s) and %d unreferenced blob(s) deleted", len(dropped), deleted)
    return dropped, deleted
