"""`python -m images`: build, list and check the training images (see images/cli.py)."""

from images.cli import main

if __name__ == "__main__":
    main()
