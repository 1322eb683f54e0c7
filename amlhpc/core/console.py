r"""Output that reads well on a terminal and in a log: the consoles, tables and progress
lines every command line of the project uses.

- On a terminal, output takes the terminal's width, and a table too narrow for its values
  wraps them inside their cells (`table()`: overflow "fold") instead of cutting them off.
- Off a terminal (a pipe, a file, a CI log) there is no width to fit. `wide_when_piped()`,
  called by each entry point before anything prints, gives such output `PIPED_WIDTH`
  columns unless COLUMNS says otherwise, so a line of text is never broken, while tables
  keep to `PIPED_TABLE_WIDTH` (80: a terminal, a pager, a CI log viewer) by wrapping their
  values inside their cells; a table that had to wrap says how to get every value on one
  line (`-o tsv`, `--json`, or COLUMNS=N). COLUMNS set by the user wins for both.
- `working(message)` says what a step that takes more than a few seconds is doing: a
  spinner on a terminal, one line otherwise (stderr, so stdout stays data).
- Text a job wrote (names, tags, error messages, log lines) may carry terminal control
  sequences: `printable()` shows every C0 and C1 control character but tab and line feed as
  `\xNN`, so `\x1b[2J` cannot clear the screen, an OSC sequence cannot set the clipboard or
  a link, and a carriage return cannot overwrite what was printed. Every table cell goes
  through it (`table()`, `row_table()`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

PIPED_WIDTH = 400
"""Columns given to output that goes to a pipe or a file: wide enough for any table here."""
PIPED_TABLE_WIDTH = 80
"""Columns a table keeps to off a terminal (unless COLUMNS is set)."""
TABLE_WIDTH_VARIABLE = "AMLHPC_TABLE_WIDTH"
"""Where wide_when_piped() leaves PIPED_TABLE_WIDTH for table() (and child processes)."""
PIPED_HELP_WIDTH = 100
"""Columns of `--help` off a terminal: typer's help panels fill their console's width, so
they read typer's own TERMINAL_WIDTH instead of the tables' PIPED_WIDTH."""


def wide_when_piped(stream: TextIO | None = None, environ: dict[str, str] | Any = None) -> None:
    """Off a terminal, and unless COLUMNS is set, let rich use PIPED_WIDTH columns (rich reads
    COLUMNS when a console is created, so call this before any console exists); `--help`
    keeps PIPED_HELP_WIDTH. Child processes inherit both, and print in full too."""
    stream = sys.stdout if stream is None else stream
    environ = os.environ if environ is None else environ
    if environ.get("COLUMNS"):
        return
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    if not terminal:
        environ["COLUMNS"] = str(PIPED_WIDTH)
        environ.setdefault(TABLE_WIDTH_VARIABLE, str(PIPED_TABLE_WIDTH))
        environ.setdefault("TERMINAL_WIDTH", str(PIPED_HELP_WIDTH))


FOLDED = ("wrapped to {cap} columns: -o tsv (lists) or --json prints every value on one line, "
          "COLUMNS=N widens the table")


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 controls but tab and line feed, DEL, and C1 controls (ESC, CSI, OSC... start sequences)."""


def printable(text: Any) -> str:
    """`text` with every control character that could drive a terminal shown as `\\xNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


class FittedTable(Table):
    """A table that keeps to TABLE_WIDTH_VARIABLE's columns when one is set (off a terminal),
    wrapping its cells, and then says so and how to get every value whole. String cells are
    made `printable()`: they often hold what a job wrote."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*(printable(r) if isinstance(r, str) else r for r in renderables), **kwargs)

    def __rich_console__(self, console: Any, options: Any) -> Any:
        cap = _table_cap()
        if cap is not None and self.width is None:
            natural = self.__rich_measure__(console, options).maximum
            if natural > cap:
                self.width = cap
                note = FOLDED.format(cap=cap)
                self.caption = f"{self.caption} ({note})" if self.caption else note
                self.caption_justify = "left"
        yield from super().__rich_console__(console, options)


def _table_cap() -> int | None:
    """The width a table keeps to: set by wide_when_piped, and only while COLUMNS is its own
    (COLUMNS given by the user or a caller wins)."""
    if os.environ.get("COLUMNS") not in (None, str(PIPED_WIDTH)):
        return None
    try:
        return max(20, int(os.environ[TABLE_WIDTH_VARIABLE]))
    except (KeyError, ValueError):
        return None


def table(*headers: str, title: str | None = None, show_header: bool = True, **kwargs: Any) -> Table:
    """A table whose cells wrap rather than lose characters when the output is narrow."""
    t = FittedTable(title=title, show_header=show_header, **kwargs)
    for header in headers:
        t.add_column(header, overflow="fold")
    return t


def row_table(title: str | None = None) -> Table:
    """Two columns, key and value, no header (a single object: `jobs show`)."""
    t = FittedTable(title=title, show_header=False)
    t.add_column("key", overflow="fold", no_wrap=True)
    t.add_column("value", overflow="fold")
    return t


def tsv(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Tab-separated values with a header line: every value whole on one line (tabs and line
    breaks inside a value become spaces), none of a table's folding."""

    def cell(value: Any) -> str:
        return " ".join(str("" if value is None else value).split())

    return "".join("\t".join(cell(v) for v in row) + "\n" for row in [list(headers), *rows])


@contextmanager
def working(console: Console, message: str) -> Iterator[None]:
    """`message` while the block runs: a spinner on a terminal, else one line up front."""
    if console.is_terminal:
        with console.status(message):
            yield
        return
    console.print(message, highlight=False, markup=False, soft_wrap=True)
    yield
