"""A fake Azure ML for the managed-run tests, built from azure-ai-ml's own pieces.

`ml_client.jobs.get` answers with `Job._from_rest_object` of the SDK's REST model
`JobBase`, deserialized from the REST API's published example of a command job
(tests/fixtures/azureml/commandjob-get.json) with this job's name, status and tags filled
in; run history answers with the SDK's `Run` model deserialized from run-history JSON;
`compute.list_nodes` with `AmlComputeNodeInfo._from_rest_object` of `AmlComputeNodeInformation`.
What a job does is scripted per attempt: each `jobs.get` moves it one step, and a step
can leave what the nodes' launchers would have left in Blob (end records, a checkpoint).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.checkpoint import CheckpointStore
from amlhpc.jobs.runtime.coord import nodestatus

FIXTURE = Path(__file__).parent / "fixtures" / "azureml" / "commandjob-get.json"
SUB, RG, WS = "00000000-0000-0000-0000-000000000000", "rg-amlhpc-dev", "mlw-amlhpc-dev"
T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
PREEMPTION = ("UserError", "AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted. Check if "
                           "the run has failed or restarted. Reason: Received pre-emption warning signal")


def arm(kind: str, name: str) -> str:
    return f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.MachineLearningServices/workspaces/{WS}/{kind}/{name}"


@dataclass
class Step:
    status: str
    error: tuple[str, str] | None = None
    node_states: tuple[str, ...] = ()
    """States of the job's nodes while at this step (node i: node_states[i])."""
    ends: dict[int, dict[str, Any]] | None = None
    """End records the nodes' launchers write on reaching this step."""
    started_h: float | None = None
    """Hours after T0 when the job started running (run history's startTimeUtc)."""
    ended_h: float | None = None
    commit: bool = False
    """The training commits a checkpoint version while at this step."""
    beats: dict[int, dict[str, Any]] | None = None
    """Heartbeats the nodes' watchdogs write on reaching this step (write_heartbeat keywords)."""
    until_h: float | None = None
    """With a clock: the job stays at this step until the clock passes T0 + until_h hours."""


def end(code: int, *, first: int = 0, last: int = 10, node: int = 0, **extra) -> dict[str, Any]:
    """An end record as amlhpc.jobs.runtime.launch.watchdog.record_end writes it."""
    return {"node": node, "host": f"node{node}-host", "exit_code": code, "error": extra.pop("error", None),
            "signals": extra.pop("signals", []), "first_step": first, "last_step": last, **extra}


class Clock:
    def __init__(self, start: datetime = T0):
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> datetime:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += timedelta(seconds=max(seconds, 1.0))


@dataclass
class _Job:
    entity: Any
    steps: list[Step]
    index: int = -1
    canceled: bool = False

    @property
    def step(self) -> Step | None:
        return self.steps[self.index] if 0 <= self.index < len(self.steps) else None


class FakeAzureML:
    """jobs.{get, create_or_update, begin_cancel, _runs_operations.get_run}, compute.list_nodes."""

    def __init__(self, container, prefix: str, scripts: dict[int, list[Step]], clock=None):
        self.container, self.prefix, self.scripts, self.clock = container, prefix, scripts, clock
        self.state: dict[str, _Job] = {}
        self.created: list[Any] = []
        self.canceled: list[str] = []
        self.fail_next_create: BaseException | None = None
        """Raised by the next job PUT (then cleared)."""
        self.refuse_creates: BaseException | None = None
        """Raised by every job PUT (an Azure ML that refuses the job for good)."""
        self.create_calls = 0
        self.unusable_nodes = 0
        """Nodes of the cluster listed `unusable` and running no job (a lost host not yet removed)."""
        self.jobs = _Jobs(self)
        self.compute = _Compute(self)

    def add_job(self, name: str, steps: list[Step], tags: dict[str, str] | None = None) -> None:
        """A job the controller did not create (a controller job of the run, for `cancel`)."""
        from azure.ai.ml.entities import CommandJob

        entity = CommandJob(name=name, command="python -m amlhpc.jobs.managed.controller", compute="azureml:jobs-controller",
                            environment="azureml:aml-hpc-controller:1", tags=tags or {"role": "controller"})
        self.state[name] = _Job(entity, steps)

    # the service's side
    def _advance(self, name: str) -> _Job:
        job = self.state[name]
        if job.canceled:
            return job
        held = job.step is not None and job.step.until_h is not None and self.clock is not None and \
            self.clock() < T0 + timedelta(hours=job.step.until_h)
        if job.index < len(job.steps) - 1 and not held:
            job.index += 1
            step = job.step
            key = (job.entity.environment_variables or {}).get(contract.EVIDENCE_KEY)
            for node, record in (step.ends or {}).items():
                nodestatus.write_end(self.container, self.prefix, name, node, {"node": node, **record}, key=key)
            for node, beat in (step.beats or {}).items():
                nodestatus.write_heartbeat(self.container, self.prefix, name, node, key=key,
                                           **{"step": None, "age_s": 0.0, "first_step": 0, "host": f"node{node}-host",
                                              **beat})
            if step.commit:
                self._commit(name, key)
        return job

    def _commit(self, name: str, key: str | None) -> None:
        """Commit a checkpoint as the attempt's rank 0 does: the pointer signed with its key."""
        import os
        import tempfile
        from unittest import mock

        job_env = {contract.RUN_ID: name, **({contract.EVIDENCE_KEY: key} if key else {})}
        with tempfile.TemporaryDirectory() as folder, mock.patch.dict(os.environ, job_env):
            os.environ.pop("AZUREML_RUN_ID", None)
            (Path(folder) / "ckpt.pt").write_text(f"weights after {name}")
            CheckpointStore(self.container, self.prefix).upload(Path(folder))

    def status(self, name: str) -> str:
        job = self.state[name]
        return "Canceled" if job.canceled else job.step.status if job.step else "NotStarted"

    def body(self, name: str) -> dict[str, Any]:
        """The Jobs - Get response body for `name`: the published example, filled in."""
        job = self.state[name]
        body = copy.deepcopy(json.loads(FIXTURE.read_text())["responses"]["200"]["body"])
        body.update({"id": arm("jobs", name), "name": name})
        props = body["properties"]
        cluster = str(job.entity.compute).removeprefix("azureml:")
        props.update({"status": self.status(name), "displayName": job.entity.display_name,
                      "experimentName": job.entity.experiment_name or "Default", "tags": dict(job.entity.tags or {}),
                      "computeId": arm("computes", cluster), "command": job.entity.command,
                      "environmentVariables": dict(job.entity.environment_variables or {}),
                      "codeId": arm("codes", "run-code") + "/versions/1"})
        return body

    def run_body(self, name: str) -> dict[str, Any]:
        """The run-history Run document for `name` (wire names of the SDK's runhistory models)."""
        job = self.state[name]
        doc: dict[str, Any] = {"runId": name, "status": self.status(name)}
        reached = job.steps[: job.index + 1]
        started = next((s.started_h for s in reached if s.started_h is not None), None)
        ended = next((s.ended_h for s in reached if s.ended_h is not None), None)
        if started is not None:
            doc["startTimeUtc"] = (T0 + timedelta(hours=started)).isoformat().replace("+00:00", "Z")
        if ended is not None:
            doc["endTimeUtc"] = (T0 + timedelta(hours=ended)).isoformat().replace("+00:00", "Z")
        if job.step and job.step.error:
            doc["error"] = {"error": {"code": job.step.error[0], "message": job.step.error[1]}}
        return doc


class _Runs:
    def __init__(self, azure: FakeAzureML):
        self.azure = azure

    def get_run(self, name: str):
        from azure.ai.ml._restclient.runhistory._utils.model_base import _deserialize
        from azure.ai.ml._restclient.runhistory.models import Run

        return _deserialize(Run, self.azure.run_body(name))


class _Jobs:
    def __init__(self, azure: FakeAzureML):
        self.azure = azure
        self._runs_operations = _Runs(azure)

    def get(self, name: str):
        from azure.ai.ml._restclient.arm_ml_service._utils.model_base import _deserialize
        from azure.ai.ml._restclient.arm_ml_service.models import JobBase
        from azure.ai.ml.entities import Job
        from azure.core.exceptions import ResourceNotFoundError

        if name not in self.azure.state:
            raise ResourceNotFoundError(f"job {name} not found")
        self.azure._advance(name)
        return Job._from_rest_object(_deserialize(JobBase, self.azure.body(name)))

    def create_or_update(self, entity, experiment_name: str | None = None):
        if self.azure.refuse_creates is not None:
            self.azure.create_calls += 1
            raise self.azure.refuse_creates
        if self.azure.fail_next_create is not None:
            failure, self.azure.fail_next_create = self.azure.fail_next_create, None
            raise failure
        attempt = int(entity.tags["attempt"])
        self.azure.created.append(entity)
        self.azure.state[entity.name] = _Job(entity, list(self.azure.scripts.get(attempt, [Step("Queued")])))
        return entity

    def begin_cancel(self, name: str):
        from azure.core.exceptions import ResourceNotFoundError

        if name not in self.azure.state:
            raise ResourceNotFoundError(f"job {name} not found")
        self.azure.canceled.append(name)
        self.azure.state[name].canceled = True


class _Compute:
    def __init__(self, azure: FakeAzureML):
        self.azure = azure

    def list_nodes(self, cluster: str):
        from azure.ai.ml._restclient.arm_ml_service._utils.model_base import _deserialize
        from azure.ai.ml._restclient.arm_ml_service.models import AmlComputeNodeInformation
        from azure.ai.ml.entities import AmlComputeNodeInfo

        nodes = []
        for name, job in self.azure.state.items():
            for i, state in enumerate(job.step.node_states if job.step else ()):
                nodes.append(AmlComputeNodeInfo._from_rest_object(_deserialize(AmlComputeNodeInformation, {
                    "nodeId": f"tvmps_{name}_{i}", "privateIpAddress": f"10.0.0.{i + 4}", "port": 50000,
                    "nodeState": state, "runId": name})))
        for i in range(self.azure.unusable_nodes):
            nodes.append(AmlComputeNodeInfo._from_rest_object(_deserialize(AmlComputeNodeInformation, {
                "nodeId": f"tvmps_lost_{i}", "privateIpAddress": f"10.0.1.{i + 4}", "port": 50000,
                "nodeState": "unusable"})))
        return nodes
