"""`python -m images`: build, list and check the training images (see images/cli.py)."""

from images.cli import app

if __name__ == "__main__":
    app(prog_name="python -m images")
