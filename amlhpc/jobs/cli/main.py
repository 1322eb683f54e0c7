"""`python -m amlhpc.jobs`: recipes -> Azure ML jobs. Thin: parse, call, print.

Bad input (recipe, flags, stack outputs) prints one error block and exits 2; nothing is
submitted. `--debug` shows the traceback instead. Shared options and which value wins
when several set the same thing: amlhpc/jobs/cli/options.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from amlhpc.core import invocation
from amlhpc.core.cli_help import (
    JsonOption,
    OutputFormat,
    OutputOption,
    VersionOption,
    new_app,
    output_format,
)
from amlhpc.core.console import table, tsv
from amlhpc.core.errors import Problem, UserError
from amlhpc.jobs.cli import job as job_commands
from amlhpc.jobs.cli.job import on_job, print_json, refuse_offline
from amlhpc.jobs.cli.options import (
    AllowTcp,
    ClusterOpt,
    Debug,
    HoursOpt,
    NodesOpt,
    Offline,
    OutputsFile,
    ResumeOpt,
    SetOpt,
    Stack,
    err,
    guard,
    load_outputs,
    number,
    out,
)

app = new_app("Submit and manage aml-hpc training jobs on Azure ML.")

DryRunOut = Annotated[Path | None, typer.Option(
    "--out", metavar="FILE", dir_okay=False,
    help="With --dry-run: write the YAML to FILE, its code: path relative to FILE's folder (where "
         "`az ml job create -f FILE` and azure-ai-ml's load_job look for it), instead of printing it.")]


@app.callback()
def _callback(version: VersionOption = False) -> None:
    """Submit and manage aml-hpc training jobs on Azure ML: recipes, cost, quota, runs, reports."""


def _plan(recipe_name: str, stack: str, offline: bool, outputs_file: Path | None, cluster: str | None,
          nodes: int | None, sets: list[str] | None, allow_tcp: bool, hours: float | None = None, *,
          pin: bool = False, **kwargs):
    from amlhpc.jobs import recipes
    from amlhpc.jobs.plan import build

    overrides = recipes.parse_overrides(sets or [])
    recipe = recipes.load(recipe_name, overrides)
    stack_outputs = load_outputs(stack, offline, outputs_file)
    if pin and not offline:
        recipe = _pin_mounted_inputs(recipe, stack_outputs)
    plan = build.plan_job(recipe, stack_outputs, cluster=cluster, nodes=nodes, allow_tcp=allow_tcp, hours=hours, **kwargs)
    return recipe, stack_outputs, plan


def _pin_mounted_inputs(recipe, stack_outputs):
    """Mounted inputs naming no version: their dataset's latest committed version (amlhpc/jobs/data/pin.py)."""
    from amlhpc.jobs.data import pin

    pinned = pin.pin_mounted_inputs(recipe, pin.stack_lister(stack_outputs))  # signs in only if an input needs it
    for note in pinned.notes:
        err.print(f"{note}", highlight=False, soft_wrap=True)
    for warning in pinned.warnings:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    return pinned.recipe


def _summary(plan, recipe, stack_outputs) -> None:
    est = plan.estimate
    err.print(f"[bold]{plan.name}[/]: {plan.instance_count} x {plan.sku} on {plan.cluster} ({plan.priority}), "
              f"{plan.processes_per_node} processes/node, distribution {plan.recipe_distribution}", highlight=False)
    err.print(f"estimate: {est.nodes} nodes x {est.hours:g} h x ${est.usd_per_node_hour:,.3f}/h = [bold]${est.usd:,.2f}[/] "
              f"({est.price_source})", highlight=False)
    for note in est.notes(stack_outputs.location):
        err.print(f"  note: {note}", highlight=False)
    if plan.deepspeed is not None:
        m = plan.deepspeed
        err.print(f"deepspeed: {m.params / 1e6:,.0f}M params, ZeRO {m.stage}{' + offload' if m.offload else ''}, "
                  f"{m.total_gib:,.1f} of {m.usable_gib:,.1f} GiB per GPU", highlight=False)
    for warning in plan.warnings:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False)


@app.command("recipes")
def list_recipes(output: OutputOption = None, as_json: JsonOption = False, debug: Debug = False) -> None:
    """List the recipes: the project's own (recipes/*.yaml) and the built-in ones. A project
    recipe named like a built-in one is the one used."""
    from amlhpc.jobs import recipes

    fmt = guard(debug, lambda: output_format(output, as_json))
    own, builtin = set(recipes.from_project()), set(recipes.builtin())
    loaded = [recipes.load(name) for name in recipes.available()]

    def source(name: str) -> str:
        if name in own:
            return "project, shadows the built-in" if name in builtin else "project"
        return "built in"

    if fmt is OutputFormat.json:
        print_json([{"recipe": r.name, "source": source(r.name), "file": str(r.source), "distribution": r.distribution,
                     "nodes": r.nodes, "description": r.description} for r in loaded])
        return
    headers = ("recipe", "source", "distribution", "nodes", "description")
    cells = [(r.name, source(r.name), r.distribution, str(r.nodes), r.description) for r in loaded]
    if fmt is OutputFormat.tsv:
        sys.stdout.write(tsv(headers, cells))
        return
    rows = table(*headers)
    for row in cells:
        rows.add_row(*row)
    out.print(rows)


@app.command()
def submit(
    recipe: Annotated[str, typer.Argument(help="Recipe name (the project's recipes/NAME.yaml, else the built-in one) or a path to a recipe file.")],
    stack: Stack,
    cluster: ClusterOpt = None,
    nodes: NodesOpt = None,
    sets: SetOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the job as Azure ML YAML (load_job / az ml job create -f) and submit nothing.")] = False,
    out_file: DryRunOut = None,
    yes: Annotated[bool, typer.Option("--yes", help="Submit even when the estimate exceeds the recipe's ceiling or the stack's budget.")] = False,
    follow: Annotated[bool, typer.Option("--stream/--no-stream", help="Follow the job's logs after submitting.")] = False,
    resume: ResumeOpt = None,
    hours: HoursOpt = None,
    allow_tcp: AllowTcp = False,
    managed: Annotated[bool, typer.Option("--managed", help="Submit under supervision: a controller job in Azure resubmits it after preemption, node failure or a hang, resuming from the latest checkpoint (docs/managed-jobs.md).")] = False,
    max_restarts: Annotated[int | None, typer.Option("--max-restarts", help="With --managed: attempts after the first; wins over the recipe's managed.max_restarts.")] = None,
    offline: Offline = False,
    outputs_file: OutputsFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout (the submitted job's name, status and Studio URL; with --dry-run the job itself); everything else goes to stderr.")] = False,
    debug: Debug = False,
) -> None:
    """Build a job from RECIPE and the stack's outputs; submit it (or print it with --dry-run)."""

    def body() -> None:
        from amlhpc.jobs.azure import submit as submitter
        from amlhpc.jobs.plan import build, cost

        if offline and not dry_run:
            raise UserError([Problem("command line", "--offline",
                                     "the offline plan's outputs are synthetic (subscription, workspace and identity "
                                     "are placeholders): a job submitted with them would go nowhere",
                                     f"add --dry-run to print the job, or drop --offline to submit to the deployed stack {stack!r}")],
                            "job not submitted")
        if max_restarts is not None and not managed:
            raise UserError([Problem("command line", "--max-restarts", "only applies to a managed run", "add --managed")],
                            "invalid flags")
        _check_out(out_file, dry_run)
        r, stack_outputs, plan = _plan(recipe, stack, offline, outputs_file, cluster, nodes, sets, allow_tcp, hours,
                                       pin=True, resume=resume)
        _summary(plan, r, stack_outputs)
        budget = stack_outputs.budget.monthly_amount_usd if stack_outputs.budget else None
        too_much = cost.over_limits(plan.estimate.usd, r.cost.ceiling_usd, budget)
        if managed:
            _submit_managed(r, stack_outputs, plan, too_much, dry_run=dry_run, yes=yes, follow=follow,
                            max_restarts=max_restarts, resume=resume, out_file=out_file, as_json=as_json)
            return
        _goodput(plan, r, stack_outputs, managed=False)
        code = build.snapshot(plan.code_dirs)
        _cost_gate(r.reference, too_much, dry_run=dry_run, yes=yes)
        if dry_run:
            if as_json:
                print_json({"dryRun": True, "job": build.to_job_dict(plan, portable(code)),
                            "estimateUsd": round(plan.estimate.usd, 2), "over": too_much})
                return
            write_dry_run(lambda code_path: build.to_yaml(plan, code_path), code, out_file)
            return
        client = submitter.connect(stack_outputs)
        _check_checkpoint_budget(submitter, client, stack_outputs, plan)
        created = submitter.submit(client, plan, code, follow=follow and not as_json,
                                   echo=(lambda line: err.print(line, highlight=False)) if as_json else out.print)
        if as_json:
            print_json(_submitted(created, plan, stack_outputs.stack))

    guard(debug, body)


def _submitted(created, plan, stack: str, **more) -> dict:
    """`submit --json`: what was created, as Azure ML answered."""
    status = getattr(created, "status", None)
    return {"job": created.name, "status": str(getattr(status, "value", status) or ""), "stack": stack,
            "experiment": plan.experiment, "cluster": plan.cluster, "nodes": plan.instance_count, "sku": plan.sku,
            "estimateUsd": round(plan.estimate.usd, 2), "studioUrl": getattr(created, "studio_url", None), **more}


def portable(code: Path, base: Path | None = None) -> str:
    """The code snapshot as a dry run names it: relative to `base` (default: the current
    folder), so the YAML names no absolute path of this machine. Azure ML resolves `code:`
    from the folder of the file that holds it."""
    return Path(os.path.relpath(code, base)).as_posix()


def _check_out(out_file: Path | None, dry_run: bool) -> None:
    if out_file is not None and not dry_run:
        raise UserError([Problem("command line", "--out", "writes the dry run's YAML", "add --dry-run")], "invalid flags")


def write_dry_run(render, code: Path, out_file: Path | None) -> None:
    """A dry run's YAML (render(code path) -> text): printed with code: relative to the current
    folder, or written to FILE (atomically: a failure leaves no half file) with code: relative
    to FILE's folder."""
    if out_file is None:
        sys.stdout.write("# code: is relative to the folder this was printed in; save the file there for "
                         "`az ml job create -f`, or write it with --out FILE\n" + render(portable(code)))
        return
    target = Path(os.path.abspath(out_file.expanduser()))
    target.parent.mkdir(parents=True, exist_ok=True)
    text = "# code: is relative to this file's folder\n" + render(portable(code, target.parent))
    partial = target.with_name(f".{target.name}.partial")
    try:
        partial.write_text(text)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    shown = os.path.relpath(target) if not os.path.relpath(target).startswith("..") else str(target)
    err.print(f"wrote {shown}: az ml job create -f {shown} -g RESOURCE_GROUP -w WORKSPACE", highlight=False, soft_wrap=True)


def _cost_gate(reference: str, too_much: list[str], *, dry_run: bool, yes: bool) -> None:
    """Over the recipe's ceiling or the stack's budget: a dry run warns, a submission needs --yes."""
    if dry_run:
        for reason in too_much:
            err.print(f"[yellow]warning:[/] {reason}; submit would need --yes", highlight=False)
    elif too_much and not yes:
        raise UserError([Problem(reference, "cost", reason,
                                 "pass --yes to submit anyway, or lower --nodes / --hours") for reason in too_much],
                        "job not submitted: over its cost limit")


def _submit_managed(r, stack_outputs, plan, too_much: list[str], *, dry_run: bool, yes: bool, follow: bool,
                    max_restarts: int | None, resume: str | None, out_file: Path | None = None,
                    as_json: bool = False) -> None:
    """`submit --managed`: render and validate the controller job and the training template; submit the controller."""
    from amlhpc.jobs.azure import submit as submitter
    from amlhpc.jobs.managed import render

    mplan = render.plan_managed(r, stack_outputs, plan, max_restarts=max_restarts, resume=resume,
                                secret=_resume_secret(submitter, stack_outputs, resume) if resume and not dry_run else None)
    policy = mplan.policy
    err.print(f"managed run [bold]{mplan.run}[/]: controller job {mplan.controller_job} on {mplan.cluster} "
              f"(${stack_outputs.controller.usd_per_hour:,.3f}/h while it runs); up to {policy.max_restarts} restart(s), "
              f"backoff {policy.backoff_s:g}s doubling to {policy.backoff_max_s:g}s", highlight=False)
    for line in render.describe_retry(policy):
        err.print(f"  retried: {line}", highlight=False)
    for line in render.describe_shrink(mplan):
        err.print(f"  {line}", highlight=False, soft_wrap=True)
    if policy.limit_usd is not None:
        err.print(f"  limit: ${policy.limit_usd:,.2f} ({policy.limit_source}) on all attempts together", highlight=False)
    err.print(f"  record: {mplan.record_blob}", highlight=False)
    _goodput(plan, r, stack_outputs, managed=True)
    code = render.snapshot(mplan)
    render.validate(mplan, code)
    _cost_gate(r.reference, too_much, dry_run=dry_run, yes=yes)
    if dry_run:
        if as_json:
            print_json({"dryRun": True, "run": mplan.run, "controller": render.controller_document(mplan, portable(code)),
                        "templates": [render.training_template(mplan, p) for p in mplan.templates.values()],
                        "over": too_much})
            return
        write_dry_run(lambda code_path: render.to_yaml(mplan, code_path), code, out_file)
        return
    client = submitter.connect(stack_outputs)
    _check_controller_capacity(submitter, client, stack_outputs, mplan.cluster)
    _check_checkpoint_budget(submitter, client, stack_outputs, plan)
    with submitter.azure_errors(f"job {mplan.controller_job}", stack_outputs.workspace):
        created = client.jobs.create_or_update(render.controller_job(mplan, code), experiment_name=plan.experiment)
    _register_controller(stack_outputs, mplan, created.name)
    if as_json:
        print_json(_submitted(created, plan, stack_outputs.stack, run=mplan.run, managed=True, record=mplan.record_blob))
        return
    out.print(f"submitted managed run {mplan.run} (controller job {created.name})", highlight=False)
    if getattr(created, "studio_url", None):
        out.print(f"studio: {created.studio_url}", highlight=False)
    out.print(f"follow it: {invocation.command('jobs', f'status {mplan.run} --stack {stack_outputs.stack}')}", highlight=False)
    if follow:
        submitter.stream(client, created.name, stack_outputs.workspace)


def _check_controller_capacity(submitter, client, stack_outputs, cluster: str) -> None:
    """One controller node per managed run: refuse a run whose controller would only queue."""
    from amlhpc.jobs.plan import limits

    busy, max_nodes = submitter.controller_load(client, cluster, stack_outputs.workspace)
    problem = None if max_nodes is None else limits.controller_problem(busy, max_nodes, cluster,
                                                                       f"Pulumi.{stack_outputs.environment}.yaml")
    if problem is not None:
        raise UserError([problem], "managed run not submitted: no controller node free")


def _check_checkpoint_budget(submitter, client, stack_outputs, plan) -> None:
    """The fleet budget: this job's checkpoint cap and the active jobs' on the same account within its ingress."""
    from amlhpc.jobs.plan import limits

    mine = limits.job_checkpoint_gbps(plan.environment_variables, plan.instance_count)
    if mine is None:
        return
    if plan.deepspeed is not None:
        accounts = len(stack_outputs.checkpoint_accounts or [stack_outputs.storage.account])
        fit = limits.job_checkpoint_fit(plan.name, plan.deepspeed.params, plan.environment_variables, accounts,
                                        stack_outputs.stack)
        if fit is not None:
            raise UserError([fit], "job not submitted: its checkpoint does not fit its interval")
    active = [(name, gbps) for name, gbps in submitter.active_checkpoint_caps(client, mine[0], stack_outputs.workspace)
              if name != plan.name]
    problem = limits.checkpoint_budget_problem(plan.name, plan.instance_count, mine[1], active,
                                               stack_outputs.storage.ingress_gbps,
                                               (stack_outputs.checkpoint_accounts or [stack_outputs.storage.account])[0])
    if problem is not None:
        raise UserError([problem], "job not submitted: over the account's checkpoint budget")


def _goodput(plan, r, stack_outputs, *, managed: bool) -> None:
    """The goodput plan of what is submitted (amlhpc/jobs/plan/goodput.py), on stderr."""
    from amlhpc.jobs.plan import goodput

    for line in goodput.report(plan, r, stack_outputs, managed=managed):
        err.print(f"  goodput: {line}", highlight=False, soft_wrap=True)


def _register_controller(stack_outputs, mplan, job: str) -> None:
    """Name the new controller beside the run's record, so `cancel` stops it even while it is queued."""
    from amlhpc.jobs.managed import client as managed

    place = managed.RecordPlace(mplan.storage["supervision"], mplan.storage["prefix"])
    try:
        managed.store_for(stack_outputs, place).add_controller(job, "submitted")
    except Exception as exc:  # noqa: BLE001 - the controller registers itself when it starts
        err.print(f"[yellow]note:[/] could not register controller {job} beside the record ({type(exc).__name__}); "
                  "it registers itself when it starts", highlight=False)


def _resume_secret(submitter, stack_outputs, run: str) -> str | None:
    """The run's evidence secret from its first controller's job definition (attempts the
    earlier controllers submitted sign with it); None when it cannot be read."""
    from amlhpc.jobs.managed.settings import MANAGED_JSON

    try:
        job = submitter.connect(stack_outputs).jobs.get(run)
        return json.loads((job.environment_variables or {}).get(MANAGED_JSON, "{}")).get("secret")
    except Exception:  # noqa: BLE001 - a new secret then: attempts still running keep their own evidence unread
        return None


@app.command()
def estimate(
    recipe: Annotated[str, typer.Argument(help="Recipe name or path.")],
    stack: Stack,
    cluster: ClusterOpt = None,
    nodes: NodesOpt = None,
    hours: HoursOpt = None,
    sets: SetOpt = None,
    allow_tcp: AllowTcp = False,
    preemption_rate: Annotated[float | None, typer.Option("--preemption-rate", callback=number("per_node_hour"), help="Goodput: low-priority preemptions per node-hour you assume (0 to below 1); wins over the recipe's cost.preemptions_per_node_hour.")] = None,
    checkpoint_gb: Annotated[float | None, typer.Option("--checkpoint-gb", callback=number("checkpoint_gb"), help="Goodput: the checkpoint's size (default: from the model's parameters, else 1 GB).")] = None,
    failure_rate: Annotated[float | None, typer.Option("--failure-rate", callback=number("per_gpu_hour"), help="Goodput: unexpected interruptions per GPU-hour (0 to below 1; default: Llama 3's, amlhpc/jobs/plan/goodput.py).")] = None,
    offline: Offline = False,
    outputs_file: OutputsFile = None,
    as_json: JsonOption = False,
    debug: Debug = False,
) -> None:
    """Cost of RECIPE on the stack: nodes x hours x price per node-hour, and its goodput plan."""

    def body() -> None:
        r, stack_outputs, plan = _plan(recipe, stack, offline, outputs_file, cluster, nodes, sets, allow_tcp, hours)
        est = plan.estimate
        if as_json:
            print_json(_estimate_document(r, stack_outputs, plan, preemption_rate=preemption_rate,
                                          checkpoint_size_gb=checkpoint_gb, failure_rate=failure_rate))
            return
        rows = table("recipe", "cluster", "sku", "priority", "nodes", "hours", "$/node-hour", "total $")
        rows.add_row(r.name, plan.cluster, plan.sku, plan.priority, str(est.nodes), f"{est.hours:g}",
                     f"{est.usd_per_node_hour:,.3f}", f"{est.usd:,.2f}")
        out.print(rows)
        out.print(f"total: {est.nodes} x {plan.sku} x {est.hours:g} h x ${est.usd_per_node_hour:,.3f}/h = ${est.usd:,.2f}",
                  highlight=False, soft_wrap=True)
        out.print(f"price from: {est.price_source}", highlight=False, soft_wrap=True)
        for note in est.notes(stack_outputs.location):
            out.print(f"note: {note}", highlight=False, soft_wrap=True)
        from amlhpc.jobs.plan import cost

        budget = stack_outputs.budget.monthly_amount_usd if stack_outputs.budget else None
        over = cost.over_limits(est.usd, r.cost.ceiling_usd, budget)
        for reason in over:
            out.print(f"[bold red]OVER:[/] {reason}: `submit` refuses it without --yes", highlight=False, soft_wrap=True)
        if not over:
            limits = [f"the recipe's ceiling ${r.cost.ceiling_usd:,.2f}" if r.cost.ceiling_usd is not None else "",
                      f"the stack's monthly budget ${budget:,.2f}" if budget is not None else ""]
            within = " and ".join(x for x in limits if x)
            out.print(f"within {within}" if within else "no cost ceiling or budget to check against", highlight=False,
                      soft_wrap=True)
        if plan.deepspeed is not None:
            out.print_json(json.dumps(plan.deepspeed.to_json()))
        from amlhpc.jobs.plan import goodput

        for line in goodput.report(plan, r, stack_outputs, preemption_rate=preemption_rate,
                                   checkpoint_size_gb=checkpoint_gb, failure_rate=failure_rate):
            out.print(f"goodput: {line}", highlight=False, soft_wrap=True)
        for warning in plan.warnings:
            err.print(f"[yellow]warning:[/] {warning}", highlight=False)

    guard(debug, body)


def _estimate_document(r, stack_outputs, plan, **given) -> dict:
    from amlhpc.jobs.plan import cost, goodput

    est = plan.estimate
    budget = stack_outputs.budget.monthly_amount_usd if stack_outputs.budget else None
    return {"recipe": r.name, "stack": stack_outputs.stack, "cluster": plan.cluster, "sku": plan.sku,
            "priority": plan.priority, "nodes": est.nodes, "hours": est.hours, "usdPerNodeHour": est.usd_per_node_hour,
            "usd": round(est.usd, 2), "priceSource": est.price_source, "notes": list(est.notes(stack_outputs.location)),
            "ceilingUsd": r.cost.ceiling_usd, "monthlyBudgetUsd": budget,
            "over": cost.over_limits(est.usd, r.cost.ceiling_usd, budget), "warnings": list(plan.warnings),
            "deepspeed": plan.deepspeed.to_json() if plan.deepspeed is not None else None,
            "goodput": goodput.report_document(plan, r, stack_outputs, **given)}


@app.command()
def quota(
    stack: Stack,
    recipe: Annotated[str | None, typer.Argument(help="A recipe: the quota its job needs (default: every cluster at maxNodes).")] = None,
    cluster: ClusterOpt = None,
    nodes: NodesOpt = None,
    sets: SetOpt = None,
    allow_tcp: AllowTcp = False,
    offline: Offline = False,
    outputs_file: OutputsFile = None,
    as_json: JsonOption = False,
    debug: Debug = False,
) -> None:
    """GPU quota needed vs available per VM family (low priority draws on lowPriorityCores)."""

    def body() -> None:
        from amlhpc.jobs.azure import submit as submitter

        refuse_offline(offline, "quota", f"the quota the plan needs is in `{invocation.command('infra', 'plan --stack S')}` (offline)")
        if recipe:
            _, stack_outputs, plan = _plan(recipe, stack, offline, outputs_file, cluster, nodes, sets, allow_tcp)
            requests = [(plan.cluster, plan.sku, plan.priority, plan.instance_count)]
        else:
            stack_outputs = load_outputs(stack, offline, outputs_file, offline_allowed=False)
            requests = [(name, c.sku, c.priority, c.max_nodes) for name, c in stack_outputs.clusters.items()]
        client = submitter.connect(stack_outputs)
        lines = submitter.quota(client, stack_outputs, requests)
        if as_json:
            print_json([{"quota": line.quota_name, "azureName": line.label, "neededVcpus": line.needed,
                          "inUse": line.used, "limit": line.limit, "available": line.available, "ok": line.ok,
                          "clusters": list(line.clusters),
                          "fix": line.hint(stack_outputs.location) if line.ok is False else None} for line in lines])
            if any(line.ok is False for line in lines):
                raise typer.Exit(1)
            return
        rows = table("quota", "Azure's name", "needed vCPUs", "in use", "limit", "available", "ok", "clusters")
        for line in lines:
            rows.add_row(line.quota_name, line.label or "-", str(line.needed), _n(line.used),
                         "none" if line.limit == -1 else _n(line.limit), _n(line.available),
                         {True: "yes", False: "[red]NO[/]", None: "?"}[line.ok], ", ".join(line.clusters))
        out.print(rows)
        for line in lines:
            if line.limit is None:
                err.print(f"[yellow]warning:[/] Azure reported no usage for {line.quota_name} in {stack_outputs.location}: "
                          "its limit is unknown (check Azure portal > Quotas > Machine learning)", highlight=False)
        short = [line for line in lines if line.ok is False]
        for line in short:
            out.print(f"fix: {line.hint(stack_outputs.location)}", highlight=False, soft_wrap=True)
        if short:
            raise typer.Exit(1)

    guard(debug, body)


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)


job_commands.mount(app)


@app.command()
def scale(
    recipe: Annotated[str, typer.Argument(help="Recipe name or path.")],
    stack: Stack,
    cluster: ClusterOpt = None,
    max_nodes: Annotated[int | None, typer.Option("--max-nodes", help="Largest run (default: the cluster's maxNodes).")] = None,
    sets: SetOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print every job of the study as YAML documents; submit nothing.")] = False,
    out_file: DryRunOut = None,
    yes: Annotated[bool, typer.Option("--yes", help="Submit even when the study's total estimate exceeds the stack's budget.")] = False,
    allow_tcp: AllowTcp = False,
    offline: Offline = False,
    outputs_file: OutputsFile = None,
    as_json: JsonOption = False,
    debug: Debug = False,
) -> None:
    """Scaling study: RECIPE on 1, 2, 4 ... nodes up to the cluster's maximum, tagged as one study."""

    def body() -> None:
        from amlhpc.jobs import recipes
        from amlhpc.jobs.azure import submit as submitter
        from amlhpc.jobs.plan import build, cost
        from amlhpc.jobs.plan import scale as scaling

        _check_out(out_file, dry_run)
        r = recipes.load(recipe, recipes.parse_overrides(sets or []))
        stack_outputs = load_outputs(stack, offline, outputs_file)
        cluster_name = build.pick_cluster(r, stack_outputs, cluster)
        top = max_nodes or stack_outputs.clusters[cluster_name].max_nodes
        study = scaling.study_id(r.name)
        plans = [build.plan_job(r, stack_outputs, cluster=cluster_name, nodes=n, allow_tcp=allow_tcp,
                                name=f"{study}-n{n}", extra_tags={"study": study, "study_nodes": str(n)})
                 for n in scaling.node_counts(top)]
        total = sum(p.estimate.usd for p in plans)
        err.print(f"study {study}: nodes {', '.join(str(p.instance_count) for p in plans)}; total estimate ${total:,.2f}", highlight=False)
        code = build.snapshot(plans[0].code_dirs)
        if dry_run:
            import yaml

            if as_json:
                print_json({"dryRun": True, "study": study, "estimateUsd": round(total, 2),
                            "jobs": [build.to_job_dict(p, portable(code)) for p in plans]})
                return
            write_dry_run(lambda code_path: yaml.safe_dump_all([build.to_job_dict(p, code_path) for p in plans],
                                                               sort_keys=False, width=120), code, out_file)
            return
        budget = stack_outputs.budget.monthly_amount_usd if stack_outputs.budget else None
        too_much = cost.over_limits(total, None, budget)
        if too_much and not yes:
            raise UserError([Problem(f"study {study}", "cost", reason, "pass --yes, or --max-nodes fewer") for reason in too_much],
                            "study not submitted: over budget")
        client = submitter.connect(stack_outputs)
        echo = (lambda line: err.print(line, highlight=False)) if as_json else out.print
        created = [submitter.submit(client, p, code, echo=echo) for p in plans]
        if as_json:
            print_json({"study": study, "estimateUsd": round(total, 2),
                        "jobs": [_submitted(c, p, stack) for c, p in zip(created, plans, strict=True)]})
            return
        out.print(f"report when they finish: {invocation.command('jobs', f'scale-report {study} --stack {stack}')}", highlight=False)

    guard(debug, body)


@app.command("scale-report")
def scale_report(study: Annotated[str, typer.Argument(help="Study id printed by `scale`.")], stack: Stack,
                 offline: Offline = False, outputs_file: OutputsFile = None, as_json: JsonOption = False,
                 debug: Debug = False) -> None:
    """Throughput, speedup and scaling efficiency of a finished scaling study."""

    def report(submitter, client, o) -> None:
        from amlhpc.jobs.plan import scale as scaling

        rows = []
        for job in submitter.study_jobs(client, study, o.workspace):
            nodes = int((job.tags or {}).get("study_nodes", 0))
            metrics = submitter.job_metrics(client, job.name, o.workspace) if job.status == "Completed" else None
            rows.append(scaling.ScalingRow(nodes, job.name, job.status, (metrics or {}).get("throughput"),
                                           (metrics or {}).get("throughput_unit", "samples/s")))
        if not rows:
            raise UserError([Problem(f"workspace {o.workspace}", study, "no jobs carry this study tag",
                                     f"use the id printed by `{invocation.command('jobs', 'scale')}`")], "unknown study")
        if as_json:
            print_json([{"nodes": row.nodes, "job": row.job, "status": row.status, "throughput": row.throughput,
                          "unit": row.unit, "speedup": row.speedup, "efficiency": row.efficiency}
                         for row in scaling.report(rows)])
            return
        grid = table("nodes", "job", "status", "throughput", "speedup", "efficiency")
        for row in scaling.report(rows):
            grid.add_row(str(row.nodes), row.job, row.status,
                         f"{row.throughput:,.1f} {row.unit}" if row.throughput else "-",
                         f"{row.speedup:.2f}x" if row.speedup else "-", f"{row.efficiency:.0%}" if row.efficiency else "-")
        out.print(grid)

    on_job(stack, offline, outputs_file, debug, report)


def _mount() -> None:
    """The data, BeeOND and rehearsal commands live with their own code."""
    from amlhpc.jobs.beeond.cli import app as beeond_app
    from amlhpc.jobs.cli import runs as runs_cli
    from amlhpc.jobs.data.cli import app as data_app
    from amlhpc.jobs.local.cli import run

    app.add_typer(data_app, name="data", help="Datasets: gzip upload to the stack's datasets container.")
    app.add_typer(beeond_app, name="beeond", help="BeeOND shared scratch on a fixed-size cluster.")
    app.command("run")(run)
    runs_cli.mount(app)
    app.command("deepspeed-plan")(__import__("amlhpc.jobs.cli.deepspeed_plan", fromlist=["deepspeed_plan"]).deepspeed_plan)


_mount()
