"""What the job service says about one attempt's job, in Azure ML's own vocabulary.

Statuses are Azure ML's JobStatus values (azure-ai-ml's REST model
`arm_ml_service.models.JobStatus`, the service's `JobStatus` enum): Completed, Failed and
Canceled end a job; NotStarted, Starting, Provisioning, Preparing, Queued, Running,
Finalizing, CancelRequested, NotResponding and Paused are on the way (NotResponding may go
back to any earlier state). Errors are run history's `RootError` (`code`: ServiceError,
UserError, ValidationError, AzureStorageError, TransientError, RequestThrottled; and a
message). Node states are AmlCompute's NodeState (idle, running, preparing, unusable,
leaving, preempted), read for the nodes whose current run is the job. `capacity` is the
service's answer to "how many nodes could this job get on its cluster now", where it has
one (amlhpc.jobs.managed.azureml: the cluster's maxNodes less the nodes it lists unusable).

amlhpc.jobs.managed.azureml builds an Observation from azure-ai-ml's entities; the local
rehearsal (amlhpc.jobs.local.managed) builds the same from its simulated nodes, so one
classifier serves both.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

TERMINAL = frozenset({"Completed", "Failed", "Canceled"})
QUEUED = frozenset({"NotStarted", "Starting", "Provisioning", "Queued"})
"""Waiting for nodes: the queue timeout counts here (Preparing already holds nodes)."""
STALLED = frozenset({"Paused", "Unknown", "NotResponding"})
"""Neither running nor ended: the controller waits managed.stall_s, then cancels and retries."""
RUNNING = frozenset({"Running", "Finalizing"})
"""States in which the job holds its nodes and runs: an attempt's cost counts from the first."""
SERVICE_ERROR_CODES = frozenset({"ServiceError", "TransientError", "AzureStorageError", "RequestThrottled",
                                 "SystemError", "InternalError"})
"""RootError codes on the service's side of the line (retried); UserError and ValidationError are ours."""
NODE_TROUBLE = frozenset({"preempted", "unusable", "leaving"})
"""Node states worth recording while an attempt runs (idle, preparing and running are not)."""


@dataclass(frozen=True)
class Observation:
    """One look at a job."""

    status: str
    error_code: str | None = None
    error_message: str | None = None
    started_at: datetime | None = None
    """When the job started running on its nodes (service time), when known."""
    ended_at: datetime | None = None
    node_states: tuple[str, ...] = ()
    """States of the cluster nodes running this job right now (lower case)."""
    warnings: tuple[str, ...] = ()
    error_codes: tuple[str, ...] = ()
    """Every error code Azure ML gave: the RootError's, its inner errors' and details', and
    the compute error code it reports ("AzureMLCompute job failed. <Code>: ...")."""
    capacity: int | None = None
    """Nodes the job's cluster could give a job now, by the service's account; None: it does not say."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def running(self) -> bool:
        return self.status in RUNNING

    @property
    def queued(self) -> bool:
        return self.status in QUEUED

    @property
    def stalled(self) -> bool:
        return self.status in STALLED

    @property
    def trouble(self) -> tuple[str, ...]:
        return tuple(sorted({s for s in self.node_states if s in NODE_TROUBLE}))
