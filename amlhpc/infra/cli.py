"""`python -m amlhpc.infra` (`aml-hpc infra`): the platform's stacks.

plan         show what a stack declares, offline (no Azure, no Pulumi CLI), or what a
             change to it does (--diff FILE, --diff-ref REV)
expired      experiment stacks past their expiresAt (used by the teardown workflow)
new-experiment  write Pulumi.exp-NAME.yaml for an experiment on an environment
preview, up, down (destroy)  Pulumi against Azure with the deploy rules (amlhpc/infra/deploy.py)

Bad input prints one block naming the file, key, value and fix, and exits 2; `--debug`
shows the traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from amlhpc.core import project
from amlhpc.core.cli_help import VersionOption, new_app
from amlhpc.core.console import working
from amlhpc.core.errors import Problem, UserError, exit_on_bad_input

app = new_app(__doc__.split("\n\n")[0])

EXIT_POLICY = 3
"""`plan --policy` found a mandatory policy violation."""


@app.callback()
def main(version: VersionOption = False) -> None:
    """aml-hpc infrastructure: offline plans, experiment lifecycle, preview/up/down against Azure."""


@app.command()
def plan(
    stack: Annotated[str, typer.Option("--stack", "-s", help="Stack name: reads Pulumi.<stack>.yaml.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan (or, with a diff, the diff) as JSON.")] = False,
    diff: Annotated[Path | None, typer.Option(
        "--diff", metavar="FILE", dir_okay=False,
        help="Show what changes against FILE, a saved `plan --json` of the stack.")] = None,
    diff_ref: Annotated[str | None, typer.Option(
        "--diff-ref", metavar="REV",
        help="Show what changes against the stack file and program at git revision REV (e.g. origin/main).")] = None,
    markdown: Annotated[bool, typer.Option(
        "--markdown", help="With --diff or --diff-ref: print the pull-request comment section.")] = False,
    policy: Annotated[bool, typer.Option(
        "--policy", help="Also run the policy rules; exit 3 on a mandatory violation.")] = False,
    access: Annotated[bool, typer.Option(
        "--access", help="Show who can do what, where, and why: the stack's role assignments and its CI "
                         "identities' rights, from the permission model (with --json: as data).")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Show every resource STACK declares, its cost and GPU quota, without Azure; or, with
    --diff/--diff-ref, what a change adds, removes, replaces and updates."""
    with exit_on_bad_input(debug):
        from amlhpc.infra.config import REPO_ROOT

        project.require(REPO_ROOT)
        _check_plan_flags(diff, diff_ref, markdown, as_json, access, policy)
        if access:
            _show_access(stack, as_json)
            return
        if diff is not None or diff_ref is not None:
            violations = _show_diff(stack, diff, diff_ref, markdown, as_json, policy)
        else:
            violations = _show_plan(stack, as_json, policy)
    if any(v.level == "mandatory" for v in violations):
        raise typer.Exit(EXIT_POLICY)


def _check_plan_flags(diff: Path | None, diff_ref: str | None, markdown: bool, as_json: bool,
                      access: bool = False, policy: bool = False) -> None:
    problems = []
    if access and (diff is not None or diff_ref is not None or markdown or policy):
        problems.append(Problem("plan", "--access", "shows the stack's access on its own",
                                "drop --diff/--diff-ref/--markdown/--policy, or run them separately"))
    if diff is not None and diff_ref is not None:
        problems.append(Problem("plan", "--diff, --diff-ref", "both given", "compare with one base: a file or a revision"))
    if markdown and diff is None and diff_ref is None:
        problems.append(Problem("plan", "--markdown", "formats a diff", "add --diff FILE or --diff-ref REV"))
    if markdown and as_json:
        problems.append(Problem("plan", "--markdown, --json", "both given", "choose one output format"))
    if problems:
        raise UserError(problems, "invalid options")


def _policy(document: dict, policy: bool) -> list:
    if not policy:
        return []
    from amlhpc.infra.policy import check_plan

    violations = check_plan(document)
    document["policy"] = [v.to_json() for v in violations]
    return violations


def _print_violations(violations: list, policy: bool) -> None:
    if policy:
        from amlhpc.infra.policy import render_violations

        render_violations(violations, Console())


def _show_plan(stack: str, as_json: bool, policy: bool) -> list:
    from amlhpc.infra.plan import evaluate

    with working(Console(stderr=True), f"planning stack {stack} offline (the program under Pulumi's mock runtime)"):
        result = evaluate(stack)
    document = result.to_json()
    violations = _policy(document, policy)
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        from amlhpc.infra.plan.render import render

        sys.stdout.write(render(result))
        _print_violations(violations, policy)
    return violations


def _show_access(stack: str, as_json: bool) -> None:
    from amlhpc.infra.plan import evaluate
    from amlhpc.infra.plan.access import access_view

    view = access_view(evaluate(stack))
    if as_json:
        sys.stdout.write(json.dumps(view, indent=2) + "\n")
    else:
        from amlhpc.infra.plan.render_access import render_access

        sys.stdout.write(render_access(view))


def _show_diff(stack: str, diff: Path | None, diff_ref: str | None, markdown: bool, as_json: bool,
               policy: bool) -> list:
    from amlhpc.infra.config import REPO_ROOT
    from amlhpc.infra.plan import diff as plan_diff
    from amlhpc.infra.plan import evaluate

    empty = {"stack": stack, "resources": [], "outputs": {}, "cost": {}, "quota": []}
    notes = []
    if diff is not None:
        base, base_label = plan_diff.read_plan(diff), str(diff)
    else:
        from amlhpc.infra.plan.revision import plan_at

        assert diff_ref is not None
        found, base_label = plan_at(diff_ref, stack)
        base = found if found is not None else empty
        if found is None:
            notes.append(f"Pulumi.{stack}.yaml does not exist at {base_label}: everything is new")
    head_label = f"Pulumi.{stack}.yaml in the working tree"
    violations = []
    if diff_ref is not None and not (REPO_ROOT / f"Pulumi.{stack}.yaml").is_file():
        head = empty  # the change deletes the stack file
        notes.append(f"Pulumi.{stack}.yaml is deleted in the working tree: everything is removed")
    else:
        head = evaluate(stack).to_json()
        violations = _policy(head, policy)
    result = plan_diff.diff(base, head, base_label, head_label)
    result.notes += notes
    if as_json:
        document = result.to_json()
        if policy:
            document["policy"] = head.get("policy", [])
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        from amlhpc.infra.plan.render_diff import render_markdown, render_text

        sys.stdout.write(render_markdown(result) if markdown else render_text(result))
        if not markdown:
            _print_violations(violations, policy and head is not empty)
    return violations


@app.command("config-keys")
def config_keys(
    as_json: Annotated[bool, typer.Option("--json", help="Print the keys as JSON.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the README's table.")] = False,
    update: Annotated[Path | None, typer.Option("--update", metavar="FILE", dir_okay=False,
                                                help="Rewrite the generated table in FILE (e.g. README.md).")] = None,
) -> None:
    """Every key a Pulumi.<stack>.yaml can set, from the config model: type, default, meaning."""
    from amlhpc.infra import config_doc

    if update is not None:
        changed = config_doc.update(update)
        print(f"{update}: {'updated' if changed else 'already current'}")
    elif as_json:
        sys.stdout.write(json.dumps([k.to_json() for k in config_doc.keys()], indent=2) + "\n")
    elif markdown:
        sys.stdout.write(config_doc.markdown())
    else:
        from amlhpc.core.console import table

        grid = table("key", "type", "default", "meaning")
        for k in config_doc.keys():
            grid.add_row(k.key, k.type, k.default.strip("`"), k.meaning)
        Console().print(grid, markup=False)


def _mount_lifecycle() -> None:
    """`expired` and `new-experiment` come from amlhpc.infra.lifecycle when it is present."""
    try:
        from amlhpc.infra import lifecycle
    except ImportError:
        return
    app.command("expired")(lifecycle.expired_command)
    app.command("new-experiment")(lifecycle.new_experiment_command)


_mount_lifecycle()


def _mount_deploy() -> None:
    """preview, up, down (and destroy, Pulumi's word for down): amlhpc/infra/deploy.py."""
    from amlhpc.infra import deploy

    app.command("preview")(deploy.preview_command)
    app.command("up")(deploy.up_command)
    app.command("down")(deploy.down_command)
    app.command("destroy", help="The same as down (Pulumi's word for it).")(deploy.down_command)


_mount_deploy()
