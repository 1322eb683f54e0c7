"""What a stack's clusters cost and which GPU quota they need, from the SKU catalog.

Cost covers the GPU nodes and, in an environment, the managed runs' controller nodes (CPU,
scaled to zero when idle); storage, registry, networking and logs are billed by use.
Low-priority nodes are priced at the on-demand reference, an upper bound: their discount
varies by region and over time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from core import pricing
from core.quota import Need, needs
from infra.config import StackConfig


@dataclass(frozen=True)
class ClusterCost:
    name: str
    sku: str
    priority: str
    min_nodes: int
    max_nodes: int
    usd_per_node_hour: float | None
    price_source: str

    @property
    def full_scale_usd_per_hour(self) -> float | None:
        return None if self.usd_per_node_hour is None else self.max_nodes * self.usd_per_node_hour

    @property
    def idle_usd_per_day(self) -> float | None:
        return None if self.usd_per_node_hour is None else self.min_nodes * self.usd_per_node_hour * 24


@dataclass(frozen=True)
class Cost:
    clusters: tuple[ClusterCost, ...]

    @property
    def full_scale_usd_per_hour(self) -> float:
        return sum(c.full_scale_usd_per_hour or 0.0 for c in self.clusters)

    @property
    def idle_usd_per_day(self) -> float:
        return sum(c.idle_usd_per_day or 0.0 for c in self.clusters)

    @property
    def unpriced(self) -> list[str]:
        return [c.name for c in self.clusters if c.usd_per_node_hour is None]

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
        ))
    ctl = cfg.controller
    if cfg.kind == "environment" and ctl.enabled:  # program.py declares it in environments only
        rows.append(ClusterCost(name=ctl.name, sku=ctl.sku, priority="Dedicated", min_nodes=0, max_nodes=ctl.max_nodes,
                                usd_per_node_hour=ctl.price, price_source=ctl.price_source(cfg.source)))
    return Cost(tuple(rows))


def quota(cfg: StackConfig) -> list[Need]:
    """vCPUs needed at full scale per quota bucket (dedicated per family; low priority pooled)."""
    return needs((c.name, c.sku, c.priority, c.max_nodes) for c in cfg.clusters)
