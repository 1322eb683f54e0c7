"""How an attempt's end is classified: Azure ML's status and error, node states, and the
nodes' end records, strongest evidence first."""

from __future__ import annotations

import pytest

from amlhpc.jobs.managed import causes
from amlhpc.jobs.managed.classify import classify
from amlhpc.jobs.managed.observation import Observation
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from tests.managed_fakes import PREEMPTION, end

FAILED = Observation("Failed", "UserError", "Execution failed")


def test_completed_carries_the_steps():
    verdict = classify(Observation("Completed"), {0: end(0, first=40, last=100), 1: end(0, node=1)}, nodes=2)
    assert (verdict.cause, verdict.first_step, verdict.last_step) == ("completed", 40, 100)


class TestPreemption:
    def test_by_azure_error(self):
        verdict = classify(Observation("Failed", *PREEMPTION), {0: end(1)}, nodes=2)
        assert verdict.cause == "preempted" and "PreemptionError" in verdict.detail

    def test_by_node_state_seen_while_running(self):
        assert classify(FAILED, {0: end(1), 1: end(1, node=1)}, nodes=2, node_events=["preempted"]).cause == "preempted"

    def test_a_cancel_after_preemption_is_a_preemption(self):
        assert classify(Observation("Canceled"), {}, nodes=2, node_events=["preempted"]).cause == "preempted"
        assert classify(Observation("Canceled"), {}, nodes=2).cause == "canceled"


class TestEndRecords:
    def test_the_launchers_status_explains_the_others_collective_failure(self):
        ends = {0: end(1), 1: end(ExitCode.HEALTH, node=1, error="health gate failed")}
        verdict = classify(FAILED, ends, nodes=2)
        assert (verdict.cause, verdict.exit_code) == ("health_gate", 3)
        assert verdict.bad_nodes == ({"node": 1, "host": "node1-host", "why": "health gate"},)
        assert verdict.detail == "node 1: health gate failed"

    def test_a_vanished_node(self):
        verdict = classify(FAILED, {0: end(1)}, nodes=3)
        assert verdict.cause == "node_failure" and [b["node"] for b in verdict.bad_nodes] == [1, 2]

    def test_unusable_node(self):
        assert classify(FAILED, {0: end(1), 1: end(1, node=1)}, nodes=2, node_events=["unusable"]).cause == "node_failure"

    def test_training_error_keeps_its_status(self):
        verdict = classify(FAILED, {0: end(137), 1: end(1, node=1)}, nodes=2)
        assert (verdict.cause, verdict.exit_code) == ("training_error", 137)
        assert verdict.retryable(causes.DEFAULT_RETRY_ON) is False and verdict.retryable(("preempted", 137)) is True

    @pytest.mark.parametrize("status, cause", sorted(causes.EXIT_CAUSES.items()))
    def test_every_launcher_status_has_its_cause(self, status, cause):
        assert classify(FAILED, {0: end(status), 1: end(status, node=1)}, nodes=2).cause == cause


class TestHangCulprit:
    def hang(self, node, culprit, last):
        return end(ExitCode.HANG, node=node, last=last, hang={"culprit": culprit, "message": "no progress"})

    def test_a_frozen_node_named_by_another_is_believed(self):
        """Node 1 froze whole (no end record); node 0's watchdog saw its heartbeat stop."""
        verdict = classify(FAILED, {0: self.hang(0, 1, 40)}, nodes=2)
        assert verdict.cause == "node_failure", "a node that left nothing behind explains the hang"
        assert [(b["node"], b["why"]) for b in verdict.bad_nodes] == [(1, "hang"), (1, "left no end record")]

    def test_a_node_named_by_another_while_both_ended(self):
        verdict = classify(FAILED, {0: self.hang(0, 1, 40), 1: end(143, node=1)}, nodes=2)
        assert verdict.cause == "hang" and [b["node"] for b in verdict.bad_nodes] == [1]

    def test_the_node_that_got_least_far(self):
        verdict = classify(FAILED, {0: self.hang(0, 0, 41), 1: self.hang(1, 1, 40)}, nodes=2)
        assert verdict.cause == "hang" and [b["node"] for b in verdict.bad_nodes] == [1]

    def test_no_blame_when_every_node_stopped_at_the_same_step(self):
        verdict = classify(FAILED, {0: self.hang(0, 0, 40), 1: self.hang(1, 1, 40)}, nodes=2)
        assert verdict.cause == "hang" and verdict.bad_nodes == ()


class TestNothingFromTheNodes:
    @pytest.mark.parametrize("code, cause", [("ServiceError", "service_error"), ("TransientError", "service_error"),
                                             ("UserError", "bad_input"), ("ValidationError", "bad_input"),
                                             (None, "unknown")])
    def test_azures_error_code(self, code, cause):
        assert classify(Observation("Failed", code, "AzureMLCompute job failed." if code else None), {}, nodes=2).cause == cause

    def test_a_job_that_trained_was_run_as_given(self):
        """Node 0's host lost, node 1 stopped by Azure ML before its store's reconnect grace ran
        out: no end record at all, a UserError, but the heartbeats showed step 39 (before, bad_input:
        the managed run failed unretried; bench/recovery.py host-loss-writer)."""
        gone = Observation("Failed", "UserError", "process of rank 0 exited with status -9")
        verdict = classify(gone, {}, nodes=2, trained_to=39)
        assert (verdict.cause, verdict.last_step) == ("node_failure", 39) and "trained to step 39" in verdict.detail
        assert classify(gone, {}, nodes=2).cause == "bad_input", "never seen training: Azure ML could not run it"
        assert classify(Observation("Failed", "ServiceError", "x"), {}, nodes=2, trained_to=39).cause == "service_error"


def test_retry_entries():
    assert causes.check_retry_entry("hang") is None and causes.check_retry_entry(75) is None
    assert "never retried" in causes.check_retry_entry("canceled")
    assert "unknown cause" in causes.check_retry_entry("preemted")
    assert "outside 1..255" in causes.check_retry_entry(300)
    assert "never retried" in causes.check_retry_entry("budget"), "a limit is a limit"
    assert set(causes.DEFAULT_RETRY_ON) == {"preempted", "node_failure", "service_error", "health_gate", "staging",
                                            "hang", "nccl_fallback", "queue_timeout", "stalled"}
