"""Experiment stack lifecycle: create one (`new-experiment`), find the expired ones (`expired`).

An experiment stack is a `Pulumi.exp-<name>.yaml` file: clusters added to an environment's
workspace, an `aml-hpc:expiresAt`, and a budget. The teardown workflow destroys the
stacks `expired_stacks()` returns; datasets and checkpoints are never at risk because an
experiment stack owns no storage (policy rule `experiment-clusters-only`).

Pure functions take `root` (where the stack files are) and `now`, so tests run on a
temporary directory at a fixed time; the `*_command` functions are the typer commands
`python -m amlhpc.infra expired` and `python -m amlhpc.infra new-experiment`, mounted by amlhpc/infra/cli.py.
Expiry is read straight from the stack files (no Pulumi, no Azure), so a stack whose
config no longer validates is still found - and reported instead of silently kept.
"""

from __future__ import annotations

import hashlib
import json as jsonlib
import math
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
import yaml

from amlhpc.core import invocation, skus
from amlhpc.core.errors import Problem, UserError, exit_with
from amlhpc.infra import naming
from amlhpc.infra.config import (
    EXPERIMENT_PREFIX,
    LOCATION_KEY,
    NAMESPACE,
    REPO_ROOT,
    StackConfig,
    check_experiment_against_environment,
    load_stack_config,
    parse,
    parse_expires_at,
    read_stack_file,
    stack_file,
)

MAX_DAYS = 90
"""Longest lifetime `new-experiment` grants. Work that runs longer than a quarter belongs
in an environment stack (or extend expiresAt deliberately, in review)."""

_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,18}[a-z0-9])?$")
"""Experiment names: 1-20 lowercase letters, digits, hyphens (amlhpc.infra.config checks the same)."""

Status = Literal["expired", "active", "invalid"]


@dataclass(frozen=True)
class ExperimentStack:
    """An experiment stack file and what its expiry says."""

    stack: str
    file: str
    environment: str | None
    expires_at: datetime | None
    problem: str | None = None
    """Why the expiry cannot be read (missing, not a date, broken YAML)."""

    def status(self, now: datetime) -> Status:
        if self.expires_at is None:
            return "invalid"
        return "expired" if self.expires_at <= now else "active"

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "file": self.file,
            "environment": self.environment,
            "expiresAt": _iso(self.expires_at) if self.expires_at else None,
            "problem": self.problem,
        }


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    return now if now.tzinfo else now.replace(tzinfo=UTC)


# --------------------------------------------------------------------------------------
# Expiry


def experiment_stacks(root: Path = REPO_ROOT) -> list[ExperimentStack]:
    """Every `Pulumi.exp-*.yaml` under root, with its expiry (or why it has none)."""
    out = []
    for path in sorted(root.glob(f"Pulumi.{EXPERIMENT_PREFIX}*.yaml")):
        stack = path.name[len("Pulumi.") : -len(".yaml")]
        try:
            flat = read_stack_file(stack, root)
        except UserError as exc:
            out.append(ExperimentStack(stack, path.name, None, None, exc.problems[0].message))
            continue
        environment = flat.get(f"{NAMESPACE}environment")
        raw = flat.get(f"{NAMESPACE}expiresAt")
        if raw is None:
            out.append(ExperimentStack(stack, path.name, environment, None, "aml-hpc:expiresAt is missing"))
            continue
        try:
            expires = parse_expires_at(raw)
        except ValueError:
            out.append(ExperimentStack(stack, path.name, environment, None,
                                       f"aml-hpc:expiresAt {raw!r} is not an ISO 8601 date or date-time"))
            continue
        out.append(ExperimentStack(stack, path.name, environment, expires))
    return out


def expired_stacks(root: Path = REPO_ROOT, now: datetime | None = None) -> list[ExperimentStack]:
    """Experiment stacks whose expiresAt is at or before `now` (default: the current time)."""
    moment = _now(now)
    return [s for s in experiment_stacks(root) if s.status(moment) == "expired"]


def expiry_report(root: Path = REPO_ROOT, now: datetime | None = None) -> dict[str, Any]:
    """The document `python -m amlhpc.infra expired --json` prints (the teardown workflow reads it)."""
    moment = _now(now)
    report: dict[str, Any] = {"now": _iso(moment), "expired": [], "active": [], "invalid": []}
    for stack in experiment_stacks(root):
        report[stack.status(moment)].append(stack.to_json())
    return report


Outcome = Literal["destroyed", "not-deployed", "failed", "dry-run", "orphaned"]

_OUTCOME_TEXT = {
    "destroyed": "destroyed and removed from the backend",
    "not-deployed": "not on the backend (already gone, or never deployed)",
    "failed": "destroy FAILED: see this job's log; the stack is kept",
    "dry-run": "would be destroyed (dry run)",
    "orphaned": "on the backend with no stack file: kept, destroy by hand",
}


def teardown_summary(report: dict[str, Any], outcomes: dict[str, str], environments: list[str]) -> str:
    """The teardown workflow's job summary (Markdown): what was destroyed and what was kept.

    report: `expiry_report()`; outcomes: stack -> Outcome for every stack the workflow
    touched (expired ones, and orphans it found on the backend); environments: the
    environment stacks, which hold all datasets and checkpoints and are never torn down.
    """
    lines = [f"## Experiment teardown at {report['now']}", ""]
    expired = report.get("expired", [])
    touched = {e["stack"]: e for e in expired}
    destroyed = [s for s, o in outcomes.items() if o in ("destroyed", "not-deployed", "dry-run")]
    lines.append("### Destroyed")
    if destroyed:
        lines += ["| stack | environment | expired at | result |", "|---|---|---|---|"]
        for stack in sorted(destroyed):
            entry = touched.get(stack, {})
            lines.append(f"| {stack} | {entry.get('environment') or '?'} | {entry.get('expiresAt') or '?'} | "
                         f"{_OUTCOME_TEXT[outcomes[stack]]} |")
        gone = [s for s in destroyed if outcomes[s] != "dry-run"]
        if gone:
            lines += ["", "Delete their stack files from the repository: "
                      + ", ".join(f"`Pulumi.{s}.yaml`" for s in sorted(gone))]
    else:
        lines.append("Nothing expired.")
    lines += ["", "### Kept", "| what | why |", "|---|---|"]
    for env in sorted(environments):
        lines.append(f"| datasets and checkpoints of `{env}` | environment stack: storage is retained/protected and "
                     "never owned by an experiment |")
    for stack in sorted(s for s, o in outcomes.items() if o in ("failed", "orphaned")):
        lines.append(f"| {stack} | {_OUTCOME_TEXT[outcomes[stack]]} |")
    for entry in report.get("active", []):
        lines.append(f"| {entry['stack']} | expires {entry['expiresAt']} |")
    for entry in report.get("invalid", []):
        lines.append(f"| {entry['stack']} | cannot read its expiry: {entry['problem']} |")
    for entry in expired:
        if entry["stack"] not in outcomes:
            lines.append(f"| {entry['stack']} | expired but not processed (job cancelled?) |")
    return "\n".join(lines) + "\n"


def teardown_summary_files(report_path: str, outcomes_path: str, *environments: str) -> str:
    """teardown_summary() from the workflow's files: the `expired --json` document and
    a tab-separated `stack<TAB>outcome` list."""
    report = jsonlib.loads(Path(report_path).read_text())
    outcomes = {}
    for line in Path(outcomes_path).read_text().splitlines():
        if line.strip():
            stack, outcome = line.split("\t", 1)
            outcomes[stack.strip()] = outcome.strip()
    return teardown_summary(report, outcomes, list(environments))


# --------------------------------------------------------------------------------------
# New experiment


def _name_problem(name: str) -> Problem | None:
    short = name[len(EXPERIMENT_PREFIX):] if name.startswith(EXPERIMENT_PREFIX) else name
    if _NAME.match(short):
        return None
    return Problem("NAME", "", f"{name!r} is not a valid experiment name",
                   "use 1-20 lowercase letters, digits and hyphens, starting and ending with a "
                   "letter or digit, e.g. bert-sweep")


def _environment(env: str, root: Path) -> StackConfig:
    if env.startswith(EXPERIMENT_PREFIX):
        raise UserError([Problem("ENV (--env)", "", f"{env!r} is an experiment stack, not an environment",
                                 "experiments join an environment stack, e.g. ENV=dev")], "invalid experiment")
    if not stack_file(env, root).is_file():
        known = [p.name[len("Pulumi."):-len(".yaml")] for p in sorted(root.glob("Pulumi.*.yaml"))]
        environments = [k for k in known if not k.startswith(EXPERIMENT_PREFIX)]
        raise UserError([Problem("ENV (--env)", "", f"no environment stack {env!r} (no Pulumi.{env}.yaml)",
                                 f"environments here: {', '.join(environments) or 'none'}")], "invalid experiment")
    return load_stack_config(env, root)


def _taken_cluster_names(environment: StackConfig, root: Path) -> set[str]:
    """Cluster names in the environment's workspace: its own and every experiment's."""
    taken = {c.name.lower() for c in environment.clusters}
    for path in root.glob(f"Pulumi.{EXPERIMENT_PREFIX}*.yaml"):
        try:
            document = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError:
            continue
        config = document.get("config") if isinstance(document, dict) else None
        clusters = config.get(f"{NAMESPACE}clusters") if isinstance(config, dict) else None
        for cluster in clusters if isinstance(clusters, list) else []:
            if isinstance(cluster, dict) and isinstance(cluster.get("name"), str):
                taken.add(cluster["name"].lower())
    return taken


def _cluster_name(name: str, taken: set[str]) -> str:
    """The experiment's cluster name: its own name when that is a valid, free cluster name;
    otherwise the name made valid (Azure ML wants a letter first and a letter after the
    last hyphen: `sweep-2` becomes `sweep-2x`), shortened with a hash of the full name when
    too long or taken. Every candidate goes through amlhpc.infra.naming's rule."""
    digest = hashlib.sha256(name.encode()).hexdigest()
    base = name if name[:1].isalpha() else f"x{name}"
    fixed = base if naming.compute_hyphen_rule_ok(base) else f"{base}x"
    # "h" keeps a letter after the hyphen whatever the hex digest holds.
    candidates = [name, fixed] + [f"{fixed[:12].rstrip('-')}-h{digest[i:i + 6]}" for i in range(0, 24, 6)]
    candidates += [f"x{digest[i:i + 8]}" for i in range(0, 40, 8)]
    for candidate in candidates:
        if naming.check("cluster", candidate) is None and candidate.lower() not in taken:
            return candidate
    raise AssertionError("no free cluster name")  # pragma: no cover - 9 hash slices all taken


def _template_cluster(environment: StackConfig, sku: str | None):
    if sku is not None:
        try:
            return skus.get(sku).name, None
        except skus.UnknownSkuError as exc:
            near = f"did you mean {' or '.join(exc.suggestions)}? " if exc.suggestions else ""
            raise UserError([Problem("--sku", "", f"unknown VM size {sku!r}",
                                     f"{near}known sizes: {', '.join(skus.names())}")], "invalid experiment") from None
    clusters = sorted(environment.clusters, key=lambda c: not skus.get(c.sku).infiniband)
    if not clusters:
        raise UserError([Problem(environment.source, f"{NAMESPACE}clusters", "the environment has no cluster to copy",
                                 "pass --sku, e.g. --sku Standard_ND96asr_v4")], "invalid experiment")
    return clusters[0].sku, clusters[0]


def _default_budget(sku_name: str, max_nodes: int, days: int, environment: StackConfig) -> float | None:
    """Full scale for the whole lifetime, rounded up to $100: what a forgotten experiment costs."""
    price = environment.hourly_price(sku_name)
    if price is None:
        return None
    return float(max(100, math.ceil(price.usd_per_hour * max_nodes * 24 * days / 100) * 100))


def render_experiment(stack: str, flat: dict[str, Any], environment: StackConfig, days: int,
                      expires: datetime) -> str:
    """The stack file's text: what it is, then the config."""
    header = [
        f"# Experiment stack: clusters added to the {environment.stack!r} environment's workspace.",
        f"# Created by aml-hpc's new-experiment for {days} day(s). The teardown workflow destroys it",
        f"# after aml-hpc:expiresAt ({_iso(expires)}); datasets and checkpoints live in the",
        "# environment stack and stay. Extend it with:",
        f"#   pulumi config set aml-hpc:expiresAt <ISO date> --stack {stack}",
        "# Commit this file: teardown reads the committed stack files.",
    ]
    body = yaml.safe_dump({"config": flat}, sort_keys=False, default_flow_style=False, width=100)
    return "\n".join(header) + "\n" + body


def new_experiment(name: str, env: str = "dev", days: int = 7, root: Path = REPO_ROOT,
                   now: datetime | None = None, *, owner: str | None = None, sku: str | None = None,
                   max_nodes: int | None = None, budget_usd: float | None = None) -> Path:
    """Write `Pulumi.exp-<name>.yaml` for an experiment on `env` that expires in `days`.

    The cluster copies the environment's first InfiniBand cluster (size, priority, node
    count, idle time) unless `sku`/`max_nodes` say otherwise; minNodes is always 0. The
    budget alerts the environment's budget contacts at the cost of running the cluster at
    full scale for the whole lifetime, unless `budget_usd` is given. The file is validated
    with the same rules `pulumi up` uses before it is written; an existing file is never
    overwritten. Raises UserError (nothing written) on bad input.
    """
    problems = [p for p in (_name_problem(name),) if p]
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        problems.append(Problem("DAYS (--days)", "", f"{days!r} is not a whole number of days from 1 to {MAX_DAYS}",
                                "e.g. DAYS=7; longer work belongs in an environment stack"))
    if max_nodes is not None and max_nodes < 1:
        problems.append(Problem("--max-nodes", "", f"{max_nodes} is below 1", "e.g. --max-nodes 2"))
    if budget_usd is not None and budget_usd <= 0:
        problems.append(Problem("--budget-usd", "", f"{budget_usd} is not a positive amount", "e.g. --budget-usd 2000"))
    if problems:
        raise UserError(problems, "invalid experiment")
    short = name[len(EXPERIMENT_PREFIX):] if name.startswith(EXPERIMENT_PREFIX) else name
    stack = f"{EXPERIMENT_PREFIX}{short}"
    path = stack_file(stack, root)
    if path.exists():
        raise UserError([Problem(path.name, "", f"stack {stack!r} already exists",
                                 "pick another NAME, or extend it: pulumi config set aml-hpc:expiresAt "
                                 f"<ISO date> --stack {stack}")], "experiment exists")
    environment = _environment(env, root)
    moment = _now(now)
    expires = (moment + timedelta(days=days)).replace(microsecond=0)

    sku_name, template = _template_cluster(environment, sku)
    nodes = max_nodes or (template.max_nodes if template else 1)
    cluster: dict[str, Any] = {
        "name": _cluster_name(short, _taken_cluster_names(environment, root)),
        "sku": sku_name,
        "minNodes": 0,
        "maxNodes": nodes,
        "idleMinutes": template.idle_minutes if template else 10,
        "priority": template.priority if template else "LowPriority",
    }
    if template and template.allow_tcp_multi_node and sku is None:
        cluster["allowTcpMultiNode"] = True
    if template and template.allow_unlisted_region and sku is None:
        cluster["allowUnlistedRegion"] = True  # same size, same region: the same choice

    who = owner or environment.owner
    emails = list(environment.budget.alert_emails) if environment.budget else []
    if not emails and "@" in who:
        emails = [who]
    amount = budget_usd or _default_budget(sku_name, nodes, days, environment)
    if not emails or amount is None:
        missing = []
        if not emails:
            missing.append(Problem(environment.source, f"{NAMESPACE}budget.alertEmails",
                                   "the environment has no budget contacts to copy, and the owner is not an email",
                                   "pass --owner you@example.com"))
        if amount is None:
            missing.append(Problem("--budget-usd", "", f"{sku_name} has no reference price to size the budget",
                                   "pass --budget-usd <monthly amount>"))
        raise UserError(missing, "invalid experiment")

    flat: dict[str, Any] = {
        LOCATION_KEY: environment.location,
        f"{NAMESPACE}owner": who,
        f"{NAMESPACE}environment": environment.stack,
        f"{NAMESPACE}expiresAt": _iso(expires),
        f"{NAMESPACE}clusters": [cluster],
        f"{NAMESPACE}budget": {"monthlyAmountUsd": int(amount) if float(amount).is_integer() else amount,
                               "alertEmails": emails},
    }
    if environment.name_prefix != "amlhpc":
        flat[f"{NAMESPACE}namePrefix"] = environment.name_prefix
    if environment.cost_center:
        flat[f"{NAMESPACE}costCenter"] = environment.cost_center

    # Validate exactly as `pulumi up` and the offline plan will, before anything is written.
    experiment = parse(stack, flat, path.name, now=moment)
    check_experiment_against_environment(experiment, environment)
    _write_new(path, render_experiment(stack, flat, environment, days, expires))
    return path


def _write_new(path: Path, text: str) -> None:
    """Create `path` with `text` whole, or fail if it exists: no partial or clobbered file."""
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.link(tmp, path)  # atomic, and refuses an existing path
    except FileExistsError:
        raise UserError([Problem(path.name, "", "was created meanwhile", "pick another NAME")], "experiment exists") from None
    finally:
        os.unlink(tmp)


# --------------------------------------------------------------------------------------
# Commands (typer; mounted as `python -m amlhpc.infra expired` and `python -m amlhpc.infra new-experiment`)


def _parse_now(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_expires_at(value)
    except ValueError:
        raise UserError([Problem("--now", "", f"{value!r} is not an ISO 8601 date or date-time",
                                 "e.g. --now 2026-12-31T00:00:00Z")], "invalid option") from None


def _describe(stack: ExperimentStack, now: datetime) -> str:
    if stack.expires_at is None:
        return f"invalid: {stack.problem}"
    delta = stack.expires_at - now
    span = abs(delta)
    amount = f"{span.days} day(s)" if span >= timedelta(days=1) else f"{int(span.total_seconds() // 3600)} hour(s)"
    return f"expired {amount} ago" if delta <= timedelta(0) else f"expires in {amount}"


def expired_command(
    json: Annotated[bool, typer.Option("--json", help="Print the JSON document the teardown workflow reads.")] = False,
    now: Annotated[str | None, typer.Option("--now", help="Judge expiry at this ISO 8601 time instead of now.")] = None,
) -> None:
    """List experiment stacks (Pulumi.exp-*.yaml) whose aml-hpc:expiresAt has passed."""
    try:
        moment = _now(_parse_now(now))
    except UserError as exc:
        exit_with(exc)
    if json:
        print(jsonlib.dumps(expiry_report(REPO_ROOT, moment), indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    stacks = experiment_stacks(REPO_ROOT)
    console = Console()
    if not stacks:
        console.print(f"no experiment stacks (Pulumi.exp-*.yaml) in {REPO_ROOT}")
        return
    table = Table(title=f"experiment stacks at {_iso(moment)}")
    for column in ("stack", "environment", "expiresAt", "status"):
        table.add_column(column)
    for stack in stacks:
        status = stack.status(moment)
        style = {"expired": "bold red", "invalid": "yellow", "active": ""}[status]
        table.add_row(stack.stack, stack.environment or "?", _iso(stack.expires_at) if stack.expires_at else "-",
                      _describe(stack, moment), style=style)
    console.print(table)
    expired = [s.stack for s in stacks if s.status(moment) == "expired"]
    console.print(f"{len(expired)} expired: {', '.join(expired)}" if expired else "none expired")


def new_experiment_command(
    name: Annotated[str, typer.Argument(help="Experiment name; the stack is exp-NAME (1-20 of a-z, 0-9, -).")],
    env: Annotated[str, typer.Option("--env", help="Environment stack whose workspace it joins.")] = "dev",
    days: Annotated[int, typer.Option("--days", help=f"Lifetime in days (1-{MAX_DAYS}); sets aml-hpc:expiresAt.")] = 7,
    owner: Annotated[str | None, typer.Option("--owner", help="Owner tag; default: the environment's owner.")] = None,
    sku: Annotated[str | None, typer.Option("--sku", help="VM size; default: the environment's first InfiniBand cluster's.")] = None,
    max_nodes: Annotated[int | None, typer.Option("--max-nodes", help="Cluster size; default: the copied cluster's.")] = None,
    budget_usd: Annotated[float | None, typer.Option("--budget-usd", help="Monthly budget; default: full scale for the whole lifetime.")] = None,
) -> None:
    """Create Pulumi.exp-NAME.yaml: a cluster on ENV's workspace that teardown removes after DAYS."""
    try:
        path = new_experiment(name, env, days, REPO_ROOT, owner=owner, sku=sku, max_nodes=max_nodes,
                              budget_usd=budget_usd)
    except UserError as exc:
        exit_with(exc)
    stack = path.name[len("Pulumi."):-len(".yaml")]
    print(f"created {path.name}\n"
          f"  offline check:  {invocation.command('infra', f'plan --stack {stack} --policy')}\n"
          f"  preview:        {invocation.deploy('preview', stack)}\n"
          f"  deploy:         {invocation.deploy('up', stack)}\n"
          f"  tear down:      {invocation.deploy('down', stack)}   (or let the teardown workflow do it after expiry)\n"
          f"Preview and deploy read the outputs {env}'s up publishes: {invocation.deploy('up', env)} first.\n"
          f"Commit {path.name} so teardown can find it.")
