"""File-based barriers: local ranks wait for their node's stager; nodes wait for each other.

`NodeBarrier` (one node, all its local ranks): local rank 0 calls `lead()` before it
starts, then `succeed(result)` or `fail(message)`; the other local ranks call `wait()`,
which returns the leader's result (a JSON document), raises `BarrierFailed` with the
leader's message, raises when the leader's process is gone without a word (SIGKILL, OOM),
or raises `BarrierTimeout` after `timeout_s`. The directory lives on node-local storage
and is scoped by the job's run id and the node index, so simulated nodes sharing one
machine, and earlier jobs on a reused node, never see each other's markers. All markers
are written to a temporary name and renamed, so a reader never sees half a document.

When the run id is the fallback "default" (no launcher variable identifies the job), a
leftover result from an earlier job could be mistaken for this one's; results older than
`stale_after_s` before the waiter arrived are then ignored.

`SharedMarkers` (all nodes, a shared mount): in `shared` staging mode every node fills
part of one directory, so each node's stager records `node-<k>.done` (or `.failed`) on
the shared mount and waits until every node has finished before releasing its own
local ranks.

Standard library only: this module ships into the training image.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

POLL_S = 0.2


class BarrierFailed(RuntimeError):
    """The stager reported failure; the message is its error."""


class BarrierTimeout(TimeoutError):
    """Nobody finished in time."""


def write_json_atomic(path: Path, document: Any) -> None:
    """Write `document` to `path` through a temporary name in the same directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) still answers kill(0).
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


class NodeBarrier:
    """Local rank 0 stages; the node's other ranks wait here (see the module docstring)."""

    def __init__(self, directory: Path, timeout_s: float, run_id: str = "default", stale_after_s: float = 120.0,
                 clock: Callable[[], float] = time.time):
        self.directory = Path(directory)
        self.timeout_s = timeout_s
        self.run_id = run_id
        self.stale_after_s = stale_after_s
        self._clock = clock

    @property
    def leader_file(self) -> Path:
        return self.directory / "leader.json"

    @property
    def result_file(self) -> Path:
        return self.directory / "result.json"

    @property
    def failed_file(self) -> Path:
        return self.directory / "failed.json"

    def lead(self) -> None:
        """Called by local rank 0 before staging: clears old markers, records who leads."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for old in (self.result_file, self.failed_file):
            try:
                old.unlink()
            except FileNotFoundError:
                pass
        write_json_atomic(self.leader_file, {"pid": os.getpid(), "host": socket.gethostname(),
                                             "started": self._clock(), "run_id": self.run_id})

    def succeed(self, result: dict[str, Any]) -> None:
        write_json_atomic(self.result_file, {"written": self._clock(), "result": result})

    def fail(self, message: str) -> None:
        write_json_atomic(self.failed_file, {"written": self._clock(), "message": message})

    def _fresh(self, document: dict[str, Any] | None, arrived: float) -> bool:
        if document is None:
            return False
        if self.run_id != "default":
            return True
        return float(document.get("written", 0)) >= arrived - self.stale_after_s

    def wait(self, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
        """Block until local rank 0 finishes; return its result or raise its failure."""
        arrived = self._clock()
        deadline = time.monotonic() + self.timeout_s
        while True:
            failed = _read_json(self.failed_file)
            if self._fresh(failed, arrived):
                raise BarrierFailed(str(failed.get("message", "staging failed on local rank 0")))
            done = _read_json(self.result_file)
            if self._fresh(done, arrived):
                return dict(done.get("result") or {})
            leader = _read_json(self.leader_file)
            if leader and self._fresh({"written": leader.get("started", 0)}, arrived) and not _alive(int(leader["pid"])):
                # Re-check: the leader may have finished between our reads.
                if not (self.result_file.exists() or self.failed_file.exists()):
                    raise BarrierFailed(
                        f"local rank 0 (pid {leader['pid']} on {leader.get('host', '?')}) exited without finishing "
                        "staging; see its log for the error, then re-run the job (finished files are kept)"
                    )
                continue
            if time.monotonic() > deadline:
                raise BarrierTimeout(
                    f"waited {self.timeout_s:.0f}s for local rank 0 to finish staging (markers in {self.directory}); "
                    "raise the timeout (AMLHPC_STAGE_TIMEOUT_S / --timeout-s) for large datasets, or check rank 0's log"
                )
            sleep(POLL_S)


class SharedMarkers:
    """Per-node completion markers on a shared mount (shared staging mode)."""

    def __init__(self, directory: Path, node_count: int, timeout_s: float, run_id: str = "default",
                 stale_after_s: float = 600.0, clock: Callable[[], float] = time.time):
        self.directory = Path(directory)
        self.node_count = node_count
        self.timeout_s = timeout_s
        self.run_id = run_id
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._started = clock()

    def _current(self, document: dict[str, Any] | None) -> dict[str, Any] | None:
        """The marker if it belongs to this job (always, unless the run id is the fallback)."""
        if document is None or self.run_id != "default":
            return document
        return document if float(document.get("written", 0)) >= self._started - self.stale_after_s else None

    def _path(self, node: int, state: str) -> Path:
        return self.directory / f"node-{node}.{state}"

    def reset(self, node: int) -> None:
        for state in ("done", "failed"):
            try:
                self._path(node, state).unlink()
            except FileNotFoundError:
                pass

    def done(self, node: int, summary: dict[str, Any]) -> None:
        write_json_atomic(self._path(node, "done"), {**summary, "written": self._clock()})

    def failed(self, node: int, message: str) -> None:
        write_json_atomic(self._path(node, "failed"), {"message": message, "written": self._clock()})

    def wait_all(self, sleep: Callable[[float], None] = time.sleep) -> list[dict[str, Any]]:
        """Block until every node is done; raise on the first failure or at the timeout."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            summaries: list[dict[str, Any]] = []
            missing: list[int] = []
            for node in range(self.node_count):
                failed = self._current(_read_json(self._path(node, "failed")))
                if failed is not None:
                    raise BarrierFailed(f"node {node} failed staging its share: {failed.get('message', '?')}")
                done = self._current(_read_json(self._path(node, "done")))
                if done is None:
                    missing.append(node)
                else:
                    summaries.append(done)
            if not missing:
                return summaries
            if time.monotonic() > deadline:
                raise BarrierTimeout(
                    f"waited {self.timeout_s:.0f}s for node(s) {', '.join(map(str, missing))} to finish their share "
                    f"of the shared directory (markers in {self.directory}); check those nodes' logs"
                )
            sleep(POLL_S)
