"""`aml-hpc doctor --stack S` (also `python -m amlhpc doctor`, `make doctor STACK=S`).

Prints one line per check - pass, fail, warn or skip - with what it found and the fix;
`--json` prints the same as a list. Exit status 1 when a check failed (the deploy or a
submit would fail), else 0; 2 for bad input (no project, an unknown stack).
"""

from __future__ import annotations

import json
from importlib import metadata
from typing import Annotated

import typer
from rich.console import Console

from amlhpc.core.console import table, working
from amlhpc.core.errors import UserError, exit_on_bad_input
from amlhpc.doctor import checks

STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}


def target(stack: str) -> checks.Target | UserError:
    """The stack's offline plan as the checks need it, or the UserError that stops it."""
    from amlhpc.infra.plan import evaluate
    from amlhpc.jobs.plan import outputs

    try:
        plan = evaluate(stack)
        document = outputs.validate(plan.outputs, f"offline plan of Pulumi.{stack}.yaml", "-")
    except UserError as exc:
        return exc
    env_config = plan.environment.config if plan.environment is not None else plan.config
    return checks.Target(stack=stack, outputs=document,
                         providers=checks.needed_providers([r.type for r in plan.resources]),
                         submitters=[s.principal_id for s in env_config.submitters],
                         environment_file=f"Pulumi.{env_config.stack}.yaml")


def seams() -> checks.Seams:
    """The real world: the sign-in jobs use (az login, managed or workload identity), ARM,
    Azure ML, the Pulumi CLI, this environment."""
    from amlhpc.jobs.azure import credentials

    return checks.Seams(credential=lambda: credentials.credential(credentials.MANAGEMENT))


def doctor(
    stack: Annotated[str, typer.Option("--stack", "-s", help="The stack to check (its Pulumi.<stack>.yaml).")] = "dev",
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Check what the first deploy and submit of STACK need: Azure sign-in and subscription,
    the Pulumi CLI and backend, resource providers, your roles, GPU quota, submitters."""
    err = Console(stderr=True)
    with exit_on_bad_input(debug):
        with working(err, f"planning stack {stack} offline, then asking Azure..."):
            found = checks.diagnose(target(stack), seams(), metadata.version("pulumi"))
    if as_json:
        print(json.dumps([c.to_json() for c in found], indent=2))
    else:
        out = Console()
        rows = table("check", "result", "found", "fix", title=f"aml-hpc doctor: stack {stack}")
        for c in found:
            rows.add_row(c.name, f"[{STYLE[c.status]}]{c.status}[/]", c.found, c.fix)
        out.print(rows)
        counts = {s: sum(1 for c in found if c.status == s) for s in STYLE}
        out.print(", ".join(f"{n} {s}" for s, n in counts.items() if n), highlight=False)
    if any(c.status == "fail" for c in found):
        raise typer.Exit(1)
