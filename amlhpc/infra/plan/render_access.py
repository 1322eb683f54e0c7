"""`python -m amlhpc.infra plan --stack S --access` as text: per principal, each right it holds -
role, where, why - in 80 columns (amlhpc/infra/plan/text.py). The JSON form is amlhpc.infra.plan.access's
view as is."""

from __future__ import annotations

from typing import Any

from amlhpc.infra.plan.text import DETAIL, INDENT, wrap


def render_access(view: dict[str, Any]) -> str:
    lines = wrap(f"aml-hpc access: stack {view['stack']} (environment {view['environment']}): who can do what, "
                 "where, and why (amlhpc/core/catalog/permissions.toml)")
    if view.get("note"):
        lines += wrap(view["note"])
    for principal in view["principals"]:
        lines += ["", f"{principal['principal']}: {principal['title']} ({principal['kind']})"]
        if not principal["rights"]:
            lines += wrap(principal["note"] or "holds nothing", INDENT)
            continue
        for right in principal["rights"]:
            condition = f", condition {right['condition']}" if right["condition"] else ""
            lines += wrap(f"{right['role']} on {right['scope']} ({right['resource']}){condition}", INDENT, DETAIL)
            lines += wrap(f"who: {right['who']}; granted by {right['grantedBy']}", DETAIL)
            lines += wrap(f"why: {right['why']}", DETAIL)
            if right["custom"]:
                lines += wrap("actions: " + ", ".join(a.removeprefix("Microsoft.") for a in right["actions"]), DETAIL)
            if right["residual"]:
                lines += wrap(f"residual risk: {right['residual']}", DETAIL)
    if view["unexplained"]:
        lines += ["", "NOT IN THE PERMISSION MODEL:"]
        for entry in view["unexplained"]:
            lines += wrap(f"{entry['assignment']}: {entry['roleDefinitionId']} for {entry['principal']} on "
                          f"{entry['scope']}", INDENT, DETAIL)
    return "\n".join(lines) + "\n"
