"""What each node of a job tells the others and the supervision, through Blob.

Beside the job's checkpoints (the container and prefix of AMLHPC_CHECKPOINT_JSON), one
folder per job run:

    <prefix>/runs/<run id>/node-<k>          heartbeat: an empty blob whose metadata is the
                                             node's progress, rewritten every watchdog check
    <prefix>/runs/<run id>/end-node-<k>.json end record: how the node's launcher ended
                                             (exit status, cause, message, host, steps)

Heartbeats carry their figures as blob metadata so one listing (`include=metadata`) reads
every node's at once, with the service's own `last_modified` time: comparing two nodes
never depends on their clocks agreeing. An end record is written once by each node's
local rank 0 as its launcher exits; a node that vanished (preempted, crashed host) leaves
none, which is itself evidence for the supervision (amlhpc.jobs.managed.classify).

Every job can write the checkpoints container, so these blobs are evidence, never orders,
and they are signed: the controller gives each attempt its own key (AMLHPC_EVIDENCE_KEY,
HMAC-SHA256, derived from a secret in the controller's job definition, which the GPU
clusters' identity cannot read: it holds no right on the workspace; the submitters and the
controller's identity can, and so can a submitter's job on the controller cluster, which runs
as that identity: the keys tell the run's attempts from other GPU jobs, not from the
workspace's submitters, who may submit and cancel any run anyway), and each record and heartbeat carries `mac`, an HMAC over its kind,
the run id, the node index and its content. A reader with the key (`verify=`) drops what
does not verify - another job's forgery, a record copied from another node or attempt -
and says why. The checkpoint pointer (`latest`, amlhpc.jobs.runtime.checkpoint.store) is
signed the same way (sign_pointer: kind `latest`, the attempt that committed it named in
the pointer), so the controller believes only a pointer one of the run's attempts wrote.

Standard library plus azure-storage-blob: ships in the image.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

log = logging.getLogger("amlhpc.nodestatus")

RUNS_FOLDER = "runs"
HEARTBEAT_FIELDS = ("step", "age_ms", "first_step", "host", "state", "busy_ms", "waiting")
"""Metadata keys of a heartbeat (values are strings, as blob metadata must be)."""
MAC = "mac"
STORED_AT = "_stored_at"
"""Added by read_ends: the service's last_modified time of the end record (never written)."""
ETAG = "_etag"
"""Added by read_ends: the end record's ETag, which changes with every write (never written)."""


def attempt_key(run_secret: str, job: str) -> str:
    """The evidence key of one attempt (hex), from the run's secret and the attempt's job name."""
    return hmac.new(bytes.fromhex(run_secret), b"amlhpc-evidence|" + job.encode(), hashlib.sha256).hexdigest()


def _mac(key: str, kind: str, run_id: str, node: int, content: bytes) -> str:
    head = f"{kind}|{run_id}|{node}|".encode()
    return hmac.new(bytes.fromhex(key), head + content, hashlib.sha256).hexdigest()


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in record.items() if k not in (MAC, STORED_AT, ETAG)}, sort_keys=True,
                      separators=(",", ":")).encode()


def _beat_content(metadata: Mapping[str, str | None]) -> bytes:
    # the service may return an empty metadata value as None, or leave the key out
    return "|".join(metadata.get(k) or "" for k in HEARTBEAT_FIELDS).encode()


POINTER_BY = "attempt"
"""The pointer's field naming the attempt (job) that committed it and signed it."""


def sign_pointer(key: str, run_id: str, document: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint pointer, naming `run_id` (the attempt committing it) and signed with its key."""
    signed = {k: v for k, v in document.items() if k not in (MAC, STORED_AT, ETAG)}
    signed[POINTER_BY] = run_id
    signed[MAC] = _mac(key, "latest", run_id, 0, _canonical(signed))
    return signed


def check_pointer(key_of: Callable[[str], str], attempts: Collection[str], document: Mapping[str, Any]) -> str | None:
    """Why a checkpoint pointer cannot be trusted, or None when an attempt of `attempts`
    signed it (`key_of`: an attempt's key)."""
    by, mac = document.get(POINTER_BY), document.get(MAC)
    if not isinstance(mac, str) or not isinstance(by, str):
        return "unsigned"
    if by not in attempts:
        return f"signed for {by!r}, which is no attempt of this run"
    if not hmac.compare_digest(mac, _mac(key_of(by), "latest", by, 0, _canonical(dict(document)))):
        return f"its signature does not verify (not written by {by})"
    return None


def check_end(key: str, run_id: str, node: int, record: dict[str, Any]) -> str | None:
    """Why an end record cannot be trusted, or None when its signature verifies."""
    mac = record.get(MAC)
    if not isinstance(mac, str):
        return "unsigned"
    if not hmac.compare_digest(mac, _mac(key, "end", run_id, node, _canonical(record))):
        return "its signature does not verify (not written by this attempt's node)"
    return None


def run_folder(prefix: str, run_id: str) -> str:
    return f"{prefix.strip('/')}/{RUNS_FOLDER}/{run_id}/"


def heartbeat_name(prefix: str, run_id: str, node: int) -> str:
    return f"{run_folder(prefix, run_id)}node-{node}"


def end_name(prefix: str, run_id: str, node: int) -> str:
    return f"{run_folder(prefix, run_id)}end-node-{node}.json"


@dataclass(frozen=True)
class Heartbeat:
    """One node's latest heartbeat as the service stored it."""

    node: int
    step: int | None
    age_s: float | None
    """Seconds since the node's last progress, when it was written; None before any."""
    first_step: int | None
    host: str
    state: str
    """training, or ended."""
    written: datetime
    """The blob's last_modified (service time)."""
    busy_s: float | None = None
    """The node's time per step in its own work (before waiting for peers): the slowest of
    its ranks, median of their latest steps; None when the training does not say."""
    waiting: bool | None = None
    """Whether every rank of the node waits for its peers (None: the training does not say)."""

    def age_at(self, when: datetime) -> float | None:
        """Seconds since the node's last progress at service time `when`."""
        if self.age_s is None:
            return None
        return self.age_s + max(0.0, (when - self.written).total_seconds())


def write_heartbeat(container, prefix: str, run_id: str, node: int, *, step: int | None, age_s: float | None,
                    first_step: int | None, host: str, state: str = "training", busy_s: float | None = None,
                    waiting: bool | None = None, key: str | None = None) -> datetime | None:
    """Rewrite this node's heartbeat (signed with `key`); returns the service's time of the write."""
    metadata = {"step": "" if step is None else str(step),
                "age_ms": "" if age_s is None else str(int(age_s * 1000)),
                "first_step": "" if first_step is None else str(first_step),
                "host": host[:200], "state": state,
                "busy_ms": "" if busy_s is None else str(int(busy_s * 1000)),
                "waiting": "" if waiting is None else str(int(waiting))}
    if key:
        metadata[MAC] = _mac(key, "beat", run_id, node, _beat_content(metadata))
    result = container.get_blob_client(heartbeat_name(prefix, run_id, node)).upload_blob(b"", overwrite=True,
                                                                                         metadata=metadata)
    return result.get("last_modified")


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


def read_heartbeats(container, prefix: str, run_id: str, verify: str | None = None,
                    refused: dict[int, str] | None = None) -> dict[int, Heartbeat]:
    """Every node's latest heartbeat under the run, by node index (one listing). With
    `verify` (the attempt's key), heartbeats that do not verify are left out (and named in
    `refused`)."""
    found: dict[int, Heartbeat] = {}
    folder = run_folder(prefix, run_id)
    for blob in container.list_blobs(name_starts_with=folder + "node-", include=["metadata"]):
        node = _int(blob.name[len(folder) + len("node-"):])
        if node is None:
            continue
        meta = blob.metadata or {}
        if verify:
            mac = meta.get(MAC)
            if not mac or not hmac.compare_digest(mac, _mac(verify, "beat", run_id, node, _beat_content(meta))):
                if refused is not None:
                    refused[node] = "heartbeat unsigned" if not mac else "heartbeat signature does not verify"
                continue
        age_ms, busy_ms, waiting = _int(meta.get("age_ms")), _int(meta.get("busy_ms")), meta.get("waiting") or ""
        found[node] = Heartbeat(node, _int(meta.get("step")), None if age_ms is None else age_ms / 1000,
                                _int(meta.get("first_step")), meta.get("host") or "", meta.get("state") or "training",
                                blob.last_modified, None if busy_ms is None else busy_ms / 1000,
                                None if waiting == "" else waiting == "1")
    return found


END_METADATA = "amlhpc_record"
"""The end record again, as blob metadata, when it fits: one listing reads every node's."""
END_METADATA_MAX = 7000
"""Blob metadata holds 8 KiB in all; a longer record is read from the blob itself."""


def write_end(container, prefix: str, run_id: str, node: int, record: dict[str, Any], key: str | None = None) -> None:
    """Write the node's end record, signed with `key` when given (overwrite: a retry after a
    lost reply writes the same record again)."""
    record = {k: v for k, v in record.items() if k not in (MAC, STORED_AT, ETAG)}
    if key:
        record[MAC] = _mac(key, "end", run_id, node, _canonical(record))
    text = json.dumps(record, sort_keys=True)
    compact = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    metadata = {END_METADATA: compact} if len(compact) <= END_METADATA_MAX else {}
    container.upload_blob(end_name(prefix, run_id, node), text.encode(), overwrite=True, metadata=metadata)


def read_ends(container, prefix: str, run_id: str) -> dict[int, dict[str, Any]]:
    """Every end record under the run, by node index, each with the service's time of its
    write under `_stored_at` and its ETag under `_etag` (unreadable ones are skipped with a
    warning): one listing with metadata, a read only for a record too long for its metadata.
    Unverified: amlhpc.jobs.managed.evidence checks signatures and epochs."""
    folder = run_folder(prefix, run_id)
    found: dict[int, dict[str, Any]] = {}
    for blob in container.list_blobs(name_starts_with=folder + "end-node-", include=["metadata"]):
        node = _int(blob.name[len(folder) + len("end-node-"):].removesuffix(".json"))
        if node is None:
            continue
        try:
            inline = (blob.metadata or {}).get(END_METADATA)
            record = json.loads(inline if inline else container.get_blob_client(blob.name).download_blob().readall())
        except (ValueError, OSError) as exc:
            log.warning("end record %s is unreadable: %s", blob.name, exc)
            continue
        if isinstance(record, dict):
            found[node] = {**record, STORED_AT: blob.last_modified, ETAG: blob.etag}
    return found
