"""Training progress: the step counter the training code reports and the launcher watches.

The launcher gives each training process a file of its own in node-local storage and
names it in AMLHPC_PROGRESS_FILE (docs/contracts.md section 4). The training calls
`report(step)` after each step it completes (the shipped workloads do it through
amlhpc/jobs/workloads/common.py); every call rewrites the file atomically (temporary name, then
rename) with

    {"step": 1234, "beats": 57, "first_step": 1000, "resumed_from": 1000, "pid": 4242}

`beats` counts the calls, so a loop that reports the same step again (validation) still
shows it is alive; `first_step` is the first step this process reported, and
`resumed_from` the step of the checkpoint it started from (`note_resumed`), null on a
fresh start. The launcher's watchdog (amlhpc.jobs.runtime.launch.watchdog)
reads the files: a change is progress. Without the variable (a run outside the launcher),
`report` does nothing.

A synchronous training may also call `compute_done(step)` when the process finished its
own work on a step and is about to wait for its peers (before the gradient all-reduce,
the barrier): the file then carries `"waiting": step` and `"busy_s"`, the seconds the
step took before that wait. Every rank of a data-parallel job finishes a step at the
same time, so the time per step cannot tell a slow node from the others; the time
before the wait can (a straggler), and so can who is not waiting when all stopped (the
node a hang started on). Both are optional: without them a node is still judged by its
steps.

The own-work time is the device's: a training that measures it (CUDA events around the
step's compute on a GPU, amlhpc.jobs.workloads.common.OwnWork) passes it as
`compute_done(step, busy_s=...)`, or, when the events are read only after the step's natural
sync point (no extra stall), as `compute_done(step, device_time_follows=True)` then
`own_work(step, seconds)`. Without a measure,
`compute_done` takes the wall time since the last `report` (right on CPU; on a GPU that is the
host's enqueue time, not the device's work). The file then also says which step the time
belongs to: `"busy_step"`, and the median of the own-work times of its latest
OWN_WORK_WINDOW steps: `"busy_median_s"`, written once the process measured that many
(`"busy_steps"`: how many it has; the median of a warm-up's first few steps says nothing;
every step counts, however seldom the launcher
looks: a watchdog that sampled the latest step once a look had a window of 20 looks, 20
minutes at its production cadence, not 20 steps). A `slow` fault armed at `training.compute`
(amlhpc.jobs.runtime.base.faultpoints) sleeps there; the time it held the process is added
to the step's own work, as a node that much slower would show.

When the training has finished its work (its last step taken, its final checkpoint written),
`report_completed(step, checkpoint)` adds

    "completed": {"step": 2000, "checkpoint": "/scratch/.../ckpt-000002000.pt"}

(checkpoint null on a rank that writes none). The launcher reads it after the command exits:
a command that then dies in its interpreter's shutdown has still done its work
(amlhpc.jobs.runtime.launch.completion).

Standard library only: this module ships into the training image.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import faultpoints
from amlhpc.jobs.runtime.base.contract import PROGRESS_FILE

_lock = threading.Lock()
_beats = 0
_resumed_from: int | None = None
_first_step: int | None = None
_last_step: int | None = None
_reported_at: float | None = None
"""Monotonic time of the last `report`: where the next step's own work starts."""
_busy_s: float | None = None
_busy_step: int | None = None
_busy_window: deque[tuple[int, float]] = deque()
"""(step, own-work seconds) of the latest OWN_WORK_WINDOW steps this process measured."""
_waiting: int | None = None
_injected: dict[int, float] = {}
"""Step -> seconds a `slow` fault held it at training.compute, until its own-work time is known."""
_completed: dict[str, Any] | None = None


@dataclass(frozen=True)
class Progress:
    """One reading of a progress file."""

    step: int
    beats: int
    first_step: int | None = None
    resumed_from: int | None = None
    waiting: int | None = None
    """The step this process finished its own work on and waits for its peers to finish."""
    busy_s: float | None = None
    """Seconds of the process's own work on its latest step (before waiting for peers)."""
    completed_step: int | None = None
    """The step the training said it completed at (report_completed), None before that."""
    completed_checkpoint: str | None = None
    """The final checkpoint it named with that, if it wrote one."""
    busy_step: int | None = None
    """The step `busy_s` measured (None in files of an older runtime: the waiting step, else `step`)."""
    busy_median_s: float | None = None
    """The median own-work time of the process's latest OWN_WORK_WINDOW steps (None before it
    measured that many, and in files of an older runtime)."""
    busy_steps: int | None = None
    """How many steps that window holds (None in files of an older runtime)."""

    @property
    def marker(self) -> tuple[int, int]:
        """What changes when the training reports again."""
        return self.step, self.beats


def progress_file(environ: Mapping[str, str] | None = None) -> Path | None:
    environ = os.environ if environ is None else environ
    value = environ.get(PROGRESS_FILE, "").strip()
    return Path(value) if value else None


def note_resumed(step: int, environ: Mapping[str, str] | None = None) -> None:
    """Record the step the restored checkpoint holds (reported with every later step)."""
    global _resumed_from
    _resumed_from = int(step)
    report(step, environ=environ)


def last_step() -> int | None:
    """The step this process reported last (None before any report)."""
    return _last_step


def report_completed(step: int, checkpoint: str | os.PathLike[str] | None = None,
                     environ: Mapping[str, str] | None = None) -> bool:
    """Tell the launcher the training finished at `step`, its final checkpoint (if this rank
    wrote one) at `checkpoint`; the last thing a training reports."""
    global _completed
    _completed = {"step": int(step), "checkpoint": None if checkpoint is None else str(checkpoint)}
    return report(step, environ=environ)


def report(step: int, environ: Mapping[str, str] | None = None) -> bool:
    """Tell the launcher this process completed `step`; False when no launcher listens."""
    global _beats, _first_step, _last_step, _reported_at, _waiting
    _last_step = int(step)
    path = progress_file(environ)
    if path is None:
        return False
    with _lock:
        _beats += 1
        _first_step = int(step) if _first_step is None else _first_step
        _waiting = None
        written = _write(path, int(step))
        _reported_at = time.monotonic()
    faultpoints.reach("training.step", step=int(step))
    return written


def compute_done(step: int, busy_s: float | None = None, *, device_time_follows: bool = False,
                 environ: Mapping[str, str] | None = None) -> bool:
    """This process finished its own work on `step` and now waits for its peers; False
    when no launcher listens. Call it right before the step's collective. `busy_s`: the
    step's own work as the training measured it; None: the wall time since the last report,
    unless `device_time_follows` (the device's time comes through `own_work` after the
    step's sync point)."""
    global _beats, _waiting
    path = progress_file(environ)
    if path is None:
        return False
    started = _reported_at if _reported_at is not None else time.monotonic()
    before = time.monotonic()
    faultpoints.reach("training.compute", step=int(step),
                      busy_s=busy_s if busy_s is not None else before - started)
    held = time.monotonic() - before  # a `slow` fault's sleep: the node that much slower
    with _lock:
        _beats += 1
        _waiting = int(step)
        if device_time_follows:
            _injected[int(step)] = held
        else:
            _record_busy(int(step), (busy_s + held) if busy_s is not None else time.monotonic() - started)
        return _write(path, _last_step if _last_step is not None else int(step) - 1)


def own_work(step: int, seconds: float, environ: Mapping[str, str] | None = None) -> bool:
    """The own-work time of `step` measured on the device, read after the step's sync point
    (after `compute_done(step, device_time_follows=True)`); False when no launcher listens."""
    global _beats
    path = progress_file(environ)
    if path is None:
        return False
    with _lock:
        _beats += 1
        _record_busy(int(step), seconds + _injected.pop(int(step), 0.0))
        return _write(path, _last_step if _last_step is not None else int(step) - 1)


def _record_busy(step: int, seconds: float) -> None:
    global _busy_s, _busy_step
    _busy_s, _busy_step = seconds, step
    if _busy_window and _busy_window[-1][0] == step:
        _busy_window.pop()  # the step measured again (its device time after its host time)
    _busy_window.append((step, seconds))
    while len(_busy_window) > OWN_WORK_WINDOW:
        _busy_window.popleft()
    for old in [s for s in _injected if s < step]:
        del _injected[old]  # a step whose device time never came (the events were not ready)


def _write(path: Path, step: int) -> bool:
    document = {"step": step, "beats": _beats, "first_step": _first_step, "resumed_from": _resumed_from,
                "waiting": _waiting, "busy_s": None if _busy_s is None else round(_busy_s, 6),
                "busy_step": _busy_step,
                "busy_median_s": round(statistics.median(s for _, s in _busy_window), 6)
                if len(_busy_window) >= OWN_WORK_WINDOW else None, "busy_steps": len(_busy_window),
                "pid": os.getpid(),
                **({"completed": _completed} if _completed else {})}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(document))
        os.replace(tmp, path)
    except OSError:
        return False  # a full or vanished scratch must not stop the training
    return True


def read(path: Path) -> Progress | None:
    """The latest report in `path`, or None when there is none (yet) or it is unreadable."""
    try:
        data = json.loads(path.read_text())
        first, resumed, waiting, busy, busy_step, median, counted = (
            data.get(k) for k in ("first_step", "resumed_from", "waiting", "busy_s", "busy_step", "busy_median_s",
                                  "busy_steps"))
        completed = data.get("completed") or {}
        done, checkpoint = completed.get("step"), completed.get("checkpoint")
        return Progress(int(data["step"]), int(data.get("beats", 0)), int(first) if first is not None else None,
                        int(resumed) if resumed is not None else None, int(waiting) if waiting is not None else None,
                        float(busy) if busy is not None else None, int(done) if done is not None else None,
                        str(checkpoint) if checkpoint else None, int(busy_step) if busy_step is not None else None,
                        float(median) if median is not None else None, int(counted) if counted is not None else None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


OWN_WORK_WINDOW = 20
"""Latest steps per rank whose median own-work time the launcher's watchdog puts in the
node's heartbeat; the controller counts a node's heartbeats as independent evidence only
that many steps apart (amlhpc.jobs.managed.stragglers). The median of 20 steps whose times
scatter lognormally with sigma 0.5 varies by about 0.14 in log (1.2533 sigma / sqrt(n), the
median's asymptotic standard error): a node 1.5x slower (0.41) stands out of that; the
median of 5 (0.28) did not."""


LAUNCH_STATE = ".amlhpc-launch"
"""The launcher's node-local state folder under a node's scratch (or temp) directory:
`<run>-node<k>/<launch generation>/<what>` (amlhpc.jobs.runtime.launch.launcher)."""


def launch_state_dir(base: Path, run_id: str, node_index: int | str, launch: str, what: str) -> Path:
    """One launch's state folder `what` (progress, exits, ...) on one node."""
    return base / LAUNCH_STATE / f"{run_id}-node{node_index}" / (launch or "any") / what


def files(scratch: Path, run_id: str = "*", node: str = "*", name: str = "rank-*.json") -> list[Path]:
    """The progress files (or the watchdog's `verdict.json`) under one node's scratch folder
    (a glob in run_id and node too: `node*/scratch` for every simulated node), newest first:
    the readers outside the launcher (rehearsals, `jobs status`) find them here."""
    found = list(scratch.glob(f"{LAUNCH_STATE}/{run_id}-node{node}/*/progress/{name}"))
    stamped = []
    for path in found:
        try:
            stamped.append((path.stat().st_mtime, str(path), path))
        except OSError:
            continue
    return [path for _, _, path in sorted(stamped, reverse=True)]
