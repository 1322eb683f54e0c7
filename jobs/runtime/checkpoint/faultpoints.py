"""Named fault points of the checkpoint state machine: where a second actor, a kill or a cancel
can land, listed once with what each one imitates.

The code calls `hit(NAME)` at each step of an upload, a commit, a prune and a restore. A test
switches one point on with an action and then asserts that it fired (an injected fault that
did not happen is an error, never a pass). The pattern is etcd's gofail
(github.com/etcd-io/gofail, `// gofail: var beforeCommit struct{}`) and ReadySet's
`failpoints` module, which lists every point in one place; read 2026-11-26.

Actions:
- "error": raise FaultInjected (a storage error at that step);
- "cancel": raise UploadCancelled (the launcher cancels the upload for an in-job restart);
- "kill": SIGKILL this process (a node or an uploader dies at that step);
- a callable: run it there (a second writer, a prune, a restart in the middle of the step).

Subprocesses take them from AMLHPC_FAULTPOINTS, e.g. `commit.manifest-written=kill`
(comma-separated); anything else only through `enable()`. Unknown names are refused, so a
typo cannot make a test pass by injecting nothing.

Standard library only: this module ships into the training image (the points cost one dict
lookup when nothing is enabled).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from jobs.runtime.checkpoint.errors import UploadCancelled

ENV = "AMLHPC_FAULTPOINTS"

POINTS: dict[str, str] = {
    "upload.pending-written": "a node's pending record (its lease on the blobs it will write) is in Blob; no part yet",
    "upload.block-staged": "the first block of a part is staged under this session's block ids; the part is not committed",
    "upload.part-committed": "one part's block list is committed; other parts of the version are still to come",
    "upload.parts-recorded": "every part of the node is in and its pending record lists them; nothing committed",
    "commit.verified": "every part of the version was checked in Blob; the manifest is not written",
    "commit.manifest-written": "the manifest is in; the `latest` pointer still names the previous version",
    "commit.pointer-written": "the pointer names the new version (committed); its pending records are still there",
    "prune.listed": "prune listed the data blobs and has not yet read what references them",
    "prune.decided": "prune decided which versions and blobs go; nothing deleted yet",
    "restore.file-written": "one file of a restore is in its temporary name, not yet renamed",
}

ACTIONS = ("error", "cancel", "kill")


class FaultInjected(RuntimeError):
    """The error a fault point raises with action "error"."""


@dataclass
class Fault:
    name: str
    action: str | Callable[[], object]
    times: int = 1
    """How many hits fire (then the point is inert again)."""
    fired: int = 0


_lock = threading.Lock()
_enabled: dict[str, Fault] = {}
_env_loaded = False


def _check(name: str) -> None:
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}; known: {', '.join(POINTS)}")


def enable(name: str, action: str | Callable[[], object], times: int = 1) -> Fault:
    """Switch `name` on; returns the Fault, whose `fired` counts the hits that acted."""
    _check(name)
    if isinstance(action, str) and action not in ACTIONS:
        raise ValueError(f"unknown fault action {action!r}; known: {', '.join(ACTIONS)} or a callable")
    fault = Fault(name, action, times)
    with _lock:
        _enabled[name] = fault
    return fault


def disable(name: str) -> None:
    with _lock:
        _enabled.pop(name, None)


def reset() -> None:
    with _lock:
        _enabled.clear()


@contextlib.contextmanager
def injected(name: str, action: str | Callable[[], object], times: int = 1) -> Iterator[Fault]:
    """Enable `name` for the block; fail the block if the point was never reached."""
    fault = enable(name, action, times)
    try:
        yield fault
    finally:
        disable(name)
    if not fault.fired:
        raise AssertionError(f"fault point {name} was never reached: the injected fault did not happen")


def _load_env() -> None:
    global _env_loaded
    _env_loaded = True
    for item in filter(None, (part.strip() for part in os.environ.get(ENV, "").split(","))):
        name, _, action = item.partition("=")
        enable(name.strip(), action.strip() or "error")


def hit(name: str) -> None:
    """Called by the code at point `name`: acts when the point is enabled."""
    if not _env_loaded:
        _load_env()
    if not _enabled:
        return
    with _lock:
        fault = _enabled.get(name)
        if fault is None or fault.fired >= fault.times:
            return
        fault.fired += 1
    action = fault.action
    if callable(action):
        action()
    elif action == "error":
        raise FaultInjected(f"injected error at {name}")
    elif action == "cancel":
        raise UploadCancelled(f"upload cancelled at {name}")
    else:
        os.kill(os.getpid(), signal.SIGKILL)
