"""What a job costs: nodes x hours x price per node-hour.

The price of each size comes with the stack's outputs (`prices`, resolved by infra from the
stack's overrides and the catalog, amlhpc.core.pricing); a size the outputs do not price falls
back to the catalog's reference price. Low-priority nodes are priced at the on-demand
figure: an upper bound, since the discount varies by region and over time.

The check against a published figure: NAG's CosmoFlow tutorial (2021) ran 4 x ND40rs_v2
for 11.5 h at $26.438/h = $1,216.15.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from amlhpc.core import invocation, pricing, skus
from amlhpc.core.errors import Problem, UserError
from amlhpc.core.skus import Price


@dataclass(frozen=True)
class Estimate:
    sku: str
    nodes: int
    hours: float
    usd_per_node_hour: float
    price_source: str
    price_region: str
    priority: str
    price_from_stack: bool = False

    @property
    def node_hours(self) -> float:
        return self.nodes * self.hours

    @property
    def usd(self) -> float:
        return round(self.node_hours * self.usd_per_node_hour, 2)

    def notes(self, stack_location: str | None = None) -> list[str]:
        out = []
        retired = skus.get(self.sku).retirement
        if retired:
            out.append(retired)
        if self.priority == "LowPriority":
            out.append("low-priority nodes priced at the on-demand rate (an upper bound)")
        if stack_location and not self.price_from_stack and self.price_region not in (stack_location, ""):
            out.append(f"reference price is for {self.price_region}, the stack is in {stack_location}: "
                       f"set aml-hpc:prices.{self.sku} in the stack file for your rate")
        return out


def price(sku_name: str, stack_prices: Mapping[str, Price] | None = None) -> Price:
    """The stack's price for a size (from its outputs), else the catalog's; UserError when none."""
    found = (stack_prices or {}).get(sku_name) or pricing.node_hour_price(sku_name)
    if found is None:
        raise UserError([Problem("amlhpc/core/catalog/skus.toml", sku_name, "has no reference price",
                                 f"set one in the stack: pulumi config set --path 'aml-hpc:prices.{sku_name}' <usd-per-hour>, "
                                 "then deploy (or plan --offline) so the outputs carry it; or record Azure's list price "
                                 f"in the catalog: {invocation.module('amlhpc.core.catalog', 'refresh --size ' + sku_name)}")],
                        "cannot estimate cost")
    return found


def estimate(sku_name: str, nodes: int, hours: float, stack_prices: Mapping[str, Price] | None = None,
             priority: str = "Dedicated") -> Estimate:
    if nodes < 1 or hours <= 0:
        raise UserError([Problem("estimate", "nodes/hours", f"nodes={nodes}, hours={hours}: both must be positive",
                                 "pass --nodes >= 1 and --hours > 0")], "cannot estimate cost")
    found = price(sku_name, stack_prices)
    return Estimate(sku_name, nodes, hours, found.usd_per_hour, pricing.describe(found), found.region, priority,
                    pricing.is_override(found))


def over_limits(estimate_usd: float, ceiling_usd: float | None, budget_usd: float | None) -> list[str]:
    """Why a job costs too much to submit without --yes (empty: fine)."""
    reasons = []
    if ceiling_usd is not None and estimate_usd > ceiling_usd:
        reasons.append(f"estimate ${estimate_usd:,.2f} exceeds the recipe's cost ceiling ${ceiling_usd:,.2f} (cost.ceiling_usd)")
    if budget_usd is not None and estimate_usd > budget_usd:
        reasons.append(f"estimate ${estimate_usd:,.2f} exceeds the stack's monthly budget ${budget_usd:,.2f}")
    return reasons
