"""`jobs list`, `jobs show RUN`, `jobs logs RUN` and `jobs report RUN`: the runs of a
stack's Azure ML workspace (managed or not), or this project's rehearsals (`--local`).
Mounted on the jobs app by amlhpc/jobs/cli/main.py, whose helpers (the workspace connection, the managed
run's record, `status`) they use; what a run is and where its records are: amlhpc/jobs/cli/run_index.py and
amlhpc/jobs/report/.
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
from amlhpc.jobs.cli.job import managed_run_record, on_job, print_json
from amlhpc.jobs.cli.job import status as job_status
from amlhpc.jobs.cli.options import Debug, Offline, OutputsFile, err, guard, out

OptionalStack = Annotated[str | None, typer.Option("--stack", help="Stack whose Azure ML workspace holds the run (not "
                                                   "needed with --local).")]
LocalRuns = Annotated[bool, typer.Option("--local", help="This project's rehearsals (.rehearsal/) instead of the "
                                         "stack's Azure ML workspace.")]
RunName = Annotated[str, typer.Argument(help="A job or managed run as submit printed it, or a rehearsal's --name "
                                        "(with --local).")]


def _rehearsals() -> Path:
    from amlhpc.jobs.local import folders

    return folders.REHEARSALS


def _need_stack(stack: str | None, local: bool) -> str:
    if stack is None and not local:
        raise UserError([Problem("command line", "--stack", "names the workspace to ask",
                                 "add --stack S for the stack's Azure ML runs, or --local for this project's rehearsals")],
                        "missing option")
    return stack or ""


def list_runs(
    stack: OptionalStack = None,
    local: LocalRuns = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Newest runs to show.")] = 20,
    offline: Offline = False,
    outputs_file: OutputsFile = None,
    as_json: JsonOption = False,
    debug: Debug = False,
) -> None:
    """Recent runs, managed or not, with state, attempts and cost (--local: this project's rehearsals)."""
    from amlhpc.jobs.cli import run_index as runs

    def show_rows(rows) -> None:
        if as_json:
            print_json([r.to_json() for r in rows])
            return
        grid = table(*runs.COLUMNS, title="rehearsals in this project" if local else f"runs in stack {stack}")
        for r in rows:
            grid.add_row(r.run, r.kind, r.state, str(r.attempts), r.cost, r.created, r.recipe)
        out.print(grid)
        for r in rows:
            if r.detail and r.kind == "managed":
                err.print(f"[yellow]note:[/] {r.run}: {r.detail}", highlight=False)

    if local:
        guard(debug, lambda: show_rows(runs.local_runs(_rehearsals())[:limit]))
        return

    def in_azure(submitter, client, o) -> None:
        from amlhpc.jobs.managed import client as managed

        def record_of(tags: dict[str, str]):
            place = managed.place_from_tags(tags)
            return managed.read(o, place) if place else None

        show_rows(runs.azure_runs(runs.recent_jobs(client, o.workspace), record_of, limit))

    on_job(guard(debug, lambda: _need_stack(stack, local)), offline, outputs_file, debug, in_azure)


def show(run: RunName, stack: OptionalStack = None, local: LocalRuns = False, offline: Offline = False,
         outputs_file: OutputsFile = None, as_json: JsonOption = False, debug: Debug = False) -> None:
    """One run: its state, attempts, cost and records (--local: a rehearsal)."""
    if not local:
        job_status(job=run, stack=guard(debug, lambda: _need_stack(stack, local)), offline=offline,
               outputs_file=outputs_file, as_json=as_json, debug=debug)
        return

    def body() -> None:
        from amlhpc.jobs.cli import run_index as runs
        from amlhpc.jobs.report import REPORT_FILE, records

        folder = runs.local_folder(_rehearsals(), run)
        r = records.read(folder)
        if as_json:
            print_json({"run": r.run, "folder": str(folder), "outcome": r.outcome, "costBasis": r.cost_basis,
                         "attempts": [vars(a) for a in r.attempts], "summary": r.summary,
                         "staging": [vars(x) for x in r.staging], "phases": [vars(p) for p in r.phases],
                         "report": str(folder / REPORT_FILE) if (folder / REPORT_FILE).is_file() else None})
            return
        grid = row_table(title=f"rehearsal {run}")
        grid.add_row("outcome", r.outcome or "unknown")
        grid.add_row("folder", str(folder))
        for key, value in sorted(r.summary.items()):
            grid.add_row(key, f"{value:,.6g}" if isinstance(value, float) else str(value))
        out.print(grid)
        if r.attempts:
            attempts = table("attempt", "run id", "started (UTC)", "ended (UTC)", "nodes", "outcome", "cost $")
            for a in r.attempts:
                attempts.add_row(str(a.number), a.name, a.started.strftime("%Y-%m-%d %H:%M:%S"),
                                 a.ended.strftime("%Y-%m-%d %H:%M:%S") if a.ended else "running", str(a.nodes),
                                 a.outcome, f"{a.usd:,.2f}" if a.usd is not None else "-")
            out.print(attempts)
            if r.cost_basis:
                out.print(f"cost: {r.cost_basis}", highlight=False, soft_wrap=True)
        out.print(f"report: {invocation.command('jobs', f'report {run} --local')}", highlight=False)

    guard(debug, body)


def logs(
    run: RunName,
    stack: OptionalStack = None,
    local: LocalRuns = False,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing what is written until the run ends.")] = False,
    node: Annotated[int | None, typer.Option("--node", min=0, help="Every process of node K (default: the first "
                                             "process of node 0, the one that logs the metrics).")] = None,
    offline: Offline = False,
    outputs_file: OutputsFile = None,
    debug: Debug = False,
) -> None:
    """A run's output, as its processes wrote it (of a managed run: its latest attempt)."""
    from amlhpc.jobs.cli import run_index as runs

    def emit(line: str) -> None:
        sys.stdout.write(line + "\n")

    if local:
        def local_body() -> None:
            folder = runs.local_folder(_rehearsals(), run)
            paths = runs.local_logs(folder, node)
            if not paths:
                raise UserError([Problem(str(folder), "user_logs", "no process logs recorded",
                                         "rehearse it again: logs are kept from this version on")], "no logs")
            runs.follow(paths, emit, done=lambda: not follow or not runs.rehearsal_running(folder))

        guard(debug, local_body)
        return

    def in_azure(submitter, client, o) -> None:
        import tempfile

        info = submitter.status(client, run, o.workspace)
        job = run
        if (info.get("tags") or {}).get("managed_run"):
            _, _, record = managed_run_record(submitter, client, o, info)
            job = record.current.job if record.current else run
        if follow:
            if node is not None:
                raise UserError([Problem("command line", "--node", "Azure ML streams the first process of a running "
                                         "job only", f"follow without --node, or read node {node} once it ran: "
                                         f"{invocation.command('jobs', f'logs {run} --stack {o.stack} --node {node}')}")], "invalid flags")
            submitter.stream(client, job, o.workspace)
            return
        detail = submitter.status(client, job, o.workspace) if job != run else info
        per_node = int((detail.get("tags") or {}).get("processes_per_node") or 1)
        with tempfile.TemporaryDirectory(prefix="amlhpc-logs-") as tmp:
            submitter.download(client, job, o.workspace, Path(tmp), everything=True)
            paths = runs.downloaded_logs(Path(tmp), runs.log_names(per_node, node))
            if not paths:
                raise UserError([Problem(f"job {job}", "user_logs", "holds no process logs (yet)",
                                         f"follow it while it runs: {invocation.command('jobs', f'logs {run} --stack {o.stack} --follow')}")],
                                "no logs")
            for line in runs.iter_lines(paths):
                emit(line)

    on_job(guard(debug, lambda: _need_stack(stack, local)), offline, outputs_file, debug, in_azure)


def report(
    run: RunName,
    stack: OptionalStack = None,
    local: LocalRuns = False,
    out_file: Annotated[Path | None, typer.Option("--out", metavar="FILE", help="Where to write the page (default: "
                                                  "report.html in the run's folder).")] = None,
    offline: Offline = False,
    outputs_file: OutputsFile = None,
    debug: Debug = False,
) -> None:
    """Write RUN's report: one HTML page with its plots (loss, throughput, MFU, step time, GPUs,
    staging timeline, attempts and cost) and records; it opens offline in any browser."""
    from amlhpc.jobs import report as run_report
    from amlhpc.jobs.cli import run_index as runs

    if local or (stack is None and (_rehearsals() / run).is_dir()):
        def local_body() -> None:
            path = run_report.write(runs.local_folder(_rehearsals(), run), out_file, run)
            out.print(f"run report: {path}", highlight=False, soft_wrap=True)

        guard(debug, local_body)
        return

    def in_azure(submitter, client, o) -> None:
        from amlhpc.core import project

        folder = project.scratch() / "runs" / run
        info = submitter.status(client, run, o.workspace)
        jobs_to_read = [run]
        if (info.get("tags") or {}).get("managed_run"):
            _, _, record = managed_run_record(submitter, client, o, info)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "supervision.json").write_text(json.dumps(record.to_json(), indent=2))
            jobs_to_read = [a.job for a in record.attempts]
        for name in jobs_to_read:
            err.print(f"downloading the outputs and logs of {name}", highlight=False)
            submitter.download(client, name, o.workspace, folder / name, everything=True)
        path = run_report.write(folder, out_file, run)
        out.print(f"run report: {path}", highlight=False, soft_wrap=True)

    on_job(guard(debug, lambda: _need_stack(stack, local)), offline, outputs_file, debug, in_azure)


def mount(app: typer.Typer) -> None:
    app.command("list")(list_runs)
    app.command("show")(show)
    app.command("logs")(logs)
    app.command("report")(report)
