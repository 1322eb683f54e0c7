"""A training that completed and then crashed at exit: the launcher counts it as completed and
says so; the managed run's classifier does not call it a training error. Real launcher
processes; the crash is a real abort() after the completion report."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from amlhpc.jobs.managed import causes
from amlhpc.jobs.managed.classify import classify
from amlhpc.jobs.managed.observation import Observation
from amlhpc.jobs.runtime.base.progress import Progress
from amlhpc.jobs.runtime.coord import nodestatus
from amlhpc.jobs.runtime.launch import completion
from tests.managed_fakes import end
from tests.test_launch import REPO, base_env, checkpoint_env, finish, start

# A training that reports its steps, writes its final checkpoint, reports completion, then
# ends as asked: abort (SIGABRT, as a C++ std::terminate does), a fault, or an exit status.
TRAIN = r"""
import os, signal, sys
from pathlib import Path
from amlhpc.jobs.runtime.base import progress
how, checkpoint_named = sys.argv[1], sys.argv[2]
folder = Path(os.environ.get("AMLHPC_CHECKPOINT_DIR") or sys.argv[3])
for step in range(1, 4):
    progress.report(step)
final = folder / "ckpt-000000003.pt"
final.write_bytes(b"weights")
if how != "no-completion":
    progress.report_completed(3, final if checkpoint_named == "yes" else folder / "missing.pt"
                              if checkpoint_named == "missing" else None)
if how == "abort":
    os.abort()
if how == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
if how == "more-steps":
    progress.report(4)
    os.abort()
if how == "no-completion":
    os.abort()
sys.exit(int(how))
"""


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def _launch(tmp_path, script, how: str, named: str = "yes", **extra) -> tuple[int, str, dict]:
    folder = tmp_path / "own-ckpt"
    folder.mkdir(exist_ok=True)
    env = base_env(tmp_path, PYTHONPATH=str(REPO), **extra)
    code, out = finish(start(env, "--", sys.executable, str(script), how, named, str(folder)))
    report = json.loads((tmp_path / "reports" / "launch-node000.json").read_text())
    report["run_id"] = env["AMLHPC_RUN_ID"]
    return code, out, report


class TestLauncher:
    def test_abort_after_completion_is_completed_and_reported(self, tmp_path, script):
        """SIGABRT after the completion report: exit 0, the report names the signal, step and checkpoint."""
        code, out, report = _launch(tmp_path, script, "abort")
        assert code == 0, out
        assert report["command_status"] == 128 + signal.SIGABRT and report["exit_code"] == 0
        after = report["exit_after_completion"]
        assert after["signal"] == "SIGABRT" and after["status"] == 134 and after["step"] == 3
        assert after["checkpoint"].endswith("ckpt-000000003.pt")
        assert report["completed"] == {"step": 3, "checkpoint": after["checkpoint"]}
        assert "the training completed (step 3" in out and "died with SIGABRT" in out

    def test_a_fault_after_completion_counts_too(self, tmp_path, script):
        code, out, report = _launch(tmp_path, script, "segv")
        assert code == 0, out
        assert report["exit_after_completion"]["signal"] == "SIGSEGV"

    def test_abort_without_a_completion_is_a_failure(self, tmp_path, script):
        code, out, report = _launch(tmp_path, script, "no-completion")
        assert code == 134, out
        assert report["exit_after_completion"] is None and report["completed"] is None

    def test_a_checkpoint_that_is_not_there_is_a_failure(self, tmp_path, script):
        code, _, report = _launch(tmp_path, script, "abort", named="missing")
        assert code == 134 and report["exit_after_completion"] is None

    def test_steps_after_the_completion_are_a_failure(self, tmp_path, script):
        code, _, report = _launch(tmp_path, script, "more-steps")
        assert code == 134 and report["exit_after_completion"] is None

    def test_an_exit_status_of_its_own_stays_a_failure(self, tmp_path, script):
        """sys.exit(3) after the completion is the program's decision, not a crash."""
        code, _, report = _launch(tmp_path, script, "3")
        assert code == 3 and report["completed"]["step"] == 3 and report["exit_after_completion"] is None

    @pytest.mark.azurite
    def test_end_record_and_final_upload(self, azurite, container, tmp_path, script):
        """With checkpoints to Blob: the final upload runs (as after exit 0) and the node's end
        record carries the completion for the supervision."""
        env = checkpoint_env(azurite, container, "runs/done", writers="rank0")
        code, out, report = _launch(tmp_path, script, "abort", **env)
        assert code == 0, out
        assert report["uploaded_versions"], out
        record = nodestatus.read_ends(container, "runs/done", report["run_id"])[0]
        assert record["exit_code"] == 0 and record["command_status"] == 134
        assert record["exit_after_completion"]["signal"] == "SIGABRT" and record["completed"]["step"] == 3


class TestJudge:
    """amlhpc.jobs.runtime.launch.completion.after_completion, case by case."""

    DONE = Progress(7, 9, completed_step=7, completed_checkpoint=None)

    @pytest.mark.parametrize("returncode", [-6, 134, -11, 139, -7, 135])
    def test_crash_signals(self, returncode):
        assert completion.after_completion(returncode, self.DONE, stopped=False, hung=False) is not None

    @pytest.mark.parametrize("returncode", [1, 2, 7, -9, 137, -15, 143, 128])
    def test_other_statuses(self, returncode):
        """SIGKILL/SIGTERM come from outside (OOM killer, a stop); plain statuses are decisions."""
        assert completion.after_completion(returncode, self.DONE, stopped=False, hung=False) is None

    def test_a_stopped_or_hung_command_is_not_completed(self):
        assert completion.after_completion(-6, self.DONE, stopped=True, hung=False) is None
        assert completion.after_completion(-6, self.DONE, stopped=False, hung=True) is None


class TestClassifier:
    FAILED = Observation("Failed", "UserError", "Execution failed: process exited with 134")

    @staticmethod
    def crashed(node: int, step: int = 10) -> dict:
        return end(134, node=node, last=step, command_status=134, completed={"step": step, "checkpoint": "/c/ckpt-10.pt"})

    def test_completed_on_every_node_is_completed(self):
        """Azure ML says Failed (a rank's exit 134), but every node completed: the attempt completed."""
        ends = {0: end(0, last=10, completed={"step": 10, "checkpoint": "/c/ckpt-10.pt"}), 1: self.crashed(1)}
        verdict = classify(self.FAILED, ends, nodes=2)
        assert verdict.cause == "completed" and "node(s) 1 then crashed at exit (exit 134)" in verdict.detail
        assert not verdict.retryable(causes.DEFAULT_RETRY_ON)

    def test_without_a_completion_it_is_a_training_error(self):
        """The same exit 134 with no completion report: the training failed."""
        verdict = classify(self.FAILED, {0: end(0, last=10), 1: end(134, node=1, command_status=134)}, nodes=2)
        assert verdict.cause == "training_error" and verdict.exit_code == 134

    def test_a_crashed_node_does_not_hide_another_nodes_failure(self):
        ends = {0: end(1, last=7, command_status=1), 1: self.crashed(1)}
        verdict = classify(self.FAILED, ends, nodes=2)
        assert verdict.cause == "training_error" and verdict.exit_code == 1

    def test_a_missing_node_is_still_a_node_failure(self):
        verdict = classify(self.FAILED, {0: self.crashed(0)}, nodes=2)
        assert verdict.cause == "node_failure"

    def test_a_launcher_status_is_not_the_commands_crash(self):
        """Exit 7 (the watchdog's hang) with a completion on record stays a hang."""
        ends = {0: end(7, last=10, command_status=134, completed={"step": 10, "checkpoint": None}), 1: self.crashed(1)}
        assert classify(self.FAILED, ends, nodes=2).cause == "hang"
