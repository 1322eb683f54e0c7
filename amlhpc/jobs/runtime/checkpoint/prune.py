"""Retention: keep the newest `keep` committed versions, delete what nothing references.

Safe against an upload or a commit running at the same time (the uploader's own retention
pass, and `python -m amlhpc.jobs.runtime.checkpoint prune` by hand), because it reads in this order:

1. the data blobs (what it may delete);
2. the pending records (every blob an upload in progress writes or reuses);
3. the `latest` pointer and the manifests.

An uploader writes its pending record before the part, and removes it only after the
manifest and the pointer that reference the part are written. So a part seen in (1) is
referenced by a record that (2) still sees, or by a manifest that (3) sees: it is never
deleted from under a version being uploaded or committed (the defect this ordering fixes:
a prune during an upload deleted the new version's parts, the version was committed
unrestorable, and retention then removed the good ones). Committed versions beyond `keep`
go first (manifests, then their unreferenced blobs), never the one `latest` names; a
manifest newer than `latest` is a commit in progress while its pending records exist, and
the leftover of a killed committer otherwise. Pending records older than the store's
`stale_pending_s` belong to uploaders that are gone, and those of a version already committed
to a committer stopped before it withdrew them: both are deleted (the blobs of the latter stay
referenced by its manifest).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from amlhpc.jobs.runtime.base import faultpoints
from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of

if TYPE_CHECKING:  # the store calls prune(): a type, not a second import at run time
    from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore

log = logging.getLogger("amlhpc.checkpoint")


def prune(store: CheckpointStore, keep: int) -> tuple[list[str], int]:
    """Returns (deleted versions, deleted data blobs)."""
    from azure.core.exceptions import ResourceNotFoundError

    keep = max(keep, 1)
    data = [b.name for b in store.container.list_blobs(name_starts_with=store.data_prefix())]
    faultpoints.reach("checkpoint.prune-listed")
    leased: set[str] = set()
    live_pending: set[str] = set()
    for version, nodes in store.pendings().items():
        for record in nodes.values():
            if store.is_stale(record):
                log.info("checkpoint retention: pending record of %s by node %d is stale (its uploader is gone)",
                         version, record.node)
                store.abandon(version, record.node)
                continue
            live_pending.add(version)
            leased |= record.blobs
    pointer, _ = store.pointer()
    versions = store.versions()
    if pointer is None:
        # Nothing committed yet: never touch a first upload's parts.
        return [], 0
    head = sequence_of(pointer["version"])
    for version in live_pending & set(versions):
        if sequence_of(version) <= head:  # committed: the committer stopped before withdrawing the leases
            for node in store.pendings().get(version, {}):
                store.abandon(version, node)
    committed = [v for v in versions if sequence_of(v) <= head]
    in_progress = [v for v in versions if sequence_of(v) > head and v in live_pending]
    kept = set(committed[-keep:]) | {pointer["version"]} | set(in_progress)
    dropped = [v for v in versions if v not in kept]
    referenced = set(leased)
    for version in kept:
        manifest = store.manifest(version)
        if manifest is not None:
            referenced.update(f["blob"] for f in manifest.files)
    stale = [name for name in data if name not in referenced]
    faultpoints.reach("checkpoint.prune-decided")
    for version in dropped:
        try:
            store.container.delete_blob(store.manifest_name(version))
        except ResourceNotFoundError:
            pass
    deleted = 0
    for name in stale:
        try:
            store.container.delete_blob(name)
            deleted += 1
        except ResourceNotFoundError:
            pass
    if dropped or deleted:
        log.info("checkpoint retention: %d old version(s) and %d unreferenced blob(s) deleted", len(dropped), deleted)
    return dropped, deleted
