"""The job service on Azure ML, for the controller: submit an attempt, observe it, cancel it.

The only module under amlhpc/jobs/managed that calls MLClient. What it reads, and from where:

- `ml_client.jobs.get(name)`: the job entity (azure-ai-ml `Job._from_rest_object` of the
  ARM `JobBase`): status, compute, tags;
- the job's run in run history (`Run`: `error.error` is a RootError with `code` and
  `message`, `startTimeUtc`, `endTimeUtc`, `warnings`), through the SDK's own
  `RunOperations.get_run` - the call its `jobs.stream` uses to print a failed job's error,
  since the ARM job resource carries no error. It is the SDK's private surface: when it
  fails the observation goes on without error text (classification then rests on node
  states and the nodes' end records);
- `ml_client.compute.list_nodes(cluster)`: AmlComputeNodeInfo with `node_state` and
  `run_id` (the job name), to see nodes of this job preempted or unusable while it runs -
  and the cluster's capacity: its maxNodes (stack outputs, in the policy's targets) less
  the nodes it lists `unusable`, whichever job they ran. An unusable node stays allocated
  to the cluster until it is removed (the predecessor service said so of its clusters:
  microsoftarchive/BatchAI issue 19, 2018-01-19, "it's still allocated and is considered to
  be used by you"), so a job asking for more nodes than that waits. azure-ai-ml's
  AmlCompute entity carries no node counts or allocation errors (azure-ai-ml 1.x,
  entities/_compute/aml_compute.py), and quota is regional and shared, so this is the
  only capacity answer read.

An attempt is the training job template the submit rendered for its cluster (load_job of
its YAML), with its own name, its node count (the template's, or fewer when the run shrank:
the command keeps its `--global-batch`, so the training accumulates more per rank, and the
launcher restores every part of the versioned checkpoint to reshard it), the attempt's run
id for the launcher (AMLHPC_RUN_ID, so nodes' end records land under the attempt's name),
its evidence key, tags naming the run, and the code of the controller's own job (one upload
for the run: the controller's snapshot holds the training code).

Submit failures: Azure ML answers a job it will never run (a bad definition, a missing
compute, an environment or code asset that does not exist) with 400, 404, 409 or 422;
`refusal` names those, so the controller records the attempt as bad input at once instead
of retrying. Anything else (throttling, 5xx, the connection) may pass, and is retried.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from amlhpc.jobs.managed.observation import Observation
from amlhpc.jobs.managed.policy import Target
from amlhpc.jobs.runtime.base import contract

log = logging.getLogger("amlhpc.managed")

RUN_TAG = "managed_run"
ATTEMPT_TAG = "attempt"
NODES_TAG = "nodes"
REFUSED_STATUSES = frozenset({400, 404, 409, 422})
"""HTTP answers to a job PUT that a retry cannot change."""
NODE_STATUSES = frozenset({"Preparing", "Queued", "Running", "Finalizing", "Failed", "Canceled", "NotResponding",
                           "Paused", "Unknown", "CancelRequested"})
"""Job statuses in which the cluster's node states say something about the job."""
_COMPUTE_CODE = re.compile(r"AzureMLCompute job failed\.\s*([A-Za-z]+Error)\b")


def observation_from(job: Any, run: Any | None = None, nodes: list[Any] | None = None,
                     max_nodes: int = 0) -> Observation:
    """An Observation from azure-ai-ml entities: the Job, its run-history Run (or None) and
    the cluster's AmlComputeNodeInfo list (or None); `max_nodes`: the cluster's maxNodes
    (0: unknown, no capacity answer)."""
    error_code = error_message = None
    started = ended = None
    warnings: tuple[str, ...] = ()
    codes: tuple[str, ...] = ()
    if run is not None:
        root = getattr(getattr(run, "error", None), "error", None)
        if root is not None:
            error_code, error_message = getattr(root, "code", None), getattr(root, "message", None)
            codes = error_codes(root)
        started, ended = getattr(run, "start_time_utc", None), getattr(run, "end_time_utc", None)
        warnings = tuple(str(getattr(w, "message", "")) for w in (getattr(run, "warnings", None) or []))
    name = getattr(job, "name", None)
    states = tuple(sorted(str(_field(n, "node_state", "nodeState") or "").lower() for n in (nodes or [])
                          if _field(n, "run_id", "runId") == name))
    capacity = None
    if max_nodes and nodes is not None:
        unusable = sum(str(_field(n, "node_state", "nodeState") or "").lower() == "unusable" for n in nodes)
        capacity = max(0, max_nodes - unusable)
    return Observation(status=enum_value(job.status), error_code=error_code, error_message=error_message,
                       started_at=started, ended_at=ended, node_states=states, warnings=warnings, error_codes=codes,
                       capacity=capacity)


def error_codes(root: Any) -> tuple[str, ...]:
    """Every code in a run-history RootError: its own, its inner errors' chain, its details'
    (recursively), and the compute error code Azure ML puts in the message
    ("AzureMLCompute job failed. PreemptionError: ...")."""
    found: list[str] = []

    def visit(error: Any, depth: int = 0) -> None:
        if error is None or depth > 8:
            return
        code = getattr(error, "code", None)
        if code:
            found.append(str(code))
        match = _COMPUTE_CODE.search(str(getattr(error, "message", "") or ""))
        if match:
            found.append(match.group(1))
        inner = getattr(error, "inner_error", None)
        while inner is not None and depth < 8:
            if getattr(inner, "code", None):
                found.append(str(inner.code))
            inner, depth = getattr(inner, "inner_error", None), depth + 1
        for detail in getattr(error, "details", None) or []:
            visit(detail, depth + 1)

    visit(root)
    return tuple(dict.fromkeys(found))


def enum_value(value: Any) -> str:
    """The wire value of an SDK enum member (str() of a str-Enum is 'JobStatus.FAILED')."""
    return str(getattr(value, "value", value))


def _field(node: Any, name: str, wire_name: str) -> Any:
    """An AmlComputeNodeInfo field. azure-ai-ml 1.35's `_from_rest_object` copies the REST
    model's `as_dict()` - wire (camelCase) keys - so `node_state` stays None and `nodeState`
    holds the value; read both."""
    return getattr(node, name, None) or getattr(node, wire_name, None)


def cluster_name(compute: str | None) -> str | None:
    """A job's compute as a cluster name (the SDK gives a name, azureml:<name> or an ARM id)."""
    if not compute:
        return None
    return compute.rsplit("/", 1)[-1].removeprefix("azureml:")


class AzureJobService:
    def __init__(self, ml_client, root: Path, code: str, run: str, experiment: str,
                 max_nodes: Mapping[str, int] | None = None):
        self.ml_client, self.root, self.code, self.run, self.experiment = ml_client, root, code, run, experiment
        self.max_nodes = dict(max_nodes or {})
        """cluster -> its maxNodes, for the capacity answer (from the policy's targets)."""

    def submit(self, job: str, attempt: int, target: Target, environment: dict[str, str]) -> None:
        from azure.ai.ml import load_job

        entity = load_job(self.root / target.template)
        entity.name = job
        entity.code = self.code
        if entity.resources is None:
            from azure.ai.ml.entities import JobResourceConfiguration

            entity.resources = JobResourceConfiguration()
        planned = entity.resources.instance_count
        entity.resources.instance_count = target.nodes
        shrunk = f", {target.nodes} of {planned} nodes" if planned and target.nodes < planned else ""
        entity.display_name = f"{entity.display_name or self.run} (attempt {attempt}{shrunk})"
        entity.tags = {**(entity.tags or {}), RUN_TAG: self.run, ATTEMPT_TAG: str(attempt), NODES_TAG: str(target.nodes)}
        entity.environment_variables = {**(entity.environment_variables or {}), **environment, contract.RUN_ID: job}
        self.ml_client.jobs.create_or_update(entity, experiment_name=self.experiment)

    @staticmethod
    def refusal(exc: BaseException) -> str | None:
        """Why Azure ML refused the job for good, or None when the failure may pass."""
        from azure.core.exceptions import HttpResponseError

        status = getattr(exc, "status_code", None)
        if isinstance(exc, HttpResponseError) and status in REFUSED_STATUSES:
            code = getattr(getattr(exc, "error", None), "code", None) or getattr(exc, "reason", "")
            return f"Azure ML refused the job (HTTP {status} {code}): {str(exc.message or exc).splitlines()[0][:300]}"
        return None

    def observe(self, job: str) -> Observation | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            entity = self.ml_client.jobs.get(job)
        except ResourceNotFoundError:
            return None
        return observation_from(entity, self._run(job), self._nodes(entity),
                                self.max_nodes.get(cluster_name(getattr(entity, "compute", None)) or "", 0))

    def cancel(self, job: str) -> None:
        self.ml_client.jobs.begin_cancel(job)

    def _run(self, job: str):
        try:
            return self.ml_client.jobs._runs_operations.get_run(job)
        except Exception as exc:  # noqa: BLE001 - private SDK surface: go on without the error text
            log.warning("run history for %s unavailable (%s: %s): classifying without Azure's error text",
                        job, type(exc).__name__, exc)
            return None

    def _nodes(self, entity) -> list[Any]:
        cluster = cluster_name(getattr(entity, "compute", None))
        if not cluster or enum_value(entity.status) not in NODE_STATUSES:
            return []
        try:
            return list(self.ml_client.compute.list_nodes(cluster))
        except Exception as exc:  # noqa: BLE001 - node states are extra evidence, not required
            log.warning("could not list the nodes of %s: %s: %s", cluster, type(exc).__name__, exc)
            return []
