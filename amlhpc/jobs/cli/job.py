"""The commands about one Azure ML job of a stack's workspace (`status`, `stream`, `cancel`,
`download`) and what the run commands (runs.py) share with them: connecting to the
workspace, refusing --offline, a managed run's record. main.py mounts them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from amlhpc.core import invocation
from amlhpc.core.cli_help import JsonOption
from amlhpc.core.console import row_table, table
from amlhpc.core.errors import Problem, UserError
from amlhpc.jobs.cli.options import (
    Debug,
    JobName,
    Offline,
    OutputsFile,
    Stack,
    guard,
    load_outputs,
    out,
)


def mount(app: typer.Typer) -> None:
    for command in (status, stream, cancel, download):
        app.command()(command)


def print_json(document) -> None:
    """Data for scripts, on stdout, nothing else there."""
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def on_job(stack: str, offline: bool, outputs_file: Path | None, debug: bool, action) -> None:
    """Connect to the stack's workspace and run `action(submit module, MLClient, outputs)`."""

    def body() -> None:
        from amlhpc.jobs.azure import submit as submitter

        refuse_offline(offline)
        stack_outputs = load_outputs(stack, offline, outputs_file)
        action(submitter, submitter.connect(stack_outputs), stack_outputs)

    guard(debug, body)


def refuse_offline(offline: bool, what: str = "this command", instead: str = "") -> None:
    """--offline on a command that can only ask Azure ML: refused before any plan or sign-in."""
    if offline:
        raise UserError([Problem("command line", "--offline", f"{what} asks Azure ML about the deployed stack; the "
                                 "offline plan has no jobs, usage or logs",
                                 "drop --offline and sign in (az login); "
                                 + (instead or f"rehearsals are local: {invocation.command('jobs', 'list --local')}, "
                                    f"{invocation.command('jobs', 'logs RUN --local')}"))], "needs Azure")


def status(job: JobName, stack: Stack, offline: Offline = False, outputs_file: OutputsFile = None,
           as_json: JsonOption = False, debug: Debug = False) -> None:
    """Status of a job (of a managed run: every attempt and the cost)."""

    def show(submitter, client, o) -> None:
        info = submitter.status(client, job, o.workspace)
        if as_json:
            print_json(_status_document(submitter, client, o, info))
            return
        rows = row_table()
        for key, value in info.items():
            rows.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value or ""))
        out.print(rows)
        if (info.get("tags") or {}).get("managed_run"):
            _managed_history(submitter, client, o, info)

    on_job(stack, offline, outputs_file, debug, show)


def _status_document(submitter, client, o, info) -> dict:
    """`status --json`: the job, and for a managed run its record with every attempt, its
    controllers and the totals."""
    from amlhpc.jobs.managed import report

    document = dict(info)
    if (info.get("tags") or {}).get("managed_run"):
        _, controllers, record = _managed_record(submitter, client, o, info)
        document["managedRun"] = {**record.to_json(), "controllers": controllers,
                                  "attemptRows": [dict(zip(report.COLUMNS, row, strict=True)) for row in report.rows(record)],
                                  "totals": report.totals(record)}
    return document


def managed_run_record(submitter, client, o, info):
    """(run, where its record is, the record) of the managed run a job belongs to."""
    from amlhpc.jobs.managed import client as managed

    run = info["tags"]["managed_run"]
    place = managed.place_from_tags(info["tags"]) or managed.place_from_tags(
        submitter.status(client, run, o.workspace).get("tags") or {})
    if place is None:
        raise UserError([Problem(f"job {info['name']}", "tags.record", "names no record",
                                 "the jobs of a managed run carry it; was the job submitted with --managed?")],
                        "not a managed run")
    return run, place, managed.read(o, place)


def _managed_record(submitter, client, o, info):
    """(run, {controller job: status or None when gone}, record) of the managed run a job
    belongs to; every controller counts (the first, resumed RUN-cXXXX and revived ones)."""
    from amlhpc.jobs.managed import client as managed

    run, place, record = managed_run_record(submitter, client, o, info)
    return run, managed.controller_statuses(client.jobs, managed.store_for(o, place), record, run), record


def _managed_history(submitter, client, o, info) -> None:
    """Every attempt of the managed run a job belongs to, its controllers, and what the run cost."""
    from amlhpc.jobs.managed import report

    run, controllers, record = _managed_record(submitter, client, o, info)
    shown = "; ".join(f"{name} {status or 'gone'}" for name, status in controllers.items())
    grid = table(*report.COLUMNS, title=f"managed run {run} ({record.state}; controllers: {shown})")
    for row in report.rows(record):
        grid.add_row(*row)
    out.print(grid)
    for line in report.summary_lines(record)[len(record.attempts) + 1:]:
        out.print(line, highlight=False, soft_wrap=True)


def stream(job: JobName, stack: Stack, offline: Offline = False, outputs_file: OutputsFile = None, debug: Debug = False) -> None:
    """Follow a job's logs until it ends."""
    on_job(stack, offline, outputs_file, debug, lambda submitter, client, o: submitter.stream(client, job, o.workspace))


def cancel(job: JobName, stack: Stack, offline: Offline = False, outputs_file: OutputsFile = None, debug: Debug = False) -> None:
    """Cancel a job (waits until Azure ML accepted the cancellation)."""

    def cancel_it(submitter, client, o) -> None:
        tags = submitter.status(client, job, o.workspace).get("tags") or {}
        if tags.get("managed_run"):
            _cancel_managed(submitter, client, o, tags["managed_run"], tags)
            return
        submitter.cancel(client, job, o.workspace)
        out.print(f"cancelled {job}")

    on_job(stack, offline, outputs_file, debug, cancel_it)


def _cancel_managed(submitter, client, o, run: str, tags: dict[str, str]) -> None:
    """A managed run: the cancel request, then every controller, then every attempt (amlhpc/jobs/managed/client.py)."""
    import getpass

    from amlhpc.jobs.managed import client as managed

    place = managed.place_from_tags(tags) or managed.place_from_tags(
        submitter.status(client, run, o.workspace).get("tags") or {})
    if place is None:
        raise UserError([Problem(f"managed run {run}", "tags.record", "no job of the run names its record",
                                 f"cancel its jobs one by one: {invocation.command('jobs', 'cancel JOB --stack ' + o.stack)}")],
                        "not a managed run")
    managed.cancel_run(client.jobs, managed.store_for(o, place), run, getpass.getuser(),
                       echo=lambda line: out.print(line, highlight=False))
    out.print(f"managed run {run}: canceled")


def download(job: JobName, stack: Stack,
             path: Annotated[Path | None, typer.Option("--path", help="Folder to download into (default ./downloads/JOB).")] = None,
             output: Annotated[str | None, typer.Option("--output", help="A named output (default: the job's outputs/ folder and logs).")] = None,
             everything: Annotated[bool, typer.Option("--all", help="Every output and the logs.")] = False,
             offline: Offline = False, outputs_file: OutputsFile = None, debug: Debug = False) -> None:
    """Download a job's outputs."""

    def fetch(submitter, client, o) -> None:
        target = submitter.download(client, job, o.workspace, path or Path("downloads") / job, output, everything)
        out.print(f"downloaded {job} to {target}")

    on_job(stack, offline, outputs_file, debug, fetch)
