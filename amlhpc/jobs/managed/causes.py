"""Why an attempt of a managed run ended, and which causes are retried by default.

One place for the vocabulary: the recipe's `managed.retry_on` names these causes (or a
training command's own exit statuses), the classifier (classify.py) returns them, and
`status` prints them. The launcher's exit statuses are read from amlhpc.jobs.runtime.launch.launcher,
never spelled out again here.
"""

from __future__ import annotations

from dataclasses import dataclass

from amlhpc.jobs.runtime.base.exit_codes import ExitCode


@dataclass(frozen=True)
class Cause:
    name: str
    retryable: bool
    """Retried by default (a recipe's managed.retry_on replaces the default set)."""
    summary: str


CAUSES: dict[str, Cause] = {c.name: c for c in (
    Cause("completed", False, "the training finished"),
    Cause("preempted", True, "low-priority nodes were preempted (Azure ML: PreemptionError, node state 'preempted')"),
    Cause("node_failure", True, "a node failed or vanished (node state 'unusable', or a node left no end record)"),
    Cause("service_error", True, "Azure ML reported a service-side error (ServiceError, TransientError, AzureStorageError, "
                                 "RequestThrottled) before the training could say anything"),
    Cause("health_gate", True, f"the health gate failed on a node (launcher exit {ExitCode.HEALTH})"),
    Cause("staging", True, f"staging the inputs failed or timed out (launcher exit {ExitCode.STAGING})"),
    Cause("hang", True, f"the watchdog stopped a training that made no progress (launcher exit {ExitCode.HANG})"),
    Cause("nccl_fallback", True, "NCCL fell back to TCP instead of InfiniBand "
                                 f"(launcher exit {ExitCode.NCCL_SOCKETS})"),
    Cause("storage_access", False, "the node's managed identity cannot reach the job's storage with the role it needs "
                                   f"(launcher exit {ExitCode.STORAGE_ACCESS}): grant the role the message names"),
    Cause("restore", False, f"the latest checkpoint could not be restored (launcher exit {ExitCode.RESTORE})"),
    Cause("final_upload", False, f"the final checkpoint could not be uploaded (launcher exit {ExitCode.FINAL_UPLOAD})"),
    Cause("bad_input", False, f"bad input: the launcher refused its settings (exit {ExitCode.USAGE}), the command was "
                              "not found (126/127), or Azure ML rejected the job"),
    Cause("training_error", False, "the training code failed (its own exit status)"),
    Cause("queue_timeout", True, "the attempt waited in Azure ML's queue longer than managed.queue_timeout_s (or, after "
                                 "a lost node, its cluster's capacity answer was below its nodes): canceled and resubmitted "
                                 "on fewer nodes (managed.min_nodes) or the next cluster of managed.fallback_clusters"),
    Cause("stalled", True, "Azure ML reported the job Paused, Unknown or NotResponding for longer than the controller "
                           "waits (managed.stall_s): canceled and resubmitted"),
    Cause("budget", False, "the controller stopped the attempt: what was spent plus the cost of the time to the next "
                           "checkpoint would pass the run's cost limit"),
    Cause("canceled", False, "canceled, by the user or in Azure ML"),
    Cause("unknown", False, "Azure ML said the job failed and nothing says why"),
)}

EXIT_CAUSES: dict[int, str] = {
    ExitCode.USAGE: "bad_input",
    ExitCode.HEALTH: "health_gate",
    ExitCode.STAGING: "staging",
    ExitCode.RESTORE: "restore",
    ExitCode.FINAL_UPLOAD: "final_upload",
    ExitCode.NCCL_SOCKETS: "nccl_fallback",
    ExitCode.STORAGE_ACCESS: "storage_access",
    ExitCode.HANG: "hang",
    ExitCode.NOT_EXECUTABLE: "bad_input",
    ExitCode.NOT_FOUND: "bad_input",
}
"""The launcher's own exit statuses; any other non-zero status is the training's."""

DEFAULT_RETRY_ON: tuple[str, ...] = tuple(name for name, cause in CAUSES.items() if cause.retryable)
NEVER_RETRIED = ("completed", "canceled", "budget")
"""A finished run is not restarted, a cancel is the user's decision, and a limit is a limit."""

PRECEDENCE: tuple[str, ...] = ("preempted", "node_failure", "hang", "nccl_fallback", "storage_access", "health_gate",
                               "staging", "restore", "bad_input", "final_upload", "training_error")
"""When nodes ended differently, the first of these explains the attempt: a preempted or
vanished node makes the others' collectives fail, a hang makes the others' time out."""


def cause_of_exit(status: int) -> str:
    """The cause for a launcher exit status (0 is not a failure)."""
    return EXIT_CAUSES.get(status, "training_error")


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
