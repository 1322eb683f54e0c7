"""The project's one error type for bad input: where it is, what is wrong, how to fix it.

Validators collect `Problem`s and raise one `UserError` holding all of them, so a user
fixes every mistake in one pass. CLIs print `UserError.render()` and exit with
`EXIT_USAGE`; a traceback is shown only with `--debug`. Pure: no Pulumi, no Azure SDK
(`jobs/` imports it too).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NoReturn

EXIT_USAGE = 2
"""Exit status for bad input (config, recipe, flags), as argparse and typer use."""


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


def exit_with(exc: UserError, debug: bool = False) -> NoReturn:
    """For CLIs: print the error's block on stderr (plain text: no wrapping, no markup) and
    exit EXIT_USAGE; with --debug, re-raise for the traceback instead."""
    if debug:
        raise exc
    sys.stderr.write(exc.render() + "\n")
    raise SystemExit(EXIT_USAGE)


@contextmanager
def exit_on_bad_input(debug: bool = False) -> Iterator[None]:
    """`with exit_on_bad_input(debug): ...` - a UserError inside becomes `exit_with`."""
    try:
        yield
    except UserError as exc:
        exit_with(exc, debug)
