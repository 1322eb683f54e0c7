"""Nothing a local command starts outlives it: success, failure, Ctrl-C or SIGTERM.

`supervised()` wraps a command (the rehearsal, the demo):

- this process becomes a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): a descendant
  whose parent dies - a launcher's training command, data-loader workers, Azurite's
  children - is re-parented here instead of to init, so it stays in this process's tree
  even in a session and process group of its own;
- SIGINT, SIGTERM and SIGHUP raise `Interrupted` (a KeyboardInterrupt) in the main thread,
  so context managers and `finally` blocks stop what they started, in order (training
  ranks, then Azurite); a signal arriving during that cleanup does not interrupt it but
  makes it hurry (no more grace periods);
- when the block ends, every process started below this one since the block began gets
  SIGTERM, then SIGKILL after `grace_s`, and the zombies are reaped;
- every child inherits `AMLHPC_LOCAL_SESSION` (one id per supervised command), so a
  process that escaped its tree could still be found by it (the interrupt test does).

Children started with `popen_kwargs()` also get SIGTERM if this process is killed outright
(`PR_SET_PDEATHSIG`). Descendants are found through /proc (Linux); elsewhere only the
signal handling applies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
DEFAULT_GRACE_S = 15.0
SESSION_VARIABLE = "AMLHPC_LOCAL_SESSION"


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived; `exit_code` is what a shell reports for it (128 + N)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    active = False
    cleaning = False
    hurry = threading.Event()
    preexisting: frozenset[int] = frozenset()
    """Processes below this one before the block began: not ours to stop."""


state = _State()


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def popen_kwargs(new_session: bool = True) -> dict:
    """Popen arguments for a child this process supervises: its own session (a terminal's
    Ctrl-C reaches only us, and we stop it in order) and SIGTERM if we die without cleanup."""
    return {"start_new_session": new_session, "preexec_fn": _die_with_parent}


def hurrying() -> bool:
    """A second stop signal arrived: cleanup should skip its grace periods."""
    return state.hurry.is_set()


def _handler(signum: int, _frame) -> None:
    if state.cleaning:
        state.hurry.set()
        return
    state.cleaning = True
    raise Interrupted(signum)


# --- the process tree (/proc) ------------------------------------------------------------


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), fields[0]


def descendants(root: int | None = None) -> list[int]:
    """Live (non-zombie) processes below `root` (default: this process), parents first."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    alive: set[int] = set()
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        info = _stat(int(entry.name))
        if info is None:
            continue
        parent, status = info
        children.setdefault(parent, []).append(int(entry.name))
        if status != "Z":
            alive.add(int(entry.name))
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return [pid for pid in found if pid in alive]


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _reap() -> None:
    """Collect exited children (ours and re-parented orphans) so no zombie is left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _ours() -> list[int]:
    """Processes below this one, less those that were there before the block (and theirs)."""
    foreign = set(state.preexisting)
    for pid in state.preexisting:
        foreign.update(descendants(pid))
    return [pid for pid in descendants() if pid not in foreign]


def stop_descendants(grace_s: float = DEFAULT_GRACE_S) -> list[int]:
    """SIGTERM every process this block started below this one, SIGKILL what is left after
    `grace_s` (or at once when hurrying); returns the pids that had to be stopped."""
    left = _ours()
    if not left:
        _reap()
        return []
    stopped = list(left)
    _signal(left, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline and not hurrying():
        time.sleep(0.1)
        _reap()
        left = _ours()
    for _ in range(50):  # new children of dying processes, or ones ignoring SIGTERM
        left = _ours()
        if not left:
            break
        _signal(left, signal.SIGKILL)
        time.sleep(0.05)
        _reap()
    _reap()
    return stopped


@contextlib.contextmanager
def supervised(grace_s: float = DEFAULT_GRACE_S) -> Iterator[None]:
    """See the module docstring. Only the main thread can install signal handlers; nested
    use is a no-op."""
    if state.active or threading.current_thread() is not threading.main_thread():
        yield
        return
    state.preexisting = frozenset(descendants())
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    previous = {signum: signal.signal(signum, _handler) for signum in STOP_SIGNALS}
    state.active, state.cleaning = True, False
    state.hurry.clear()
    os.environ.setdefault(SESSION_VARIABLE, uuid.uuid4().hex)
    try:
        yield
    finally:
        state.cleaning = True
        try:
            stop_descendants(grace_s)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            _prctl(PR_SET_CHILD_SUBREAPER, 0)
            state.active = state.cleaning = False


def wait(process: subprocess.Popen, timeout_s: float) -> int | None:
    """Wait for `process` up to `timeout_s`, less if a second stop signal asks to hurry."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not hurrying():
        code = process.poll()
        if code is not None:
            return code
        time.sleep(0.05)
    return process.poll()


def run_step(argv: list[str], *, cwd: Path, env: Mapping[str, str] | None, grace_s: float = DEFAULT_GRACE_S, **kwargs) -> int:
    """Run a command in its own session and wait; on a stop signal pass it on once, give
    the command `grace_s` to clean up after itself, then stop what is left."""
    process = subprocess.Popen(argv, cwd=cwd, env=env, **popen_kwargs(), **kwargs)
    try:
        return process.wait()
    except Interrupted as interrupted:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(interrupted.signum)
        if wait(process, grace_s) is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        raise
