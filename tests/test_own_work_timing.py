"""Each step's own-work time as every recipe measures it (amlhpc.jobs.workloads.common.OwnWork,
amlhpc.jobs.runtime.base.progress): wall time on CPU, CUDA events read after the step's sync
point on a GPU (here a stand-in for torch.cuda.Event: the subject is when they are recorded
and read, not CUDA), a `slow` fault's hold added either way, and the step each time belongs to."""

from __future__ import annotations

import ast
import statistics
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.base import faultpoints, progress
from amlhpc.jobs.runtime.base.progress import Progress
from amlhpc.jobs.runtime.launch import watchdog
from amlhpc.jobs.workloads import common

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def progress_file(tmp_path, monkeypatch):
    path = tmp_path / "rank-0.json"
    monkeypatch.setenv(progress.PROGRESS_FILE, str(path))
    for name, value in (("_busy_s", None), ("_busy_step", None), ("_waiting", None), ("_last_step", None),
                        ("_reported_at", None)):
        monkeypatch.setattr(progress, name, value)
    monkeypatch.setattr(progress, "_injected", {})
    monkeypatch.setattr(progress, "_busy_window", progress.deque())
    return path


def test_the_report_carries_the_median_of_the_latest_window_of_steps(progress_file):
    """Every step counts into the median, however seldom the launcher reads the file: a watchdog
    that looks once in 30 steps still gets the median of the latest OWN_WORK_WINDOW steps."""
    window = progress.OWN_WORK_WINDOW
    for step in range(1, window):
        progress.compute_done(step, busy_s=9.0)
    warming = progress.read(progress_file)
    assert (warming.busy_median_s, warming.busy_steps) == (None, window - 1), "a warm-up's few steps are no median"
    early = watchdog.NodeWatch(watchdog.WatchdogSettings(hang_s=60), node=0, local_size=1, started=0.0)
    early.observe(0, warming, now=1.0)
    assert early.busy_s is None, "not the latest step's time either"
    for step in range(window, 3 * window + 1):
        progress.compute_done(step, busy_s=1.0 if step <= 2 * window else 3.0 + step / 1000)
        progress.report(step)
    seen = progress.read(progress_file)
    latest = [3.0 + s / 1000 for s in range(2 * window + 1, 3 * window + 1)]
    assert seen.busy_median_s == pytest.approx(statistics.median(latest), abs=1e-4), "only the latest window"
    w = watchdog.NodeWatch(watchdog.WatchdogSettings(hang_s=60), node=0, local_size=1, started=0.0)
    w.observe(0, seen, now=1.0)  # the one report this watch saw
    assert w.busy_s == pytest.approx(statistics.median(latest), abs=1e-4)


def test_a_step_measured_twice_counts_once(progress_file):
    progress.compute_done(1, device_time_follows=True)
    progress.own_work(1, 0.5)
    progress.compute_done(2, busy_s=0.1)
    progress.compute_done(2, busy_s=0.2)
    assert [(step, round(seconds, 2)) for step, seconds in progress._busy_window] == [(1, 0.5), (2, 0.2)]


def test_on_cpu_the_step_is_timed_from_start_to_done(progress_file, monkeypatch):
    clock = iter([10.0, 10.25])
    monkeypatch.setattr(common.time, "perf_counter", lambda: next(clock))
    progress.report(4)
    own = common.OwnWork()
    own.start()
    own.done(5)
    seen = progress.read(progress_file)
    assert (seen.waiting, seen.busy_s, seen.busy_step) == (5, pytest.approx(0.25, abs=1e-3), 5)
    own.settle()  # nothing pending on CPU
    assert progress.read(progress_file).beats == seen.beats


class FakeEvent:
    """torch.cuda.Event's surface that OwnWork uses; `at` is the device time it completes at."""

    clock = 0.0
    ready = True

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing, "elapsed_time needs timing events"
        self.at: float | None = None

    def record(self) -> None:
        self.at = FakeEvent.clock

    def query(self) -> bool:
        return FakeEvent.ready

    def elapsed_time(self, end: FakeEvent) -> float:
        assert FakeEvent.ready, "read before the end event completed: that would wait for the device"
        return (end.at - self.at) * 1000.0  # milliseconds, like CUDA's


class Device:
    type = "cuda"


def test_on_a_gpu_the_device_time_is_read_after_the_sync_point(progress_file, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    progress.report(4)
    own = common.OwnWork(Device())
    FakeEvent.clock, FakeEvent.ready = 100.0, False
    own.start()
    FakeEvent.clock = 100.4  # the device reached the end of the step's compute 0.4 s later
    own.done(5)
    enqueued = progress.read(progress_file)
    assert enqueued.waiting == 5 and enqueued.busy_step is None, "no host time passed off as the device's"
    own.settle()  # the events are not complete: nothing read, nothing waited for
    assert progress.read(progress_file).busy_step is None
    FakeEvent.ready = True
    own.settle()
    seen = progress.read(progress_file)
    assert seen.busy_step == 5 and seen.busy_s == pytest.approx(0.4, abs=1e-3)


def test_a_slow_faults_hold_counts_on_both_paths(progress_file, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    held = iter([0.0, 0.3])  # time.monotonic around the fault point: it held the process 0.3 s
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(held, 0.3))
    slowed = faultpoints.arm("training.compute", lambda **ctx: None)
    progress._reported_at = 0.0
    own = common.OwnWork(Device())
    FakeEvent.clock, FakeEvent.ready = 0.0, True
    own.start()
    FakeEvent.clock = 0.1
    own.done(7)
    own.settle()
    seen = progress.read(progress_file)
    assert slowed.fired == 1 and (seen.busy_step, seen.busy_s) == (7, pytest.approx(0.4)), "0.1 device + 0.3 held"


def test_the_watchdog_files_the_time_under_the_step_it_measured():
    w = watchdog.NodeWatch(watchdog.WatchdogSettings(hang_s=60), node=0, local_size=1, started=0.0)
    # waiting on step 6 while the file still carries step 5's device time: filed under 5, once
    w.observe(0, Progress(5, 1, 0, None, waiting=None, busy_s=0.2, busy_step=5), now=1)
    w.observe(0, Progress(5, 2, 0, None, waiting=6, busy_s=0.2, busy_step=5), now=2)
    w.observe(0, Progress(5, 3, 0, None, waiting=6, busy_s=0.9, busy_step=6), now=3)
    assert [s for s, _ in w.busy[0]] == [5, 6]
    assert watchdog.STEP_WINDOW == progress.OWN_WORK_WINDOW


@pytest.mark.parametrize("recipe", ["llm/train.py", "bert_pretrain/train.py", "cosmoflow/train.py", "synthetic.py"])
def test_every_recipe_times_its_steps_with_the_shared_helper(recipe):
    """start, done before the step's collective, settle after its sync point: the one helper,
    no recipe of its own clock for it."""
    tree = ast.parse((ROOT / "amlhpc/jobs/workloads" / recipe).read_text())
    calls = {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute)}
    assert {"OwnWork", "start", "done"} <= calls
    assert "compute_done" not in calls and "own_work" not in calls
    if recipe != "synthetic.py":
        assert "settle" in calls
