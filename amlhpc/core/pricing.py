"""What a node-hour of a VM size costs: one rule for the offline plan, the stack outputs
and the jobs' estimates.

A stack's override (`aml-hpc:prices.<size>` in Pulumi.<stack>.yaml) wins over the
catalog's reference price (one region, one date, both reported so a user can tell when to
override). The producer (infra) resolves the prices of a stack's sizes into the outputs
document; the consumer (jobs) reads them from there, falling back to the catalog for a
size the stack does not declare. Low-priority nodes are priced at the on-demand figure:
an upper bound, since their discount varies by region and over time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from amlhpc.core import skus
from amlhpc.core.skus import Price

STACK_OVERRIDE = "stack"
"""`Price.as_of` of a price that comes from the stack's own config."""


def node_hour_price(sku_name: str, overrides: Mapping[str, float] | None = None, *,
                    location: str = "", reference: str = "the stack file") -> Price | None:
    """The stack's override for `sku_name`, else the catalog's reference price, else None."""
    if overrides and sku_name in overrides:
        return Price(float(overrides[sku_name]), location, STACK_OVERRIDE, f"{reference}: aml-hpc:prices.{sku_name}")
    return skus.get(sku_name).price


def is_override(price: Price) -> bool:
    return price.as_of == STACK_OVERRIDE


def describe(price: Price) -> str:
    """Where a price comes from, for tables and messages."""
    if is_override(price):
        return price.source
    return f"catalog: {skus.cite(price.source)}, {price.region}, {price.as_of}"


def price_table(sku_names: Iterable[str], overrides: Mapping[str, float] | None = None, *,
                location: str = "", reference: str = "the stack file") -> dict[str, Price]:
    """Prices of the given sizes (unpriced sizes are left out), for the outputs document."""
    table = {}
    for name in sorted(set(sku_names)):
        price = node_hour_price(name, overrides, location=location, reference=reference)
        if price is not None:
            table[name] = price
    return table
