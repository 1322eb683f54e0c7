"""The manners every command line of the project shares (jobs, infra, images and `aml-hpc`).

- `-h` as well as `--help`; `--version` on every entry point; shell completion
  (`--install-completion`, `--show-completion`) on every app, through typer's own options.
- Help screens show flags as flags: `--json`, not `--json <bool>`. Typer's rich help prints
  an option's type unless the option has a metavar (`TyperOption.display_type_rich`), and a
  flag takes no value, so `BareFlagsGroup` (given to typer through its public `cls=`) gives
  every flag of the command tree an empty metavar when the group's parameters are read.
- The exit statuses, one table for every command (`EXIT_STATUSES`), shown at the foot of
  each app's `--help` and rendered into docs/cli.md.
- `run(app)`: the entry point's wrapper. Output off a terminal is printed in full
  (amlhpc/core/console.py); bad input and what the machine refuses (a read-only or full folder, a
  missing tool) end as one short block or line, never a traceback, unless `--debug`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from amlhpc.core.console import wide_when_piped
from amlhpc.core.errors import UserError, exit_on_os_error, exit_with
from amlhpc.core.version import __version__

HELP_OPTIONS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

EXIT_STATUSES: list[tuple[str, str, str]] = [
    ("0", "done: every step succeeded and every check passed", "all"),
    ("1", "it ran, and what it ran or checked failed: a quota short, a failing doctor check, an image "
          "build, a rehearsal or a managed run that did not succeed", "all"),
    ("2", "nothing was done: bad input (flags, stack file, recipe, stack outputs), or what this "
          "machine refused (a read-only or full folder, a missing tool, the wrong Python); the message "
          "names the fix", "all"),
    ("3", "a mandatory policy rule is violated", "infra plan --policy"),
    ("3-9", "the launcher's status of the first process that failed: 3 health gate, 4 staging, "
            "5 restore, 6 final upload, 7 hang, 8 NCCL over sockets, 9 storage access (docs/runtime.md)",
            "jobs run"),
    ("other", "the Pulumi CLI's own status, once it ran and failed (a missing CLI, passphrase or subscription is 2)",
     "infra preview, up, down, destroy"),
    ("130", "interrupted (Ctrl-C); 128+N after signal N: everything it started was stopped", "all"),
]
"""(status, meaning, commands) for every exit status the command lines use."""



def exit_status_epilog() -> str:
    """The same table for the foot of `--help` (typer's rich help keeps the line breaks)."""
    rows = "\n\n".join(f"{code}: {meaning}" + ("" if where == "all" else f" ({where})")
                       for code, meaning, where in EXIT_STATUSES)
    return f"Exit status:\n\n{rows}"


def _bare_flags(command: Any, ctx: Any, params: list[Any] | None = None) -> None:
    """Empty metavars for the flags of `command` and of every command below it (their help
    options included: `get_params` makes and keeps them, with the names `ctx` gives)."""
    for param in command.get_params(ctx) if params is None else params:
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        _bare_flags(sub, ctx)


class BareFlagsGroup(TyperGroup):
    """A typer group whose help shows flags (its own, and every command's below it) without a type."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        _bare_flags(self, ctx, params)
        return params


def _print_version(value: bool) -> None:
    if value:
        print(f"aml-hpc {__version__}")
        raise typer.Exit()


JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON (for scripts) instead of a table.")]
"""`--json` on every command that prints data."""


class OutputFormat(StrEnum):
    """How a list prints (az's `-o`): a table for people, JSON or tab-separated values for scripts."""

    table = "table"
    json = "json"
    tsv = "tsv"


OutputOption = Annotated[OutputFormat | None, typer.Option("--output", "-o", help="table (default), json (as --json) or "
                                                             "tsv: one row per line, every column, tab-separated, "
                                                             "with a header line (for cut, awk, sort).")]
"""`-o table|json|tsv` on every command that prints a list."""


def output_format(output: OutputFormat | None, as_json: bool) -> OutputFormat:
    """The format asked for: `-o`, else `--json`, else a table (both given must agree)."""
    if output is not None and as_json and output is not OutputFormat.json:
        from amlhpc.core.errors import Problem

        raise UserError([Problem("command line", "--json/-o", f"--json and -o {output.value} ask for two formats",
                                 "give one of them")], "invalid flags")
    return output or (OutputFormat.json if as_json else OutputFormat.table)

VersionOption = Annotated[bool, typer.Option("--version", help="Print aml-hpc's version and exit.",
                                             callback=_print_version, is_eager=True)]
"""Add to an app's callback: `version: VersionOption = False`."""


def new_app(help: str, **settings: Any) -> typer.Typer:
    """A typer app with the shared manners (its callback adds VersionOption)."""
    defaults: dict[str, Any] = {
        "cls": BareFlagsGroup, "context_settings": HELP_OPTIONS, "no_args_is_help": True,
        "pretty_exceptions_enable": False, "add_completion": True, "epilog": exit_status_epilog(),
    }
    return typer.Typer(help=help, **{**defaults, **settings})


def run(app: typer.Typer, prog_name: str, argv: Sequence[str] | None = None) -> NoReturn:
    """Run `app` as a program: full-width output off a terminal; a UserError or an OSError
    that escaped a command's own guard ends as its short message (traceback with --debug)."""
    args = list(sys.argv[1:] if argv is None else argv)
    wide_when_piped()
    debug = "--debug" in args
    try:
        app(args=args, prog_name=prog_name)
    except UserError as exc:
        exit_with(exc, debug)
    except OSError as exc:
        exit_on_os_error(exc, debug)
    raise SystemExit(0)
