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
from amlhpc.core.cli_help import JsonOption, OutputFormat, OutputOption, output_format
from amlhpc.core.console import printable, table, tsv
from amlhpc.core.errors import Problem, UserError
from amlhpc.jobs.cli.job import managed_run_record, on_job, print_json
from amlhpc.jobs.cli.job import status as job_status
from amlhpc.jobs.cli.options import (
    Debug,
    LocalRuns,
    Offline,
    OptionalStack,
    OutputsFile,
    RunName,
    err,
    guard,
    out,
)
from amlhpc.jobs.cli.options import need_stack as _need_stack


def _rehearsals() -> Path:
    from amlhpc.jobs.local import folders

    return folders.REHEARSALS


def list_runs(
    stack: OptionalStack = None,
    local: LocalRuns = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Newest runs to show.")] = 20,
    state: Annotated[str | None, typer.Option("--state", help="Only runs in this state (its start: failed, running, "
                                              "succeeded, canceled; case-insensitive).")] = None,
    recipe: Annotated[str | None, typer.Option("--recipe", help="Only runs of this recipe.")] = None,
    user: Annotated[str | None, typer.Option("--user", help="Only runs this user submitted (Azure ML's created-by) or "
                                             "started (a rehearsal).")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only runs created since: an age (12h, 7d, 2w) or a UTC "
                                              "date or time (2026-11-25, 2026-11-25T08:00).")] = None,
    offline: Offline = False,
    outputs_file: OutputsFile = None,
    output: OutputOption = None,
    as_json: JsonOption = False,
    debug: Debug = False,
) -> None:
    """Recent runs, managed or not, with state, attempts, cost and who started them (--local: this
    project's rehearsals); filters combine."""
    from amlhpc.jobs.cli import run_index as runs

    fmt = guard(debug, lambda: output_format(output, as_json))
    keep = guard(debug, lambda: runs.Filter(state, recipe, user, runs.parse_since(since)))

    def show_rows(rows) -> None:
        if fmt is OutputFormat.json:
            print_json([r.to_json() for r in rows])
            return
        if fmt is OutputFormat.tsv:
            sys.stdout.write(tsv(runs.COLUMNS, (r.cells() for r in rows)))
            return
        grid = table(*runs.COLUMNS, title="rehearsals in this project" if local else f"runs in stack {stack}")
        for r in rows:
            grid.add_row(*r.cells())
        out.print(grid)
        for r in rows:
            if r.detail and r.kind == "managed":
                err.print(f"[yellow]note:[/] {printable(r.run)}: {printable(r.detail)}", highlight=False)

    if local:
        guard(debug, lambda: show_rows([r for r in runs.local_runs(_rehearsals()) if keep(r)][:limit]))
        return

    def in_azure(submitter, client, o) -> None:
        from amlhpc.jobs.managed import client as managed

        def record_of(tags: dict[str, str]):
            place = managed.place_from_tags(tags)
            return managed.read(o, place) if place else None

        show_rows(runs.azure_runs(runs.recent_jobs(client, o.workspace), record_of, limit, keep))

    on_job(guard(debug, lambda: _need_stack(stack, local)), offline, outputs_file, debug, in_azure)


def show(run: RunName, stack: OptionalStack = None, local: LocalRuns = False, offline: Offline = False,
         outputs_file: OutputsFile = None, as_json: JsonOption = False, debug: Debug = False) -> None:
    """One run: its state, attempts, cost and records (--local: a rehearsal)."""
    if not local:
        job_status(job=run, stack=guard(debug, lambda: _need_stack(stack, local)), offline=offline,
               outputs_file=outputs_file, as_json=as_json, debug=debug)
        return

    from amlhpc.jobs.cli import local_runs

    guard(debug, lambda: local_runs.show(run, as_json))


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

    terminal = sys.stdout.isatty()

    def emit(line: str) -> None:
        # On a terminal, a line a job wrote cannot drive it (printable); piped, the bytes stay as written.
        sys.stdout.write((printable(line) if terminal else line) + "\n")

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
    as_json: JsonOption = False,
    debug: Debug = False,
) -> None:
    """Write RUN's report: one HTML page with its plots (loss, throughput, MFU, step time, GPUs,
    staging timeline, attempts and cost) and records; it opens offline in any browser."""
    from amlhpc.jobs import report as run_report
    from amlhpc.jobs.cli import run_index as runs

    def written(path: Path) -> None:
        if as_json:
            print_json({"run": run, "report": str(path)})
            return
        out.print(f"run report: {path}", highlight=False, soft_wrap=True)

    if local or (stack is None and (_rehearsals() / run).is_dir()):
        def local_body() -> None:
            written(run_report.write(runs.local_folder(_rehearsals(), run), out_file, run))

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
        written(run_report.write(folder, out_file, run))

    on_job(guard(debug, lambda: _need_stack(stack, local)), offline, outputs_file, debug, in_azure)


def mount(app: typer.Typer) -> None:
    app.command("list")(list_runs)
    app.command("show")(show)
    app.command("logs")(logs)
    app.command("report")(report)
