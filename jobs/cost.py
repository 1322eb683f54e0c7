"""What a job costs: nodes x hours x price per node-hour, from the catalog or the stack.

The price is the stack's override (`aml-hpc:prices` in Pulumi.<stack>.yaml) when it has
one for the size, else the catalog's reference price (one region, one date: both are
reported, so a user can tell when to override). Low-priority nodes are priced at the
on-demand figure: an upper bound, since the discount varies by region and over time.

Seed 000's figure is the check: 4 x ND40rs_v2 x 11.5 h at $26.438/h = $1,216.15.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra import skus
from infra.errors import Problem, UserError


@dataclass(frozen=True)
class Estimate:
    sku: str
    nodes: int
    hours: float
    usd_per_node_hour: float
    price_source: str
    price_region: str
    priority: str

    @property
    def node_hours(self) -> float:
        return self.nodes * self.hours

    @property
    def usd(self) -> float:
        return round(self.node_hours * self.usd_per_node_hour, 2)

    def notes(self, stack_location: str | None = None) -> list[str]:
        out = []
        if self.priority == "LowPriority":
            out.append("low-priority nodes priced at the on-demand rate (an upper bound)")
        if stack_location and self.price_region not in (stack_location, "") and self.price_source != "stack":
            out.append(f"reference price is for {self.price_region}, the stack is in {stack_location}: "
                       f"set aml-hpc:prices.{self.sku} in the stack file for your rate")
        return out


def price(sku_name: str, overrides: dict[str, float] | None = None) -> tuple[float, str, str]:
    """(USD per node-hour, source, region) for a size; UserError when nothing prices it."""
    overrides = overrides or {}
    if sku_name in overrides:
        return float(overrides[sku_name]), "stack", ""
    reference = skus.get(sku_name).price
    if reference is None:
        raise UserError([Problem("infra/skus.py", sku_name, "has no reference price",
                                 f"set one in the stack: pulumi config set --path 'aml-hpc:prices.{sku_name}' <usd-per-hour>")],
                        "cannot estimate cost")
    return reference.usd_per_hour, f"catalog ({reference.source}, {reference.as_of})", reference.region


def estimate(sku_name: str, nodes: int, hours: float, overrides: dict[str, float] | None = None,
             priority: str = "Dedicated") -> Estimate:
    if nodes < 1 or hours <= 0:
        raise UserError([Problem("estimate", "nodes/hours", f"nodes={nodes}, hours={hours}: both must be positive",
                                 "pass --nodes >= 1 and --hours > 0")], "cannot estimate cost")
    usd, source, region = price(sku_name, overrides)
    return Estimate(sku_name, nodes, hours, usd, source, region, priority)


def over_limits(estimate_usd: float, ceiling_usd: float | None, budget_usd: float | None) -> list[str]:
    """Why a job costs too much to submit without --yes (empty: fine)."""
    reasons = []
    if ceiling_usd is not None and estimate_usd > ceiling_usd:
        reasons.append(f"estimate ${estimate_usd:,.2f} exceeds the recipe's cost ceiling ${ceiling_usd:,.2f} (cost.ceiling_usd)")
    if budget_usd is not None and estimate_usd > budget_usd:
        reasons.append(f"estimate ${estimate_usd:,.2f} exceeds the stack's monthly budget ${budget_usd:,.2f}")
    return reasons
