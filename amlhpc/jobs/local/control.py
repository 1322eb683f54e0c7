"""A running rehearsal, seen from another shell: is it running, and how to cancel it.

While `jobs run RECIPE --local` runs, its folder holds `running.json` (the command's pid, its
host, when it started, plain or managed), removed when it ends. `jobs cancel RUN --local`
writes `cancel.json` beside it (who asked, when): the rehearsal watches for it, as Azure ML's
jobs and the managed run's supervision watch for a cancel request, and stops - a plain
rehearsal stops every process and records the attempt as canceled; a managed one passes the
request to its supervision (amlhpc/jobs/managed/supervisor.py), which cancels the attempt and
ends the record `canceled`. If the rehearsal does not end in time, `cancel` sends its command
SIGTERM, which stops everything it started (amlhpc/jobs/local/processes.py).

A pid is trusted only while that process is alive and started when the file says (its start
time in /proc), so a stale file (a machine that rebooted, a reused pid) never aims a signal at
a stranger.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUNNING_FILE = "running.json"
CANCEL_FILE = "cancel.json"


def _write(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


@contextlib.contextmanager
def announce(folder: Path, kind: str) -> Iterator[None]:
    """Mark the folder's rehearsal as running in this process for the block (a stale cancel
    request from an earlier run is set aside first)."""
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (folder / CANCEL_FILE).unlink()
    _write(folder / RUNNING_FILE, {"pid": os.getpid(), "start_ticks": _start_ticks(os.getpid()),
                                   "host": socket.gethostname(), "started": time.time(), "kind": kind})
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            (folder / RUNNING_FILE).unlink()


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat field 22), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(fields[19])


def _ours(pid: int, ticks: int | None) -> bool:
    """`pid` is alive and is the process that wrote the file (its start time matches: not a
    stranger that reused the number)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    now = _start_ticks(pid)
    return ticks is None or now is None or now == ticks


@dataclass(frozen=True)
class Running:
    pid: int
    kind: str
    started: float


def running(folder: Path) -> Running | None:
    """The rehearsal running in `folder`, or None (never ran, ended, or its command died)."""
    document = _read(folder / RUNNING_FILE)
    if document is None or document.get("host") != socket.gethostname():
        return None
    pid = document.get("pid")
    ticks = document.get("start_ticks")
    if not isinstance(pid, int) or pid <= 0 or not _ours(pid, ticks if isinstance(ticks, int) else None):
        return None
    return Running(pid, str(document.get("kind") or "rehearsal"), float(document.get("started") or 0))


def request_cancel(folder: Path, by: str | None = None) -> dict[str, Any]:
    """Ask the rehearsal in `folder` to stop (it watches for this file)."""
    request = {"id": uuid.uuid4().hex[:12], "by": by or getpass.getuser(), "at": time.time()}
    _write(folder / CANCEL_FILE, request)
    return request


def cancel_requested(folder: Path) -> dict[str, Any] | None:
    """The cancel request for the rehearsal running in `folder`, if one was made."""
    return _read(folder / CANCEL_FILE)


def watcher(folder: Path) -> Callable[[], dict[str, Any] | None]:
    """What the rehearsal polls: the request, once (checking a small file every poll)."""
    return lambda: cancel_requested(folder)


def wait_until_stopped(folder: Path, run: Running, wait_s: float, poll_s: float = 0.5,
                       echo: Callable[[str], None] = print) -> bool:
    """Wait for the rehearsal to honour the request; SIGTERM its command after `wait_s`, then
    wait as long again. True when it stopped."""
    for signalled in (False, True):
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if running(folder) is None:
                return True
            time.sleep(poll_s)
        if signalled:
            return running(folder) is None
        echo(f"the rehearsal (pid {run.pid}) did not stop within {wait_s:.0f} s: sending it SIGTERM")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(run.pid, signal.SIGTERM)
    return running(folder) is None
