"""File-based barriers: local ranks wait for their node's stager; nodes wait for each other.

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

`SharedMarkers` (all nodes, a shared mount): in `shared` staging mode every node fills
part of one directory, so each node's stager records `node-<k>.done` (or `.failed`) on
the shared mount and waits until every node has finished before releasing its own
local ranks. No value is shared by the nodes of one launch and no earlier one (torchrun's
`none`, an Azure ML job requeued under its id onto a persistent mount), so node 0 makes
one: it publishes a fresh random generation in `launch.json` and rewrites that file every
`heartbeat_s` while the nodes stage. Another node adopts a generation only once it has
seen the file change (the heartbeat of a live node 0: an earlier launch's file never
changes again), and every done or failed marker carries the generation; a node counts
only markers of its own. node 0 also publishes a digest of the listing it planned from,
and a node that listed something else fails instead of staging a share of another
split (the dataset changed while the nodes listed it).

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

from amlhpc.jobs.runtime.base import clock as clocks
from amlhpc.jobs.runtime.base import faultpoints

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
                 clock: Callable[[], float] = clocks.time, fallback: Path | None = None, generation: str | None = None):
        self.directory = Path(directory)
        self.timeout_s = timeout_s
        self.run_id = run_id
        self.generation = generation
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

    def wait(self, sleep: Callable[[float], None] = clocks.sleep) -> dict[str, Any]:
        """Block until local rank 0 finishes; return its result or raise its failure."""
        arrived = self._clock()
        deadline = clocks.monotonic() + self.timeout_s
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
            if clocks.monotonic() > deadline:
                raise BarrierTimeout(
                    f"waited {self.timeout_s:.0f}s for local rank 0 to finish staging (markers in {self.directory}); "
                    "raise the timeout (AMLHPC_STAGE_TIMEOUT_S / --timeout-s) for large datasets, or check rank 0's log"
                )
            sleep(POLL_S)


class SharedMarkers:
    """Per-node completion markers on a shared mount (shared staging mode), under one generation
    node 0 publishes for this launch (see the module docstring).

    Every node: `start()` before staging its share, then `done(summary)` or `failed(message)`,
    then `wait_all()`, and `close()` at the end (node 0 stops its heartbeat there)."""

    def __init__(self, directory: Path, node_count: int, timeout_s: float, node_index: int, listing: str = "",
                 heartbeat_s: float = 1.0, clock: Callable[[], float] = clocks.time,
                 sleep: Callable[[float], None] = clocks.sleep):
        self.directory = Path(directory)
        self.node_count = node_count
        self.timeout_s = timeout_s
        self.node_index = node_index
        self.listing = listing
        self.heartbeat_s = heartbeat_s
        self._clock = clock
        self._sleep = sleep
        self.generation: str | None = None
        self._stop = threading.Event()
        self._beating: threading.Thread | None = None
        self._adopting: threading.Thread | None = None
        self._adopt_error: BaseException | None = None

    @property
    def launch_file(self) -> Path:
        return self.directory / "launch.json"

    def _path(self, node: int, state: str) -> Path:
        return self.directory / f"node-{node}.{state}"

    def start(self) -> None:
        """Clear this node's markers; node 0 publishes a fresh generation and starts beating,
        the others start watching for it."""
        for state in ("done", "failed"):
            try:
                self._path(self.node_index, state).unlink()
            except FileNotFoundError:
                pass
        if self.node_index == 0:
            self.generation = secrets.token_hex(8)
            self._beat(0)
            self._beating = threading.Thread(target=self._heartbeat, name="shared-markers-heartbeat", daemon=True)
            self._beating.start()
            faultpoints.reach("shared.after-publish", directory=str(self.directory))
        else:
            self._adopting = threading.Thread(target=self._adopt_quietly, name="shared-markers-adopt", daemon=True)
            self._adopting.start()

    def _beat(self, count: int) -> None:
        write_json_atomic(self.launch_file, {"generation": self.generation, "beat": count, "listing": self.listing,
                                             "node_count": self.node_count, "written": self._clock()})

    def _heartbeat(self) -> None:
        count = 0
        while not self._stop.wait(self.heartbeat_s):
            count += 1
            try:
                self._beat(count)
            except OSError:
                pass  # a hiccup of the mount: the next beat tries again

    def _adopt_quietly(self) -> None:
        try:
            self._adopt(clocks.monotonic() + self.timeout_s)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever needs the generation
            self._adopt_error = exc

    def _adopt(self, deadline: float) -> None:
        """Take node 0's generation once its file changes while watched: proof that the node 0 of
        this launch is alive now (an earlier launch's file never changes again)."""
        seen = _read_json(self.launch_file)
        while not self._stop.is_set():
            self._sleep(POLL_S)
            now = _read_json(self.launch_file)
            if now is not None and now.get("generation") and now != seen:
                if now.get("listing") != self.listing:
                    raise BarrierFailed(
                        f"node 0 planned from another listing of the dataset than node {self.node_index} (digest "
                        f"{now.get('listing')} vs {self.listing}): the blobs changed while the nodes listed them; "
                        "re-run the job")
                self.generation = str(now["generation"])
                return
            if clocks.monotonic() > deadline:
                raise BarrierTimeout(
                    f"waited {self.timeout_s:.0f}s for node 0 to publish this launch's generation "
                    f"({self.launch_file} did not change); check node 0's log")

    def _own_generation(self, wait_s: float | None = None) -> str | None:
        if self._adopting is not None:
            self._adopting.join(wait_s)
            if self._adopt_error is not None and not self._adopting.is_alive():
                raise self._adopt_error
        return self.generation

    def done(self, summary: dict[str, Any]) -> None:
        generation = self._own_generation()
        write_json_atomic(self._path(self.node_index, "done"),
                          {**summary, "generation": generation, "written": self._clock()})
        faultpoints.reach("shared.after-done", node=self.node_index)

    def failed(self, message: str) -> None:
        """Record this node's failure (under this launch's generation when known within a few heartbeats)."""
        try:
            generation = self._own_generation(wait_s=5 * self.heartbeat_s)
        except (BarrierFailed, BarrierTimeout):
            generation = None
        write_json_atomic(self._path(self.node_index, "failed"),
                          {"message": message, "generation": generation, "written": self._clock()})

    def _current(self, document: dict[str, Any] | None) -> dict[str, Any] | None:
        return document if document is not None and document.get("generation") == self.generation else None

    def wait_all(self, deadline_s: float | None = None) -> list[dict[str, Any]]:
        """Block until every node of this launch is done; raise on the first failure or at the timeout."""
        deadline = clocks.monotonic() + (self.timeout_s if deadline_s is None else deadline_s)
        self._own_generation()
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
            if clocks.monotonic() > deadline:
                raise BarrierTimeout(
                    f"waited {self.timeout_s:.0f}s for node(s) {', '.join(map(str, missing))} to finish their share "
                    f"of the shared directory (markers in {self.directory}); check those nodes' logs"
                )
            self._sleep(POLL_S)

    def close(self) -> None:
        self._stop.set()
        if self._beating is not None:
            self._beating.join()
