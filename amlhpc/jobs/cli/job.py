"""The commands about one Azure ML job of a stack's workspace (`status`, `stream`, `cancel`,
`download`) and what the run commands (runs.py) share with them: connecting to the
workspace, refusing --offline, a managed run's record. main.py mounts them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from amlhpc.core import invocation
from amlhpc.core.cli_help import JsonOption
from amlhpc.core.console import printable, row_table, table
from amlhpc.core.errors import Problem, UserError
from amlhpc.jobs.cli.options import (
    Debug,
    LocalRuns,
    Offline,
    OptionalStack,
    OutputsFile,
    RunName,
    err,
    guard,
    load_outputs,
    need_stack,
    out,
    print_json,
)


def mount(app: typer.Typer) -> None:
    for command in (status, stream, cancel, download, connect):
        app.command()(command)


def on_job(stack: str, offline: bool, outputs_file: Path | None, debug: bool, action) -> None:
    """Connect to the stack's workspace and run `action(submit module, MLClient, outputs)`."""

    def body() -> None:
        from amlhpc.jobs.azure import submit as submitter

        refuse_offline(offline)
        stack_outputs = load_outputs(stack, offline, outputs_file, offline_allowed=False)
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


def status(job: RunName, stack: OptionalStack = None, local: LocalRuns = False, offline: Offline = False,
           outputs_file: OutputsFile = None, as_json: JsonOption = False, debug: Debug = False) -> None:
    """Status of a job (of a managed run: every attempt and the cost; --local: a rehearsal)."""
    if local:
        from amlhpc.jobs.cli import local_runs

        guard(debug, lambda: local_runs.show(job, as_json))
        return
    stack = guard(debug, lambda: need_stack(stack, local))

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
        out.print(printable(line), highlight=False, soft_wrap=True)


def stream(job: RunName, stack: OptionalStack = None, local: LocalRuns = False, offline: Offline = False,
           outputs_file: OutputsFile = None, debug: Debug = False) -> None:
    """Follow a job's logs until it ends (--local: a rehearsal's first process, until it ends)."""
    if local:
        from amlhpc.jobs.cli import local_runs

        guard(debug, lambda: local_runs.stream(job))
        return
    on_job(guard(debug, lambda: need_stack(stack, local)), offline, outputs_file, debug,
           lambda submitter, client, o: submitter.stream(client, job, o.workspace))


def cancel(job: RunName, stack: OptionalStack = None, local: LocalRuns = False,
           wait: Annotated[float, typer.Option("--wait", min=1, max=3600, help="With --local: seconds to wait for the "
                                               "rehearsal to stop before it is sent SIGTERM.")] = 60,
           offline: Offline = False, outputs_file: OutputsFile = None, as_json: JsonOption = False,
           debug: Debug = False) -> None:
    """Cancel a job (waits until Azure ML accepted the cancellation; --local: a rehearsal running in
    another shell, whose processes stop and whose record then says canceled)."""
    if local:
        from amlhpc.jobs.cli import local_runs

        guard(debug, lambda: local_runs.cancel(job, wait, as_json))
        return

    def cancel_it(submitter, client, o) -> None:
        tags = submitter.status(client, job, o.workspace).get("tags") or {}
        if tags.get("managed_run"):
            _cancel_managed(submitter, client, o, tags["managed_run"], tags, as_json)
            return
        submitter.cancel(client, job, o.workspace)
        if as_json:
            print_json({"job": job, "canceled": True})
            return
        out.print(f"cancelled {job}")

    on_job(guard(debug, lambda: need_stack(stack, local)), offline, outputs_file, debug, cancel_it)


def _cancel_managed(submitter, client, o, run: str, tags: dict[str, str], as_json: bool = False) -> None:
    """A managed run: the cancel request, then every controller, then every attempt (amlhpc/jobs/managed/client.py)."""
    import getpass

    from amlhpc.jobs.managed import client as managed

    place = managed.place_from_tags(tags) or managed.place_from_tags(
        submitter.status(client, run, o.workspace).get("tags") or {})
    if place is None:
        raise UserError([Problem(f"managed run {run}", "tags.record", "no job of the run names its record",
                                 f"cancel its jobs one by one: {invocation.command('jobs', 'cancel JOB --stack ' + o.stack)}")],
                        "not a managed run")
    canceled = managed.cancel_run(client.jobs, managed.store_for(o, place), run, getpass.getuser(),
                                  echo=lambda line: (err if as_json else out).print(printable(line), highlight=False))
    if as_json:
        print_json({"run": run, "canceled": True, "jobs": canceled})
        return
    out.print(f"managed run {run}: canceled")


def download(job: RunName, stack: OptionalStack = None, local: LocalRuns = False,
             path: Annotated[Path | None, typer.Option("--path", help="Folder to download into (default ./downloads/JOB).")] = None,
             output: Annotated[str | None, typer.Option("--output", help="A named output (default: the job's outputs/ folder and logs).")] = None,
             everything: Annotated[bool, typer.Option("--all", help="Every output and the logs (--local: and the run's records).")] = False,
             offline: Offline = False, outputs_file: OutputsFile = None, as_json: JsonOption = False,
             debug: Debug = False) -> None:
    """Download a job's outputs (--local: copy a rehearsal's, laid out the same way)."""
    if local:
        from amlhpc.jobs.cli import local_runs

        guard(debug, lambda: local_runs.download(job, path, everything, as_json))
        return

    def fetch(submitter, client, o) -> None:
        target = submitter.download(client, job, o.workspace, path or Path("downloads") / job, output, everything)
        if as_json:
            print_json({"job": job, "path": str(target)})
            return
        out.print(f"downloaded {job} to {target}")

    on_job(guard(debug, lambda: need_stack(stack, local)), offline, outputs_file, debug, fetch)


SERVICE_KINDS = {"ssh": "SSH", "vscode": "VS Code", "jupyterlab": "JupyterLab", "tensorboard": "TensorBoard"}
"""Azure ML's job service types (azure-ai-ml's JobServiceTypeNames, as the service names them,
compared without case or underscores) and how to call them."""


def _kind(service_type: str | None) -> str:
    return (service_type or "").lower().replace("_", "").replace(" ", "")


def connect(
    job: RunName,
    stack: OptionalStack = None,
    node: Annotated[int, typer.Option("--node", min=0, help="The node whose services to show (0: the first).")] = 0,
    service: Annotated[str | None, typer.Option("--service", help="With --open: the service to open (default: VS Code, "
                                                "else JupyterLab, else TensorBoard).")] = None,
    open_it: Annotated[bool, typer.Option("--open", help="Open the service's endpoint in a browser.")] = False,
    key_file: Annotated[str, typer.Option("--key-file", help="The private key of the recipe's services.ssh.public_keys, "
                                          "for the SSH command printed.")] = "~/.ssh/id_ed25519",
    offline: Offline = False,
    outputs_file: OutputsFile = None,
    as_json: JsonOption = False,
    debug: Debug = False,
) -> None:
    """How to reach a running job's node: the services it exposes (Azure ML's job services, the
    recipe's `services:` - SSH, VS Code, JupyterLab, TensorBoard), their endpoints, and the
    `az ml job connect-ssh` command for SSH (through the workspace: no public IP needed)."""

    def body(submitter, client, o) -> None:
        info = submitter.status(client, job, o.workspace)
        target = job
        if (info.get("tags") or {}).get("managed_run"):
            _, _, record = managed_run_record(submitter, client, o, info)
            if record.current is None:
                raise UserError([Problem(f"managed run {job}", "attempts", f"no attempt runs now ({record.state})",
                                         f"see it: {invocation.command('jobs', f'status {job} --stack {o.stack}')}")], "nothing to connect to")
            target = record.current.job
            info = submitter.status(client, target, o.workspace)
        found = submitter.services(client, target, o.workspace, node)
        rows = [{"name": name, "type": getattr(s, "type", None), "status": getattr(s, "status", None),
                 "endpoint": getattr(s, "endpoint", None), "port": getattr(s, "port", None),
                 "error": getattr(s, "error", None)} for name, s in sorted(found.items())]
        if not rows:
            status = info.get("status")
            raise UserError([Problem(f"job {target}", f"node {node}",
                                     f"exposes no services (job status: {status})",
                                     "services run while the job runs, and only those its recipe asks for: add "
                                     "`services: {ssh: {public_keys: \"$(cat ~/.ssh/id_ed25519.pub)\"}, vs_code: true}` to "
                                     "the recipe and submit again")], "nothing to connect to")
        ssh = next((r for r in rows if _kind(r["type"]) == "ssh"), None)
        ssh_command = (f"az ml job connect-ssh --name {target} --node-index {node} --private-key-file-path {key_file} "
                       f"--resource-group {o.resource_group} --workspace-name {o.workspace}" if ssh else None)
        if as_json:
            print_json({"job": target, "node": node, "services": rows, "sshCommand": ssh_command})
        else:
            grid = table("service", "type", "status", "endpoint", title=f"job {target}, node {node}")
            for r in rows:
                grid.add_row(r["name"], SERVICE_KINDS.get(_kind(r["type"]), str(r["type"])), str(r["status"] or "-"),
                             str(r["endpoint"] or r["error"] or "-"))
            out.print(grid)
            if ssh_command:
                out.print(f"ssh: {ssh_command}", highlight=False, soft_wrap=True)
        if open_it:
            _open(rows, service, target)

    on_job(guard(debug, lambda: need_stack(stack, False)), offline, outputs_file, debug, body)


def _open(rows: list[dict], service: str | None, job: str) -> None:
    """Open one service's endpoint (an https URL) in the default browser."""
    import webbrowser

    web = [r for r in rows if str(r["endpoint"] or "").startswith("https://")]
    if service is not None:
        chosen = next((r for r in web if service in (r["name"], _kind(r["type"]))), None)
    else:
        chosen = next((r for kind in ("vscode", "jupyterlab", "tensorboard") for r in web if _kind(r["type"]) == kind), None)
    if chosen is None:
        names = ", ".join(r["name"] for r in web) or "none"
        raise UserError([Problem(f"job {job}", "--service", f"no web endpoint to open{f' named {service!r}' if service else ''}",
                                 f"services with one: {names}")], "nothing to open")
    err.print(f"opening {chosen['name']}: {chosen['endpoint']}", highlight=False)
    webbrowser.open(chosen["endpoint"])
