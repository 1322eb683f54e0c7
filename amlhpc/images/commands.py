"""The one seam between `images` and the outside world's command-line tools (az, pulumi,
git, docker): a `Runner` takes an argv and returns what the command did.

Tests pass a fake runner that records argv and answers like the real tools; the CLI
uses `SubprocessRunner`. Nothing here ever logs an environment or a command's secret
output: argv only carries names, tags and build args (no secret is a build arg).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def first_error_line(self) -> str:
        for line in (self.stderr or self.stdout).splitlines():
            if line.strip():
                return line.strip()
        return f"exit status {self.returncode}"


class CommandNotFound(Exception):
    """The program itself is not installed (argv[0] not on PATH)."""

    def __init__(self, program: str):
        super().__init__(program)
        self.program = program


class Runner(Protocol):
    def __call__(self, argv: list[str], *, capture: bool = True, cwd: str | None = None) -> CommandResult:
        """Run argv. capture=False streams output to this terminal (long builds)."""
        ...


class SubprocessRunner:
    """Runs commands for real."""

    def __call__(self, argv: list[str], *, capture: bool = True, cwd: str | None = None) -> CommandResult:
        try:
            done = subprocess.run(argv, capture_output=capture, text=True, cwd=cwd, check=False)
        except FileNotFoundError as exc:
            raise CommandNotFound(argv[0]) from exc
        return CommandResult(done.returncode, done.stdout or "", done.stderr or "")
