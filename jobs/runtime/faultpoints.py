"""Named fault points: the places where tests and rehearsals crash, delay or race a state
machine on purpose, listed once with what each imitates.

The pattern is etcd's gofail and PingCAP's failpoint (a named point in the code that a
test switches on): code calls `hit(NAME, **context)` at the point, and nothing happens
unless a test or a rehearsal armed it. Faults happen at steps, never at wall-clock times.

- In process (the controller's tests, the managed rehearsal): `arm(NAME, action)` or
  `with armed(NAME, action) as point:`; `action(context)` runs at the point. `crash`
  raises `Crash`, a BaseException, so no `except Exception` on the way swallows it and no
  `finally` that expects an orderly stop runs its cleanup (the supervisor releases its
  lease only on an orderly exit): the process "dies" exactly there. `point.fired` counts
  the hits that acted; a test that arms a point asserts it fired.
- In a child process (the training of a rehearsed attempt): `AMLHPC_FAULTPOINTS`, a JSON
  object NAME -> {"action": "gate" | "slow", ...}, read once. `gate` stops the process at
  the point (the first hit at or after `at_step`), writes `<dir>/reached-<pid>.json` and
  waits for `<dir>/release`: the rehearsal then preempts, freezes or kills exactly there.
  `slow` sleeps (`factor` - 1) x the step's own work (`busy_s`): a node `factor` times
  slower than its peers (with `dir`, its first slowed step writes the reached file too).

Standard library only: this module ships into the training image, and is inert there.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV = "AMLHPC_FAULTPOINTS"

POINTS: dict[str, str] = {
    # the controller's loop (jobs.managed.supervisor): one per step of its state machine
    "controller.claim": "an attempt is due, before its claim is written (a crash leaves nothing claimed)",
    "controller.claimed": "the claim is durable, before the job is created (a crash leaves a claim without a job)",
    "controller.submitted": "the job was created, before the record says so (a crash leaves a job the record calls "
                            "submitting)",
    "controller.watch": "a running attempt was observed, before the record write (a controller lost mid-attempt)",
    "controller.ended": "an attempt was seen ended and classified, before the record write",
    "controller.backoff": "between attempts, while the next one waits for its backoff",
    "controller.cancel": "a cancel request was seen, before the running attempt's job is canceled",
    "controller.record.write": "before every write of the run's record (a second writer, a lapsed lease)",
    # `python -m jobs cancel` (jobs.managed.client.cancel_run)
    "cancel.requested": "the cancel request is durable, before the run's controllers are stopped",
    "cancel.stopped": "the controllers were stopped, before the attempts are swept",
    # the training of a rehearsed attempt (jobs.runtime.progress)
    "training.step": "a training process reported a completed step (context: step)",
    "training.compute": "a training process finished its own work on a step, before waiting for its peers "
                        "(context: step, busy_s)",
}


class Crash(BaseException):  # noqa: N818 - it imitates a process dying, not an error to handle
    """The process dies here (a killed controller, a lost node)."""

    def __init__(self, point: str):
        super().__init__(f"fault point {point}: crashed here on purpose")
        self.point = point


@dataclass
class Armed:
    name: str
    action: Callable[[dict[str, Any]], None]
    when: Callable[[dict[str, Any]], bool]
    times: int
    """How many hits act (0: every hit)."""
    fired: int = 0
    contexts: list[dict[str, Any]] = field(default_factory=list)


_lock = threading.Lock()
_armed: dict[str, Armed] = {}
_env: dict[str, dict[str, Any]] | None = None
_env_fired: set[str] = set()


def _check(name: str) -> None:
    if name not in POINTS:
        raise KeyError(f"unknown fault point {name!r}: jobs/runtime/faultpoints.py lists them")


def arm(name: str, action: Callable[[dict[str, Any]], None], *, when: Callable[[dict[str, Any]], bool] | None = None,
        times: int = 1) -> Armed:
    """Act at `name` on the next `times` hits for which `when(context)` holds."""
    _check(name)
    point = Armed(name, action, when or (lambda _ctx: True), times)
    with _lock:
        _armed[name] = point
    return point


def disarm(name: str) -> None:
    with _lock:
        _armed.pop(name, None)


def reset() -> None:
    with _lock:
        _armed.clear()


@contextmanager
def armed(name: str, action: Callable[[dict[str, Any]], None], **kwargs: Any) -> Iterator[Armed]:
    point = arm(name, action, **kwargs)
    try:
        yield point
    finally:
        with _lock:
            if _armed.get(name) is point:
                del _armed[name]


def crash(context: dict[str, Any]) -> None:
    """An action: die at the point."""
    raise Crash(context["point"])


def hit(name: str, **context: Any) -> None:
    """The point `name` is reached; act if a test or a rehearsal armed it."""
    _check(name)
    context["point"] = name
    with _lock:
        point = _armed.get(name)
        if point is not None and point.when(context):
            point.fired += 1
            point.contexts.append(dict(context))
            if point.times and point.fired >= point.times:
                del _armed[name]
        else:
            point = None
    if point is not None:
        point.action(context)
        return
    if os.environ.get(ENV):
        _from_env(name, context)


# --- in a child process -------------------------------------------------------------


def _settings() -> dict[str, dict[str, Any]]:
    global _env
    if _env is None:
        try:
            loaded = json.loads(os.environ.get(ENV, "") or "{}")
        except ValueError:
            loaded = {}
        _env = {k: v for k, v in loaded.items() if k in POINTS and isinstance(v, dict)} if isinstance(loaded, dict) else {}
    return _env


def _from_env(name: str, context: dict[str, Any]) -> None:
    spec = _settings().get(name)
    if not spec:
        return
    if spec.get("action") == "slow":
        factor, busy = float(spec.get("factor", 1.0)), float(context.get("busy_s") or 0.0)
        if factor > 1 and busy > 0:
            if spec.get("dir") and name not in _env_fired:
                _env_fired.add(name)
                _say_reached(Path(spec["dir"]), context)
            time.sleep((factor - 1) * busy)
        return
    if spec.get("action") == "gate" and name not in _env_fired and int(context.get("step", 0)) >= int(spec["at_step"]):
        _env_fired.add(name)
        gate(Path(spec["dir"]), context, float(spec.get("timeout_s", 600)))


def _say_reached(folder: Path, context: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    reached = folder / f"reached-{os.getpid()}.json"
    tmp = reached.with_suffix(".tmp")
    tmp.write_text(json.dumps({k: v for k, v in context.items() if isinstance(v, int | float | str)}))
    os.replace(tmp, reached)


def gate(folder: Path, context: dict[str, Any], timeout_s: float) -> None:
    """Say this process reached the point, then wait for the rehearsal's release."""
    _say_reached(folder, context)
    deadline = time.monotonic() + timeout_s
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def env_for(points: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The child-process variable arming `points` (NAME -> spec)."""
    for name in points:
        _check(name)
    return {ENV: json.dumps(points, separators=(",", ":"))}
