"""The supervision of a managed run against a fake Azure ML made of azure-ai-ml's own
entities (tests/managed_fakes.py), with the run's record, the nodes' end records and the
checkpoints in a real Blob service (Azurite): preempted, failed with each launcher exit
status, canceled, hung, over budget, out of restarts, and the controller restarted."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from amlhpc.jobs.managed.azureml import observation_from
from amlhpc.jobs.managed.policy import Policy
from amlhpc.jobs.managed.record import RecordStore, iso
from amlhpc.jobs.managed.report import summary_lines
from amlhpc.jobs.managed.supervisor import Resume
from amlhpc.jobs.runtime.base import contract
from tests import managed_fixtures
from tests.managed_fakes import PREEMPTION, T0, Step, end
from tests.managed_harness import Harness, completed, failed, running

managed_plan, template = managed_fixtures.managed_plan, managed_fixtures.template  # the shared fixtures

pytestmark = pytest.mark.azurite


class TestPreemption:
    def test_preempted_then_resumed_and_completed(self, container, template, managed_plan):
        scripts = {1: [Step("Queued"), running(commit=True),
                       Step("Running", node_states=("running", "preempted"), started_h=0.0),
                       Step("Failed", error=PREEMPTION, started_h=0.0, ended_h=1.5,
                            ends={0: end(143, node=0, first=0, last=40, signals=["SIGTERM"])})],
                   2: [Step("Queued"), running(), completed(ended_h=3.5, first=40)]}
        h = Harness(container, template, managed_plan, scripts)
        record = h.supervisor.run()

        assert record.state == "succeeded" and [a.job for a in record.attempts] == [f"{h.run}-a1", f"{h.run}-a2"]
        first, second = record.attempts
        assert (first.cause, first.retryable, first.status) == ("preempted", True, "Failed")
        assert first.node_events == ["preempted"] and "preempted" in first.detail
        assert first.resumed_version is None and second.resumed_version is not None, "attempt 2 restores the checkpoint"
        assert (second.first_step, second.last_step) == (40, 100)
        # charged from the submission (queue included) to run history's end, on 2 nodes
        assert first.usd == round(2 * 27.197 * 1.5, 2), "attempt 1 was submitted at T0 and ended at T0 + 1.5 h"
        submitted = datetime.fromisoformat(second.submitted_at)
        assert second.usd == round(2 * 27.197 * (T0 + timedelta(hours=3.5) - submitted).total_seconds() / 3600, 2)
        due = next(line for line in h.lines if line.startswith("next attempt at ")).split()[3]
        waited = (datetime.fromisoformat(second.claimed_at) - datetime.fromisoformat(due)).total_seconds()
        assert 0 <= waited < 30, "attempt 2 claimed once the 60 s backoff was over"
        # each attempt is the template, named and tagged, with the controller's code and its own run id
        created = h.azure.created
        assert [job.name for job in created] == [f"{h.run}-a1", f"{h.run}-a2"]
        assert created[1].tags["managed_run"] == h.run and created[1].tags["attempt"] == "2"
        assert created[1].environment_variables[contract.RUN_ID] == f"{h.run}-a2"
        assert created[1].code == "azureml:/subscriptions/s/codes/run-code/versions/1"
        assert created[1].environment_variables[contract.CHECKPOINT_JSON] == \
            managed_plan.training.environment_variables[contract.CHECKPOINT_JSON], "same checkpoint prefix"
        text = "\n".join(summary_lines(record, T0))
        assert "preempted (retried)" in text and f"{second.resumed_version} (step 40)" in text
        assert f"total: ${first.usd + second.usd + record.controller_usd(0.096):,.2f}" in text

    def test_a_canceled_job_whose_nodes_were_preempted_is_retried(self, container, template, managed_plan):
        scripts = {1: [Step("Running", node_states=("preempted", "preempted"), started_h=0.0),
                       Step("Canceled", started_h=0.0, ended_h=0.5)],
                   2: [completed()]}
        record = Harness(container, template, managed_plan, scripts).supervisor.run()
        assert [a.cause for a in record.attempts] == ["preempted", "completed"]


@pytest.mark.parametrize("code, cause, retried", [
    (2, "bad_input", False), (3, "health_gate", True), (4, "staging", True), (5, "restore", False),
    (6, "final_upload", False), (8, "nccl_fallback", True), (7, "hang", True), (9, "storage_access", False), (1, "training_error", False),
    (137, "training_error", False), (127, "bad_input", False)])
def test_failed_with_each_exit_status(container, template, managed_plan, code, cause, retried):
    scripts = {1: [running(), failed(code)], 2: [completed()]}
    h = Harness(container, template, managed_plan, scripts)
    record = h.supervisor.run()
    first = record.attempts[0]
    assert (first.cause, first.exit_code, first.retryable) == (cause, code, retried)
    if retried:
        assert record.state == "succeeded" and len(h.azure.created) == 2
    else:
        assert record.state == "failed" and len(h.azure.created) == 1, "never resubmitted"
        assert f"ended {cause}" in record.reason and "not retried" in record.reason


def test_a_recipe_can_retry_its_own_exit_status(container, template, managed_plan):
    policy = Policy(nodes=2, usd_per_node_hour=1.0, expected_hours=1, retry_on=("preempted", 75), backoff_s=1)
    record = Harness(container, template, managed_plan, {1: [failed(75)], 2: [failed(3)]}, policy).supervisor.run()
    assert [(a.cause, a.retryable) for a in record.attempts] == [("training_error", True), ("health_gate", False)]
    assert record.state == "failed"


class TestHang:
    def test_hung_attempt_names_the_node_and_is_retried(self, container, template, managed_plan):
        hang = {"culprit": 1, "message": "node 1 (node1-host) made no progress for 1300s (step 40)"}
        ends = {0: end(7, node=0, hang=hang, first=0, last=40), 1: end(7, node=1, hang=hang, first=0, last=40)}
        scripts = {1: [running(), Step("Failed", error=("UserError", "exit 7"), ends=ends, started_h=0, ended_h=1)],
                   2: [completed()]}
        h = Harness(container, template, managed_plan, scripts)
        record = h.supervisor.run()
        first = record.attempts[0]
        assert first.cause == "hang" and "made no progress" in first.detail
        assert first.bad_nodes == [{"node": 1, "host": "node1-host", "why": "hang"}]
        assert record.state == "succeeded"
        assert any("distrust node1-host (hang)" in line for line in summary_lines(record))


class TestNodesAndService:
    def test_a_vanished_node_is_a_node_failure(self, container, template, managed_plan):
        """Node 1 left no end record (its host died); node 0's collective failed with exit 1."""
        scripts = {1: [Step("Failed", error=("UserError", "exit 1"), ends={0: end(1)}, started_h=0, ended_h=1)],
                   2: [completed()]}
        record = Harness(container, template, managed_plan, scripts).supervisor.run()
        assert record.attempts[0].cause == "node_failure"
        assert record.attempts[0].bad_nodes == [{"node": 1, "why": "left no end record"}]

    def test_an_unusable_node(self, container, template, managed_plan):
        scripts = {1: [Step("Running", node_states=("running", "unusable"), started_h=0),
                       Step("Failed", ends={0: end(1), 1: end(1, node=1)}, started_h=0, ended_h=1)],
                   2: [completed()]}
        record = Harness(container, template, managed_plan, scripts).supervisor.run()
        assert record.attempts[0].cause == "node_failure" and record.attempts[0].node_events == ["unusable"]

    def test_no_end_record_after_training_is_a_node_failure(self, container, template, managed_plan):
        """Every launcher ended without a word after the heartbeats showed training (node 0's host
        lost): retried as a node failure, not a bad input."""
        scripts = {1: [running(beats={0: {"step": 39}, 1: {"step": 39}}),
                       Step("Failed", error=("UserError", "process of rank 0 exited with status -9"), started_h=0,
                            ended_h=1)],
                   2: [completed()]}
        record = Harness(container, template, managed_plan, scripts).supervisor.run()
        first = record.attempts[0]
        assert (first.cause, first.retryable, first.last_step) == ("node_failure", True, 39)
        assert record.state == "succeeded" and len(record.attempts) == 2

    @pytest.mark.parametrize("code, cause, retried", [("ServiceError", "service_error", True),
                                                      ("UserError", "bad_input", False)])
    def test_no_node_started(self, container, template, managed_plan, code, cause, retried):
        """Azure ML failed the job before any launcher ran (e.g. an image it cannot pull)."""
        scripts = {1: [Step("Failed", error=(code, "AzureMLCompute job failed. AggregatedUnauthorizedAccessError"))],
                   2: [completed()]}
        record = Harness(container, template, managed_plan, scripts).supervisor.run()
        first = record.attempts[0]
        assert (first.cause, first.retryable) == (cause, retried)
        assert first.started_at is None and 0 < first.usd < 1, "never started: charged for its one look in the queue only"


class TestCancel:
    def test_canceled_in_studio_is_not_resubmitted(self, container, template, managed_plan):
        scripts = {1: [running(), Step("Canceled", started_h=0, ended_h=0.5)]}
        h = Harness(container, template, managed_plan, scripts)
        record = h.supervisor.run()
        assert record.state == "canceled" and record.attempts[0].cause == "canceled"
        assert len(h.azure.created) == 1

    def test_jobs_cancel_stops_the_running_attempt(self, container, template, managed_plan):
        scripts = {1: [Step("Queued"), running(), running(), running()]}
        h = Harness(container, template, managed_plan, scripts)
        h.supervisor.store.acquire()
        for _ in range(3):
            h.supervisor.tick()
        RecordStore(container, h.prefix).request_cancel("alice@example.com")
        record = h.supervisor.tick()
        h.supervisor.store.release()
        assert record.state == "canceled" and "canceled by alice@example.com" in record.reason
        assert h.azure.canceled == [f"{h.run}-a1"] and record.attempts[0].cause == "canceled"


class TestLimits:
    def test_max_restarts_reached(self, container, template, managed_plan):
        preempted = [running(), Step("Failed", error=PREEMPTION, started_h=0, ended_h=0.2)]
        policy = Policy(nodes=2, usd_per_node_hour=1.0, expected_hours=1, max_restarts=2, backoff_s=10, backoff_max_s=15)
        h = Harness(container, template, managed_plan, {1: preempted, 2: preempted, 3: preempted, 4: [completed()]},
                    policy)
        record = h.supervisor.run()
        assert record.state == "failed" and len(h.azure.created) == 3
        assert "max restarts reached (2 of managed.max_restarts 2)" in record.reason
        assert [policy.backoff(n) for n in (1, 2, 3)] == [10, 15, 15], "doubling, capped at backoff_max_s"
        slept = [round(s) for s in h.clock.slept]
        assert 10 in slept and 15 in slept, "the controller slept exactly the backoff before each restart"

    def test_budget_exceeded(self, container, template, managed_plan):
        """2 nodes x $10/h: attempt 1 ran 4 h ($80) before it was preempted; one more attempt
        is budgeted at the 6 expected hours not yet run ($120): $200 > the $150 limit."""
        policy = Policy(nodes=2, usd_per_node_hour=10.0, expected_hours=10, limit_usd=150,
                        limit_source="amlhpc/jobs/recipes/cosmoflow.yaml: cost.ceiling_usd")
        scripts = {1: [running(), Step("Failed", error=PREEMPTION, started_h=0, ended_h=4)], 2: [completed()]}
        h = Harness(container, template, managed_plan, scripts, policy)
        record = h.supervisor.run()
        assert record.state == "failed" and len(h.azure.created) == 1
        assert "over budget: $80.00 spent + $120.00 for one more attempt exceeds " \
               "amlhpc/jobs/recipes/cosmoflow.yaml: cost.ceiling_usd $150.00" in record.reason


class TestControllerRestart:
    def test_a_new_controller_picks_up_the_running_attempt(self, container, template, managed_plan):
        scripts = {1: [Step("Queued"), running(), running(), completed()]}
        h = Harness(container, template, managed_plan, scripts)
        first = h.supervisor
        assert first.store.acquire()
        first.tick()
        first.tick()  # attempt 1 submitted and running; then the controller dies without a word
        second = h.new_supervisor("ctl-2")
        assert not second.store.acquire(), "the dead controller's lease still holds"
        first.store.lease.break_lease(lease_break_period=0)  # what its expiry after 60 s does
        record = second.run()
        assert record.state == "succeeded" and [j.name for j in h.azure.created] == [f"{h.run}-a1"]
        assert [c["job"] for c in record.controllers] == ["ctl-1", "ctl-2"]

    def test_a_crash_between_claim_and_submit_gives_one_job(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan, {1: [running(), completed()]})
        h.azure.fail_next_create = ConnectionError("the controller's node went away mid-submit")
        h.supervisor.store.acquire()
        with pytest.raises(ConnectionError):
            h.supervisor.tick()
        h.supervisor.store.release()
        claimed = h.record().attempts
        assert [(a.job, a.state) for a in claimed] == [(f"{h.run}-a1", "submitting")] and not h.azure.created
        record = h.new_supervisor("ctl-2").run()
        assert record.state == "succeeded" and [j.name for j in h.azure.created] == [f"{h.run}-a1"]

    def test_two_controllers_never_run_two_attempts(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan, {1: [running(), running(), completed()]})
        a, b = h.supervisor, h.new_supervisor("ctl-2")
        assert a.store.acquire() and not b.store.acquire()
        a.tick()
        a.store.release()
        assert b.store.acquire()
        b.tick()
        b.tick()
        b.store.release()
        assert [j.name for j in h.azure.created] == [f"{h.run}-a1"]

    def test_restarting_a_finished_run_counts_restarts_afresh(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan, {1: [failed(1)], 2: [completed()]})
        assert h.supervisor.run().state == "failed"
        assert h.new_supervisor("ctl-again").start(h.run, "cosmoflow").state == "failed", \
            "without an explicit resume a finished run stays finished"
        resume = Resume("token-1", iso(h.clock()))
        record = h.new_supervisor("ctl-resume", resume=resume).start(h.run, "cosmoflow")
        assert record.state == "succeeded" and [a.number for a in record.attempts] == [1, 2]
        assert record.base_attempt == 1 and record.resumes == ["token-1"]


def test_observation_from_sdk_entities(container, template, managed_plan):
    """The fake's documents survive the SDK's own deserialization: status (an enum member),
    run history's error and times, node states (read despite the SDK's camelCase quirk)."""
    h = Harness(container, template, managed_plan,
                {1: [Step("Failed", error=PREEMPTION, node_states=("preempted",), started_h=0, ended_h=1)]})
    h.supervisor.service.submit(f"{h.run}-a1", 1, h.policy.target(0), {})
    job = h.azure.jobs.get(f"{h.run}-a1")
    observation = observation_from(job, h.azure.jobs._runs_operations.get_run(job.name),
                                   h.azure.compute.list_nodes("nd-a100"))
    assert observation.status == "Failed" and observation.error_code == "UserError"
    assert "PreemptionError" in observation.error_message and observation.node_states == ("preempted",)
    assert observation.started_at == T0 and observation.terminal


class TestControllerStart:
    def test_a_second_controller_waits_for_the_lease_then_opens_the_record(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan, {1: [running(), completed()]})
        first = h.supervisor
        assert first.store.acquire()
        second = h.new_supervisor("ctl-2")
        waits = []

        def wait(seconds):  # the first controller's lease runs out while the second waits
            waits.append(seconds)
            if first.store.lease is not None:
                first.store.lease.break_lease(lease_break_period=0)
                first.store.lease = None

        second.sleep = wait
        second.policy = Policy(nodes=2, usd_per_node_hour=2.0, expected_hours=1, max_restarts=7)
        record = second.start(h.run, "cosmoflow")
        assert waits[0] == 10 and any("another controller holds" in line for line in h.lines)
        assert record.state == "succeeded" and record.rules().max_restarts == 7, "the newest controller's policy"

    def test_a_fresh_run_is_created_by_its_controller(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan, {1: [completed()]})
        RecordStore(container, h.prefix).blob.delete_blob()
        record = h.supervisor.start(h.run, "cosmoflow")
        assert record.state == "succeeded" and record.recipe == "cosmoflow"

    def test_transient_azure_errors_do_not_stop_the_supervision(self, container, template, managed_plan):
        from azure.core.exceptions import ServiceRequestError

        h = Harness(container, template, managed_plan, {1: [running(), running(), completed()]})
        real_get, calls = h.azure.jobs.get, []

        def flaky(name):
            calls.append(name)
            if len(calls) in (2, 3):
                raise ServiceRequestError("connection reset by peer")
            return real_get(name)

        h.azure.jobs.get = flaky
        record = h.supervisor.run()
        assert record.state == "succeeded" and len(h.azure.created) == 1
        assert sum("failed (ServiceRequestError" in line for line in h.lines) == 2
