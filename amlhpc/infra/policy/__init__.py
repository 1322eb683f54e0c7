"""Platform policy: one set of rules, enforced by `pulumi preview --policy-pack
amlhpc/infra/policy/pack` and offline by `python -m amlhpc.infra plan --stack NAME --policy`.

    from amlhpc.infra.policy import check_plan, has_mandatory, render, render_violations
    violations = check_plan(amlhpc.infra.plan.evaluate("dev").to_json())
    print(render(violations, "dev"))          # plain text, or
    render_violations(violations, Console())  # a rich table

Pure (no Pulumi import): rules.py holds the rules, model.py the neutral view they read,
plan_check.py the offline adapter, pack/ the Pulumi policy pack adapter.
"""

from amlhpc.infra.policy.model import Limits, ResourceView, StackView, Violation
from amlhpc.infra.policy.plan_check import (
    EXIT_POLICY_VIOLATION,
    check_plan,
    has_mandatory,
    render,
    render_violations,
    run_rules,
)
from amlhpc.infra.policy.rules import RULES, RULES_BY_NAME

__all__ = [
    "EXIT_POLICY_VIOLATION",
    "Limits",
    "RULES",
    "RULES_BY_NAME",
    "ResourceView",
    "StackView",
    "Violation",
    "check_plan",
    "has_mandatory",
    "render",
    "render_violations",
    "run_rules",
]
