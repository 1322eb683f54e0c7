"""The harness of the supervisor tests: a supervisor wired as the controller wires it, on
the fake Azure ML of tests/managed_fakes.py, with the record and the evidence in Azurite;
the managed plan and its training template as fixtures; scripted steps of an attempt."""

from __future__ import annotations

import uuid
from pathlib import Path

import yaml

from amlhpc.jobs import recipes
from amlhpc.jobs.managed import render
from amlhpc.jobs.managed.azureml import AzureJobService
from amlhpc.jobs.managed.evidence import Evidence
from amlhpc.jobs.managed.policy import Policy
from amlhpc.jobs.managed.record import Record, RecordStore
from amlhpc.jobs.managed.supervisor import Supervisor, open_record
from amlhpc.jobs.plan import build
from tests.jobs_helpers import stack_outputs
from tests.managed_fakes import Clock, FakeAzureML, Step, end


def new_managed_plan():
    """The managed plan of cosmoflow on the dev fixture outputs (a module-scoped fixture in each test file)."""
    recipe = recipes.load("cosmoflow")
    outputs = stack_outputs("dev")
    training = build.plan_job(recipe, outputs, name=f"cosmoflow-m{uuid.uuid4().hex[:6]}")
    return render.plan_managed(recipe, outputs, training)


def write_template(tmp_path: Path, managed_plan) -> Path:
    """The training template where the controller's snapshot has it (a fixture in each test file)."""
    path = tmp_path / render.TEMPLATE_PATH
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(render.training_template(managed_plan), sort_keys=False))
    return path


SECRET = "5e" * 32


class Harness:
    """A supervisor on the fake Azure ML, as the controller wires it: the record in the
    supervision container (`records`, default the same test container), the evidence in
    the checkpoints container."""

    def __init__(self, container, template, managed_plan, scripts, policy: Policy | None = None, controller="ctl-1",
                 records=None, code=None):
        self.run = managed_plan.run
        self.prefix = managed_plan.storage["prefix"]
        self.container = container
        self.records = records if records is not None else container
        self.clock = Clock()
        self.azure = FakeAzureML(container, self.prefix, scripts, clock=self.clock)
        self.lines: list[str] = []
        self.policy = policy or Policy(nodes=2, usd_per_node_hour=27.197, expected_hours=12, max_restarts=3,
                                       backoff_s=60, backoff_max_s=900, controller_usd_per_hour=0.096, poll_s=30)
        self.root = template.parent.parent
        self.code = code
        open_record(self.store(), self.run, "cosmoflow", self.policy, code=code)
        self.supervisor = self.new_supervisor(controller)

    def store(self) -> RecordStore:
        return RecordStore(self.records, self.prefix, lease_s=self.policy.lease_s)

    def new_supervisor(self, controller: str, policy: Policy | None = None, **kwargs) -> Supervisor:
        rules = policy or self.policy
        service = AzureJobService(self.azure, self.root, "azureml:/subscriptions/s/codes/run-code/versions/1",
                                  self.run, "cosmoflow", max_nodes={t.cluster: t.max_nodes for t in rules.targets})
        return Supervisor(self.store(), service, Evidence(self.container, self.prefix, secret=SECRET),
                          rules, controller=controller, echo=self.lines.append, clock=self.clock,
                          sleep=self.clock.sleep, **{"code": self.code, **kwargs})

    def record(self) -> Record:
        return self.store().load()[0]


def running(ended_h=None, **kw):
    return Step("Running", started_h=0.0, **kw)


def failed(code: int, culprit: int | None = None, ended_h: float = 1.0, **kw) -> Step:
    """Node `culprit` (default 0) ends with `code`, the other node with the training's collective error."""
    culprit = 0 if culprit is None else culprit
    ends = {n: end(code if n == culprit else 1, node=n, first=0, last=40) for n in (0, 1)}
    return Step("Failed", error=("UserError", f"Execution failed. User process exited with status code {code}"),
                ends=ends, started_h=0.0, ended_h=ended_h, **kw)


def completed(ended_h: float = 2.0, first: int = 40) -> Step:
    return Step("Completed", ends={n: end(0, node=n, first=first, last=100) for n in (0, 1)}, started_h=0.0,
                ended_h=ended_h)
