"""The per-run commands on this project's rehearsals (`--local`): status (and `show`), cancel,
stream and download, as their Azure forms (amlhpc/jobs/cli/job.py) do for a workspace's jobs.
A rehearsal is the folder `.rehearsal/<run>/` (amlhpc/jobs/cli/run_index.py finds it); whether
it still runs and how to stop it from another shell: amlhpc/jobs/local/control.py.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from amlhpc.core import invocation
from amlhpc.core.console import row_table, table
from amlhpc.core.errors import Problem, UserError
from amlhpc.jobs.cli.options import err, out, print_json


def rehearsals() -> Path:
    from amlhpc.jobs.local import folders

    return folders.REHEARSALS


def folder_of(run: str) -> Path:
    from amlhpc.jobs.cli import run_index

    return run_index.local_folder(rehearsals(), run)


def document(run: str, folder: Path) -> dict[str, Any]:
    """What `status --local --json` and `show --local --json` print."""
    from amlhpc.jobs.local import control
    from amlhpc.jobs.report import REPORT_FILE, records

    r = records.read(folder)
    live = control.running(folder)
    return {"run": r.run, "folder": str(folder), "state": "running" if live else (r.outcome or "unknown"),
            "outcome": r.outcome, "running": {"pid": live.pid, "kind": live.kind} if live else None,
            "costBasis": r.cost_basis, "attempts": [vars(a) for a in r.attempts], "summary": r.summary,
            "staging": [vars(x) for x in r.staging], "phases": [vars(p) for p in r.phases],
            "report": str(folder / REPORT_FILE) if (folder / REPORT_FILE).is_file() else None}


def show(run: str, as_json: bool) -> None:
    """One rehearsal: its state, attempts, cost and summary."""

    folder = folder_of(run)
    doc = document(run, folder)
    if as_json:
        print_json(doc)
        return
    grid = row_table(title=f"rehearsal {run}")
    grid.add_row("state", doc["state"] + (f" (pid {doc['running']['pid']})" if doc["running"] else ""))
    grid.add_row("folder", str(folder))
    for key, value in sorted(doc["summary"].items()):
        grid.add_row(key, f"{value:,.6g}" if isinstance(value, float) else str(value))
    out.print(grid)
    attempts = doc["attempts"]
    if attempts:
        rows = table("attempt", "run id", "started (UTC)", "ended (UTC)", "nodes", "outcome", "cost $")
        for a in attempts:
            rows.add_row(str(a["number"]), a["name"], a["started"].strftime("%Y-%m-%d %H:%M:%S"),
                         a["ended"].strftime("%Y-%m-%d %H:%M:%S") if a["ended"] else "running", str(a["nodes"]),
                         a["outcome"], f"{a['usd']:,.2f}" if a["usd"] is not None else "-")
        out.print(rows)
        if doc["costBasis"]:
            out.print(f"cost: {doc['costBasis']}", highlight=False, soft_wrap=True)
    out.print(f"report: {invocation.command('jobs', f'report {run} --local')}", highlight=False)


def cancel(run: str, wait_s: float, as_json: bool) -> None:
    """Ask the running rehearsal to stop; wait until it did; say what its record says."""
    from amlhpc.jobs.local import control

    folder = folder_of(run)
    live = control.running(folder)
    if live is None:
        state = document(run, folder)["state"]
        raise UserError([Problem(str(folder), run, f"is not running (state: {state}): there is nothing to cancel",
                                 f"see it: {invocation.command('jobs', f'show {run} --local')}")], "nothing to cancel")
    request = control.request_cancel(folder)
    err.print(f"asked rehearsal {run} (pid {live.pid}) to stop; waiting for it", highlight=False)
    stopped = control.wait_until_stopped(folder, live, wait_s, echo=lambda line: err.print(line, highlight=False))
    doc = document(run, folder)
    if as_json:
        print_json({"run": run, "canceled": stopped, "by": request["by"], "state": doc["state"]})
    else:
        out.print(f"rehearsal {run}: {'canceled' if stopped else 'still running'}; its state: {doc['state']}",
                  highlight=False)
    if not stopped:
        raise UserError([Problem(str(folder), run, f"pid {live.pid} still runs after the request and a SIGTERM",
                                 f"stop it by hand: kill -TERM {live.pid}")], "not canceled")


def stream(run: str) -> None:
    """Rank 0's output from the start, then what it writes, until the rehearsal ends."""
    from amlhpc.jobs.cli import run_index
    from amlhpc.jobs.local import control

    folder = folder_of(run)
    paths = run_index.local_logs(folder, None)
    if not paths:
        raise UserError([Problem(str(folder), "user_logs", "no process logs recorded",
                                 "rehearse it again: logs are kept from this version on")], "no logs")
    def emit(line: str) -> None:
        sys.stdout.write(line + "\n")

    run_index.follow(paths, emit, done=lambda: control.running(folder) is None and not run_index.rehearsal_running(folder))


def download(run: str, path: Path | None, everything: bool, as_json: bool) -> None:
    """The rehearsal's outputs (each node's outputs/ folder) and, with --all, its logs and
    records, laid out as `jobs download` lays out a job's: <path>/node<K>/outputs/..."""
    from amlhpc.jobs.local import rehearsal

    folder = folder_of(run)
    target = path or Path("downloads") / run
    parts = ["outputs", *([rehearsal.LOG_DIR] if everything else [])]
    copied = 0
    for node in sorted(folder.glob("node*")):
        for part in parts:
            source = node / part
            if source.is_dir():
                shutil.copytree(source, target / node.name / part, dirs_exist_ok=True)
                copied += sum(1 for p in source.rglob("*") if p.is_file())
    if everything:
        for record in ("attempts.jsonl", "run.json", "supervision.json"):
            if (folder / record).is_file():
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(folder / record, target / record)
                copied += 1
    if not copied:
        raise UserError([Problem(str(folder), run, "has no outputs yet", "wait for its first attempt to write some")],
                        "nothing to download")
    if as_json:
        print_json({"run": run, "path": str(target), "files": copied})
        return
    out.print(f"downloaded {run} to {target} ({copied} file(s))", highlight=False)
