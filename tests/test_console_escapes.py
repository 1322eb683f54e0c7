"""Text a job wrote reaches the terminal without driving it (amlhpc/core/console.py printable).

A job name, a tag, an error message or a log line is the job's text: with `\\x1b[2J` in it,
rich printed the sequence and the terminal cleared; an OSC sequence could set the clipboard.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from amlhpc.core.console import printable, row_table, table

CLEAR = "\x1b[2J"


@pytest.mark.parametrize("text, shown", [
    (f"train{CLEAR}ed", "train\\x1b[2Jed"),
    ("\x1b]52;c;ZXZpbA==\x07", "\\x1b]52;c;ZXZpbA==\\x07"),  # OSC 52: set the clipboard
    ("\x9b2J", "\\x9b2J"),                                   # C1 CSI, one byte
    ("done\rfake", "done\\x0dfake"),                           # a carriage return overwrites the line
    ("tab\there\nnext", "tab\there\nnext"),                    # tab and line feed are text
])
def test_printable_shows_every_control_character(text, shown):
    assert printable(text) == shown


def render(renderable) -> str:
    buffer = io.StringIO()
    Console(file=buffer, force_terminal=True, width=200, color_system=None).print(renderable)
    return buffer.getvalue()


@pytest.mark.parametrize("make", [lambda: table("job", "status"), lambda: row_table()])
def test_a_job_name_with_a_clear_screen_is_shown_not_obeyed(make):
    grid = make()
    grid.add_row(f"cosmoflow-{CLEAR}a1", "Failed")
    out = render(grid)
    assert "\x1b" not in out and "cosmoflow-\\x1b[2Ja1" in out


def test_jobs_logs_on_a_terminal_shows_a_log_lines_escape(monkeypatch, capsys, tmp_path):
    """`jobs logs --local` on a terminal: the line is shown with the sequence spelled out."""
    from amlhpc.jobs.cli import run_index, runs

    log = tmp_path / "std_log.txt"
    log.write_text(f"step 10 loss 0.5{CLEAR}\n")
    monkeypatch.setattr(run_index, "local_folder", lambda *_: tmp_path)
    monkeypatch.setattr(run_index, "local_logs", lambda *_: [log])
    monkeypatch.setattr(runs, "_rehearsals", lambda: tmp_path)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    runs.logs("run-1", local=True)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "step 10 loss 0.5\\x1b[2J" in out
