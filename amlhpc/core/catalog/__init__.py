"""The catalog: data files (skus.toml, nccl.toml, availability.toml, read by amlhpc.core.skus,
amlhpc.core.nccl and amlhpc.core.availability) and the fetcher that refreshes prices and size facts from
Azure (`python -m amlhpc.core.catalog refresh`, amlhpc/core/catalog/refresh.py)."""
