"""The managed-run record as a state machine under interleavings: at every named point of
the controller's loop (amlhpc/jobs/runtime/base/faultpoints.py), the controller is killed, a second
writer comes in, or a cancel arrives; and `jobs cancel` is interleaved with a claim. Each
test asserts its point fired, that no attempt ever ran twice or unsupervised, and where
the run ended."""

from __future__ import annotations

import pytest

from amlhpc.jobs.managed import client
from amlhpc.jobs.managed.observation import TERMINAL
from amlhpc.jobs.managed.record import RecordConflict
from amlhpc.jobs.runtime.base import faultpoints
from tests import managed_fixtures
from tests.managed_fakes import PREEMPTION, Step
from tests.managed_harness import Harness, completed, running

managed_plan, template = managed_fixtures.managed_plan, managed_fixtures.template  # the shared fixtures

pytestmark = pytest.mark.azurite

POINTS = ("controller.claim", "controller.claimed", "controller.submitted", "controller.watch", "controller.ended",
          "controller.backoff", "controller.record.write")


@pytest.fixture(autouse=True)
def clean_points():
    faultpoints.reset()
    yield
    faultpoints.reset()


def scripts() -> dict[int, list[Step]]:
    """Attempt 1 runs, is preempted and ends; attempt 2 completes: every point is passed."""
    return {1: [running(), running(), Step("Failed", error=PREEMPTION, started_h=0, ended_h=0.5)],
            2: [running(), completed()]}


def harness(container, template, managed_plan) -> Harness:
    return Harness(container, template, managed_plan, scripts())  # polls every 30 s, backs off 60 s


def when_for(point: str):
    """The first hit, except record writes: the third (attempt 1 claimed, submitted, then watched)."""
    seen = []
    return lambda **ctx: point != "controller.record.write" or (seen.append(1) or len(seen) == 3)


def one_job_per_attempt(h: Harness, record) -> None:
    names = [job.name for job in h.azure.created]
    assert names == [a.job for a in record.attempts], f"each attempt's job created once, in order: {names}"


@pytest.mark.parametrize("point", POINTS)
def test_a_controller_killed_at_each_point_is_replaced(container, template, managed_plan, point):
    h = harness(container, template, managed_plan)
    armed = faultpoints.arm(point, faultpoints.crash, when=when_for(point))
    with pytest.raises(faultpoints.Crash):
        h.supervisor.run()
    assert armed.fired == 1
    assert h.store().lease_held(), "a killed controller leaves its lease to lapse"
    h.supervisor.store.lease.break_lease(lease_break_period=0)  # what the lease's expiry does
    record = h.new_supervisor("ctl-2").run()
    assert record.state == "succeeded" and [a.cause for a in record.attempts] == ["preempted", "completed"]
    one_job_per_attempt(h, record)
    assert [c["job"] for c in record.controllers][-1] == "ctl-2"


@pytest.mark.parametrize("point", POINTS)
def test_a_second_writer_at_each_point_is_refused(container, template, managed_plan, point):
    h = harness(container, template, managed_plan)
    second = h.new_supervisor("ctl-2")
    refused = []

    def intrude(**ctx):
        assert not second.store.acquire(), "the second controller waits for the lease"
        record, etag = second.store.load()
        record.attempts = []  # a stale view
        with pytest.raises(RecordConflict):
            second.store.save(record, etag)
        refused.append(point)

    armed = faultpoints.arm(point, intrude, when=when_for(point))
    record = h.supervisor.run()
    assert armed.fired == 1 and refused == [point]
    assert record.state == "succeeded" and [a.cause for a in record.attempts] == ["preempted", "completed"]
    one_job_per_attempt(h, record)


@pytest.mark.parametrize("point", POINTS)
def test_a_cancel_at_each_point_leaves_nothing_running(container, template, managed_plan, point):
    h = harness(container, template, managed_plan)
    created_before: list[int] = []

    def cancel(**ctx):
        created_before.append(len(h.azure.created))
        h.store().request_cancel("alice")

    armed = faultpoints.arm(point, cancel, when=when_for(point))
    record = h.supervisor.run()
    assert armed.fired == 1
    assert record.state == "canceled" and "canceled by alice" in record.reason
    assert len(h.azure.created) == created_before[0], "no job created after the request"
    assert all(h.azure.status(job.name) in TERMINAL for job in h.azure.created), "nothing left running"
    assert all(a.state == "ended" for a in record.attempts)


class TestJobsCancel:
    def controllers(self, h: Harness) -> None:
        """The run's first controller ended long ago; a resumed one (RUN-cXXXX) runs."""
        h.azure.add_job(h.run, [Step("Completed")])
        h.azure.add_job(f"{h.run}-c1a2b", [Step("Running")])
        h.store().add_controller(f"{h.run}-c1a2b", "resumed")

    def test_a_resumed_controller_is_seen_and_canceled(self, container, template, managed_plan):
        h = harness(container, template, managed_plan)
        self.controllers(h)
        statuses = client.controller_statuses(h.azure.jobs, h.store(), h.record(), h.run)
        assert statuses == {h.run: "Completed", f"{h.run}-c1a2b": "Running"}
        canceled = client.cancel_run(h.azure.jobs, h.store(), h.run, "alice", echo=h.lines.append, sleep=h.clock.sleep)
        assert canceled == [f"{h.run}-c1a2b"] and h.record().state == "canceled"

    def test_a_claim_between_the_request_and_the_stop_is_refused(self, container, template, managed_plan):
        """A controller acts after the request was written and before it is stopped: it
        must not create the attempt's job."""
        h = harness(container, template, managed_plan)
        self.controllers(h)

        def controller_acts(**ctx):
            h.supervisor.store.acquire()
            h.supervisor.tick()
            h.supervisor.store.release()

        with faultpoints.armed("cancel.requested", controller_acts) as point:
            client.cancel_run(h.azure.jobs, h.store(), h.run, "alice", echo=h.lines.append, sleep=h.clock.sleep)
        assert point.fired == 1 and h.azure.created == [], "no job created once the cancel was asked"
        assert h.record().state == "canceled"

    def test_a_job_created_in_the_window_before_the_stop_is_swept(self, container, template, managed_plan):
        """The controller had checked for a cancel, the request lands, then it creates the job
        and is stopped: the sweep after the stop finds the attempt and cancels its job."""
        h = harness(container, template, managed_plan)
        self.controllers(h)
        with faultpoints.armed("controller.claimed", faultpoints.crash):
            with pytest.raises(faultpoints.Crash):
                h.supervisor.run()  # claimed, no job yet; the controller "pauses" here

        def create_after_check(**ctx):
            record = h.record()
            attempt = record.attempts[0]
            h.supervisor.service.submit(attempt.job, attempt.number, h.policy.target(0), {})

        def stopped(**ctx):  # canceling its job stopped the controller: its lease went with it
            h.supervisor.store.lease.break_lease(lease_break_period=0)

        with faultpoints.armed("cancel.requested", create_after_check) as point, \
                faultpoints.armed("cancel.stopped", stopped):
            client.cancel_run(h.azure.jobs, h.store(), h.run, "alice", echo=h.lines.append, sleep=h.clock.sleep)
        assert point.fired == 1 and h.azure.canceled[-1] == f"{h.run}-a1" and h.azure.status(f"{h.run}-a1") == "Canceled"
        record = h.record()
        assert record.state == "canceled" and record.attempts[0].cause == "canceled"
        assert h.new_supervisor("ctl-late").run().state == "canceled", "a controller started later honours it"
        assert len(h.azure.created) == 1
