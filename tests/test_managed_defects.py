"""Each defect an independent review found in managed runs, as a test: the cost limit during
an attempt, classification per requeue epoch, cancel and resume, a submit Azure ML refuses
for good, outages, the statuses that are neither running nor ended, the preemption code,
the queue timeout and the fallback cluster, stragglers. On the fake Azure ML built from
azure-ai-ml's own entities, the record and the evidence in Azurite."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from amlhpc.jobs.managed import render
from amlhpc.jobs.managed.azureml import observation_from
from amlhpc.jobs.managed.classify import classify
from amlhpc.jobs.managed.observation import Observation
from amlhpc.jobs.managed.policy import Target
from amlhpc.jobs.managed.record import iso, now_utc
from amlhpc.jobs.managed.report import summary_lines
from amlhpc.jobs.managed.supervisor import Resume
from amlhpc.jobs.runtime.base import exit_codes
from amlhpc.jobs.runtime.base.progress import OWN_WORK_WINDOW
from tests import managed_fixtures
from tests.aml_fakes import service_error
from tests.managed_fakes import PREEMPTION, Step, end
from tests.managed_harness import Harness, completed, failed, running

managed_plan, template = managed_fixtures.managed_plan, managed_fixtures.template  # the shared fixtures
policy = managed_fixtures.policy

pytestmark = pytest.mark.azurite
REPO = Path(__file__).resolve().parent.parent


class TestCostLimitDuringAnAttempt:
    def test_the_reviewed_overspend_is_stopped_within_one_poll(self, container, template, managed_plan):
        """The probe: $1,000 limit, 6 h preempted, then an attempt that would run 24 h to its
        timeout ($1,631.83 spent). Now the second attempt is canceled once what was spent plus
        the cost to its next checkpoint would pass the limit, and the total passes the limit by
        at most one polling interval's cost."""
        rules = policy(limit_usd=1000, limit_source="cost.ceiling_usd", checkpoint_interval_s=600, poll_s=600,
                       backoff_s=60, expected_hours=12)
        scripts = {1: [running(until_h=6), Step("Failed", error=PREEMPTION, started_h=0, ended_h=6)],
                   2: [Step("Queued", until_h=6.5), Step("Running", started_h=6.5, until_h=30, commit=True),
                       completed(ended_h=30)]}
        h = Harness(container, template, managed_plan, scripts, rules)
        record = h.supervisor.run()
        first, second = record.attempts
        assert first.cause == "preempted" and second.cause == "budget" and record.state == "failed"
        assert h.azure.canceled == [second.job], "the controller canceled the running attempt"
        assert "until the next checkpoint" in second.detail and "queued and preparing time included" in second.detail
        total = record.total_usd(rules.controller_usd_per_hour)
        one_poll = (rules.target(0).usd_per_hour + rules.controller_usd_per_hour) * rules.poll_s / 3600
        assert total <= 1000 + one_poll, f"${total:,.2f} spent"
        assert total > 1000 - rules.target(0).usd_per_hour * 600 / 3600 - one_poll, "it did not stop long before"

    def test_queued_time_counts(self, container, template, managed_plan):
        """An attempt queued 3 h then running 1 h is charged 4 h."""
        scripts = {1: [Step("Queued", until_h=3), Step("Running", started_h=3, until_h=4), completed(ended_h=4)]}
        h = Harness(container, template, managed_plan, scripts, policy(poll_s=600))
        record = h.supervisor.run()
        attempt = record.attempts[0]
        assert attempt.hours() == pytest.approx(1.0, abs=0.2) and attempt.charged_hours() == pytest.approx(4.0, abs=0.01)
        assert attempt.usd == round(2 * 27.197 * attempt.charged_hours(), 2)


class TestRequeueEpochs:
    def test_a_failure_after_a_requeued_preemption_is_not_retried(self, container, template, managed_plan):
        """Preempted, requeued by Azure ML (the same job back in the queue), then every node
        exits 1: a training error, not a preemption; the first epoch's end record is ignored."""
        scripts = {1: [running(node_states=("running", "preempted"), ends={1: end(143, node=1, signals=["SIGTERM"])}),
                       Step("Queued", started_h=0), Step("Running", started_h=0, node_states=("running", "running")),
                       Step("Failed", error=("UserError", "Execution failed. User process exited with status code 1"),
                            started_h=0, ended_h=2, ends={0: end(1), 1: end(1, node=1)})],
                   2: [completed()]}
        h = Harness(container, template, managed_plan, scripts)
        record = h.supervisor.run()
        attempt = record.attempts[0]
        assert (attempt.cause, attempt.retryable) == ("training_error", False), attempt.detail
        assert attempt.node_events == ["preempted"] and attempt.epoch_events == [] and len(attempt.requeued_at) == 1
        assert record.state == "failed" and len(h.azure.created) == 1

    def test_an_earlier_epochs_end_record_is_not_this_epochs(self, container, template, managed_plan):
        """Node 1 left a health-gate record before the requeue and none after (its host went
        away): node 1 vanished in this epoch, and its old record is set aside."""
        scripts = {1: [running(ends={1: end(3, node=1, error="health gate failed")}), Step("Queued", started_h=0),
                       Step("Running", started_h=0),
                       Step("Failed", error=("UserError", "exit 1"), started_h=0, ended_h=2, ends={0: end(1)})],
                   2: [completed()]}
        h = Harness(container, template, managed_plan, scripts)
        record = h.supervisor.run()
        attempt = record.attempts[0]
        assert attempt.cause == "node_failure" and attempt.bad_nodes == [{"node": 1, "why": "left no end record"}]
        assert any("earlier epoch" in why for why in attempt.ignored_evidence)


class TestCancelAndResume:
    def test_resume_after_cancel_is_not_canceled_at_once(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan, {1: [running(), running(), running()], 2: [running(), completed()]})
        h.supervisor.store.acquire()
        h.supervisor.tick(), h.supervisor.tick()
        h.supervisor.store.release()
        h.store().request_cancel("alice")
        assert h.supervisor.run().state == "canceled"
        assert h.new_supervisor("ctl-later").start(h.run, "cosmoflow").state == "canceled", \
            "a controller without --resume honours the cancel"
        resumed = h.new_supervisor("ctl-resume", resume=Resume("tok-1", iso(now_utc()))).start(h.run, "cosmoflow")
        assert resumed.state == "succeeded" and [a.cause for a in resumed.attempts] == ["canceled", "completed"]
        assert len(resumed.cancels_handled) == 1 and resumed.resumes == ["tok-1"]

    def test_a_cancel_after_the_resume_cancels_again(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan, {1: [running()] * 3, 2: [running()] * 50})
        h.store().request_cancel("alice")
        assert h.supervisor.run().state == "canceled"
        resumed = h.new_supervisor("ctl-resume", resume=Resume("tok-1", iso(now_utc())))
        resumed.store.acquire()
        from amlhpc.jobs.managed.supervisor import open_record

        open_record(resumed.store, h.run, "cosmoflow", h.policy, resumed.resume)
        resumed.tick(), resumed.tick()
        resumed.store.release()
        h.store().request_cancel("bob")
        record = resumed.run()
        assert record.state == "canceled" and "canceled by bob" in record.reason
        assert h.azure.canceled == [record.attempts[-1].job]


class TestSubmit:
    def test_a_job_azure_refuses_for_good_fails_fast(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan, {1: [completed()]})
        h.azure.refuse_creates = service_error(400, "UserError", "Compute nd-a100 not found in workspace")
        record = h.supervisor.run()
        attempt = record.attempts[0]
        assert h.azure.create_calls == 1, "no second try"
        assert (attempt.state, attempt.cause, attempt.retryable) == ("ended", "bad_input", False)
        assert "Azure ML refused the job (HTTP 400" in attempt.detail and record.state == "failed"
        assert sum(h.clock.slept) < 60, "over at the first look, not after 20 tries"

    def test_a_throttled_submit_is_retried_and_creates_one_job(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan, {1: [running(), completed()]})
        h.azure.fail_next_create = service_error(429, "TooManyRequests", "slow down")
        record = h.supervisor.run()
        assert record.state == "succeeded" and [j.name for j in h.azure.created] == [f"{h.run}-a1"]


class TestOutages:
    def test_a_long_outage_does_not_end_supervision_while_an_attempt_runs(self, container, template, managed_plan):
        """40 failed looks in a row (more than the 20 that used to end the controller), an
        hour and more: the record is kept, the backoff capped, and the attempt supervised to its end."""
        from azure.core.exceptions import ServiceRequestError

        rules = policy(outage_backoff_max_s=300)
        h = Harness(container, template, managed_plan, {1: [running(), running(), completed()]}, rules)
        real_get, calls = h.azure.jobs.get, []

        def down(name):
            calls.append(name)
            if 2 <= len(calls) <= 41:
                raise ServiceRequestError("connection reset by peer")
            return real_get(name)

        h.azure.jobs.get = down
        record = h.supervisor.run()
        assert record.state == "succeeded" and len(h.azure.created) == 1
        assert sum("look failed (ServiceRequestError" in line for line in h.lines) == 40
        assert sum(h.clock.slept) > 3600, "over an hour without an answer"
        assert any("40 in a row" in line and "looking again in 300s" in line for line in h.lines), "capped backoff"


class TestStatuses:
    @pytest.mark.parametrize("status", ["Paused", "Unknown", "NotResponding"])
    def test_a_job_stuck_neither_running_nor_ended_is_canceled_and_retried(self, container, template, managed_plan,
                                                                           status):
        scripts = {1: [running(), Step(status, started_h=0)], 2: [completed()]}
        h = Harness(container, template, managed_plan, scripts, policy(stall_s=900))
        record = h.supervisor.run()
        first = record.attempts[0]
        assert (first.cause, first.retryable) == ("stalled", True) and status in first.detail
        assert h.azure.canceled == [first.job] and record.state == "succeeded"

    def test_node_states_are_read_while_not_responding(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan,
                    {1: [Step("NotResponding", node_states=("preempted", "running"), started_h=0)]})
        h.supervisor.service.submit(f"{h.run}-a1", 1, h.policy.target(0), {})
        assert h.supervisor.service.observe(f"{h.run}-a1").node_states == ("preempted", "running")

    def test_preemption_is_recognised_by_its_error_code(self):
        """Run history's RootError with the compute code in its details; message text that says nothing."""
        from azure.ai.ml._restclient.runhistory._utils.model_base import _deserialize
        from azure.ai.ml._restclient.runhistory.models import Run

        run = _deserialize(Run, {"runId": "j", "status": "Failed", "error": {"error": {
            "code": "UserError", "message": "Execution failed.",
            "details": [{"code": "PreemptionError", "message": "Nodes of this job were taken back"}]}}})
        job = type("Job", (), {"name": "j", "status": "Failed"})()
        observation = observation_from(job, run, [])
        assert "PreemptionError" in observation.error_codes
        verdict = classify(observation, {0: end(1)}, nodes=2)
        assert verdict.cause == "preempted" and "error code PreemptionError" in verdict.detail

    def test_a_message_naming_preemption_is_not_a_preemption_when_the_codes_say_otherwise(self):
        observation = Observation("Failed", "UserError", "my loss pre-empted by NaN", error_codes=("UserError",))
        assert classify(observation, {0: end(1), 1: end(1, node=1)}, nodes=2).cause == "training_error"

    def test_the_hangs_culprit_is_kept(self):
        """Node 1 froze; both watchdogs say so (node 0 waited for it): node 1 is blamed, not node 0."""
        ends = {0: end(7, node=0, hang={"culprit": 1, "message": "no rank on node 0 progressed for 1200s; node 1 stopped "
                                                                 "in its own work while node(s) 0 wait for it"}),
                1: end(7, node=1, hang={"culprit": 1, "message": "no rank on node 1 progressed for 1200s"})}
        verdict = classify(Observation("Failed", "UserError", "exit 7"), ends, nodes=2)
        assert verdict.cause == "hang" and verdict.detail.startswith("hang started on node 1 (node1-host)")
        assert [b["node"] for b in verdict.bad_nodes] == [1]


class TestQueueTimeoutAndFallback:
    @pytest.fixture
    def two_clusters(self, template, managed_plan):
        dedicated = template.parent / "training-job-nd-a100-dedicated.yml"
        document = yaml.safe_load(template.read_text())
        document["compute"] = "azureml:nd-a100-dedicated"
        dedicated.write_text(yaml.safe_dump(document))
        return (Target("nd-a100", 2, 10.0, "LowPriority", render.TEMPLATE_PATH),
                Target("nd-a100-dedicated", 2, 27.197, "Dedicated", "managed/training-job-nd-a100-dedicated.yml"))

    def test_an_attempt_queued_too_long_moves_to_the_next_cluster(self, container, template, managed_plan, two_clusters):
        rules = policy(targets=two_clusters, queue_timeout_s=1800, limit_usd=500, limit_source="ceiling", expected_hours=2)
        h = Harness(container, template, managed_plan, {1: [Step("Queued")], 2: [running(), completed()]}, rules)
        record = h.supervisor.run()
        first, second = record.attempts
        assert (first.cause, first.cluster, second.cluster) == ("queue_timeout", "nd-a100", "nd-a100-dedicated")
        assert "queued 18" in first.detail and h.azure.canceled == [first.job]
        assert str(h.azure.created[1].compute).endswith("nd-a100-dedicated"), "submitted from that cluster's template"
        assert record.state == "succeeded" and record.total_usd(0.096) <= 500

    def test_dedicated_after_repeated_preemption(self, container, template, managed_plan, two_clusters):
        preempted = [running(), Step("Failed", error=PREEMPTION, started_h=0, ended_h=0.5)]
        rules = policy(targets=two_clusters, fallback_after_preemptions=2, backoff_s=1)
        h = Harness(container, template, managed_plan, {1: preempted, 2: preempted, 3: [completed()]}, rules)
        record = h.supervisor.run()
        assert [(a.cause, a.cluster) for a in record.attempts] == [
            ("preempted", "nd-a100"), ("preempted", "nd-a100"), ("completed", "nd-a100-dedicated")]
        assert record.attempts[2].usd_per_hour == 2 * 27.197, "charged at the Dedicated price"
        assert any("after 2 preemption(s)" in line and "nd-a100-dedicated" in line for line in h.lines)


class TestStragglers:
    @staticmethod
    def beats(busy1: float, look: int) -> dict[int, dict]:
        """Look `look`'s heartbeats, a window of steps after the last: each one new evidence."""
        step = look * OWN_WORK_WINDOW
        return {0: {"busy_s": 0.10, "step": step}, 1: {"busy_s": busy1, "step": step}}

    def test_a_persistently_slow_node_is_named(self, container, template, managed_plan):
        scripts = {1: [running(beats=self.beats(0.31, s)) for s in range(1, 6)] + [failed(75)], 2: [completed()]}
        h = Harness(container, template, managed_plan, scripts, policy(straggler_factor=1.5, straggler_looks=3,
                                                                        retry_on=("preempted", 75)))
        record = h.supervisor.run()
        named = record.attempts[0].stragglers
        assert [(s["node"], s["host"]) for s in named] == [(1, "node1-host")] and named[0]["factor"] == 3.1
        text = "\n".join(summary_lines(record))
        assert "node1-host (node 1) is a straggler: 3.1x" in text
        assert "attempt 2 started after attempt 1 named: node1-host (node 1) is a straggler" in text

    def test_noise_is_not_a_straggler(self, container, template, managed_plan):
        scripts = {1: [running(beats=self.beats(0.10 + 0.02 * (s % 2), s)) for s in range(1, 8)] + [completed()]}
        record = Harness(container, template, managed_plan, scripts).supervisor.run()
        assert record.attempts[0].stragglers == []

    def test_heartbeats_a_step_apart_are_one_window_not_three(self, container, template, managed_plan):
        """Five looks a step apart show the same window of steps (its median mostly of the
        same steps): one piece of evidence, not five."""
        beats = [{0: {"busy_s": 0.10, "step": s}, 1: {"busy_s": 0.31, "step": s}} for s in range(1, 6)]
        scripts = {1: [running(beats=b) for b in beats] + [completed()]}
        record = Harness(container, template, managed_plan, scripts).supervisor.run()
        assert record.attempts[0].stragglers == []
        assert record.attempts[0].slow_looks["1"] == [1, 1]

    def test_one_slow_look_then_normal_is_not_a_straggler(self, container, template, managed_plan):
        scripts = {1: [running(beats=self.beats(b, s)) for s, b in enumerate((0.3, 0.3, 0.1, 0.3, 0.1), 1)] + [completed()]}
        assert Harness(container, template, managed_plan, scripts).supervisor.run().attempts[0].stragglers == []


def test_the_docs_give_the_hangs_exit_code():
    """The watchdog's exit status is amlhpc.jobs.runtime.base.exit_codes.ExitCode.HANG wherever the docs name it."""
    pattern = re.compile(r"\b(?:hang|watchdog)\b[^.|]{0,240}?\bexit(?:s)? \**(\d+)", re.IGNORECASE)
    checked = 0
    for doc in ("docs/managed-jobs.md", "docs/jobs.md"):
        text = " ".join((REPO / doc).read_text().split())
        for match in pattern.finditer(text):
            checked += 1
            assert int(match.group(1)) == exit_codes.ExitCode.HANG, f"{doc}: ...{match.group(0)[-200:]}"
    assert checked >= 2, "both docs state the hang's exit status"
