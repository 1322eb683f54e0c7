"""`python -m amlhpc.images`: build, list and check the training images (see amlhpc/images/cli.py)."""

from amlhpc.core.interpreter import check

check("images")

from amlhpc.core.cli_help import run  # noqa: E402
from amlhpc.images.cli import app  # noqa: E402

if __name__ == "__main__":
    run(app, "python -m amlhpc.images")
