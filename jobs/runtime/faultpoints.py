"""Named fault points: the steps of a state machine where a test stops, kills or races it.

The pattern of etcd's gofail and PingCAP's failpoint (github.com/etcd-io/gofail,
github.com/pingcap/failpoint, read 2026-11-25): the code marks each step with
`reach("upload.before-commit", blob=name)`, which does nothing unless a test armed that
point; every point is listed once in POINTS with what a fault there imitates, so a reader
sees the whole state machine's interleavings in one place and a typo in a test is an
error, not a point that never fires.

Arming:
- in the same process: `with armed("upload.before-commit", action) as point: ...`, where
  `action(**context)` runs at the point (it may start a second writer, or raise); after
  the block, `point.fired` says how often it ran. `raising(...)` is an action that raises
  `FaultInjected`, the "crash" of an in-process writer.
- in a child process: `AMLHPC_FAULTPOINTS="upload.before-commit=kill"` (`kill`: SIGKILL
  itself there, as a power cut or the OOM killer would; `error`: raise FaultInjected;
  `exit:N`: leave at once with status N; `log`: only record it; `hold:PATH`: wait there
  until PATH exists, so a test can act while the process is exactly at that step), with
  `AMLHPC_FAULTPOINTS_LOG=FILE`, where each
  firing is appended (and flushed to disk) before the action, so the test can assert that
  the fault it asked for happened. `name@K=...` fires at the K-th time the point is reached
  (1-based) instead of the first.

An armed point fires once unless told otherwise (`times`), so a second writer started from
the action runs through the same point untouched; `when` picks which of several writers
(by the context they pass, e.g. their upload session) the point stops.

Standard library only: ships into the training image (staging's markers use it too).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

ENV_POINTS = "AMLHPC_FAULTPOINTS"
ENV_LOG = "AMLHPC_FAULTPOINTS_LOG"

POINTS: dict[str, str] = {
    # jobs.data.upload: one file's blob, from the listing to the report
    "upload.after-list": "the prefix was listed and the plan made; nothing written yet",
    "upload.after-stage-block": "one Put Block of the blob returned; the rest of its blocks are not staged",
    "upload.before-commit": "every block is staged (or the single Put Blob's body is ready); the commit is not sent",
    "upload.after-commit": "the commit returned: the blob is complete; the report does not count it yet",
    "upload.before-refresh": "a touched file hashed equal; its blob's new mtime is not written yet",
    # jobs.data.seal: one foreign blob
    "seal.after-read": "the blob's stored bytes were hashed; no checksum written yet",
    "seal.between-writes": "Content-MD5 is written; the project's metadata (stored SHA-256) is not",
    # jobs.runtime.staging: one node's stager of one input
    "staging.after-lock": "the node's stager holds the input's lock; nothing of the input is touched yet",
    # jobs.runtime.nodebarrier: local rank 0 and its node's other ranks
    "barrier.after-lead": "local rank 0 recorded itself as leader; staging has not started",
    "barrier.before-result": "staging finished; its result is not written for the waiting ranks yet",
    # jobs.runtime.nodebarrier: the nodes of a shared-mode input
    "shared.after-publish": "node 0 published this launch's generation; no node is done yet",
    "shared.after-done": "this node wrote its done marker; it has not waited for the others",
}


class FaultInjected(RuntimeError):
    """Raised at an armed point whose action is an error (a crash inside the process)."""


@dataclass
class Armed:
    name: str
    action: Callable[..., None]
    times: int = 1
    at: int = 1
    """The first reach that fires (1-based): `at=2` lets one pass through first."""
    when: Callable[..., bool] | None = None
    """Only reaches whose context it accepts count (e.g. one writer's session of two)."""
    reached: int = 0
    fired: int = 0
    contexts: list[dict] = field(default_factory=list)


_armed: dict[str, Armed] = {}
_lock = threading.Lock()
_env_loaded = False


def _check(name: str) -> None:
    if name not in POINTS:
        raise KeyError(f"unknown fault point {name!r}; known: {', '.join(sorted(POINTS))}")


def reach(name: str, **context) -> None:
    """Mark a step; runs the armed action, if any (see the module docstring)."""
    if not _env_loaded:
        _load_env()
    if not _armed:
        return
    with _lock:
        point = _armed.get(name)
        if point is None or (point.when is not None and not point.when(**context)):
            return
        point.reached += 1
        if not point.at <= point.reached < point.at + point.times:
            return
        point.fired += 1
        point.contexts.append(dict(context))
    point.action(**context)


@contextmanager
def armed(name: str, action: Callable[..., None], times: int = 1, at: int = 1,
          when: Callable[..., bool] | None = None) -> Iterator[Armed]:
    """Arm `name` for the block; yields the record whose `fired` the test asserts."""
    _check(name)
    point = Armed(name, action, times, at, when)
    with _lock:
        if name in _armed:
            raise RuntimeError(f"fault point {name!r} is already armed")
        _armed[name] = point
    try:
        yield point
    finally:
        with _lock:
            _armed.pop(name, None)


def raising(message: str = "injected fault") -> Callable[..., None]:
    def action(**context) -> None:
        raise FaultInjected(f"{message} ({', '.join(f'{k}={v}' for k, v in context.items())})")
    return action


def fired_in_log(path: str | os.PathLike) -> list[str]:
    """The points a child process logged as fired (AMLHPC_FAULTPOINTS_LOG), in order."""
    try:
        with open(path, encoding="utf-8") as log:
            return [line.split("\t", 1)[0] for line in log.read().splitlines() if line]
    except FileNotFoundError:
        return []


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
        for item in filter(None, (part.strip() for part in spec.split(","))):
            target, _, what = item.partition("=")
            name, _, at = target.partition("@")
            _check(name)
            _armed[name] = Armed(name, _env_action(name, what or "kill", log_path), at=int(at or 1))


HOLD_LIMIT_S = 600.0
"""The longest a `hold:` point waits for its file (a test that forgot to release it fails, not hangs)."""


def _env_action(name: str, what: str, log_path: str | None) -> Callable[..., None]:
    if what not in ("kill", "error", "log") and not what.startswith(("exit:", "hold:")):
        raise ValueError(f"{ENV_POINTS}: {name}={what}: the action must be kill, error, log, exit:N or hold:PATH")

    def action(**context) -> None:
        if log_path:
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"{name}\t{context}\n")
                log.flush()
                os.fsync(log.fileno())
        if what == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if what == "error":
            raise FaultInjected(f"injected fault at {name}")
        if what.startswith("hold:"):
            import time

            release, until = what.split(":", 1)[1], time.monotonic() + HOLD_LIMIT_S
            while not os.path.exists(release):
                if time.monotonic() > until:
                    raise FaultInjected(f"fault point {name} held for {HOLD_LIMIT_S:.0f}s: nobody created {release}")
                time.sleep(0.02)
            return
        if what.startswith("exit:"):
            os._exit(int(what.split(":", 1)[1]))
    return action
