"""The project's one error type for bad input: where it is, what is wrong, how to fix it.

Validators collect `Problem`s and raise one `UserError` holding all of them, so a user
fixes every mistake in one pass. CLIs print `UserError.render()` and exit with
`EXIT_USAGE`; a traceback is shown only with `--debug`. Pure: no Pulumi, no Azure SDK
(`amlhpc/jobs/` imports it too).

What the machine refuses (a read-only or full folder, a missing tool: an `OSError`) is
the user's to fix as well: `os_error_line()` says it in one line with the fix, and the
same guard exits with it (EXIT_USAGE, nothing half-done) instead of a traceback.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NoReturn

from amlhpc.core import invocation

EXIT_FAILURE = 1
"""Exit status when the command ran and what it did or checked failed."""
EXIT_USAGE = 2
"""Exit status for bad input (config, recipe, flags), as argparse and typer use; also what
this machine refused (a read-only folder, a missing tool): nothing was done."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input.

    reference: the file (or source) the value came from, e.g. "Pulumi.dev.yaml".
    path: where in it, e.g. "aml-hpc:clusters[0].sku".
    message: what is wrong, naming the bad value.
    hint: what is allowed and how to fix it (a command, a valid value).
    """

    reference: str
    path: str
    message: str
    hint: str = ""

    def render(self) -> str:
        where = f"{self.reference}: {self.path}" if self.path else self.reference
        text = f"{where}: {self.message}"
        if self.hint:
            text += f"\n    fix: {self.hint}"
        return text


@dataclass
class UserError(Exception):
    """Bad input, with every problem found. Raise once, after collecting."""

    problems: list[Problem] = field(default_factory=list)
    title: str = "invalid input"

    def __post_init__(self) -> None:
        super().__init__(self.render())

    def render(self) -> str:
        count = len(self.problems)
        head = f"{self.title} ({count} problem{'s' if count != 1 else ''}):"
        return "\n".join([head, *("  - " + p.render().replace("\n", "\n  ") for p in self.problems)])

    def __str__(self) -> str:
        return self.render()


class ProblemCollector:
    """Collects problems for one reference; `raise_if_any` raises them together."""

    def __init__(self, reference: str, title: str = "invalid input"):
        self.reference = reference
        self.title = title
        self.problems: list[Problem] = []

    def add(self, path: str, message: str, hint: str = "") -> None:
        self.problems.append(Problem(self.reference, path, message, hint))

    def extend(self, problems: list[Problem]) -> None:
        self.problems.extend(problems)

    def raise_if_any(self) -> None:
        if self.problems:
            raise UserError(list(self.problems), self.title)


_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_NOT_ALLOWED = {errno.EACCES, errno.EPERM}


def _shown(path: object) -> str:
    """A path as the user would type it: relative to the current folder when inside it."""
    text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
    try:
        relative = os.path.relpath(text)
    except ValueError:
        return text
    return text if relative.startswith("..") else relative


_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\] ([^:']+)")


def _first_of_many(exc: shutil.Error) -> tuple[OSError, int] | None:
    """shutil.copytree's error (a list of (source, destination, why) for every file that
    failed, which can run to thousands) as the first failure, an OSError, and the count."""
    failures = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
    for failure in failures:
        if isinstance(failure, (tuple, list)) and len(failure) == 3:
            source, destination, why = failure
            match = _ERRNO_IN_TEXT.search(str(why))
            if match:
                code = int(match.group(1))
                target = source if code in _NOT_ALLOWED and not os.access(source, os.R_OK) else destination
                return OSError(code, match.group(2).strip(), target), len(failures)
            return OSError(None, str(why).splitlines()[0][:200], destination), len(failures)
    return None


def _unreadable(path: str) -> bool:
    """`path` exists and this process may not read it (a folder: list it)."""
    mode = os.R_OK | (os.X_OK if os.path.isdir(path) else 0)
    return os.path.lexists(path) and not os.access(path, mode)


def os_error_line(exc: OSError) -> str:
    """One line: what the machine refused, on which path or tool, and what fixes it."""
    if isinstance(exc, shutil.Error):
        first = _first_of_many(exc)
        if first is None:
            return f"copying failed: {str(exc)[:200]}: fix: check the folders' space and permissions, or rerun with --debug"
        inner, count = first
        more = f" (and {count - 1:,} more file(s) like it)" if count > 1 else ""
        line = os_error_line(inner)
        head, sep, fix = line.partition(": fix: ")
        return f"{head}{more}{sep}{fix}" if sep else line + more
    path = _shown(exc.filename) if exc.filename is not None else None
    reason = (exc.strerror or str(exc)).rstrip(".").lower()
    if exc.errno in _NO_SPACE:
        return (f"no space left on the device holding {path or 'the output'}: fix: free some space "
                f"(`{invocation.clean()}` removes .rehearsal/, .scratch/ and .azurite/), or pass --workdir on another disk")
    if exc.errno in _NOT_ALLOWED and exc.filename is not None and _unreadable(os.fsdecode(exc.filename)):
        return (f"cannot read {path}: {reason}: fix: make it readable (chmod u+r {path}), or leave it out of the "
                "folder you pass")
    if exc.errno == errno.EROFS or exc.errno in _NOT_ALLOWED:
        where = path or "a file"
        return (f"cannot write {where}: {reason}: fix: make it writable (chmod -R u+w {where}), or run from a "
                "project folder you own (aml-hpc --project DIR)")
    if exc.errno == errno.ENOENT and path and os.sep not in path and isinstance(exc, FileNotFoundError) \
            and not os.path.exists(path):
        return f"{path}: command not found: fix: install {path}, or add the folder holding it to PATH"
    if exc.errno == errno.ENOENT:
        return f"{path or 'a file'}: no such file or folder: fix: check the path (and the folder you run from)"
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        return (f"{path or 'a path'}: a file (or a broken link) is where a folder is needed: fix: move it out of the "
                "way, or point the command at another folder")
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return f"{reason}: fix: check the network, and that the service it names is running"
    return f"{path + ': ' if path else ''}{reason}: fix: check the path and its permissions, or rerun with --debug"


def exit_on_os_error(exc: OSError, debug: bool = False) -> NoReturn:
    """For CLIs: the one line of `os_error_line` on stderr and EXIT_USAGE; --debug re-raises."""
    if debug:
        raise exc
    if exc.errno == errno.EPIPE:  # the reader went away (`| head`): nothing to say to it
        raise SystemExit(EXIT_FAILURE)
    sys.stderr.write("error: " + os_error_line(exc) + "\n")
    raise SystemExit(EXIT_USAGE)


def exit_with(exc: UserError, debug: bool = False) -> NoReturn:
    """For CLIs: print the error's block on stderr (plain text: no wrapping, no markup) and
    exit EXIT_USAGE; with --debug, re-raise for the traceback instead."""
    if debug:
        raise exc
    sys.stderr.write(exc.render() + "\n")
    raise SystemExit(EXIT_USAGE)


@contextmanager
def exit_on_bad_input(debug: bool = False) -> Iterator[None]:
    """`with exit_on_bad_input(debug): ...` - a UserError inside becomes `exit_with`, an
    OSError `exit_on_os_error`."""
    try:
        yield
    except UserError as exc:
        exit_with(exc, debug)
    except OSError as exc:
        exit_on_os_error(exc, debug)
