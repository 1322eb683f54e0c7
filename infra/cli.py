"""`python -m infra`: the offline side of the Pulumi program.

plan         show what a stack declares, offline (no Azure, no Pulumi CLI)
expired      experiment stacks past their expiresAt (used by the teardown workflow)
new-experiment  write Pulumi.exp-NAME.yaml for an experiment on an environment

Bad input prints one block naming the file, key, value and fix, and exits 2; `--debug`
shows the traceback.
"""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console

from core.cli_help import flags_without_types
from core.errors import exit_on_bad_input

flags_without_types()

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0])

EXIT_POLICY = 3
"""`plan --policy` found a mandatory policy violation."""


@app.callback()
def main() -> None:
    """aml-hpc infrastructure, offline: plans, experiment lifecycle."""


@app.command()
def plan(
    stack: str = typer.Option(..., "--stack", "-s", help="Stack name: reads Pulumi.<stack>.yaml."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan and the outputs document as JSON."),
    policy: bool = typer.Option(False, "--policy", help="Also run the policy rules; exit 3 on a mandatory violation."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Show every resource STACK declares, its cost and GPU quota, without Azure."""
    from infra.plan import evaluate

    with exit_on_bad_input(debug):
        result = evaluate(stack)
    document = result.to_json()
    violations = []
    if policy:
        from infra.policy import check_plan

        violations = check_plan(document)
        document["policy"] = [v.to_json() for v in violations]
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        from infra.plan.render import render

        render(result, Console())
        if policy:
            from infra.policy import render_violations

            render_violations(violations, Console())
    if any(v.level == "mandatory" for v in violations):
        raise typer.Exit(EXIT_POLICY)


def _mount_lifecycle() -> None:
    """`expired` and `new-experiment` come from infra.lifecycle when it is present."""
    try:
        from infra import lifecycle
    except ImportError:
        return
    app.command("expired")(lifecycle.expired_command)
    app.command("new-experiment")(lifecycle.new_experiment_command)


_mount_lifecycle()
