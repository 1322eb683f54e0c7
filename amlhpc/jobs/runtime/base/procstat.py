"""A process's fields from /proc/PID/stat (proc(5), read 2026-11-28), for the checks that ask the
kernel about a process: its state, its start time, its CPU time.

The second field, the command name in parentheses, may itself hold spaces and parentheses, so
the fields are split after its last ")". Standard library only: ships in the image.
"""

from __future__ import annotations

from pathlib import Path

STATE = 0
"""Index of field 3 (R, S, D, Z, T...) in what `fields` returns."""
UTIME, STIME = 11, 12
"""Fields 14 and 15: user and system CPU time, in clock ticks."""
START_TIME = 19
"""Field 22: when the process started, in clock ticks since boot."""


def fields(pid: int | str) -> list[str] | None:
    """Fields 3 onward of /proc/PID/stat (index 0 is field 3); None where it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, separator, rest = text.rpartition(")")
    return rest.split() if separator else None
