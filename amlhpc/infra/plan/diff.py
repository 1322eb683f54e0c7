"""What changes between two offline plans of a stack: resources added, removed, replaced or
updated (which properties), and how the GPU cost and quota move.

Both sides are plan documents (`python -m amlhpc.infra plan --json`, docs/contracts.md section 3),
so a base can come from a saved file or from the program at another git revision
(amlhpc/infra/plan/revision.py). Resources are matched by URN without the stack and project, so
two stacks can be compared too.

A change replaces the resource, as `pulumi up` would, when the changed property is
- one of the resource's `replaceOnChanges` paths (our components declare them where Azure
  silently ignores an update, amlhpc/infra/quirks.py),
- part of its Azure resource id (a URL path parameter: resource group, the name, the
  parent's name): azure-native replaces on any of them (pulumi/pulumi-azure-native,
  provider/pkg/provider/diff.go, "All the parameters that are part of the resource path
  cause a replacement"), or
- `location`: create-only in Azure Resource Manager (Azure/azure-rest-api-specs,
  common-types resource-management TrackedResource.location, x-ms-mutability read+create).
Paths in `ignoreChanges` are reported as ignored, never as updates. A change of
dependencies alone is not an update (Pulumi does not show one either).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.core import invocation
from amlhpc.core.errors import Problem, UserError
from amlhpc.infra.plan import component_names
from amlhpc.infra.plan.mocks import RecordedResource, id_inputs, qualified_name

ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "<absent>"})()
"""A property on one side only."""

ACTIONS = ("add", "replace", "update", "remove")
REASON_REPLACE_ON_CHANGES = "replace-on-change"
REASON_RESOURCE_ID = "part of the Azure resource id"
REASON_LOCATION = "Azure resources cannot change region"
_OPTIONS = ("protect", "retainOnDelete", "deleteBeforeReplace", "replaceOnChanges", "ignoreChanges")


@dataclass(frozen=True)
class Change:
    """One property that differs. `replaces` says why it forces a replacement, if it does."""

    path: str
    before: Any = ABSENT
    after: Any = ABSENT
    replaces: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"path": self.path}
        if self.before is not ABSENT:
            doc["before"] = self.before
        if self.after is not ABSENT:
            doc["after"] = self.after
        if self.replaces:
            doc["replaces"] = self.replaces
        return doc


@dataclass(frozen=True)
class ResourceDiff:
    action: str
    """add, replace, update or remove."""
    resource: RecordedResource
    """The resource as the head plan declares it (as the base did, for a removal)."""
    component: str
    changes: tuple[Change, ...] = ()
    option_changes: tuple[Change, ...] = ()
    ignored: tuple[str, ...] = ()
    """Paths that differ but are in the resource's ignoreChanges."""

    @property
    def name(self) -> str:
        return qualified_name(self.resource.type, self.resource.inputs, self.resource.name)

    def to_json(self) -> dict[str, Any]:
        r = self.resource
        return {"action": self.action, "urn": r.urn, "type": r.type, "name": self.name,
                "component": self.component, "changes": [c.to_json() for c in self.changes],
                "optionChanges": [c.to_json() for c in self.option_changes], "ignored": list(self.ignored),
                "protect": r.protect, "retainOnDelete": r.retain_on_delete,
                "deleteBeforeReplace": r.delete_before_replace}


@dataclass(frozen=True)
class Delta:
    """A number before and after (None: absent on that side). Money deltas also carry what
    has no price on each side: then the figure is a lower bound and the change unknown."""

    label: str
    before: float | None
    after: float | None
    unpriced_before: tuple[str, ...] = ()
    """Clusters (or, on a cluster's own line, its size) with no price in the base plan."""
    unpriced_after: tuple[str, ...] = ()
    unpriced_skus: tuple[str, ...] = ()
    """The sizes without a price, on either side: what `aml-hpc:prices.<size>` would fix."""

    @property
    def unpriced(self) -> bool:
        return bool(self.unpriced_before or self.unpriced_after)

    @property
    def change(self) -> float | None:
        """after - before; None when either side holds an unpriced size (never a made-up saving)."""
        if self.unpriced:
            return None
        return (self.after or 0) - (self.before or 0)

    @property
    def changed(self) -> bool:
        return self.before != self.after or self.unpriced_before != self.unpriced_after

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "before": self.before, "after": self.after, "change": self.change,
                "unpricedBefore": list(self.unpriced_before), "unpricedAfter": list(self.unpriced_after),
                "unpricedSkus": list(self.unpriced_skus)}


@dataclass
class PlanDiff:
    stack: str
    base: str
    """Where the base plan came from (a file, or stack@revision)."""
    head: str
    resources: list[ResourceDiff]
    unchanged: int
    cost: list[Delta]
    """The whole stack's full-scale $/hour, then its idle $/day."""
    clusters: list[Delta]
    """Full-scale $/hour per GPU cluster whose cost changed."""
    quota: list[Delta]
    """vCPUs per quota bucket (`name (priority)`) that changed."""
    outputs: list[Change]
    notes: list[str] = field(default_factory=list)

    def count(self, action: str) -> int:
        return sum(1 for r in self.resources if r.action == action)

    @property
    def empty(self) -> bool:
        return not (self.resources or self.outputs or self.quota or any(d.changed for d in self.cost))

    def summary(self) -> str:
        counts = [f"{self.count(a)} to {a}" for a in ACTIONS if self.count(a)]
        return ", ".join(counts) if counts else "no resource changes"

    def to_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "base": self.base, "head": self.head,
                "summary": {a: self.count(a) for a in ACTIONS} | {"unchanged": self.unchanged},
                "resources": [r.to_json() for r in self.resources],
                "cost": [d.to_json() for d in self.cost], "clusters": [d.to_json() for d in self.clusters],
                "quota": [d.to_json() for d in self.quota], "outputs": [c.to_json() for c in self.outputs],
                "notes": list(self.notes)}


def resource_key(urn: str) -> str:
    """The URN without `urn:pulumi:<stack>::<project>::`: type chain and name."""
    return "::".join(urn.split("::")[2:]) or urn


def changes(before: Any, after: Any, path: str = "") -> list[Change]:
    """Leaf-level differences: dicts key by key (an added or removed object too, so each
    line stays short), lists item by item when the lengths match, anything else whole."""
    both_dicts = isinstance(before, dict) and isinstance(after, dict)
    one_dict = (before is ABSENT and isinstance(after, dict) and after) or (
        after is ABSENT and isinstance(before, dict) and before)
    if both_dicts or one_dict:
        old = before if isinstance(before, dict) else {}
        new = after if isinstance(after, dict) else {}
        out: list[Change] = []
        for key in sorted(set(old) | set(new)):
            sub = f"{path}.{key}" if path else str(key)
            out += changes(old.get(key, ABSENT) if before is not ABSENT else ABSENT,
                           new.get(key, ABSENT) if after is not ABSENT else ABSENT, sub)
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = []
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            out += changes(b, a, f"{path}[{i}]")
        return out
    if before is ABSENT and after is ABSENT:
        return []
    return [] if _same(before, after) else [Change(path, before, after)]


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same kind: 3 and 3.0 are the same number (the wire carries
    doubles), True and 1 are not."""
    number = (int, float)
    if isinstance(a, number) and isinstance(b, number) and not isinstance(a, bool) and not isinstance(b, bool):
        return a == b
    return type(a) is type(b) and a == b


def _matches(pattern: str, path: str) -> bool:
    """A replaceOnChanges / ignoreChanges path covers `path`, its parents or its children."""
    if pattern == "*":
        return True
    return (path == pattern or path.startswith(pattern + ".") or path.startswith(pattern + "[")
            or pattern.startswith(path + ".") or pattern.startswith(path + "["))


def _top(path: str) -> str:
    return path.split(".", 1)[0].split("[", 1)[0]


def replace_reason(resource: RecordedResource, path: str) -> str | None:
    if any(_matches(p, path) for p in resource.replace_on_changes):
        return REASON_REPLACE_ON_CHANGES
    if resource.custom and _top(path) in id_inputs(resource.type):
        return REASON_RESOURCE_ID
    if resource.custom and _top(path) == "location" and resource.type.startswith("azure-native:"):
        return REASON_LOCATION
    return None


def _option_changes(before: dict[str, Any], after: dict[str, Any]) -> tuple[Change, ...]:
    """Options that differ. An option only one side records (a plan saved before the
    option was recorded) is not a change."""
    out = []
    for label in _OPTIONS:
        if label not in before or label not in after:
            continue
        b, a = before[label], after[label]
        if isinstance(b, list) and isinstance(a, list):
            b, a = sorted(b), sorted(a)
        if b != a:
            out.append(Change(f"options.{label}", b, a))
    return tuple(out)


def _resource_diff(before: RecordedResource, after: RecordedResource, component: str,
                   before_options: dict[str, Any], after_options: dict[str, Any]) -> ResourceDiff | None:
    """None when Pulumi would leave the resource alone."""
    found = changes(before.inputs, after.inputs)
    ignored = tuple(c.path for c in found if any(_matches(p, c.path) for p in after.ignore_changes))
    kept = tuple(Change(c.path, c.before, c.after, replace_reason(after, c.path))
                 for c in found if c.path not in ignored)
    if before.secret_inputs != after.secret_inputs:
        kept += (Change("secretInputs", before.secret_inputs, after.secret_inputs),)
    options = _option_changes(before_options, after_options)
    if not (kept or options):
        return None
    action = "replace" if any(c.replaces for c in kept) else "update"
    return ResourceDiff(action, after, component, kept, options, ignored)


def _cost(doc: dict[str, Any]) -> dict[str, Any]:
    return doc.get("cost") or {}


def _cluster_costs(doc: dict[str, Any]) -> dict[str, tuple[str, float | None, str]]:
    """name -> (label, full-scale $/hour or None when unpriced, size)."""
    out = {}
    for c in _cost(doc).get("clusters") or []:
        label = f"{c.get('name')} ({c.get('sku')}, {c.get('priority')}, {c.get('min_nodes')}-{c.get('max_nodes')} nodes)"
        out[str(c.get("name"))] = (label, c.get("fullScaleUsdPerHour"), str(c.get("sku")))
    return out


def _unpriced_skus(*docs: dict[str, Any]) -> tuple[str, ...]:
    return tuple(sorted({name for d in docs for (_, usd, name) in _cluster_costs(d).values() if usd is None}))


def _cost_deltas(base: dict[str, Any], head: dict[str, Any]) -> tuple[list[Delta], list[Delta]]:
    """The stack's totals (full scale $/hour, idle $/day), then each cluster whose cost moved."""
    old_cost, new_cost = _cost(base), _cost(head)
    skus = _unpriced_skus(base, head)
    gaps = (tuple(old_cost.get("unpriced") or ()), tuple(new_cost.get("unpriced") or ()))
    totals = [Delta(label, old_cost.get(key, 0.0), new_cost.get(key, 0.0), *gaps, skus)
              for label, key in (("full scale", "fullScaleUsdPerHour"), ("idle", "idleUsdPerDay"))]
    old_clusters, new_clusters = _cluster_costs(base), _cluster_costs(head)
    clusters = []
    for name in sorted(set(old_clusters) | set(new_clusters)):
        before, after = old_clusters.get(name), new_clusters.get(name)
        if before is not None and after is not None and before[1:] == after[1:]:
            continue
        unpriced_before = (before[2],) if before is not None and before[1] is None else ()
        unpriced_after = (after[2],) if after is not None and after[1] is None else ()
        label = (after or before)[0]  # type: ignore[index]
        clusters.append(Delta(label, before[1] if before else None, after[1] if after else None,
                              unpriced_before, unpriced_after, tuple(sorted({*unpriced_before, *unpriced_after}))))
    return totals, clusters


def _quota(doc: dict[str, Any]) -> dict[str, int]:
    return {f"{q['quotaName']} ({q['priority']})": int(q["vcpusNeeded"]) for q in doc.get("quota") or []}


def diff(base: dict[str, Any], head: dict[str, Any], base_label: str, head_label: str) -> PlanDiff:
    """Compare two plan documents: what going from `base` to `head` does."""
    old = [RecordedResource.from_json(r) for r in base.get("resources") or []]
    new = [RecordedResource.from_json(r) for r in head.get("resources") or []]
    old_options = {resource_key(r["urn"]): r.get("options") or {} for r in base.get("resources") or []}
    new_options = {resource_key(r["urn"]): r.get("options") or {} for r in head.get("resources") or []}
    old_component, new_component = component_names(old), component_names(new)
    old_by_key = {resource_key(r.urn): r for r in old if r.custom}
    new_by_key = {resource_key(r.urn): r for r in new if r.custom}

    found: list[ResourceDiff] = []
    unchanged = 0
    for key, r in new_by_key.items():
        if key not in old_by_key:
            found.append(ResourceDiff("add", r, new_component[r.urn]))
            continue
        change = _resource_diff(old_by_key[key], r, new_component[r.urn], old_options[key], new_options[key])
        if change is None:
            unchanged += 1
        else:
            found.append(change)
    found += [ResourceDiff("remove", r, old_component[r.urn]) for key, r in old_by_key.items()
              if key not in new_by_key]
    found.sort(key=lambda d: (ACTIONS.index(d.action), d.component, d.resource.type, d.name))

    cost, clusters = _cost_deltas(base, head)
    old_quota, new_quota = _quota(base), _quota(head)
    quota = [Delta(name, old_quota.get(name), new_quota.get(name))
             for name in sorted(set(old_quota) | set(new_quota)) if old_quota.get(name) != new_quota.get(name)]

    notes = []
    if base.get("stack") and base.get("stack") != head.get("stack"):
        notes.append(f"comparing stack {head.get('stack')} with a plan of stack {base.get('stack')}")
    return PlanDiff(stack=str(head.get("stack") or base.get("stack")), base=base_label, head=head_label,
                    resources=found, unchanged=unchanged, cost=cost, clusters=clusters, quota=quota,
                    outputs=changes(base.get("outputs") or {}, head.get("outputs") or {}), notes=notes)


def read_plan(path: Path) -> dict[str, Any]:
    """A saved `plan --json` document, or a UserError naming the file and the fix."""
    fix = f"write one with `{invocation.command('infra', 'plan --stack STACK --json > FILE')}`"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError([Problem(str(path), "", "no such file", fix)], "cannot read the base plan") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError([Problem(str(path), "", f"not a JSON document ({exc})", fix)],
                        "cannot read the base plan") from None
    problems = []
    if not isinstance(doc, dict):
        problems.append(Problem(str(path), "", f"holds a JSON {type(doc).__name__}, not a plan object", fix))
    else:
        resources = doc.get("resources")
        if not isinstance(resources, list):
            problems.append(Problem(str(path), "resources", "missing: this is not an offline plan", fix))
        else:
            for i, r in enumerate(resources):
                missing = [k for k in ("urn", "type", "name") if not isinstance(r, dict) or k not in r]
                if missing:
                    problems.append(Problem(str(path), f"resources[{i}]", f"lacks {', '.join(missing)}", fix))
                    break
    if problems:
        raise UserError(problems, "cannot read the base plan")
    return doc
