"""Named fault points: the steps of a state machine where a test or a rehearsal stops, kills,
slows or races it on purpose, listed once with what a fault there imitates.

The pattern of etcd's gofail and PingCAP's failpoint (github.com/etcd-io/gofail,
github.com/pingcap/failpoint, read 2026-11-25): the code marks each step with
`reach("upload.before-commit", blob=name)`, which does nothing unless a test armed that
point; every point is listed once in POINTS, so a reader sees the whole state machine's
interleavings in one place and a typo in a test is an error, not a point that never fires.
Faults happen at steps, never at wall-clock times.

Arming in the same process:
- `arm(NAME, action, times=1, at=1, when=None)` (returns the record) / `disarm(NAME)` /
  `reset()`, or `with armed(NAME, action, ...) as point:`. `action(**context)` runs at the
  point; it may start a second writer, raise, or call `crash` / `raising(...)`. `point.fired`
  counts the reaches that acted: a test that arms a point asserts it fired.
- `times`: how many reaches act (0: every one); `at`: the first reach that acts (1-based, so
  `at=2` lets one through first); `when(**context)`: only reaches it accepts count (one
  writer of two, an attempt number).
- `crash` dies at the point: it raises `Crash`, a BaseException, so no `except Exception`
  swallows it and no cleanup that expects an orderly stop runs (a killed controller keeps
  its lease). `raising(message)` raises `FaultInjected`, an ordinary error.

Arming in a child process, through AMLHPC_FAULTPOINTS (read once), in either form:
- `name[@K]=ACTION[,name=ACTION...]`, ACTION one of `kill` (SIGKILL itself there, as a power
  cut or the OOM killer would), `error` (raise FaultInjected), `exit:N`, `log` (only record
  it) or `hold:PATH` (wait there until PATH exists, so a test acts while the process is at
  exactly that step); `@K` fires at the K-th reach instead of the first. With
  AMLHPC_FAULTPOINTS_LOG=FILE each firing is appended (and flushed) before the action, so
  the test can assert that the fault it asked for happened (`fired_in_log`).
- a JSON object NAME -> one settings object or a list of them (`env_for` writes it; `jobs run
  --fault SPEC`, amlhpc/jobs/local/faults.py, is how a user asks for one), each with an
  `action` and the selectors that choose its reaches: `step` (that step exactly), `at_step`
  (the first reach with step >= it), `rank`, and `gen` (the launch's restart generation,
  AMLHPC_RESTART_GENERATION, read at the reach: the first run is 0; a setting without `gen`
  acts in every generation). A setting acts once per process, except `slow`. Actions:
  `gate` stops the process, writes `<dir>/reached-<pid>.json` and waits for `<dir>/release`
  (the rehearsal then preempts, freezes or kills it exactly there); `slow` sleeps
  (factor - 1) x the step's own work (`busy_s`), a node `factor` times slower than its peers;
  `exit` ends the process with `code` at once (a crash: no cleanup runs); `error` raises
  FaultInjected with `message` (an NCCL error, say); `hang` stops the process's progress for
  good (only a signal ends it). `planned(NAME, **context)` tells the code at a point what is
  armed there before it acts (the training finishes its checkpoint writes first).

Standard library only: this module ships into the training image, and is inert there.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base.contract import RESTART_GENERATION

ENV_POINTS = "AMLHPC_FAULTPOINTS"
ENV_LOG = "AMLHPC_FAULTPOINTS_LOG"

POINTS: dict[str, str] = {
    # amlhpc.jobs.data.upload: one file's blob, from the listing to the report
    "upload.after-list": "the prefix was listed and the plan made; nothing written yet",
    "upload.after-stage-block": "one Put Block of the blob returned; the rest of its blocks are not staged",
    "upload.before-commit": "every block is staged (or the single Put Blob's body is ready); the commit is not sent",
    "upload.after-commit": "the commit returned: the blob is complete; the report does not count it yet",
    "upload.before-refresh": "a touched file hashed equal; its blob's new mtime is not written yet",
    # amlhpc.jobs.data.seal: one foreign blob
    "seal.after-read": "the blob's stored bytes were hashed; no checksum written yet",
    "seal.between-writes": "Content-MD5 is written; the project's metadata (stored SHA-256) is not",
    # amlhpc.jobs.runtime.staging.stager: one node's stager of one input
    "staging.after-lock": "the node's stager holds the input's lock; nothing of the input is touched yet",
    "staging.agreed": "the nodes' manifest (version and digest) is decided on the job's store; nothing staged yet",
    # amlhpc.jobs.data.versions: one versioned upload of a dataset
    "dataset.marker-written": "the version's in-progress marker is in; none of its files is uploaded",
    "dataset.files-uploaded": "every file of the version is committed; its manifest is not written",
    "dataset.parts-written": "a large version's manifest parts are in; its index (the commit) is not written",
    "dataset.manifest-written": "the manifest is in (the version is committed); the marker is not deleted yet",
    # amlhpc.jobs.runtime.coord.nodebarrier: local rank 0 and its node's other ranks
    "barrier.after-lead": "local rank 0 recorded itself as leader; staging has not started",
    "barrier.before-result": "staging finished; its result is not written for the waiting ranks yet",
    # amlhpc.jobs.runtime.staging.stager: the nodes of a shared-mode input, on the job's store
    "shared.listed": "the nodes agreed on the listing they plan from; this node has not staged its share",
    "shared.after-done": "this node arrived at the barrier; it has not waited for the others",
    # the managed run's controller loop (amlhpc.jobs.managed.supervisor): one per step of its state machine
    "controller.claim": "an attempt is due, before its claim is written (a crash leaves nothing claimed)",
    "controller.claimed": "the claim is durable, before the job is created (a crash leaves a claim without a job)",
    "controller.submitted": "the job was created, before the record says so (a crash leaves a job the record calls "
                            "submitting)",
    "controller.watch": "a running attempt was observed, before the record write (a controller lost mid-attempt)",
    "controller.ended": "an attempt's end was decided (seen ended and classified, or ended by the controller: a queue "
                        "timeout, the budget, a stall, a silent node, a cancel, a refused or missing job), before the "
                        "record write",
    "controller.stopping": "the controller's own stop of a running attempt is in the record; the job is not canceled yet",
    "controller.backoff": "between attempts, while the next one waits for its backoff",
    "controller.cancel": "a cancel request was seen, before the running attempt's job is canceled",
    "controller.record.write": "before every write of the run's record (a second writer, a lapsed lease)",
    # the revival check (amlhpc.jobs.managed.revive): between its look and its lease
    "revive.listed": "the check saw no live controller, before it takes the lease to start one (a second "
                     "check overlaps here)",
    # `python -m amlhpc.jobs cancel` (amlhpc.jobs.managed.client.cancel_run)
    "cancel.requested": "the cancel request is durable, before the run's controllers are stopped",
    "cancel.stopped": "the controllers were stopped, before the attempts are swept",
    # amlhpc.jobs.runtime.checkpoint: one versioned upload, its commit, a prune and a restore
    "checkpoint.pending-written": "a node's pending record (its lease on the blobs it will write) is in Blob; no part yet",
    "checkpoint.block-staged": "the first block of a part is staged under this session's block ids; the part is not committed",
    "checkpoint.part-committed": "one part's block list is committed; other parts of the version are still to come",
    "checkpoint.parts-recorded": "every part of the node is in and its pending record lists them; nothing committed",
    "checkpoint.verified": "every part of the version was checked in Blob; the manifest is not written",
    "checkpoint.manifest-written": "the manifest is in; the `latest` pointer still names the previous version",
    "checkpoint.pointer-written": "the pointer names the new version (committed); its pending records are still there",
    "checkpoint.prune-listed": "prune listed the data blobs and has not yet read what references them",
    "checkpoint.prune-decided": "prune decided which versions and blobs go; nothing deleted yet",
    "checkpoint.restore-file-written": "one file of a restore is in its temporary name, not yet renamed",
    # the training of a rehearsed attempt (amlhpc.jobs.runtime.base.progress)
    "launch.final-upload": "the training ended and the node's end record (final upload pending) is written; the "
                           "final upload has not started",
    # the in-job restart (amlhpc.jobs.runtime.launch.restart, amlhpc.jobs.runtime.health.quick)
    "restart.health-check": "a node's training ended for an in-job restart; its quick health check has not run (an "
                            "armed error fails the check: context node)",
    "launch.reaped": "the launcher reaped its command after a SIGKILL (an armed error: it never exits, as a process "
                     "in uninterruptible sleep; context pid)",
    "training.step": "a training process reported a completed step (context: step)",
    "training.compute": "a training process finished its own work on a step, before waiting for its peers "
                        "(context: step, busy_s)",
    "training.fault": "a training process finished a step and its checkpoint writes; the next step has not "
                      "started (context: step, rank, gen; amlhpc.jobs.workloads.resume.inject_fault)",
}


class FaultInjected(RuntimeError):
    """Raised at an armed point whose action is an error (a crash inside the process)."""


class Crash(BaseException):  # noqa: N818 - it imitates a process dying, not an error to handle
    """The process dies here (a killed controller, a lost node)."""

    def __init__(self, point: str):
        super().__init__(f"fault point {point}: crashed here on purpose")
        self.point = point


@dataclass
class Armed:
    name: str
    action: Callable[..., None]
    times: int = 1
    """How many reaches act (0: every one)."""
    at: int = 1
    """The first reach that acts (1-based)."""
    when: Callable[..., bool] | None = None
    """Only reaches whose context it accepts count."""
    reached: int = 0
    fired: int = 0
    contexts: list[dict[str, Any]] = field(default_factory=list)

    def takes(self, context: dict[str, Any]) -> bool:
        """Count this reach; whether it acts."""
        if self.when is not None and not self.when(**context):
            return False
        self.reached += 1
        if self.reached < self.at or (self.times and self.reached >= self.at + self.times):
            return False
        self.fired += 1
        self.contexts.append(dict(context))
        return True


_armed: dict[str, Armed] = {}
_lock = threading.Lock()
_env_loaded = False
_acting = threading.local()


def _check(name: str) -> None:
    if name not in POINTS:
        raise KeyError(f"unknown fault point {name!r}; amlhpc/jobs/runtime/base/faultpoints.py lists them: {', '.join(sorted(POINTS))}")


def reach(name: str, **context: Any) -> None:
    """Mark a step; runs the armed action, if any (see the module docstring)."""
    _check(name)
    if not _env_loaded:
        _load_env()
    if not _armed:
        return
    with _lock:
        point = _armed.get(name)
        if point is None or not point.takes(context):
            return
    _acting.point = name
    try:
        point.action(**context)
    finally:
        _acting.point = None


def arm(name: str, action: Callable[..., None], *, times: int = 1, at: int = 1,
        when: Callable[..., bool] | None = None) -> Armed:
    """Act at `name` (see the module docstring); returns the record whose `fired` a test asserts."""
    _check(name)
    if not _env_loaded:
        _load_env()
    point = Armed(name, action, times, at, when)
    with _lock:
        _armed[name] = point  # re-arming a point replaces it
    return point


def disarm(name: str) -> None:
    with _lock:
        _armed.pop(name, None)


def reset() -> None:
    """Disarm every point armed in this process."""
    with _lock:
        _armed.clear()


@contextmanager
def armed(name: str, action: Callable[..., None], *, times: int = 1, at: int = 1,
          when: Callable[..., bool] | None = None) -> Iterator[Armed]:
    """`arm` for the block."""
    point = arm(name, action, times=times, at=at, when=when)
    try:
        yield point
    finally:
        with _lock:
            if _armed.get(name) is point:
                del _armed[name]


@contextmanager
def injected(name: str, action: Callable[..., None], *, times: int = 1, at: int = 1,
             when: Callable[..., bool] | None = None) -> Iterator[Armed]:
    """`armed`, and an AssertionError when the block never reached the point: an injected
    fault that did not happen is an error, never a pass."""
    with armed(name, action, times=times, at=at, when=when) as point:
        yield point
    if not point.fired:
        raise AssertionError(f"fault point {name} was never reached: the injected fault did not happen")


def crash(**_context: Any) -> None:
    """An action: die at the point."""
    raise Crash(getattr(_acting, "point", None) or "?")


def raising(message: str = "injected fault") -> Callable[..., None]:
    """An action: raise FaultInjected naming the point's context."""
    def action(**context: Any) -> None:
        raise FaultInjected(f"{message} ({', '.join(f'{k}={v}' for k, v in context.items())})")
    return action


def fired_in_log(path: str | os.PathLike) -> list[str]:
    """The points a child process logged as fired (AMLHPC_FAULTPOINTS_LOG), in order."""
    try:
        with open(path, encoding="utf-8") as log:
            return [line.split("\t", 1)[0] for line in log.read().splitlines() if line]
    except FileNotFoundError:
        return []


def fired_settings(path: str | os.PathLike) -> list[dict[str, Any]]:
    """What a child process logged as fired through the JSON form (AMLHPC_FAULTPOINTS_LOG):
    each firing's settings and context, in order."""
    found = []
    try:
        with open(path, encoding="utf-8") as log:
            for line in log.read().splitlines():
                _, _, details = line.partition("\t")
                try:
                    found.append(json.loads(details))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return found


def env_for(points: Mapping[str, dict[str, Any] | list[dict[str, Any]]]) -> dict[str, str]:
    """The child-process variable arming `points` (NAME -> settings or a list of them; see the
    module docstring)."""
    for name, settings in points.items():
        _check(name)
        for one in settings if isinstance(settings, list) else [settings]:
            if one.get("action") not in JSON_ACTIONS:
                raise ValueError(f"{ENV_POINTS}: {name}: the action must be one of {', '.join(JSON_ACTIONS)}, "
                                 f"not {one.get('action')!r}")
    return {ENV_POINTS: json.dumps(points, separators=(",", ":"))}


def planned(name: str, **context: Any) -> list[dict[str, Any]]:
    """The settings armed at `name` through AMLHPC_FAULTPOINTS's JSON form whose selectors
    accept `context` (a selector the context does not name is not checked; `gen` is this
    process's generation unless given) and that have not acted yet. Only a question: nothing acts."""
    _check(name)
    if not _env_loaded:
        _load_env()
    with _lock:
        point = _armed.get(name)
    found = getattr(point.action, "settings", []) if point is not None else []
    return [one for one, done in found if not done.is_set() and _selects(one, context, partial=True)]


# --- in a child process -------------------------------------------------------------

HOLD_LIMIT_S = 600.0
"""The longest a `hold:` or `gate` point waits (a test that forgot to release it fails, not hangs)."""


def _load_env() -> None:
    global _env_loaded
    with _lock:
        if _env_loaded:
            return
        _env_loaded = True
        spec = os.environ.get(ENV_POINTS, "").strip()
        if not spec:
            return
        log_path = os.environ.get(ENV_LOG) or None
        if spec.startswith("{"):
            for name, settings in json.loads(spec).items():
                _check(name)
                _armed[name] = Armed(name, _json_action(name, settings if isinstance(settings, list) else [settings],
                                                        log_path), times=0)
            return
        for item in filter(None, (part.strip() for part in spec.split(","))):
            target, _, what = item.partition("=")
            name, _, at = target.partition("@")
            _check(name)
            _armed[name] = Armed(name, _env_action(name, what or "kill", log_path), at=int(at or 1))


def _env_action(name: str, what: str, log_path: str | None) -> Callable[..., None]:
    if what not in ("kill", "error", "log") and not what.startswith(("exit:", "hold:")):
        raise ValueError(f"{ENV_POINTS}: {name}={what}: the action must be kill, error, log, exit:N or hold:PATH")

    def action(**context: Any) -> None:
        if log_path:
            _log(log_path, name, context)
        if what == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if what == "error":
            raise FaultInjected(f"injected fault at {name}")
        if what.startswith("hold:"):
            _wait_for(Path(what.split(":", 1)[1]), name)
        if what.startswith("exit:"):
            os._exit(int(what.split(":", 1)[1]))
    return action


JSON_ACTIONS = ("gate", "slow", "exit", "error", "hang")
SELECTORS = ("step", "rank", "gen")
"""Settings keys compared for equality with a reach's context (`at_step` is compared with >=)."""


def generation() -> int:
    """This process's restart generation (0: the launch's first run of the command)."""
    try:
        return int(os.environ.get(RESTART_GENERATION) or 0)
    except ValueError:
        return 0


def _selects(settings: dict[str, Any], context: dict[str, Any], partial: bool = False) -> bool:
    """Whether a JSON setting acts at a reach with `context` (`partial`: keys the context lacks pass)."""
    context = {"gen": generation(), **context}
    for key in SELECTORS:
        if key in settings and (key in context or not partial) and \
                (key not in context or int(context[key]) != int(settings[key])):
            return False
    at_step = settings.get("at_step")
    return at_step is None or ("step" not in context and partial) or int(context.get("step", 0)) >= int(at_step)


def _json_action(name: str, settings: list[dict[str, Any]], log_path: str | None = None) -> Callable[..., None]:
    """The JSON settings of one point: each acts at the reaches its selectors accept, once
    (`slow`: at every one); see the module docstring."""
    for one in settings:
        if one.get("action") not in JSON_ACTIONS:
            raise ValueError(f"{ENV_POINTS}: {name}: the action must be one of {', '.join(JSON_ACTIONS)}, "
                             f"not {one.get('action')!r}")
    pairs = [(one, threading.Event()) for one in settings]

    def action(**context: Any) -> None:
        for one, done in pairs:
            if (done.is_set() and one["action"] != "slow") or not _selects(one, context):
                continue
            _act(name, one, done, {**context, "gen": context.get("gen", generation())}, log_path)

    action.settings = pairs  # type: ignore[attr-defined]  # read by planned()
    return action


def _act(name: str, settings: dict[str, Any], done: threading.Event, context: dict[str, Any],
         log_path: str | None) -> None:
    kind = settings["action"]
    logged = {**settings, **{k: v for k, v in context.items() if isinstance(v, int | float | str)}}
    if kind == "slow":
        factor, busy = float(settings.get("factor", 1.0)), float(context.get("busy_s") or 0.0)
        if factor > 1 and busy > 0:
            if not done.is_set():  # said once: the first step it slows
                done.set()
                if log_path:
                    _log(log_path, name, logged)
                if settings.get("dir"):
                    _say_reached(Path(settings["dir"]), context)
            time.sleep((factor - 1) * busy)
        return
    done.set()
    if log_path:
        _log(log_path, name, logged)
    if kind == "gate":
        gate(Path(settings["dir"]), context, float(settings.get("timeout_s", HOLD_LIMIT_S)))
    elif kind == "exit":
        os._exit(int(settings.get("code", 1)))
    elif kind == "error":
        raise FaultInjected(str(settings.get("message") or f"injected fault at {name}"))
    elif kind == "hang":
        while True:  # no more progress: only a signal ends this (the watchdog's, or the rehearsal's)
            time.sleep(3600)


def _log(path: str, name: str, details: dict[str, Any]) -> None:
    """Append a firing to AMLHPC_FAULTPOINTS_LOG (flushed to disk before the action, which may kill)."""
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"{name}\t{json.dumps(details, default=str)}\n")
        log.flush()
        os.fsync(log.fileno())


def _say_reached(folder: Path, context: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    reached = folder / f"reached-{os.getpid()}.json"
    tmp = reached.with_suffix(".tmp")
    tmp.write_text(json.dumps({k: v for k, v in context.items() if isinstance(v, int | float | str)}))
    os.replace(tmp, reached)


def gate(folder: Path, context: dict[str, Any], timeout_s: float = HOLD_LIMIT_S) -> None:
    """Say this process reached the point, then wait for the rehearsal's release."""
    _say_reached(folder, context)
    deadline = time.monotonic() + timeout_s
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _wait_for(release: Path, name: str) -> None:
    until = time.monotonic() + HOLD_LIMIT_S
    while not release.exists():
        if time.monotonic() > until:
            raise FaultInjected(f"fault point {name} held for {HOLD_LIMIT_S:.0f}s: nobody created {release}")
        time.sleep(0.02)
