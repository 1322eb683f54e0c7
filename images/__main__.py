"""`python -m images`: build, list and check the training images (see images/cli.py)."""

from core.interpreter import check

check("images")

from core.cli_help import run  # noqa: E402
from images.cli import app  # noqa: E402

if __name__ == "__main__":
    run(app, "python -m images")
