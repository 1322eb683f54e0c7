"""A controller that cannot be orphaned (amlhpc/jobs/managed/revive.py): the revival check starts a
copy of the controller when none holds the record's lease, never two, never for a finished
run, waits for one that is starting, and cancels one that hangs; the schedule that runs it
is an azure-ai-ml JobSchedule the SDK turns into the service's REST shape."""

from __future__ import annotations

from datetime import timedelta

import pytest
import yaml

from amlhpc.jobs.managed import revive
from amlhpc.jobs.managed.record import iso
from tests import managed_fixtures
from tests.managed_harness import Harness, completed, running

managed_plan, template = managed_fixtures.managed_plan, managed_fixtures.template  # the shared fixtures

pytestmark = pytest.mark.azurite


class Launcher:
    """Controller jobs as the revival check sees them."""

    def __init__(self, statuses: dict[str, str]):
        self.statuses, self.started, self.canceled = dict(statuses), [], []

    def status(self, job):
        return self.statuses.get(job)

    def cancel(self, job):
        self.canceled.append(job)
        self.statuses[job] = "Canceled"

    def start(self, run, previous):
        name = f"{run}-c{len(self.started) + 1:04x}"
        self.started.append((name, previous))
        self.statuses[name] = "Queued"
        return name


def started_run(container, template, managed_plan) -> Harness:
    """A run whose controller claimed attempt 1 and then died (its lease lapsed)."""
    h = Harness(container, template, managed_plan, {1: [running(), running(), completed()]})
    h.supervisor.store.acquire()
    h.supervisor.tick()
    h.supervisor.store.lease.break_lease(lease_break_period=0)
    return h


def test_a_dead_controller_is_replaced_once(container, template, managed_plan):
    h = started_run(container, template, managed_plan)
    launcher = Launcher({h.run: "Failed"})
    first = revive.revive(h.store(), launcher, h.run, echo=h.lines.append)
    assert first == f"{h.run}-c0001" and launcher.started == [(first, h.run)]
    assert h.store().controller_jobs() == [first], "registered beside the record: status and cancel see it"
    assert revive.revive(h.store(), launcher, h.run, echo=h.lines.append) is None, "it is starting: wait for it"
    assert any("is Queued: waiting for it" in line for line in h.lines)
    launcher.statuses[first] = "Failed"  # the copy died too
    assert revive.revive(h.store(), launcher, h.run, echo=h.lines.append) == f"{h.run}-c0002"
    assert launcher.started[-1] == (f"{h.run}-c0002", first), "a copy of the newest controller"


def test_nothing_while_a_controller_holds_the_lease(container, template, managed_plan):
    h = Harness(container, template, managed_plan, {1: [running()]})
    h.supervisor.store.acquire()
    launcher = Launcher({h.run: "Running"})
    assert revive.revive(h.store(), launcher, h.run) is None and launcher.started == []
    h.supervisor.store.release()


def test_nothing_for_a_finished_run(container, template, managed_plan):
    h = Harness(container, template, managed_plan, {1: [completed()]})
    assert h.supervisor.run().state == "succeeded"
    launcher = Launcher({h.run: "Completed"})
    assert revive.revive(h.store(), launcher, h.run) is None and launcher.started == []


def test_a_hung_controller_is_canceled_and_replaced(container, template, managed_plan):
    h = started_run(container, template, managed_plan)
    h.store().add_controller("ctl-1", "started")  # the controller's job name is its name in the record
    launcher = Launcher({"ctl-1": "Running"})
    seen = h.record().controllers[0]["seen_at"]
    assert revive.revive(h.store(), launcher, h.run, now=lambda: h.clock()) is None, "between two renewals"
    later = h.clock() + timedelta(seconds=revive.HUNG_AFTER_LEASES * h.policy.lease_s + 1)
    assert iso(later) > seen
    new = revive.revive(h.store(), launcher, h.run, echo=h.lines.append, now=lambda: later)
    assert launcher.canceled == ["ctl-1"] and new == f"{h.run}-c0001"


def test_two_checks_at_once_start_one_controller(container, template, managed_plan):
    h = started_run(container, template, managed_plan)
    launcher = Launcher({h.run: "Failed"})
    other = h.store()
    assert other.acquire(15), "the other check took the lease first"
    assert revive.revive(h.store(), launcher, h.run) is None and launcher.started == []
    other.release()


def test_two_overlapping_checks_start_one_controller(container, template, managed_plan):
    """The second check looked (no live controller) before the first started one and let its
    lease go; taking the lease after it, the second lists again and sees the new controller."""
    from amlhpc.jobs.runtime.base import faultpoints

    h = started_run(container, template, managed_plan)
    launcher = Launcher({h.run: "Failed"})
    first: list[str | None] = []
    with faultpoints.injected("revive.listed", lambda **_: first.append(revive.revive(h.store(), launcher, h.run)),
                              when=lambda **_: not first):
        second = revive.revive(h.store(), launcher, h.run, echo=h.lines.append)
    assert first == [f"{h.run}-c0001"] and second is None
    assert launcher.started == [(first[0], h.run)], "one controller, not two"
    assert any(f"controller {first[0]} is Queued: waiting for it" in line for line in h.lines)


def test_the_revived_controller_continues_the_run(container, template, managed_plan):
    h = started_run(container, template, managed_plan)
    launcher = Launcher({h.run: "Failed"})
    name = revive.revive(h.store(), launcher, h.run)
    record = h.new_supervisor(name).run()
    assert record.state == "succeeded" and [j.name for j in h.azure.created] == [f"{h.run}-a1"]
    assert [c["job"] for c in record.controllers] == ["ctl-1", name]


def test_the_schedule_is_what_azure_ml_accepts(managed_plan, tmp_path):
    """The JobSchedule the first controller creates, from its own job: azure-ai-ml turns it
    into the REST shape of Schedules - Create Or Update (a recurrence every few minutes,
    the revival command, the controller's code, environment, cluster, identity, settings)."""
    from azure.ai.ml.entities import CommandJob, ManagedIdentityConfiguration

    from amlhpc.jobs.managed.settings import MANAGED_JSON

    controller = CommandJob(
        name=managed_plan.run, experiment_name="cosmoflow", command="python -m amlhpc.jobs.managed.controller",
        code="azureml:/subscriptions/s/resourceGroups/r/providers/Microsoft.MachineLearningServices/workspaces/w/codes/c/"
             "versions/1", environment="azureml:aml-hpc-controller:0123456789ab", compute="azureml:jobs-controller",
        environment_variables={MANAGED_JSON: "{}", "AZURE_CLIENT_ID": "cid"},
        identity=ManagedIdentityConfiguration(client_id="cid"))
    schedule = revive.revival_schedule(controller, managed_plan.run)
    rest = schedule._to_rest_object().as_dict()
    props = rest["properties"]
    assert props["trigger"]["triggerType"] == "Recurrence" and props["trigger"]["frequency"].lower() == "minute"
    assert props["trigger"]["interval"] == revive.REVIVE_EVERY_MIN
    pipeline = props["action"]["jobDefinition"]
    assert pipeline["jobType"] == "Pipeline" and pipeline["tags"]["role"] == "revival"
    step = pipeline["jobs"]["revive"]
    component = yaml.safe_load(step["componentId"])  # an anonymous component, registered when the schedule is created
    assert component["command"] == "python -m amlhpc.jobs.managed.revive"
    assert component["environment"] == "azureml:aml-hpc-controller:0123456789ab" and component["code"] == controller.code
    assert step["environment_variables"][MANAGED_JSON] == "{}" and step["identity"]["client_id"] == "cid"
    assert step["computeId"].endswith("jobs-controller") and step["resources"]["instance_count"] == 1
    assert schedule.name == f"amlhpc-revive-{managed_plan.run}"
