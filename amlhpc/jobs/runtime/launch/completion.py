"""Did a training command that died at exit finish its work first?

A process can crash after its last line of training code: in its interpreter's shutdown, a
native library's thread or destructor can abort it (SIGABRT, "terminate called without an
active exception") or fault (SIGSEGV). Reported as is, that turns a training whose final
checkpoint is on disk into a failed job, and a managed run into a "training error".

The training says when it is done: `amlhpc.jobs.runtime.base.progress.report_completed(step, checkpoint)`
(the shipped workloads do it in amlhpc/jobs/workloads/common.py's `Metrics.summary`). After the
command exits, the launcher asks `after_completion` whether the death came after that: only
then is the exit counted as the success it was, and the launcher's report says what happened
(`exit_after_completion`). Everything else stays a failure:

- no completion reported, or a later step reported after it;
- an exit status of the program's own choosing (`sys.exit(3)` after the completion is a
  decision, not a crash): only a death by SIGABRT, SIGSEGV, SIGBUS, SIGFPE or SIGILL counts,
  as the signal itself (-N) or as a shell reports it (128+N);
- a command that was being stopped (the launcher forwarded SIGTERM/SIGINT/SIGHUP) or that
  the hang watchdog stopped;
- a completion that names a checkpoint file which does not exist.

Standard library only: ships in the image.
"""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from amlhpc.jobs.runtime.base.progress import Progress

CRASH_SIGNALS = (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)
"""Signals a process raises on itself when native code fails (abort(), a fault), never a stop request."""


@dataclass(frozen=True)
class AfterCompletion:
    """A command that completed its training, then died by `signal` (status as a shell says it)."""

    status: int
    signal: str
    step: int
    checkpoint: str | None

    def to_json(self) -> dict:
        return asdict(self)

    def message(self) -> str:
        where = f", final checkpoint {self.checkpoint}" if self.checkpoint else ""
        return (f"the training completed (step {self.step}{where}) and then died with {self.signal} (exit {self.status}) "
                "while its interpreter shut down: counted as completed")


def crash_signal(returncode: int) -> signal.Signals | None:
    """The crash signal a Popen return code (-N) or a shell status (128+N) stands for."""
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
    if number is None:
        return None
    try:
        found = signal.Signals(number)
    except ValueError:
        return None
    return found if found in CRASH_SIGNALS else None


def after_completion(returncode: int, reading: Progress | None, *, stopped: bool, hung: bool) -> AfterCompletion | None:
    """The completed training behind a crashed exit, or None when the exit is a failure."""
    crash = crash_signal(returncode)
    if crash is None or stopped or hung or reading is None or reading.completed_step is None:
        return None
    if reading.step != reading.completed_step:
        return None  # it went on reporting steps after it said it was done
    if reading.completed_checkpoint and not Path(reading.completed_checkpoint).exists():
        return None
    status = 128 + int(crash)
    return AfterCompletion(status, crash.name, reading.completed_step, reading.completed_checkpoint)
