"""Named fault points (amlhpc/jobs/runtime/base/faultpoints.py): inert unless armed, act exactly where
armed and say so; in a child process, a gate holds the training at a step until released,
and a slow point makes one process's own work longer; progress reports carry the wait."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.base import faultpoints, progress

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def clean():
    faultpoints.reset()
    yield
    faultpoints.reset()


def test_an_unarmed_point_does_nothing_and_an_unknown_one_is_refused():
    faultpoints.reach("controller.claim", attempt=1)
    with pytest.raises(KeyError, match="unknown fault point 'controller.nope'"):
        faultpoints.reach("controller.nope")
    with pytest.raises(KeyError):
        faultpoints.arm("controller.nope", faultpoints.crash)


def test_crash_is_not_swallowed_by_except_exception():
    with faultpoints.armed("controller.claimed", faultpoints.crash) as point:
        with pytest.raises(faultpoints.Crash, match="controller.claimed"):
            try:
                faultpoints.reach("controller.claimed", attempt=2)
            except Exception:  # noqa: BLE001 - what a careless handler on the way would do
                pytest.fail("a crash must pass through `except Exception`")
    assert point.fired == 1 and point.contexts[0]["attempt"] == 2


def test_when_and_times():
    seen = []
    point = faultpoints.arm("controller.watch", lambda **ctx: seen.append(ctx["attempt"]), when=lambda **ctx: ctx["attempt"] >= 2,
                            times=2)
    for attempt in (1, 2, 3, 4):
        faultpoints.reach("controller.watch", attempt=attempt)
    assert seen == [2, 3] and point.fired == 2, "acted on the 2 matching hits, then disarmed itself"


def test_a_gate_holds_a_child_process_at_its_step(tmp_path):
    """A child reporting steps 1..5 stops at step 3 until the gate is released."""
    gate = tmp_path / "gate"
    progress_file = tmp_path / "rank-0.json"
    script = ("from amlhpc.jobs.runtime.base import progress\n"
              "for step in range(1, 6):\n"
              "    progress.report(step)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), progress.PROGRESS_FILE: str(progress_file),
           **faultpoints.env_for({"training.step": {"action": "gate", "at_step": 3, "dir": str(gate)}})}
    child = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 60
        while not list(gate.glob("reached-*.json")):
            assert child.poll() is None, "the child ended without reaching the gate"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        reached = json.loads(next(gate.glob("reached-*.json")).read_text())
        assert reached["step"] == 3 and progress.read(progress_file).step == 3, "held right after reporting step 3"
        assert child.poll() is None
        (gate / "release").touch()
        assert child.wait(60) == 0 and progress.read(progress_file).step == 5
    finally:
        child.kill()


def test_compute_done_reports_the_wait_and_the_own_work(tmp_path, monkeypatch):
    path = tmp_path / "rank-0.json"
    monkeypatch.setenv(progress.PROGRESS_FILE, str(path))
    progress.report(4)
    slowed = faultpoints.arm("training.compute", lambda **ctx: time.sleep(0.05))
    assert progress.compute_done(5)
    waiting = progress.read(path)
    assert (waiting.step, waiting.waiting) == (4, 5) and waiting.busy_s >= 0.05, "the delay counts as own work"
    assert slowed.fired == 1
    progress.report(5)
    done = progress.read(path)
    assert (done.step, done.waiting) == (5, None) and done.busy_s == waiting.busy_s
