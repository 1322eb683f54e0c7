"""The controller's own endings of an attempt go through the one ending path and its fault
point (`controller.ended`): a queue timeout, the budget, a stall and a silent node, each
crashed there and then finished by a new controller with the same cause; and the rule for an
attempt Azure ML reports Running while a node's heartbeat stopped. On the fake Azure ML built
from azure-ai-ml's own entities, the record and the evidence in Azurite."""

from __future__ import annotations

import pytest

from amlhpc.jobs.managed.policy import Policy, Target
from amlhpc.jobs.runtime.base import faultpoints
from tests import managed_fixtures
from tests.managed_fakes import Step
from tests.managed_harness import Harness, completed, running

managed_plan, template = managed_fixtures.managed_plan, managed_fixtures.template  # the shared fixtures

pytestmark = pytest.mark.azurite


def policy(**changes) -> Policy:
    """The shared policy with the silent-node check off (silent_node_s=None) unless a test turns it on."""
    return managed_fixtures.policy(**{"silent_node_s": None, **changes})


def beating(nodes, steps: int, start: int = 1) -> list[Step]:
    """Looks of a running attempt at which only `nodes` write a new heartbeat (step k)."""
    return [running(beats={n: {"step": k} for n in nodes}) for k in range(start, start + steps)]


TWO_CLUSTERS = (Target("nd-a100", 2, 27.197, "LowPriority"), Target("nd-a100-dedicated", 2, 27.197, "Dedicated"))

ENDINGS = {
    "queue_timeout": (dict(targets=TWO_CLUSTERS, queue_timeout_s=600),
                      {1: [Step("Queued")] * 40, 2: [completed()]}),
    "budget": (dict(limit_usd=100, limit_source="cost.ceiling_usd", checkpoint_interval_s=600, expected_hours=0.1),
               {1: [running()] * 400, 2: [completed()]}),
    "stalled": (dict(stall_s=300), {1: [running(), *[Step("NotResponding", started_h=0)] * 40], 2: [completed()]}),
    "node_failure": (dict(silent_node_s=300), {1: [running(beats={0: {"step": 0}, 1: {"step": 0}}), *beating([0], 40)],
                                               2: [completed()]}),
}


def crashed_then_finished(h: Harness, point: str) -> faultpoints.Armed:
    """Run the controller until it dies at `point`, then a new controller to the run's end."""
    with faultpoints.injected(point, faultpoints.crash) as armed:
        with pytest.raises(faultpoints.Crash):
            h.supervisor.run()
    h.supervisor.store.lease.break_lease(lease_break_period=0)  # what its expiry does
    h.record_after = h.new_supervisor("ctl-2").run()
    return armed


@pytest.mark.parametrize("cause", sorted(ENDINGS))
def test_each_ending_of_the_controller_reaches_the_ended_point(container, template, managed_plan, cause):
    """Before: `controller.ended` fired only for a job Azure ML ended; the controller's own
    endings wrote their record past it, so no test could crash a controller there."""
    changes, scripts = ENDINGS[cause]
    h = Harness(container, template, managed_plan, scripts, policy(**changes))
    armed = crashed_then_finished(h, "controller.ended")
    assert armed.contexts[0]["cause"] == cause
    first = h.record_after.attempts[0]
    assert first.cause == cause, f"{first.cause}: {first.detail}"
    assert h.azure.canceled[0] == first.job, "the crashed controller had canceled it; the record still says why"
    if cause != "budget":
        assert first.retryable and h.record_after.state == "succeeded"


@pytest.mark.parametrize("cause", ["stalled", "node_failure"])
def test_a_controller_dead_before_its_cancel_leaves_a_stop_the_next_one_finishes(container, template, managed_plan,
                                                                                 cause):
    changes, scripts = ENDINGS[cause]
    h = Harness(container, template, managed_plan, scripts, policy(**changes))
    crashed_then_finished(h, "controller.stopping")
    first = h.record_after.attempts[0]
    assert first.cause == cause and first.retryable and h.record_after.state == "succeeded"
    assert h.azure.canceled == [first.job], "the next controller canceled the job the stop was recorded for"


class TestSilentNodes:
    def test_a_node_whose_heartbeat_stopped_is_named_and_the_attempt_resubmitted(self, container, template,
                                                                                 managed_plan):
        scripts = {1: [running(beats={0: {"step": 0}, 1: {"step": 0}}), *beating([0], 40)], 2: [completed()]}
        h = Harness(container, template, managed_plan, scripts, policy(silent_node_s=300))
        record = h.supervisor.run()
        first = record.attempts[0]
        assert (first.cause, first.retryable, first.status) == ("node_failure", True, "Canceled")
        assert first.bad_nodes == [{"node": 1, "host": "node1-host", "why": "heartbeat stopped"}]
        assert "no new heartbeat came from node 1 (node1-host)" in first.detail and "silent_node_s 300" in first.detail
        assert h.azure.canceled == [first.job] and record.state == "succeeded"

    def test_a_node_that_never_wrote_one_is_judged_from_the_first_heartbeat(self, container, template, managed_plan):
        scripts = {1: beating([0], 40), 2: [completed()]}
        h = Harness(container, template, managed_plan, scripts, policy(silent_node_s=300))
        first = h.supervisor.run().attempts[0]
        assert first.cause == "node_failure" and first.bad_nodes == [{"node": 1, "why": "heartbeat stopped"}]
        assert "node 1 (no heartbeat yet)" in first.detail

    def test_nodes_that_keep_beating_are_never_stopped(self, container, template, managed_plan):
        scripts = {1: [*beating([0, 1], 30), completed()]}
        h = Harness(container, template, managed_plan, scripts, policy(silent_node_s=300))
        record = h.supervisor.run()
        assert [a.cause for a in record.attempts] == ["completed"] and not h.azure.canceled

    def test_off_when_not_set(self, container, template, managed_plan):
        scripts = {1: [*beating([0], 30), completed()]}
        record = Harness(container, template, managed_plan, scripts, policy(silent_node_s=None)).supervisor.run()
        assert [a.cause for a in record.attempts] == ["completed"]
