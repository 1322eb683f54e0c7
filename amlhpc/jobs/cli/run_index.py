"""Runs, as `jobs list`, `jobs show` and `jobs logs` see them: the rehearsals in this project
(`--local`: .rehearsal/<run>/) and the jobs of a stack's workspace (Azure ML), managed or not.

A row is a run: a plain job, or a managed run (its controller and attempts, grouped by their
`managed_run` tag, with the state, attempts and cost its record holds). A rehearsal is a run
whose attempts are the lines of its attempts.jsonl. Costs say where they come from: a
managed run's record, a job's estimate at submission (tag `estimated_usd`), or a
rehearsal's time at the planned size's price.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from amlhpc.core import invocation
from amlhpc.core.errors import Problem, UserError

LIST_SCAN = 300
"""Jobs read from the workspace for `jobs list` (the newest; the service lists newest first)."""


@dataclass(frozen=True)
class RunRow:
    run: str
    kind: str
    """plain, managed or rehearsal"""
    state: str
    attempts: int
    cost: str
    """"$12.34 (record)", "est. $652.73", "$0.19 at ND96asr_v4 price", or "?"."""
    created: str
    recipe: str
    detail: str = ""
    user: str = ""
    """Who submitted it (Azure ML's creation context) or started the rehearsal."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def cells(self) -> list[str]:
        return [self.run, self.kind, self.state, str(self.attempts), self.cost, self.created, self.recipe, self.user]


COLUMNS = ("run", "kind", "state", "attempts", "cost", "created", "recipe", "user")
CREATED_FORMAT = "%Y-%m-%d %H:%M"
"""`created` of a row (UTC)."""


@dataclass(frozen=True)
class Filter:
    """`jobs list --state --recipe --user --since`: every given one must match (case-insensitive;
    state matches its start, so `failed` finds `failed (status 3)` and `Failed`)."""

    state: str | None = None
    recipe: str | None = None
    user: str | None = None
    since: datetime | None = None

    def __call__(self, row: RunRow) -> bool:
        if self.state and not row.state.lower().startswith(self.state.lower()):
            return False
        if self.recipe and row.recipe.lower() != self.recipe.lower():
            return False
        if self.user and row.user.lower() != self.user.lower():
            return False
        if self.since is not None:
            try:
                created = datetime.strptime(row.created, CREATED_FORMAT).replace(tzinfo=UTC)
            except ValueError:
                return False
            if created < self.since:
                return False
        return True


_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([mhdw])$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str | None, now: datetime | None = None) -> datetime | None:
    """`--since`: an age (30m, 12h, 7d, 2w) or a date or time (2026-11-25, 2026-11-25T08:00, UTC)."""
    if text is None:
        return None
    now = now or datetime.now(UTC)
    match = _AGO.match(text.strip().lower())
    if match:
        return now - timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UserError([Problem("--since", text, "is neither an age nor a date",
                                 "e.g. --since 12h, --since 7d, --since 2026-11-25 or --since 2026-11-25T08:00 (UTC)")],
                        "invalid --since") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


# --------------------------------------------------------------------------------------
# rehearsals


def local_runs(rehearsals: Path) -> list[RunRow]:
    """Every rehearsal folder, newest first."""
    from amlhpc.jobs.local import control
    from amlhpc.jobs.report import records

    if not rehearsals.is_dir():
        return []
    rows = []
    for folder in sorted((p for p in rehearsals.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True):
        r = records.read(folder)
        usd = [a.usd for a in r.attempts if a.usd is not None]
        cost = f"${sum(usd):,.2f} at planned price" if usd else "-"
        created = r.attempts[0].started.strftime("%Y-%m-%d %H:%M") if r.attempts else \
            time.strftime("%Y-%m-%d %H:%M", time.gmtime(folder.stat().st_mtime))
        kind = "managed rehearsal" if (folder / "supervision.json").is_file() else "rehearsal"
        identity = _run_file(folder)
        state = "running" if control.running(folder) else (r.outcome or "unknown")
        rows.append(RunRow(folder.name, kind, state, len(r.attempts), cost, created,
                           str(identity.get("recipe") or r.summary.get("workload", "")), str(folder),
                           str(identity.get("user") or "")))
    return rows


def _run_file(folder: Path) -> dict[str, Any]:
    """The rehearsal's run.json (amlhpc/jobs/local/reruns.py), or nothing."""
    import json

    from amlhpc.jobs.local import reruns

    try:
        document = json.loads((folder / reruns.RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def local_folder(rehearsals: Path, run: str) -> Path:
    folder = rehearsals / run
    if not folder.is_dir():
        import difflib

        known = sorted(p.name for p in rehearsals.iterdir() if p.is_dir()) if rehearsals.is_dir() else []
        near = difflib.get_close_matches(run, known, n=1)
        raise UserError([Problem(str(rehearsals), run, "no rehearsal of that name in this project",
                                 (f"did you mean {near[0]}? " if near else "")
                                 + f"rehearsals here: {', '.join(known) or 'none'} ({invocation.command('jobs', 'list --local')})")],
                        "unknown run")
    return folder


def local_logs(folder: Path, node: int | None) -> list[Path]:
    """The process logs of a rehearsal: every rank of `node` (default: node 0's first rank)."""
    from amlhpc.jobs.local.rehearsal import LOG_DIR

    nodes = sorted(folder.glob("node*"), key=lambda p: int(p.name[4:]) if p.name[4:].isdigit() else 0)
    if node is not None:
        chosen = [p for p in nodes if p.name == f"node{node}"]
        if not chosen:
            raise UserError([Problem(str(folder), f"--node {node}", "no such simulated node",
                                     f"nodes: {', '.join(p.name[4:] for p in nodes) or 'none'}")], "unknown node")
        return sorted((chosen[0] / LOG_DIR).glob("std_log_process_*.txt"))
    logs = sorted((nodes[0] / LOG_DIR).glob("std_log_process_*.txt")) if nodes else []
    return logs[:1]


def rehearsal_running(folder: Path) -> bool:
    """Whether a process of the rehearsal still runs: the launcher's progress files name
    each training process (amlhpc/jobs/runtime/base/progress.py), and one of them is alive."""
    import json
    import os

    for path in folder.glob("node*/scratch/.amlhpc-launch/*/progress/*.json"):
        try:
            pid = int(json.loads(path.read_text()).get("pid", 0))
        except (OSError, ValueError, TypeError):
            continue
        if pid > 0:
            try:
                os.kill(pid, 0)
                return True
            except ProcessLookupError:
                continue
            except PermissionError:
                return True
    return False


def follow(paths: list[Path], emit: Callable[[str], None], done: Callable[[], bool], poll_s: float = 0.5) -> None:
    """Print what the files hold, then what is appended, until `done()` (or Ctrl-C)."""
    offsets = dict.fromkeys(paths, 0)
    while True:
        finished = done()
        for path in paths:
            try:
                with path.open("rb") as f:
                    f.seek(offsets[path])
                    chunk = f.read()
            except FileNotFoundError:
                continue
            offsets[path] += len(chunk)
            text = chunk.decode(errors="replace")
            for line in text.splitlines():
                emit(line if len(paths) == 1 else f"[{path.stem.removeprefix('std_log_process_')}] {line}")
        if finished:
            return
        time.sleep(poll_s)


# --------------------------------------------------------------------------------------
# Azure ML


def _tags(job: Any) -> dict[str, str]:
    return dict(getattr(job, "tags", None) or {})


def _status(job: Any) -> str:
    """A job's status as the service names it (the SDK gives an enum for listed jobs)."""
    status = getattr(job, "status", None)
    return str(getattr(status, "value", status) or "?")


def _created(job: Any) -> str:
    ctx = getattr(job, "creation_context", None)
    when: Any = getattr(ctx, "created_at", None)
    if hasattr(when, "astimezone") and getattr(when, "tzinfo", None) is not None:
        when = when.astimezone(UTC)
    return when.strftime(CREATED_FORMAT) if hasattr(when, "strftime") else str(when or "")


def _user(job: Any) -> str:
    return str(getattr(getattr(job, "creation_context", None), "created_by", None) or "")


def recent_jobs(ml_client: Any, workspace: str, scan: int = LIST_SCAN) -> list[Any]:
    from amlhpc.jobs.azure import submit

    with submit.azure_errors("jobs", workspace):
        return list(itertools.islice(ml_client.jobs.list(), scan))


def azure_runs(jobs: list[Any], read_record: Callable[[dict[str, str]], Any], limit: int,
               keep: Callable[[RunRow], bool] = lambda row: True) -> list[RunRow]:
    """Rows for the newest `limit` runs of `jobs` that `keep` keeps: a managed run once (from its
    controller and its record), every other job as itself."""
    rows: list[RunRow] = []
    seen: set[str] = set()
    members: dict[str, list[Any]] = {}
    for job in jobs:
        run = _tags(job).get("managed_run")
        if run:
            members.setdefault(run, []).append(job)
    for job in sorted(jobs, key=_created, reverse=True):
        tags = _tags(job)
        run = tags.get("managed_run")
        if run:
            if run in seen:
                continue
            seen.add(run)
            row = _managed_row(run, members[run], read_record)
        else:
            estimate = tags.get("estimated_usd")
            row = RunRow(job.name, "plain", _status(job), 1, f"est. ${float(estimate):,.2f}" if estimate else "?",
                         _created(job), tags.get("recipe", ""), user=_user(job))
        if keep(row):
            rows.append(row)
        if len(rows) >= limit:
            break
    return rows


def _managed_row(run: str, jobs: list[Any], read_record: Callable[[dict[str, str]], Any]) -> RunRow:
    controller = next((j for j in jobs if _tags(j).get("role") == "controller"), None)
    attempts = [j for j in jobs if _tags(j).get("role") != "controller"]
    recipe = next((_tags(j).get("recipe", "") for j in jobs if _tags(j).get("recipe")), "")
    created = min((_created(j) for j in jobs), default="")
    try:
        record = read_record(_tags(controller)) if controller is not None else None
    except UserError as exc:
        record, detail = None, exc.problems[0].message
    else:
        detail = ""
    user = next((_user(j) for j in jobs if _user(j)), "")
    if record is None:
        state = _status(controller) if controller is not None else "?"
        return RunRow(run, "managed", state, len(attempts), "?", created, recipe,
                      detail or "its record could not be read", user)
    return RunRow(run, "managed", record.state, len(record.attempts), f"${record.total_usd(record.rules().controller_usd_per_hour):,.2f} (record)", created,
                  recipe or record.recipe, user=user)


def log_names(processes_per_node: int, node: int | None) -> list[str]:
    """Azure ML's per-process log names for one node (`std_log_process_<global rank>.txt`),
    node 0's first process when no node is named."""
    if node is None:
        return ["std_log_process_0.txt"]
    return [f"std_log_process_{node * processes_per_node + i}.txt" for i in range(processes_per_node)]


def downloaded_logs(folder: Path, names: list[str]) -> list[Path]:
    found = {p.name: p for p in folder.rglob("std_log_process_*.txt")}
    return [found[n] for n in names if n in found]


def iter_lines(paths: list[Path]) -> Iterator[str]:
    for path in paths:
        prefix = "" if len(paths) == 1 else f"[{path.stem.removeprefix('std_log_process_')}] "
        for line in path.read_text(errors="replace").splitlines():
            yield prefix + line
