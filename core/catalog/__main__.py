"""`python -m core.catalog refresh ...`: see core/catalog/refresh.py."""

from core.catalog.refresh import app

if __name__ == "__main__":
    app(prog_name="python -m core.catalog")
