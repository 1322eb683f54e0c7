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
none, which is itself evidence for the supervision (jobs.managed.classify).

Standard library plus azure-storage-blob: ships in the image.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

log = logging.getLogger("amlhpc.nodestatus")

RUNS_FOLDER = "runs"
HEARTBEAT_FIELDS = ("step", "age_ms", "first_step", "host", "state")
"""Metadata keys of a heartbeat (values are strings, as blob metadata must be)."""


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

    def age_at(self, when: datetime) -> float | None:
        """Seconds since the node's last progress at service time `when`."""
        if self.age_s is None:
            return None
        return self.age_s + max(0.0, (when - self.written).total_seconds())


def write_heartbeat(container, prefix: str, run_id: str, node: int, *, step: int | None, age_s: float | None,
                    first_step: int | None, host: str, state: str = "training") -> datetime | None:
    """Rewrite this node's heartbeat; returns the service's time of the write."""
    metadata = {"step": "" if step is None else str(step),
                "age_ms": "" if age_s is None else str(int(age_s * 1000)),
                "first_step": "" if first_step is None else str(first_step),
                "host": host[:200], "state": state}
    result = container.get_blob_client(heartbeat_name(prefix, run_id, node)).upload_blob(b"", overwrite=True,
                                                                                         metadata=metadata)
    return result.get("last_modified")


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


def read_heartbeats(container, prefix: str, run_id: str) -> dict[int, Heartbeat]:
    """Every node's latest heartbeat under the run, by node index (one listing)."""
    found: dict[int, Heartbeat] = {}
    folder = run_folder(prefix, run_id)
    for blob in container.list_blobs(name_starts_with=folder + "node-", include=["metadata"]):
        node = _int(blob.name[len(folder) + len("node-"):])
        if node is None:
            continue
        meta = blob.metadata or {}
        age_ms = _int(meta.get("age_ms"))
        found[node] = Heartbeat(node, _int(meta.get("step")), None if age_ms is None else age_ms / 1000,
                                _int(meta.get("first_step")), meta.get("host", ""), meta.get("state", "training"),
                                blob.last_modified)
    return found


def write_end(container, prefix: str, run_id: str, node: int, record: dict[str, Any]) -> None:
    container.upload_blob(end_name(prefix, run_id, node), json.dumps(record, sort_keys=True).encode(), overwrite=True)


def read_ends(container, prefix: str, run_id: str) -> dict[int, dict[str, Any]]:
    """Every end record under the run, by node index (unreadable ones are skipped with a warning)."""
    folder = run_folder(prefix, run_id)
    found: dict[int, dict[str, Any]] = {}
    for blob in container.list_blobs(name_starts_with=folder + "end-node-"):
        node = _int(blob.name[len(folder) + len("end-node-"):].removesuffix(".json"))
        if node is None:
            continue
        try:
            found[node] = json.loads(container.get_blob_client(blob.name).download_blob().readall())
        except (ValueError, OSError) as exc:
            log.warning("end record %s is unreadable: %s", blob.name, exc)
    return found
