"""The catalog: data files (skus.toml, nccl.toml, availability.toml, read by core.skus,
core.nccl and core.availability) and the fetcher that refreshes prices and size facts from
Azure (`python -m core.catalog refresh`, core/catalog/refresh.py)."""
