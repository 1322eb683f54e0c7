"""A plan diff as text (terminals, CI logs) and as a pull-request comment section (Markdown).

Lines start with the action, as a reviewer reads a diff: `+` add, `-` remove, `!` replace,
`~` update; in a ```diff block GitHub colours them. Property changes follow, one per path
(`before -> after` on one line when it fits 80 columns, else on lines of their own, values
never re-wrapped), marked when they force the replacement and why.
"""

from __future__ import annotations

from amlhpc.infra.plan.details import details
from amlhpc.infra.plan.diff import ABSENT, Change, Delta, PlanDiff, ResourceDiff
from amlhpc.infra.plan.render import short_type
from amlhpc.infra.plan.text import (
    DETAIL,
    INDENT,
    WIDTH,
    money,
    pair,
    price_fix,
    signed_money,
    value,
    wrap,
)

SIGIL = {"add": "+", "remove": "-", "replace": "!", "update": "~"}
MARKER = "<!-- aml-hpc offline plan diff -->"
"""First line of the pull-request comment, so the workflow finds and edits its own."""


def change_lines(c: Change, indent: str = DETAIL) -> list[str]:
    if c.before is ABSENT:
        sigil, text = "+", value(c.after)
    elif c.after is ABSENT:
        sigil, text = "-", value(c.before)
    else:
        sigil, text = "~", f"{value(c.before)} -> {value(c.after)}"
    why = f"  [replaces: {c.replaces}]" if c.replaces else ""
    line = f"{indent}{sigil} {c.path}: {text}{why}"
    if len(line) <= WIDTH:
        return [line]
    lines = [f"{indent}{sigil} {c.path}{why}"]
    if c.before is not ABSENT:
        lines.append(f"{indent}    - {value(c.before)}")
    if c.after is not ABSENT:
        lines.append(f"{indent}    + {value(c.after)}")
    return lines


def resource_lines(d: ResourceDiff) -> list[str]:
    r = d.resource
    lines = pair(f"{SIGIL[d.action]} {short_type(r.type)}", d.name, "")
    context = f"in {d.component}" if d.component else "outside any component"
    if d.action == "add":
        text = details(r)
        lines += wrap(f"{context}: {text}" if text else context, DETAIL)
    elif d.action == "remove":
        lines += wrap(context, DETAIL)
        if r.protect:
            lines += wrap("PROTECTED: `pulumi up` fails until a change removes the protect option first", DETAIL)
        if r.retain_on_delete:
            lines += wrap("retained: it leaves the stack but stays in Azure", DETAIL)
    else:
        replaced = sorted({c.path for c in d.changes if c.replaces})
        if d.action == "replace":
            how = "deleted, then created again" if r.delete_before_replace else "created anew, then the old one deleted"
            lines += wrap(f"{context}: replaced ({how}) because of {', '.join(replaced)}", DETAIL)
            if r.protect:
                lines += wrap("PROTECTED: `pulumi up` refuses to replace it", DETAIL)
        else:
            lines += wrap(f"{context}: updated in place", DETAIL)
        for c in (*d.changes, *d.option_changes):
            lines += change_lines(c)
        if d.ignored:
            lines += wrap(f"(ignored, in ignoreChanges: {', '.join(d.ignored)})", DETAIL)
    return lines


def _delta_text(d: Delta, fmt, unit: str = "") -> str:
    before = "none" if d.before is None else fmt(d.before) + unit
    after = "none" if d.after is None else fmt(d.after) + unit
    if d.before == d.after:
        return f"{after} (no change)"
    return f"{before} -> {after} ({d.change:+,.0f}{unit})"


def _money_side(value: float | None, unpriced: tuple[str, ...], unit: str) -> str:
    """A money figure, honest about what it leaves out: a size without a price is never $0."""
    if not unpriced:
        return "none" if value is None else money(value, unit)
    if value is None:
        return "unpriced"
    return f"at least {money(value, unit)} + unpriced {', '.join(unpriced)}"


def money_delta_text(d: Delta, unit: str) -> str:
    before, after = _money_side(d.before, d.unpriced_before, unit), _money_side(d.after, d.unpriced_after, unit)
    if not d.changed:
        return f"{after} (no change)"
    if d.change is None:
        return f"{before} -> {after} (change unknown: no price for {', '.join(d.unpriced_skus)}; " \
               f"{price_fix(d.unpriced_skus)})"
    return f"{before} -> {after} ({signed_money(d.change, unit)})"


def cost_lines(diff: PlanDiff) -> list[str]:
    lines = ["GPU cost at reference on-demand prices"]
    for d, unit in zip(diff.cost, ("/hour", "/day"), strict=True):
        lines += wrap(f"{d.label}: {money_delta_text(d, unit)}", INDENT, DETAIL)
    for d in diff.clusters:
        lines += wrap(f"{d.label}: {money_delta_text(d, '/hour')}", INDENT, DETAIL)
    return lines


def quota_lines(diff: PlanDiff) -> list[str]:
    lines = ["GPU quota needed (vCPUs at full scale)"]
    for d in diff.quota:
        lines += wrap(f"{d.label}: {_delta_text(d, lambda v: f'{v:,.0f}')}", INDENT, DETAIL)
    if not diff.quota:
        lines.append(f"{INDENT}no change")
    return lines


def body_lines(diff: PlanDiff) -> list[str]:
    """Everything after the header: resources, cost, quota, outputs."""
    lines = wrap(f"{diff.summary()}; {diff.unchanged} unchanged")
    for note in diff.notes:
        lines += wrap(f"Note: {note}")
    for d in diff.resources:
        lines += [""] + resource_lines(d)
    lines += [""] + cost_lines(diff) + [""] + quota_lines(diff)
    if diff.outputs:
        lines += ["", "Stack outputs"]
        for c in diff.outputs:
            lines += change_lines(c, INDENT)
    return lines


def render_text(diff: PlanDiff) -> str:
    lines = wrap(f"aml-hpc plan diff: stack {diff.stack}, {diff.base} -> {diff.head}")
    lines += wrap("Offline: desired states under Pulumi mocks, not a `pulumi preview` against Azure.")
    return "\n".join(lines + [""] + body_lines(diff)) + "\n"


def headline(diff: PlanDiff) -> str:
    full = diff.cost[0]
    if full.change is None and full.changed:
        money_move = f"; full scale: change unknown (unpriced {', '.join(full.unpriced_skus)})"
    else:
        money_move = f"; full scale {signed_money(full.change, '/hour')}" if full.change else ""
    quota_move = "; quota " + ", ".join(f"{d.label} {d.change:+,.0f}" for d in diff.quota) if diff.quota else ""
    return f"{diff.summary()}{money_move}{quota_move}"


def render_markdown(diff: PlanDiff) -> str:
    """One stack's section of the pull-request comment."""
    title = f"#### `{diff.stack}`: {headline(diff)}"
    if diff.empty:
        return f"{title}\n\nNo change to resources, cost, quota or outputs against {diff.base}.\n"
    block = "\n".join(body_lines(diff))
    fence = "```"
    while fence in block:
        fence += "`"
    return f"{title}\n\nAgainst {diff.base}.\n\n{fence}diff\n{block}\n{fence}\n"
