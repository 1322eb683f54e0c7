"""What a stack's clusters cost and which GPU quota they need, from the SKU catalog.

Cost covers the GPU nodes and, in an environment, the managed runs' controller nodes (CPU,
scaled to zero when idle); storage, registry, networking and logs are billed by use.
Low-priority nodes are priced at the on-demand reference, an upper bound: their discount
varies by region and over time.

A size without a price is "unpriced", never $0: the totals are then lower bounds and say
so. Each price carries its region; a stack elsewhere is told which region's rows it reads
(Azure's prices differ by region, and the catalog holds one region's).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from amlhpc.core import pricing
from amlhpc.core.quota import Need, needs
from amlhpc.infra.config import CONTROLLER_PRICE_REGION, StackConfig


@dataclass(frozen=True)
class ClusterCost:
    name: str
    sku: str
    priority: str
    min_nodes: int
    max_nodes: int
    usd_per_node_hour: float | None
    price_source: str
    price_region: str | None = None
    """Where the price was read (the catalog's row region, or the stack's own for an override)."""

    @property
    def full_scale_usd_per_hour(self) -> float | None:
        return None if self.usd_per_node_hour is None else self.max_nodes * self.usd_per_node_hour

    @property
    def idle_usd_per_day(self) -> float | None:
        return None if self.usd_per_node_hour is None else self.min_nodes * self.usd_per_node_hour * 24


@dataclass(frozen=True)
class Cost:
    clusters: tuple[ClusterCost, ...]
    location: str = ""
    """The stack's region."""

    @property
    def full_scale_usd_per_hour(self) -> float:
        return sum(c.full_scale_usd_per_hour or 0.0 for c in self.clusters)

    @property
    def idle_usd_per_day(self) -> float:
        return sum(c.idle_usd_per_day or 0.0 for c in self.clusters)

    @property
    def unpriced(self) -> list[str]:
        return [c.name for c in self.clusters if c.usd_per_node_hour is None]

    @property
    def price_regions(self) -> list[str]:
        return sorted({c.price_region for c in self.clusters if c.price_region})

    @property
    def priced_elsewhere(self) -> list[str]:
        """Regions whose prices stand in for the stack's own region's."""
        return [r for r in self.price_regions if r != self.location]

    def to_json(self) -> dict[str, Any]:
        return {
            "fullScaleUsdPerHour": round(self.full_scale_usd_per_hour, 3),
            "idleUsdPerDay": round(self.idle_usd_per_day, 3),
            "scope": "GPU nodes and the managed runs' controller nodes; low priority priced at on-demand (upper bound)",
            "clusters": [
                {**{k: v for k, v in asdict(c).items()},
                 "fullScaleUsdPerHour": c.full_scale_usd_per_hour, "idleUsdPerDay": c.idle_usd_per_day}
                for c in self.clusters
            ],
            "unpriced": self.unpriced,
            "unpricedSkus": sorted({c.sku for c in self.clusters if c.usd_per_node_hour is None}),
            "location": self.location,
            "priceRegions": self.price_regions,
        }


def cost(cfg: StackConfig) -> Cost:
    rows = []
    for c in cfg.clusters:
        price = cfg.hourly_price(c.sku)
        rows.append(ClusterCost(
            name=c.name, sku=c.sku, priority=c.priority, min_nodes=c.min_nodes, max_nodes=c.max_nodes,
            usd_per_node_hour=price.usd_per_hour if price else None,
            price_source=pricing.describe(price) if price else
            f"no reference price: set aml-hpc:prices.{c.sku} in {cfg.source}",
            price_region=(price.region or cfg.location) if price else None,
        ))
    ctl = cfg.controller
    if cfg.kind == "environment" and ctl.enabled:  # program.py declares it in environments only
        rows.append(ClusterCost(name=ctl.name, sku=ctl.sku, priority="Dedicated", min_nodes=0, max_nodes=ctl.max_nodes,
                                usd_per_node_hour=ctl.price, price_source=ctl.price_source(cfg.source),
                                price_region=cfg.location if ctl.usd_per_hour else CONTROLLER_PRICE_REGION))
    return Cost(tuple(rows), cfg.location)


def quota(cfg: StackConfig) -> list[Need]:
    """vCPUs needed at full scale per quota bucket (dedicated per family; low priority pooled)."""
    return needs((c.name, c.sku, c.priority, c.max_nodes) for c in cfg.clusters)
