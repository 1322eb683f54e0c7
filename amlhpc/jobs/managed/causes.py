"""Why an attempt of a managed run ended, and which causes are retried by default.

One place for the vocabulary: the recipe's `managed.retry_on` names these causes (or a
training command's own exit statuses), the classifier (classify.py) returns them, and
`status` prints them. The launcher's exit statuses are read from
amlhpc.jobs.runtime.base.exit_codes, never spelled out again here. `Why` is the enum; its
members are strings, so records and recipes keep their plain names.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from amlhpc.jobs.runtime.base.exit_codes import ExitCode


class Why(StrEnum):
    """Why an attempt ended: every name `CAUSES` describes."""

    COMPLETED = "completed"
    PREEMPTED = "preempted"
    NODE_FAILURE = "node_failure"
    SERVICE_ERROR = "service_error"
    HEALTH_GATE = "health_gate"
    STAGING = "staging"
    HANG = "hang"
    NCCL_FALLBACK = "nccl_fallback"
    STORAGE_ACCESS = "storage_access"
    RESTORE = "restore"
    FINAL_UPLOAD = "final_upload"
    BAD_INPUT = "bad_input"
    TRAINING_ERROR = "training_error"
    QUEUE_TIMEOUT = "queue_timeout"
    STALLED = "stalled"
    BUDGET = "budget"
    CANCELED = "canceled"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Cause:
    name: Why
    retryable: bool
    """Retried by default (a recipe's managed.retry_on replaces the default set)."""
    summary: str


CAUSES: dict[str, Cause] = {c.name: c for c in (
    Cause(Why.COMPLETED, False, "the training finished"),
    Cause(Why.PREEMPTED, True, "low-priority nodes were preempted (Azure ML: PreemptionError, node state 'preempted')"),
    Cause(Why.NODE_FAILURE, True, "a node failed or vanished (node state 'unusable', a node left no end record, a "
                                f"launcher reported a node lost (exit {ExitCode.NODE_LOST}): node 0's store gone, or a "
                                "training process not reaped after SIGKILL), or a node's heartbeat stopped while Azure "
                                "ML said Running (managed.silent_node_s)"),
    Cause(Why.SERVICE_ERROR, True, "Azure ML reported a service-side error (ServiceError, TransientError, AzureStorageError, "
                                 "RequestThrottled) before the training could say anything"),
    Cause(Why.HEALTH_GATE, True, f"the health gate failed on a node (launcher exit {ExitCode.HEALTH}), or its health "
                               f"check before an in-job restart (exit {ExitCode.RESTART_HEALTH})"),
    Cause(Why.STAGING, True, f"staging the inputs failed or timed out (launcher exit {ExitCode.STAGING})"),
    Cause(Why.HANG, True, f"the watchdog stopped a training that made no progress (launcher exit {ExitCode.HANG})"),
    Cause(Why.NCCL_FALLBACK, True, "NCCL fell back to TCP instead of InfiniBand "
                                 f"(launcher exit {ExitCode.NCCL_SOCKETS})"),
    Cause(Why.STORAGE_ACCESS, False, "the node's managed identity cannot reach the job's storage with the role it needs "
                                   f"(launcher exit {ExitCode.STORAGE_ACCESS}): grant the role the message names"),
    Cause(Why.RESTORE, False, f"the latest checkpoint could not be restored (launcher exit {ExitCode.RESTORE})"),
    Cause(Why.FINAL_UPLOAD, False, f"the final checkpoint could not be uploaded (launcher exit {ExitCode.FINAL_UPLOAD})"),
    Cause(Why.BAD_INPUT, False, f"bad input: the launcher refused its settings (exit {ExitCode.USAGE}), the command was "
                              "not found (126/127), or Azure ML rejected the job"),
    Cause(Why.TRAINING_ERROR, False, "the training code failed (its own exit status)"),
    Cause(Why.QUEUE_TIMEOUT, True, "the attempt waited in Azure ML's queue longer than managed.queue_timeout_s (or, after "
                                 "a lost node, its cluster's capacity answer was below its nodes): canceled and resubmitted "
                                 "on fewer nodes (managed.min_nodes) or the next cluster of managed.fallback_clusters"),
    Cause(Why.STALLED, True, "Azure ML reported the job Paused, Unknown or NotResponding for longer than the controller "
                           "waits (managed.stall_s): canceled and resubmitted"),
    Cause(Why.BUDGET, False, "the controller stopped the attempt: what was spent plus the cost of the time to the next "
                           "checkpoint would pass the run's cost limit"),
    Cause(Why.CANCELED, False, "canceled, by the user or in Azure ML"),
    Cause(Why.UNKNOWN, False, "Azure ML said the job failed and nothing says why"),
)}

EXIT_CAUSES: dict[int, Why] = {
    ExitCode.USAGE: Why.BAD_INPUT,
    ExitCode.HEALTH: Why.HEALTH_GATE,
    ExitCode.STAGING: Why.STAGING,
    ExitCode.RESTORE: Why.RESTORE,
    ExitCode.FINAL_UPLOAD: Why.FINAL_UPLOAD,
    ExitCode.NCCL_SOCKETS: Why.NCCL_FALLBACK,
    ExitCode.STORAGE_ACCESS: Why.STORAGE_ACCESS,
    ExitCode.HANG: Why.HANG,
    ExitCode.NODE_LOST: Why.NODE_FAILURE,
    ExitCode.RESTART_HEALTH: Why.HEALTH_GATE,
    ExitCode.NOT_EXECUTABLE: Why.BAD_INPUT,
    ExitCode.NOT_FOUND: Why.BAD_INPUT,
}
"""The launcher's own exit statuses; any other non-zero status is the training's."""

DEFAULT_RETRY_ON: tuple[str, ...] = tuple(str(name) for name, cause in CAUSES.items() if cause.retryable)
"""Plain strings: a recipe and its YAML hold them as written."""
NEVER_RETRIED = (Why.COMPLETED, Why.CANCELED, Why.BUDGET)
"""A finished run is not restarted, a cancel is the user's decision, and a limit is a limit."""

PRECEDENCE: tuple[Why, ...] = (Why.PREEMPTED, Why.NODE_FAILURE, Why.HANG, Why.NCCL_FALLBACK, Why.STORAGE_ACCESS,
                               Why.HEALTH_GATE, Why.STAGING, Why.RESTORE, Why.BAD_INPUT, Why.FINAL_UPLOAD,
                               Why.TRAINING_ERROR)
"""When nodes ended differently, the first of these explains the attempt: a preempted or
vanished node makes the others' collectives fail, a hang makes the others' time out."""


def cause_of_exit(status: int) -> Why:
    """The cause for a launcher exit status (0 is not a failure)."""
    return EXIT_CAUSES.get(status, Why.TRAINING_ERROR)


def check_retry_entry(entry: object) -> str | None:
    """What is wrong with one `managed.retry_on` entry, or None when it is usable."""
    if isinstance(entry, bool):
        return f"{entry!r} is neither a cause nor an exit status"
    if isinstance(entry, int):
        return None if 1 <= entry <= 255 else f"exit status {entry} is outside 1..255"
    if entry in NEVER_RETRIED:
        return f"{entry!r} is never retried (a finished run is done; a cancel is the user's decision; a limit is a limit)"
    if entry not in CAUSES:
        return f"unknown cause {entry!r}"
    return None
