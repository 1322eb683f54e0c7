"""File-based barriers on one node: local ranks wait for their node's stager (or restore, or
restart decision).

`NodeBarrier` (one node, all its local ranks): local rank 0 calls `lead()` before it
starts, then `succeed(result)` or `fail(message, kind)`; the other local ranks call
`wait()`, which returns the leader's result (a JSON document), raises `BarrierFailed`
(with the leader's message and kind: 'failed', 'usage' or 'timeout'), raises when the
leader's process is gone without a word (SIGKILL, OOM), or raises `BarrierTimeout` after
`timeout_s`. The directory is node-local and keyed by the job (amlhpc.jobs.runtime.base.jobid) and
the node index. All markers are written to a temporary name and renamed, so a reader
never sees half a document.

Markers of another launch are never trusted. With a `generation` (amlhpc.jobs.runtime.base.launchid:
a value only the ranks of this launch on this node share, what staging passes), the
leader record, the result and the failure each carry it, and a waiter takes only its own
generation's, however recent another's are: a result from an earlier launch that used
the same job id never releases this launch's ranks, a failure from one never fails them.
Without a generation (the earlier rule, kept for callers that have none):
- a result counts only with the leader record it belongs to (the same `session`), and a
  leader record counts only while that process is alive (pid and its start time, so a
  reused pid does not fool it) or when it started less than `stale_after_s` before the
  waiter arrived (a leader that finished and exited just before);
- a failure counts when it is that fresh too.

When local rank 0 cannot write its own markers (disk full, read-only or missing
directory), it records the failure in a fallback directory (/dev/shm, memory-backed, else
the temp dir) that waiters also watch, so they fail within a poll instead of waiting out
the timeout; a waiter whose own directory is unusable fails at once as well.

Barriers across nodes are not files: they run on the job's coordination store
(amlhpc.jobs.runtime.coord.agree), which lives as long as this launch and nothing earlier.

Standard library only: this module ships into the training image.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import clock as clock_seam
from amlhpc.jobs.runtime.base import faultpoints, procstat

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
    write_bytes_atomic(path, json.dumps(document, indent=2, sort_keys=True).encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary name in the same directory, one per process and
    thread (two threads of one process writing the same file must not share a temporary)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a write that failed (a full disk) leaves no temporary behind


def _read_json(path: Path) -> Any | None:
    try:
        document = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return document if isinstance(document, dict) else None


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
    found = procstat.fields(pid)
    return found[procstat.START_TIME] if found and len(found) > procstat.START_TIME else None


def _alive(pid: int, start: str | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = procstat.fields(pid)
    if not fields:
        return True
    if fields[procstat.STATE] == "Z":  # a zombie (exited, not yet reaped) still answers kill(0)
        return False
    return start is None or fields[procstat.START_TIME] == start


def fallback_root() -> Path:
    shm = Path("/dev/shm")
    return shm / "amlhpc-barrier" if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir()) / "amlhpc-barrier-fallback"


class NodeBarrier:
    """Local rank 0 stages; the node's other ranks wait here (see the module docstring)."""

    def __init__(self, directory: Path, timeout_s: float, run_id: str = "default", stale_after_s: float = 600.0,
                 clock: Callable[[], float] | None = None, fallback: Path | None = None, generation: str | None = None):
        self.directory = Path(directory)
        self.timeout_s = timeout_s
        self.run_id = run_id
        self.generation = generation
        self.stale_after_s = stale_after_s
        self._clock = clock or clock_seam.time
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
                "started": self._clock(), "run_id": self.run_id, "session": self.session,
                "generation": self.generation})
        except OSError as exc:
            self.fail(f"local rank 0 could not set up the node barrier in {self.directory}: {exc.strerror or exc}")
            raise
        faultpoints.reach("barrier.after-lead", directory=str(self.directory))

    def succeed(self, result: dict[str, Any]) -> None:
        faultpoints.reach("barrier.before-result", directory=str(self.directory))
        write_json_atomic(self.result_file, {"written": self._clock(), "session": self.session, "result": result,
                                             "generation": self.generation})

    def fail(self, message: str, kind: str = "failed") -> None:
        """Record the failure; in the fallback directory as well when the barrier's own is unusable."""
        document = {"written": self._clock(), "session": self.session, "message": message, "kind": kind,
                    "pid": os.getpid(), "generation": self.generation}
        try:
            write_json_atomic(self.failed_file, document)
            return
        except OSError:
            pass
        try:
            write_json_atomic(self.fallback / "failed.json", document)
        except OSError:
            pass  # nowhere to write: the waiters notice the leader's exit instead

    def _ours(self, document: dict[str, Any] | None) -> bool:
        """With a generation, only this launch's markers count (see the module docstring)."""
        return document is not None and (self.generation is None or document.get("generation") == self.generation)

    def _failure(self, arrived: float) -> dict[str, Any] | None:
        for path in (self.failed_file, self.fallback / "failed.json"):
            failed = _read_json(path)
            if not failed or not self._ours(failed):
                continue
            if self.generation is not None or float(failed.get("written", 0)) >= arrived - self.stale_after_s:
                return failed
        return None

    def _current_leader(self, arrived: float) -> dict[str, Any] | None:
        leader = _read_json(self.leader_file)
        if not leader or "pid" not in leader or not self._ours(leader):
            return None
        if self.generation is not None or float(leader.get("started", 0)) >= arrived - self.stale_after_s:
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

    def wait(self, sleep: Callable[[float], None] | None = None) -> dict[str, Any]:
        """Block until local rank 0 finishes; return its result or raise its failure."""
        sleep = sleep or clock_seam.sleep
        arrived = self._clock()
        deadline = clock_seam.monotonic() + self.timeout_s
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
                if done is not None and self._ours(done) and done.get("session") == leader.get("session", done.get("session")):
                    return dict(done.get("result") or {})
                if not _alive(int(leader["pid"]), leader.get("start")):
                    # Re-check: the leader may have finished between our reads.
                    done = _read_json(self.result_file)
                    finished = done is not None and self._ours(done) and done.get("session") == leader.get("session", done.get("session"))
                    if not (finished or self._failure(arrived)):
                        raise BarrierFailed(
                            f"local rank 0 (pid {leader['pid']} on {leader.get('host', '?')}) exited without finishing "
                            "staging; see its log for the error, then re-run the job (finished files are kept)"
                        )
                    continue
            if clock_seam.monotonic() > deadline:
                raise BarrierTimeout(
                    f"waited {self.timeout_s:.0f}s for local rank 0 to finish staging (markers in {self.directory}); "
                    "raise the timeout (AMLHPC_STAGE_TIMEOUT_S / --timeout-s) for large datasets, or check rank 0's log"
                )
            sleep(POLL_S)
