"""`python -m jobs`: the jobs CLI (see jobs/cli.py)."""

from core.interpreter import check

check("jobs")

from core.cli_help import run  # noqa: E402
from jobs.cli import app  # noqa: E402

if __name__ == "__main__":
    run(app, "python -m jobs")
