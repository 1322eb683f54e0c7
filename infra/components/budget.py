"""A monthly consumption budget with email alerts.

Environment stacks budget their whole resource group; experiment stacks budget the
environment's group filtered to their own `stack` tag, so each experiment has its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import pulumi
from pulumi_azure_native import consumption

from infra import quirks
from infra.components import ComponentError


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
    stack_tag: str | None = None
    """Only count resources tagged stack=<this> (experiment budgets)."""
    start: datetime | None = None
    """Deployment time; the budget starts on the first of that month."""


class Budget(pulumi.ComponentResource):
    """A consumption budget on a resource group."""

    def __init__(self, name: str, args: BudgetArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:cost:Budget", name, None, opts)
        if not args.alert_emails:
            raise ComponentError(self, "a budget needs at least one alert email")
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
                start_date=quirks.budget_start_date(args.start or datetime.now()),
            ),
            filter=consumption.BudgetFilterArgs(
                tags=consumption.BudgetComparisonExpressionArgs(name="stack", operator="In", values=[args.stack_tag])
            ) if args.stack_tag else None,
            notifications=notifications,
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=quirks.BUDGET_IGNORE_CHANGES),
        )
        self.register_outputs({})
