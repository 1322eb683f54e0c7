"""`python -m amlhpc`: the `aml-hpc` command (amlhpc/app.py)."""

from amlhpc.core.interpreter import check

check("amlhpc")

from amlhpc.app import main  # noqa: E402

if __name__ == "__main__":
    main()
