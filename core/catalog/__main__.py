"""`python -m core.catalog refresh ...`: see core/catalog/refresh.py."""

from core.catalog.refresh import app
from core.cli_help import run

if __name__ == "__main__":
    run(app, "python -m core.catalog")
