"""A monthly consumption budget with email alerts.

Environment stacks budget their whole resource group. Experiment stacks budget the
environment's group filtered to the resource ids of their own clusters: tags on Azure ML
computes never reach cost records (Azure Resource Manager, "Tag support for Azure
resources": workspaces/computes, tag in cost report: No), so a tag filter would never
count an experiment's GPU hours, while Cost Management does break cost down per compute
(Cloud Adoption Framework, "Manage budgets, costs, and quota for Azure Machine Learning at
organizational scale"). An experiment's budget therefore covers its clusters' node hours
and nothing shared (storage, registry, network), which the environment's budget watches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pulumi
from pulumi_azure_native import consumption

from amlhpc.infra import quirks
from amlhpc.infra.components import ComponentError


@dataclass
class BudgetArgs:
    budget_name: str
    scope: pulumi.Input[str]
    """Resource group id the budget watches."""
    monthly_amount_usd: float
    alert_emails: list[str]
    thresholds_percent: list[int] = field(default_factory=lambda: [50, 80, 100])
    """Actual-spend alerts at these percentages of the amount."""
    forecast_alert: bool = True
    """Also alert when the forecast crosses 100%."""
    resource_ids: list[pulumi.Input[str]] | None = None
    """Only count cost recorded against these resources (an experiment's clusters). Cost
    Management keeps resource ids in lower case, so they are compared lower-cased."""
    start: datetime | None = None
    """Deployment time; the budget starts on the first of that month (UTC)."""


class Budget(pulumi.ComponentResource):
    """A consumption budget on a resource group."""

    def __init__(self, name: str, args: BudgetArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:cost:Budget", name, None, opts)
        if not args.alert_emails:
            raise ComponentError(self, "a budget needs at least one alert email")
        count = len(set(args.thresholds_percent)) + (1 if args.forecast_alert else 0)
        if count > quirks.BUDGET_MAX_NOTIFICATIONS:
            raise ComponentError(self, f"{count} notifications; an Azure budget takes at most "
                                       f"{quirks.BUDGET_MAX_NOTIFICATIONS}")
        notifications = {
            f"actual-{pct}": consumption.NotificationArgs(
                enabled=True, operator="GreaterThanOrEqualTo", threshold=pct,
                threshold_type="Actual", contact_emails=args.alert_emails,
            )
            for pct in sorted(set(args.thresholds_percent))
        }
        if args.forecast_alert:
            notifications["forecast-100"] = consumption.NotificationArgs(
                enabled=True, operator="GreaterThan", threshold=100,
                threshold_type="Forecasted", contact_emails=args.alert_emails,
            )
        consumption.Budget(
            f"{name}-budget",
            budget_name=args.budget_name,
            scope=args.scope,
            amount=args.monthly_amount_usd,
            category="Cost",
            time_grain="Monthly",
            time_period=consumption.BudgetTimePeriodArgs(
                start_date=quirks.budget_start_date(args.start or datetime.now(UTC)),
            ),
            filter=_resource_filter(args.resource_ids) if args.resource_ids else None,
            notifications=notifications,
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=quirks.BUDGET_IGNORE_CHANGES),
        )
        self.register_outputs({})


def _resource_filter(resource_ids: list[pulumi.Input[str]]) -> pulumi.Output[consumption.BudgetFilterArgs]:
    return pulumi.Output.all(*resource_ids).apply(lambda ids: consumption.BudgetFilterArgs(
        dimensions=consumption.BudgetComparisonExpressionArgs(
            name="ResourceId", operator="In", values=[i.lower() for i in ids])))
