"""The rules as a Pulumi policy pack (pulumi-policy), for `pulumi preview/up --policy-pack
amlhpc/infra/policy/pack`.

One ResourceValidationPolicy or StackValidationPolicy per rule, at the rule's level. What
Pulumi's analyzer protocol does not carry is marked unknown in the view: pulumi-policy
1.21 gives a policy `protect`, `ignoreChanges`, `deleteBeforeReplace`, `aliases`,
`customTimeouts`, `additionalSecretOutputs` and `parent`, but neither `retainOnDelete` nor
`replaceOnChanges`. Rules that need them report "not applicable" here, with a pointer to
`python -m amlhpc.infra plan --stack S --policy`, which the pull-request workflow runs as well.

Values unknown during preview raise pulumi-policy's UnknownValueError when a rule reads
them; the SDK turns that into an advisory "can't run during preview" note, never a pass.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from amlhpc.infra.policy.model import Finding, Limits, NotVisible, ResourceView, StackView
from amlhpc.infra.policy.rules import RULES, Rule

PACK_NAME = "aml-hpc"

_LEVELS = {"mandatory": EnforcementLevel.MANDATORY, "advisory": EnforcementLevel.ADVISORY}

# Policy config (Pulumi's `--policy-pack-config`): thresholds a platform team may tune.
_IDLE_SCHEMA = PolicyConfigSchema(
    properties={"maxIdleMinutes": {"type": "integer", "minimum": 2, "default": Limits().max_idle_minutes}}
)


def _limits(config: Mapping[str, Any] | None) -> Limits:
    value = (config or {}).get("maxIdleMinutes")
    return Limits(max_idle_minutes=int(value)) if value is not None else Limits()


def _stack(view: ResourceView | None = None) -> StackView:
    """The stack being previewed: the engine tells the analyzer in PULUMI_STACK; a
    resource's own `stack` tag is the fallback (older engines). Its environment is decided by
    the stack, never by the resources' `environment` tag, which the stack file writes: an
    environment stack's name, an experiment's `aml-hpc:environment` read from its stack file
    (unknown, so outside dev, when that file cannot be read)."""
    name = os.environ.get("PULUMI_STACK", "")
    if not name and view is not None and view.tags:
        name = str(view.tags.get("stack") or "")
    kind = StackView.kind_of(name)
    return StackView(name or "unknown", kind, environment=_experiment_environment(name) if kind == "experiment" else None)


@cache
def _experiment_environment(name: str) -> str | None:
    from amlhpc.core.errors import UserError
    from amlhpc.infra.config import REPO_ROOT, load_stack_config

    try:
        return load_stack_config(name.rsplit("/", 1)[-1], REPO_ROOT).environment or None
    except (UserError, OSError):
        return None


def view_of(resource_type: str, props: Mapping[str, Any], urn: str, name: str, opts) -> ResourceView:
    return ResourceView(
        urn=urn,
        type=resource_type,
        name=name,
        inputs=props,
        protect=bool(opts.protect),
        retain_on_delete=None,  # not in the analyzer protocol
        delete_before_replace=opts.delete_before_replace,
        replace_on_changes=None,  # not in the analyzer protocol
    )


def _text(finding: Finding) -> str:
    return f"{finding.message}\nfix: {finding.fix}"


def _resource_policy(rule: Rule) -> ResourceValidationPolicy:
    check = rule.check_resource
    assert check is not None

    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        view = view_of(args.resource_type, args.props, args.urn, args.name, args.opts)
        try:
            for finding in check(view, _stack(view), _limits(args.get_config())):
                report_violation(_text(finding), args.urn)
        except NotVisible as exc:
            args.not_applicable(exc.reason)

    return ResourceValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=_LEVELS[rule.level],
        config_schema=_IDLE_SCHEMA if rule.name == "gpu-idle-scale-down" else None,
    )


def _stack_policy(rule: Rule) -> StackValidationPolicy:
    check = rule.check_stack
    assert check is not None

    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        views = [view_of(r.resource_type, r.props, r.urn, r.name, r.opts) for r in args.resources]
        tagged = next((v for v in views if v.tags), None)
        try:
            for finding in check(views, _stack(tagged), _limits(args.get_config())):
                report_violation(_text(finding), finding.urn)
        except NotVisible as exc:
            args.not_applicable(exc.reason)

    return StackValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=_LEVELS[rule.level],
    )


def policies() -> list[Policy]:
    """One pulumi-policy Policy per rule in amlhpc.infra.policy.rules.RULES."""
    out: list[Policy] = []
    for rule in RULES:
        out.append(_resource_policy(rule) if rule.check_resource is not None else _stack_policy(rule))
    return out
