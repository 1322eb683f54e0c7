"""A warm standby for the next in-job restart: a Python process that has already started and
imported the heavy modules (torch), waiting to become the training command.

Most of a restarted training's start is the interpreter and `import torch` (seconds, more on a
busy node); the launcher therefore keeps, beside a Python training command, one process that
has done both. On an in-job restart it sends the standby the new run's environment (one JSON
line on its stdin) and the standby runs the command's module or script in place
(`runpy`, as `python -m MODULE` / `python SCRIPT` would), so the restart costs only what the
training itself does when it starts (its process group, data, model, the checkpoint).

    python -m amlhpc.jobs.runtime.launch.standby [--preload torch,numpy] [--ready-file PATH] -- [-u] -m MODULE ARGS...
    python -m amlhpc.jobs.runtime.launch.standby [--preload torch,numpy] [--ready-file PATH] -- [-u] SCRIPT ARGS...

`--ready-file` is written once the preloads are done (the launcher names it to the running
training as AMLHPC_STANDBY_READY, so a test can fail it after the standby is ready), and
`started_file(ready_file)` the moment the standby has read the run's environment and turns into
the command: a launcher that hands the run over and sees no such file within
STANDBY_START_S (the standby is stopped, as every process of a frozen host is, or wedged)
kills it and starts the command cold, and the restart's record says so. A standby handed the
run before it was ready (a fault soon after the start) is still importing, ahead of a cold
start that would import the same from nothing: the launcher waits for it as long as its CPU
time advances (at most PRELOAD_WAIT_S), and gives up STANDBY_START_S after it stopped working.
Before, it was killed 10 s after the handover and the command started cold: the restart took
longer than without a standby (bench.recovery, "fault as it comes").

Only commands of that shape get a standby (`standby_command` says which); any other command
is started cold, as before. The standby has its own session, dies with the launcher, and is
discarded when no restart is left.

Standard library only: ships in the image.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import runpy
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from amlhpc.jobs.runtime.base import procstat

PRELOAD = ("torch", "torch.nn", "torch.optim", "torch._dynamo", "torch.utils.data", "torch.distributed",
           "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict", "torch.distributed.fsdp",
           "numpy")
"""Imported by the standby before it waits (each only when it is installed): torch and the parts a
training resuming from a torch.distributed.checkpoint imports (5 s here), and torch._dynamo, which
the first optimizer imports (3 s here)."""
CPUS_PER_RANK = 2
"""A standby is kept by default (AMLHPC_STANDBY=auto) only where the machine has this many CPUs
for each training process it runs, so that its imports never slow a running training."""


def worth_keeping(cpus: int | None, ranks_on_machine: int) -> bool:
    """Whether `auto` keeps a standby: CPUS_PER_RANK for each rank the machine runs (a node's
    local ranks; in a local rehearsal, every simulated node's, as they share one machine)."""
    return (cpus or 1) >= CPUS_PER_RANK * max(ranks_on_machine, 1)


_PYTHON_FLAGS = ("-u", "-B", "-O", "-OO")
STANDBY_START_S = 10.0
"""How long a launcher waits for a live standby to say it took the run (it answers in
milliseconds: it only reads a line and writes a file), before it starts the command cold."""
PRELOAD_WAIT_S = 300.0
"""The longest a launcher waits for a standby still importing when handed the run."""
_WORK_SAMPLE_S = 0.5


def cpu_seconds(pid: int) -> float | None:
    """The process's CPU time so far (user and system, /proc/PID/stat); None where it cannot be read."""
    fields = procstat.fields(pid)
    try:
        return (int(fields[procstat.UTIME]) + int(fields[procstat.STIME])) / os.sysconf("SC_CLK_TCK") if fields else None
    except (IndexError, ValueError):
        return None


def started_file(ready_file: Path) -> Path:
    """Written by the standby when it has taken the run (see the module docstring)."""
    return ready_file.with_name(f"{ready_file.name}.started")


def _write_pid(path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, path)


def _is_python(executable: str) -> bool:
    return Path(executable).name.startswith("python") or executable == sys.executable


def standby_command(command: Sequence[str], ready_file: Path | None = None) -> list[str] | None:
    """The standby for `command`, or None when it is not `python [-u] -m MODULE ...` or
    `python [-u] SCRIPT ...`."""
    if not command or not _is_python(command[0]):  # (an empty command: standbys are off)
        return None
    rest = list(command[1:])
    flags = []
    while rest and rest[0] in _PYTHON_FLAGS:
        flags.append(rest.pop(0))
    if not rest or (rest[0] == "-m" and len(rest) < 2) or (rest[0] != "-m" and rest[0].startswith("-")):
        return None
    ready = ["--ready-file", str(ready_file)] if ready_file else []
    return [command[0], *flags, "-m", "amlhpc.jobs.runtime.launch.standby", *ready, "--", *rest]


class Standby:
    """One standby process (see the module docstring)."""

    def __init__(self, command: list[str], env: dict[str, str], preexec_fn: Callable[[], None] | None = None,
                 ready_file: Path | None = None):
        self.ready_file = ready_file
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, start_new_session=True,
                                        preexec_fn=preexec_fn)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def activate(self, env: dict[str, str]) -> subprocess.Popen | None:
        """Hand it the run's environment: it becomes the training command. None if it is gone."""
        if not self.alive:
            return None
        stdin = self.process.stdin
        if stdin is None:
            return None
        try:
            stdin.write((json.dumps(env) + "\n").encode())
            stdin.close()
        except (BrokenPipeError, OSError):
            return None
        return self.process

    def took_it(self, within_s: float = STANDBY_START_S, preload_wait_s: float = PRELOAD_WAIT_S) -> bool:
        """After `activate`: whether the standby took the run within `within_s` of its last sign of
        work (True without a ready file to tell by). While it is not ready yet (still importing),
        CPU time it spends counts as work, for at most `preload_wait_s` in all."""
        if self.ready_file is None:
            return True
        marker = started_file(self.ready_file)
        started = time.monotonic()
        deadline = started + within_s
        cpu, sampled = cpu_seconds(self.process.pid), started
        while not marker.exists():
            now = time.monotonic()
            if now - sampled >= _WORK_SAMPLE_S and not self.ready_file.exists():
                spent, sampled = cpu_seconds(self.process.pid), now
                if cpu is not None and spent is not None and spent > cpu:
                    deadline = min(max(deadline, now + within_s), started + preload_wait_s)
                cpu = spent
            if now > deadline:
                return False
            if not self.alive:
                return marker.exists()
            time.sleep(0.02)
        return True

    def discard(self) -> None:
        if self.alive:
            self.process.kill()
        self.process.wait()
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    preload: tuple[str, ...] = PRELOAD
    ready_file = None
    while argv[:1] in (["--preload"], ["--ready-file"]) and len(argv) > 1:
        if argv[0] == "--preload":
            preload = tuple(filter(None, argv[1].split(",")))
        else:
            ready_file = Path(argv[1])
        argv = argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: python -m amlhpc.jobs.runtime.launch.standby [--preload A,B] -- -m MODULE ARGS... | SCRIPT ARGS...",
              file=sys.stderr)
        return 2
    target = argv[1:]
    for name in preload:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # an optional part this torch lacks: the command imports what it needs itself
    if ready_file is not None:
        _write_pid(ready_file)
    line = sys.stdin.readline()
    if not line:
        return 0  # discarded before it was needed
    env = json.loads(line)
    if ready_file is not None:
        _write_pid(started_file(ready_file))
    os.environ.clear()
    os.environ.update(env)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the command's stdin, as a cold start's would be
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = target
        sys.path.insert(0, str(Path(target[0]).resolve().parent))
        runpy.run_path(target[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
