"""`python -m amlhpc.jobs`: the jobs CLI (see amlhpc/jobs/cli/main.py)."""

from amlhpc.core.interpreter import check

check("jobs")

from amlhpc.core.cli_help import run  # noqa: E402
from amlhpc.jobs.cli.main import app  # noqa: E402

if __name__ == "__main__":
    run(app, "python -m amlhpc.jobs")
