"""`python -m amlhpc.core.catalog refresh ...`: see amlhpc/core/catalog/refresh.py."""

from amlhpc.core.catalog.refresh import app
from amlhpc.core.cli_help import run

if __name__ == "__main__":
    run(app, "python -m amlhpc.core.catalog")
