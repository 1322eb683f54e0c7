"""A bound on the wait for a training process after its SIGKILL.

SIGKILL cannot be caught, but it is only acted on when the process leaves the kernel: one in
uninterruptible sleep (state D: a GPU that fell off the bus, a wedged driver, a hung network
file system) stays, and `wait()` on it never returns (signal(7): "uninterruptible sleep" is
not interrupted by signals; proc(5), /proc/PID/stat field 3, read 2026-11-28). A launcher
that waits for it holds the node forever: no in-job restart, no end record, the job neither
runs nor ends. So once any SIGKILL went to the command's process group (the stop signal's
grace passed, the watchdog stopped it, an in-job restart killed it), the launcher waits at
most `--kill-wait` seconds (KILL_WAIT_S) more, then gives the process up: the node is lost
(amlhpc.jobs.runtime.base.exit_codes.ExitCode.NODE_LOST), its end record says which process
and how long, and the managed run resubmits without the node.

Standard library only: ships in the image.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from typing import Protocol

from amlhpc.jobs.runtime.base import clock, faultpoints

log = logging.getLogger("amlhpc.launch")

KILL_WAIT_S = 30.0
"""The longest the launcher waits for its command after a SIGKILL (--kill-wait)."""
LOOK_S = 0.5
"""How often the wait looks whether a SIGKILL was sent."""


class Waitable(Protocol):
    pid: int

    def wait(self, timeout: float | None = None) -> int: ...


class Unreaped(Exception):
    """The command did not die after its SIGKILL: the node is lost."""

    def __init__(self, pid: int, waited_s: float, why: str):
        super().__init__(f"the training command (pid {pid}) did not exit {waited_s:.0f}s after SIGKILL ({why}): a "
                         "process in uninterruptible sleep (a GPU off the bus, a wedged driver or file system); "
                         "the node is lost")
        self.pid, self.waited_s, self.why = pid, waited_s, why


class Kills:
    """When the command's process group first got SIGKILL, and from whom (every killer of the
    launcher kills through `kill_group`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.at: float | None = None
        """Monotonic time of the first SIGKILL."""
        self.why: str = ""

    def note(self, why: str) -> None:
        with self._lock:
            if self.at is None:
                self.at, self.why = clock.monotonic(), why

    def kill_group(self, pid: int, why: str) -> bool:
        """SIGKILL the process group `pid`; False when it is gone already."""
        self.note(why)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True


def _stuck(pid: int) -> bool:
    """The `launch.reaped` fault point: an armed error makes a killed process one that never
    exits (a test or rehearsal needs no real uninterruptible sleep)."""
    try:
        faultpoints.reach("launch.reaped", pid=pid)
    except faultpoints.FaultInjected:
        return True
    return False


def wait(child: Waitable, kills: Kills, bound_s: float = KILL_WAIT_S) -> int:
    """The command's return code; Unreaped once `bound_s` passed since a SIGKILL without its exit."""
    stuck = False
    while True:
        if stuck:
            clock.sleep(LOOK_S)
        else:
            try:
                code = child.wait(timeout=LOOK_S)
            except subprocess.TimeoutExpired:
                pass
            else:
                stuck = kills.at is not None and _stuck(child.pid)
                if not stuck:
                    return code
        if kills.at is not None:
            waited = clock.monotonic() - kills.at
            if waited > bound_s:
                raise Unreaped(child.pid, waited, kills.why)
