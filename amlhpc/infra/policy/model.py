"""The neutral view the policy rules read, and what they report.

Rules never see Pulumi's policy SDK or the plan JSON directly: each adapter (the policy
pack in `amlhpc/infra/policy/pack/`, the offline check in `amlhpc/infra/policy/plan_check.py`) turns
what it has into `ResourceView`s and a `StackView`, runs the rules, and reports
`Violation`s its own way. Pure: no Pulumi import, so the offline plan and tests can use it.

Inputs are the camelCase properties the provider receives (`properties.properties.vmSize`
for an AmlCompute cluster). The policy pack hands over read-only proxies that raise when
a value is unknown during preview; rules therefore only use the Mapping/Sequence
interface (`.get`, `in`, iteration), never `isinstance(x, dict)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Level = Literal["mandatory", "advisory"]
StackKind = Literal["environment", "experiment"]

EXPERIMENT_PREFIX = "exp-"


class NotVisible(Exception):
    """A rule needs a fact this adapter cannot see (the policy pack gets no retainOnDelete).

    The pack reports the rule as not applicable with this reason; the offline plan, which
    sees every option, never raises it.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ResourceView:
    """One resource as the engine would register it."""

    urn: str
    type: str
    """Type token, e.g. azure-native:storage:StorageAccount."""
    name: str
    """Logical (Pulumi) name."""
    inputs: Mapping[str, Any]
    protect: bool = False
    retain_on_delete: bool | None = None
    """None when the adapter cannot see it (Pulumi's analyzer protocol does not carry it)."""
    delete_before_replace: bool | None = None
    replace_on_changes: tuple[str, ...] | None = None
    """None when the adapter cannot see it."""

    @property
    def type_chain(self) -> tuple[str, ...]:
        """Parent component types down to this resource's type, read from the URN.

        urn:pulumi:dev::aml-hpc::aml-hpc:data:DatasetStorage$azure-native:storage:StorageAccount::data-account
        -> ("aml-hpc:data:DatasetStorage", "azure-native:storage:StorageAccount")
        """
        parts = self.urn.split("::")
        if len(parts) < 4:
            return (self.type,)
        return tuple(parts[2].split("$"))

    def within(self, component_type: str) -> bool:
        """True when a component of `component_type` is among this resource's parents."""
        return component_type in self.type_chain[:-1]

    @property
    def tags(self) -> Mapping[str, Any] | None:
        tags = self.inputs.get("tags")
        return tags if isinstance(tags, Mapping) else None


@dataclass(frozen=True)
class StackView:
    """The stack being checked."""

    name: str
    kind: StackKind
    tags: Mapping[str, str] = field(default_factory=dict)
    """The tags the stack's config asks for (empty when the adapter does not know them)."""
    environment: str | None = None
    """The environment the stack belongs to, as the stack decides it: an environment stack's own
    name, an experiment's `aml-hpc:environment` (the fact its deploy job and state follow); None
    when the adapter cannot tell (the baseline then treats the stack as outside dev). Never a
    resource's tag: the config writes tags."""

    @property
    def short_name(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @staticmethod
    def kind_of(stack_name: str) -> StackKind:
        # The last segment: fully qualified names look like org/project/exp-name.
        short = stack_name.rsplit("/", 1)[-1]
        return "experiment" if short.startswith(EXPERIMENT_PREFIX) else "environment"


@dataclass(frozen=True)
class Limits:
    """Thresholds a platform team may tune (policy pack config, `check_plan(limits=...)`)."""

    max_idle_minutes: int = 30
    """Longest a GPU node may sit idle before the cluster releases it. Default 30 min: an
    8-GPU node costs tens of dollars an hour, and jobs queued back to back reuse warm
    nodes well within that window."""


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Finding:
    """What a rule found: the problem, how to fix it, and (for stack rules) where."""

    message: str
    fix: str
    urn: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Violation:
    """A rule broken by a resource (or the stack, when urn is None)."""

    rule: str
    level: Level
    urn: str | None
    name: str | None
    message: str
    fix: str

    def render(self) -> str:
        where = f" {self.name}" if self.name else " (stack)"
        return f"{self.level.upper()} {self.rule}{where}: {self.message}\n    fix: {self.fix}"

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "level": self.level, "urn": self.urn, "name": self.name,
                "message": self.message, "fix": self.fix}


def get_path(value: Any, *path: str) -> Any:
    """value[p0][p1]... or None where a step is missing (works on the pack's proxies)."""
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))
