"""The rules over the offline plan: `check_plan(plan) -> list[Violation]`.

The plan JSON (docs/contracts.md section 3) carries every resource's inputs and all of its
options, retainOnDelete included, so every rule can decide here - including the ones the
policy pack must skip. `python -m amlhpc.infra plan --stack NAME --policy` prints
`render(violations)` and exits `EXIT_POLICY_VIOLATION` when one is mandatory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from amlhpc.core import invocation
from amlhpc.core.errors import Problem, UserError
from amlhpc.infra.policy.model import (
    DEFAULT_LIMITS,
    Limits,
    NotVisible,
    ResourceView,
    StackView,
    Violation,
)
from amlhpc.infra.policy.rules import RULES, Rule

EXIT_POLICY_VIOLATION = 3
"""Exit status when a mandatory rule is broken: the config parses (not EXIT_USAGE) but
declares something the platform forbids; CI can tell the two apart."""

_LEVEL_ORDER = {"mandatory": 0, "advisory": 1}


def views_from_plan(plan: Mapping[str, Any]) -> tuple[list[ResourceView], StackView]:
    """The neutral views of a plan JSON document, or a UserError naming what is missing."""
    problems = []
    for key in ("stack", "resources"):
        if key not in plan:
            problems.append(Problem("plan JSON", key, "is missing",
                                    f"pass the document `{invocation.command('infra', 'plan --stack NAME --json')}` prints"))
    if problems:
        raise UserError(problems, "not an offline plan")
    resources = []
    for i, item in enumerate(plan["resources"]):
        if not isinstance(item, Mapping) or "type" not in item or "urn" not in item:
            raise UserError([Problem("plan JSON", f"resources[{i}]", "is not a resource (needs urn and type)",
                                     f"pass the document `{invocation.command('infra', 'plan --stack NAME --json')}` prints")],
                            "not an offline plan")
        if item.get("custom") is False:
            continue  # components carry no inputs of their own
        options = item.get("options") or {}
        resources.append(ResourceView(
            urn=item["urn"],
            type=item["type"],
            name=item.get("name") or item["urn"].rsplit("::", 1)[-1],
            inputs=item.get("inputs") or {},
            protect=bool(options.get("protect")),
            retain_on_delete=bool(options.get("retainOnDelete")),
            delete_before_replace=bool(options.get("deleteBeforeReplace")),
            replace_on_changes=tuple(options.get("replaceOnChanges") or ()),
        ))
    stack_name = str(plan["stack"])
    kind = plan.get("kind") or StackView.kind_of(stack_name)
    outputs = plan.get("outputs") or {}
    tags = outputs.get("tags") or {}
    # An experiment's environment is its parsed aml-hpc:environment (the plan's outputs carry it);
    # an environment stack's is its name, whatever its file says (baseline.environment_of).
    environment = str(outputs.get("environment") or "") or None if kind == "experiment" else None
    return resources, StackView(stack_name, kind, dict(tags), environment)


def run_rules(resources: Sequence[ResourceView], stack: StackView, limits: Limits = DEFAULT_LIMITS,
              rules: Sequence[Rule] = RULES) -> list[Violation]:
    """Every rule over every resource; violations sorted mandatory first."""
    out: list[Violation] = []
    for rule in rules:
        try:
            if rule.check_resource is not None:
                for resource in resources:
                    for finding in rule.check_resource(resource, stack, limits):
                        out.append(Violation(rule.name, rule.level, resource.urn, resource.name,
                                             finding.message, finding.fix))
            if rule.check_stack is not None:
                for finding in rule.check_stack(resources, stack, limits):
                    out.append(Violation(rule.name, rule.level, finding.urn, finding.name,
                                         finding.message, finding.fix))
        except NotVisible as exc:  # pragma: no cover - the plan shows every option
            raise AssertionError(f"rule {rule.name} could not see {exc.reason} in a plan") from exc
    return sorted(out, key=lambda v: (_LEVEL_ORDER[v.level], v.rule, v.urn or ""))


def check_plan(plan: Mapping[str, Any] | Any, limits: Limits = DEFAULT_LIMITS) -> list[Violation]:
    """Policy violations of an offline plan (a plan JSON dict, or a Plan with `to_json()`)."""
    document = plan.to_json() if hasattr(plan, "to_json") else plan
    resources, stack = views_from_plan(document)
    return run_rules(resources, stack, limits)


def has_mandatory(violations: Sequence[Violation]) -> bool:
    return any(v.level == "mandatory" for v in violations)


def render_violations(violations: Sequence[Violation], console, stack: str | None = None) -> None:
    """Print violations to a rich Console (what `python -m amlhpc.infra plan --policy` shows):
    one block per violation - level, rule, resource - with the problem and the fix."""
    from rich.markup import escape

    name = f" {stack!r}" if stack else ""
    if not violations:
        console.print(f"[green]policy:[/green] stack{name} passes all {len(RULES)} rules")
        return
    mandatory = sum(v.level == "mandatory" for v in violations)
    console.print(f"[bold]policy:[/bold] stack{name}: {mandatory} mandatory, "
                  f"{len(violations) - mandatory} advisory violation(s)")
    for v in violations:
        style = "bold red" if v.level == "mandatory" else "yellow"
        console.print(f"  [{style}]{v.level.upper()}[/{style}] [bold]{v.rule}[/bold] {escape(v.name or '(stack)')}")
        console.print(f"    {escape(v.message)}", soft_wrap=False)
        console.print(f"    [dim]fix:[/dim] {escape(v.fix)}")


def render(violations: Sequence[Violation], stack: str) -> str:
    """A plain-text block for the terminal and CI logs (no secrets: rules never echo values)."""
    mandatory = sum(v.level == "mandatory" for v in violations)
    advisory = len(violations) - mandatory
    if not violations:
        return f"policy: stack {stack!r} passes all {len(RULES)} rules"
    head = f"policy: stack {stack!r}: {mandatory} mandatory, {advisory} advisory violation(s)"
    return "\n".join([head, *("  " + v.render().replace("\n", "\n  ") for v in violations)])
