"""`python -m jobs`: the jobs CLI (see jobs/cli.py)."""

from jobs.cli import main

if __name__ == "__main__":
    main()
