"""Every fact of the catalog with the source it comes from and that source's date.

    python -m amlhpc.core.catalog facts [--size NAME] [--json]

The catalog's three data files each cite their sources ([sources] tables): skus.toml (a size's
hardware, pass marks, price, Azure ML support, conflicts between Microsoft's sources),
availability.toml (regions, low priority) and nccl.toml (the environment per size). This module
walks them and yields one `Fact` per figure, each resolved to its source's title, URL and date,
so a reviewer can check any figure against where it was read, and a test can hold that no
figure is left without a source and a date.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from amlhpc.core import availability, nccl, skus


@dataclass(frozen=True)
class Fact:
    file: str
    """The catalog file that holds it (skus.toml, availability.toml, nccl.toml)."""
    subject: str
    """The VM size (or storage_account, azureml, container_registry: the service limits)."""
    key: str
    value: Any
    source: str
    """Source id."""
    as_of: str
    """The source's date."""
    title: str
    url: str


_GEMM_TORCH = ("gemm_torch_tflops", "gemm_torch_measured_on")


def _health_source(health: skus.HealthThresholds, key: str) -> str:
    if key in _GEMM_TORCH:
        return health.gemm_torch_source
    if key.startswith("gemm_"):
        return health.gemm_source
    return health.source


def _sku_facts(sku: skus.Sku) -> Iterator[tuple[str, Any, str]]:
    """(key, value, source id) of every figure the size's record holds."""
    for key in skus.FACT_KEYS:
        value = getattr(sku, key)
        if value is not None:
            yield key, value, sku.fact_source(key)
    defaults = skus.HealthThresholds()
    for field in fields(skus.HealthThresholds):
        value = getattr(sku.health, field.name)
        if field.name in ("source", "gemm_source", "gemm_torch_source", "multinode") or value == getattr(defaults, field.name):
            continue
        yield f"health.{field.name}", value, _health_source(sku.health, field.name)
    for band in sku.health.multinode:
        key = f"health.multinode.{band.scope}{'.sharp' if band.sharp else ''}"
        yield key, list(band.busbw_gbytes_per_s), band.source
    if sku.price is not None:
        yield "price", f"{sku.price.usd_per_hour} USD/h in {sku.price.region} ({sku.price.as_of})", sku.price.source
    yield "azureml.amlcompute", sku.azureml.amlcompute, sku.azureml.source
    if sku.nvlink_domain is not None:
        yield "nvlink_domain", f"{sku.nvlink_domain.vms} VMs, {sku.nvlink_domain.gpus} GPUs", sku.nvlink_domain.source
    for conflict in sku.conflicts:
        yield f"conflict.{conflict.fact}", conflict.other, conflict.other_source


def catalog_facts(size: str | None = None) -> list[Fact]:
    """Every fact, or the given size's, each with its source and date."""
    out: list[Fact] = []

    def add(file: str, subject: str, key: str, value: Any, source_id: str, sources) -> None:
        source = sources.get(source_id)
        out.append(Fact(file, subject, key, value, source_id, source.as_of if source else "",
                        source.title if source else "", source.url if source else ""))

    for name, sku in skus.CATALOG.items():
        if size in (None, name):
            for key, value, source_id in _sku_facts(sku):
                add("skus.toml", name, key, value, source_id, skus.SOURCES)
    if size is None:
        limits = skus.STORAGE_ACCOUNT
        for field in fields(skus.StorageAccountLimits):
            if field.name != "source":
                add("skus.toml", "storage_account", field.name, getattr(limits, field.name), limits.source, skus.SOURCES)
        for found in skus.LIMITS.values():
            add("skus.toml", found.subject, found.key, found.value, found.source, skus.SOURCES)
    for name, offering in availability.OFFERINGS.items():
        if size not in (None, name):
            continue
        listed = sorted(set(offering.regions) - set(dict(offering.seen_in)))
        add("availability.toml", name, "regions" + ("" if offering.complete else " (partial)"), listed,
            offering.source, availability.SOURCES)
        for region, source_id in offering.seen_in:
            add("availability.toml", name, f"seen_in.{region}", True, source_id, availability.SOURCES)
        if offering.retired is not None:
            add("availability.toml", name, "retired", offering.retired.isoformat(), offering.source, availability.SOURCES)
        if offering.low_priority is not None:
            add("availability.toml", name, "low_priority", offering.low_priority, offering.low_priority_source,
                availability.SOURCES)
    for setting in nccl.SETTINGS:
        for name in setting.sizes:
            if size in (None, name):
                add("nccl.toml", name, setting.name + (f" ({setting.opt_in})" if setting.opt_in else ""), setting.value,
                    setting.source, nccl.SOURCES)
    return out


def render(facts: list[Fact], as_json: bool = False) -> str:
    if as_json:
        return json.dumps([f.__dict__ for f in facts], indent=1, default=str)
    lines = [f"{f.file}  {f.subject}  {f.key} = {f.value!r}  <- {f.source} ({f.as_of})" for f in facts]
    lines.append(f"{len(facts)} facts, {len({f.source for f in facts})} sources")
    return "\n".join(lines)
