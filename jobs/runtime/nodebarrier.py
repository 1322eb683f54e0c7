"""File-based barriers: local ranks wait for their node's stager; nodes wait for each other.

`NodeBarrier` (one node, all its local ranks): local rank 0 calls `lead()` before it
starts, then `succeed(result)` or `fail(message, kind)`; the other local ranks call
`wait()`, which returns the leader's result (a JSON document), raises `BarrierFailed`
(with the leader's message and kind: 'failed', 'usage' or 'timeout'), raises when the
leader's process is gone without a word (SIGKILL, OOM), or raises `BarrierTimeout` after
`timeout_s`. The directory is node-local and keyed by the job (jobs.runtime.jobid) and
the node index. All markers are written to a temporary name and renamed, so a reader
never sees half a document.

Markers of another job are never trusted:
- a result counts only with the leader record it belongs to (the same `session`), and a
  leader record counts only while that process is alive (pid and its start time, so a
  reused pid does not fool it) or when it started less than `stale_after_s` before the
  waiter arrived (a leader that finished and exited just before);
- a failure counts when it is that fresh too: failing on a stale failure is safe,
  releasing ranks on a stale result is not.

When local rank 0 cannot write its own markers (disk full, read-only or missing
directory), it records the failure in a fallback directory (/dev/shm, memory-backed, else
the temp dir) that waiters also watch, so they fail within a poll instead of waiting out
the timeout; a waiter whose own directory is unusable fails at once as well.

`SharedMarkers` (all nodes, a shared mount): in `shared` staging mode every node fills
part of one directory, so each node's stager records `node-<k>.done` (or `.failed`) on
the shared mount and waits until every node has finished before releasing its own
local ranks. Markers live under the job's key; without a unique job id, markers written
more than `timeout_s` before this node started waiting are an earlier job's and ignored.

Standard library only: this module ships into the training image.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

POLL_S = 0.2
FAILURE_KINDS = ("failed", "usage", "timeout")


class BarrierFailed(RuntimeError):
    """The stager reported failure; the message is its error, `kind` what sort of failure."""

    def __init__(self, message: str, kind: str = "failed"):
        super().__init__(message)
        self.kind = kind if kind in FAILURE_KINDS else "failed"


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
        document = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return document if isinstance(document, dict) else None


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return True
    if fields[0] == "Z":  # a zombie (exited, not yet reaped) still answers kill(0)
        return False
    return start is None or fields[19] == start


def fallback_root() -> Path:
    shm = Path("/dev/shm")
    return shm / "amlhpc-barrier" if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir()) / "amlhpc-barrier-fallback"


class NodeBarrier:
    """Local rank 0 stages; the node's other ranks wait here (see the module docstring)."""

    def __init__(self, directory: Path, timeout_s: float, run_id: str = "default", stale_after_s: float = 600.0,
                 clock: Callable[[], float] = time.time, fallback: Path | None = None):
        self.directory = Path(directory)
        self.timeout_s = timeout_s
        self.run_id = run_id
        self.stale_after_s = stale_after_s
        self._clock = clock
        if fallback is None:
            tag = hashlib.sha256(str(self.directory.resolve()).encode()).hexdigest()[:16]
            fallback = fallback_root() / f"{self.directory.name[:80]}-{tag}"
        self.fallback = fallback
        self.session = ""

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
        """Called by local rank 0 before staging: clears old markers, records who leads.
        When that fails, the failure is recorded where the waiters look, then raised."""
        self.session = secrets.token_hex(8)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for old in (self.result_file, self.failed_file, self.fallback / "failed.json"):
                try:
                    old.unlink()
                except FileNotFoundError:
                    pass
            write_json_atomic(self.leader_file, {
                "pid": os.getpid(), "start": process_start(os.getpid()), "host": socket.gethostname(),
                "started": self._clock(), "run_id": self.run_id, "session": self.session})
        except OSError as exc:
            self.fail(f"local rank 0 could not set up the node barrier in {self.directory}: {exc.strerror or exc}")
            raise

    def succeed(self, result: dict[str, Any]) -> None:
        write_json_atomic(self.result_file, {"written": self._clock(), "session": self.session, "result": result})

    def fail(self, message: str, kind: str = "failed") -> None:
        """Record the failure; in the fallback directory as well when the barrier's own is unusable."""
        document = {"written": self._clock(), "session": self.session, "message": message, "kind": kind,
                    "pid": os.getpid()}
        try:
            write_json_atomic(self.failed_file, document)
            return
        except OSError:
            pass
        try:
            write_json_atomic(self.fallback / "failed.json", document)
        except OSError:
            pass  # nowhere to write: the waiters notice the leader's exit instead

    def _failure(self, arrived: float) -> dict[str, Any] | None:
        for path in (self.failed_file, self.fallback / "failed.json"):
            failed = _read_json(path)
            if failed and float(failed.get("written", 0)) >= arrived - self.stale_after_s:
                return failed
        return None

    def _current_leader(self, arrived: float) -> dict[str, Any] | None:
        leader = _read_json(self.leader_file)
        if not leader or "pid" not in leader:
            return None
        if float(leader.get("started", 0)) >= arrived - self.stale_after_s:
            return leader
        return leader if _alive(int(leader["pid"]), leader.get("start")) else None

    def _unusable(self) -> str | None:
        """Why this node's barrier directory cannot exist, when it cannot."""
        for parent in (self.directory, *self.directory.parents):
            if parent.exists():
                if not parent.is_dir():
                    return f"{parent} is a file, not a directory"
                return None if os.access(parent, os.W_OK | os.X_OK) else f"{parent} is not writable"
        return None

    def wait(self, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
        """Block until local rank 0 finishes; return its result or raise its failure."""
        arrived = self._clock()
        deadline = time.monotonic() + self.timeout_s
        problem = self._unusable()
        if problem:
            raise BarrierFailed(f"the node barrier cannot work: {problem}", "usage")
        while True:
            failed = self._failure(arrived)
            if failed:
                raise BarrierFailed(str(failed.get("message", "staging failed on local rank 0")), failed.get("kind", "failed"))
            leader = self._current_leader(arrived)
            if leader:
                done = _read_json(self.result_file)
                if done and done.get("session") == leader.get("session", done.get("session")):
                    return dict(done.get("result") or {})
                if not _alive(int(leader["pid"]), leader.get("start")):
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
                 unique_id: bool | None = None, clock: Callable[[], float] = time.time):
        self.directory = Path(directory)
        self.node_count = node_count
        self.timeout_s = timeout_s
        self.run_id = run_id
        self.unique_id = unique_id if unique_id is not None else run_id.lower() not in ("default", "none", "")
        self._clock = clock
        self._started = clock()

    def _current(self, document: dict[str, Any] | None) -> dict[str, Any] | None:
        """The marker if it belongs to this job: always under a unique id, else when recent enough."""
        if document is None or self.unique_id:
            return document
        return document if float(document.get("written", 0)) >= self._started - self.timeout_s else None

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

    def wait_all(self, sleep: Callable[[float], None] = time.sleep, deadline_s: float | None = None) -> list[dict[str, Any]]:
        """Block until every node is done; raise on the first failure or at the timeout."""
        deadline = time.monotonic() + (self.timeout_s if deadline_s is None else deadline_s)
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
