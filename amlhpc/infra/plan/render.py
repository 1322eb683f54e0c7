"""The offline plan as text: resources grouped by component, cost, quota, outputs.

Laid out by amlhpc/infra/plan/text.py (80 columns, words never split, same bytes on every run).
Each Azure resource is one line `type  name` (the name qualified by its Azure parents,
`account/container`, so no two rows look alike), then the properties a reviewer checks and
its marks (protected, retained, replace-on-change fields...).
"""

from __future__ import annotations

import math

from amlhpc.infra import published
from amlhpc.infra.plan import Plan
from amlhpc.infra.plan.details import details
from amlhpc.infra.plan.mocks import RecordedResource, qualified_name
from amlhpc.infra.plan.render_reachability import reachability_lines
from amlhpc.infra.plan.text import DETAIL, INDENT, money, pair, price_fix, wrap


def short_type(type_token: str) -> str:
    return type_token.removeprefix("azure-native:")


def marks(r: RecordedResource) -> list[str]:
    """What a reviewer must know beyond the properties: deletion and replacement behaviour."""
    out = []
    if r.protect:
        out.append("protected")
    if r.retain_on_delete:
        out.append("retained")
    if r.replace_on_changes:
        fields = ", ".join(sorted(p.rsplit(".", 1)[-1] for p in r.replace_on_changes))
        out.append(f"replace on change of {fields}")
    if r.delete_before_replace:
        out.append("deleted before its replacement")
    if r.ignore_changes:
        out.append(f"ignores changes to {', '.join(sorted(r.ignore_changes))}")
    if r.secret_inputs:
        out.append(f"secret: {', '.join(r.secret_inputs)}")
    return out


def resource_lines(r: RecordedResource, indent: str = INDENT, sigil: str = "") -> list[str]:
    """A resource: `type  name`, its details, its marks."""
    lines = pair(f"{sigil}{short_type(r.type)}", qualified_name(r.type, r.inputs, r.name), indent)
    text = details(r)
    if text:
        lines += wrap(text, DETAIL)
    if marks(r):
        lines += wrap(f"[{'; '.join(marks(r))}]", DETAIL)
    return lines


def component_heading(name: str, head: RecordedResource | None) -> str:
    if not name:
        return "(outside any component)"
    return f"{name} ({head.type})" if head is not None else name


def render(plan: Plan) -> str:
    """The whole plan as text (ends with a newline)."""
    cfg = plan.config
    lines = wrap(f"aml-hpc plan: stack {cfg.stack} ({cfg.kind}) from {cfg.source}, location {cfg.location}")
    lines += wrap("Offline: the desired state under Pulumi mocks, not Azure's answer; ids are synthetic.")
    if cfg.is_experiment:
        lines += wrap(f"Reads environment {cfg.environment}'s published outputs ({published.BLOB} beside its "
                      "state, written by its up; here its offline plan's).")
    groups = plan.by_component()
    custom = plan.custom_resources()
    lines += ["", f"Resources: {len(custom)} in Azure, in {len([g for g in groups if g[2]])} components", ""]
    for name, head, members in groups:
        if not members:
            continue
        lines.append(component_heading(name, head))
        for r in members:
            lines += resource_lines(r)
    lines += [""] + cost_lines(plan) + [""] + failure_lines(plan) + [""] + quota_lines(plan) + [""] + limit_lines(plan)
    lines += [""] + outputs_lines(plan)
    lines += [""] + reachability_lines(plan)
    return "\n".join(lines) + "\n"


def cost_lines(plan: Plan) -> list[str]:
    cost = plan.cost
    lines = ["GPU cost at reference on-demand prices"]
    for c in cost.clusters:
        lines += pair(c.name, f"{c.sku}, {c.priority}, {c.min_nodes}-{c.max_nodes} nodes")
        if c.usd_per_node_hour is None:
            lines += wrap(f"UNPRICED: no reference price for {c.sku}, so no figure at all (not $0); "
                          f"{price_fix((c.sku,))}", DETAIL)
            continue
        lines += wrap(f"{money(c.usd_per_node_hour, '/node-hour')}: {money(c.full_scale_usd_per_hour, '/hour')} "
                      f"at full scale, {money(c.idle_usd_per_day, '/day')} idle", DETAIL)
        lines += wrap(f"price: {c.price_source}", DETAIL)
    if not cost.clusters:
        lines.append(f"{INDENT}no clusters")
    bound = "at least " if cost.unpriced else ""
    lines += wrap(f"Full scale: {bound}{money(cost.full_scale_usd_per_hour, '/hour')}; idle: {bound}"
                  f"{money(cost.idle_usd_per_day, '/day')} (nodes only: GPU and the runs' controller; low "
                  f"priority at on-demand prices, an upper bound)"
                  + (f"; unpriced: {', '.join(cost.unpriced)}" if cost.unpriced else ""))
    if cost.priced_elsewhere:
        lines += wrap(f"Prices: {' and '.join(cost.priced_elsewhere)} prices, not {cost.location}: the catalog "
                      f"holds one region's rows and Azure's prices differ by region; set aml-hpc:prices.<size> "
                      f"for {cost.location}'s figures")
    return lines


def failure_lines(plan: Plan) -> list[str]:
    """How often a job on each GPU cluster at full scale fails, by class (amlhpc/core/goodput.py)."""
    from amlhpc.core import goodput, invocation, skus

    lines = ["Failures of a job at full scale (Meta's Llama 3 rates per GPU-hour, by cause)"]
    shown = 0
    for c in plan.cost.clusters:
        gpus = skus.CATALOG[c.sku].gpus if c.sku in skus.CATALOG else 0
        if not gpus:
            continue
        shown += 1
        every = goodput.at_scale(c.max_nodes, gpus)
        if not all(math.isfinite(h) for h in every.values()):  # maxNodes 0: nothing to fail
            lines += pair(c.name, f"{c.max_nodes} x {gpus} GPUs: no failures expected")
            continue
        total = 1 / sum(1 / h for h in every.values())
        lines += pair(c.name, f"{c.max_nodes} x {gpus} GPUs: a failure every {total:,.1f} h")
        lines += wrap(f"process faults every {every[goodput.PROCESS]:,.0f} h (an in-job restart), GPU faults every "
                      f"{every[goodput.DEVICE]:,.0f} h and host losses every {every[goodput.HOST]:,.0f} h (a new job, "
                      f"restored from Blob); a recipe's checkpoint intervals: `{invocation.command('jobs', 'estimate RECIPE --stack STACK')}`",
                      DETAIL)
    if not shown:
        lines.append(f"{INDENT}no GPU clusters")
    return lines


def quota_lines(plan: Plan) -> list[str]:
    lines = ["GPU quota needed (vCPUs at full scale)"]
    for q in plan.quota:
        lines.append(f"{INDENT}{q.quota_name} ({q.priority}): {q.vcpus} vCPUs")
        lines += wrap(f"families {', '.join(q.families)}; clusters {', '.join(q.clusters)}", DETAIL)
    if not plan.quota:
        lines.append(f"{INDENT}none")
    return lines


def limit_lines(plan: Plan) -> list[str]:
    """Azure ML's and the registry's limits: each check, and the fix for what is over."""
    lines = ["Azure limits at full scale"]
    checks = plan.limits()
    for c in checks:
        verdict = "ok" if c.ok else "OVER"
        lines += wrap(f"{c.subject}: {c.needed:,g} of {c.allowed:,g} {c.unit} ({verdict})", INDENT, DETAIL)
        lines += wrap(f"limit {c.limit}: {c.source}" + ("" if c.ok else f"; fix: {c.fix}"), DETAIL)
    if not checks:
        lines.append(f"{INDENT}none to check (no clusters)")
    for load in plan.storage_load():
        over = load.over()
        lines += wrap(f"{load.account} ({', '.join(load.roles)}): ingress {load.ingress_gbps:,.1f} of "
                      f"{load.target_ingress_gbps:g} Gb/s, egress {load.egress_gbps:,.1f} of {load.target_egress_gbps:g} Gb/s, "
                      f"{load.requests_per_s:,.0f} of {load.target_requests_per_s:,.0f} requests/s; checkpoint caps "
                      f"{load.checkpoint_caps_gbps:,.1f} Gb/s together ({'OVER' if over else 'ok'})", INDENT, DETAIL)
        for what, fix in over:
            lines += wrap(f"{what}: {fix}", DETAIL)
        keys = ("aml-hpc:checkpointAccounts.ingressGbps" if load.roles == ("checkpoints",)
                else "aml-hpc:storage.ingressGbps/egressGbps")
        lines += wrap(f"targets: {load.source}; stack file {keys}", DETAIL)
    return lines


def outputs_lines(plan: Plan) -> list[str]:
    out = plan.outputs
    environments = ", ".join(sorted((out.get("registry") or {}).get("environments") or {})) or "none"
    text = (f"Outputs: workspace {out.get('workspace')}, clusters "
            f"{', '.join(out.get('clusters') or {}) or 'none'}, storage "
            f"{(out.get('storage') or {}).get('account')}, checkpoint accounts "
            f"{', '.join(str(a) for a in out.get('checkpointAccounts') or []) or 'the dataset account'}, coordination "
            f"account {out.get('coordinationAccount') or 'the dataset account'}, environments {environments}")
    if plan.secret_outputs:
        text += f"; SECRET outputs: {', '.join(plan.secret_outputs)}"
    return wrap(text, "", INDENT)
