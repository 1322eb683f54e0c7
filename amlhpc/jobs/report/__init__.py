"""`jobs report RUN`: one self-contained HTML page with a run's plots and records.

records.py reads what the run wrote (metric lines, telemetry, launcher and staging reports,
attempts and the managed-run record), figures.py draws each plot to SVG, page.py lays them
out. `write()` puts them together.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from amlhpc.core import atomic
from amlhpc.jobs.report import figures, page, records

REPORT_FILE = "report.html"


def write(folder: Path, out: Path | None = None, run: str | None = None, now: datetime | None = None) -> Path:
    """Read the run in `folder`, write its page (default `<folder>/report.html`), return its path."""
    figures.require_matplotlib()
    found = records.read(folder, run)
    target = out or folder / REPORT_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    return atomic.write_text(target, page.render(found, figures.all_plots(found), now))
