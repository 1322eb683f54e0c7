"""`python -m amlhpc.jobs run RECIPE --local`: rehearse a recipe on this machine (amlhpc/jobs/local/rehearsal.py).

    python -m amlhpc.jobs run cosmoflow [--local] [--nodes 2] [--procs-per-node 2] [--stack dev]
        [--set key=value ...] [--name NAME] [--data INPUT=DIR] [--quiet] [--fault SPEC ...]
        [--managed [--resume] [--max-restarts N]]

--fault SPEC (repeatable; amlhpc/jobs/local/faults.py has the grammar) injects a fault at a
training step, on a node or a rank, in a restart generation (`gen=K`) and attempt
(`attempt=K`), or at a controller phase: `hang@step=6,node=1`, `preempt@step=4,node=0,grace=30`,
`kill-host@step=5,node=1,replace=no`, `slow@node=1,factor=3`, `kill-controller@phase=watch`,
`crash@step=5,rank=3`, `error@step=3,rank=1`, `stall@step=5,rank=3`. Node and controller
faults need --managed. A fault that did not happen fails the command (exit 1).

With --managed the run is supervised as `submit --managed` would be in Azure
(amlhpc/jobs/local/managed.py). A managed run's name in use is refused unless --resume (its
default name is new each time).

In order: the recipe with its local profile (`local:` in the recipe: a model, messages and
data a 2-core machine without a GPU can run; --set wins over it), then what the profile
requires of this machine (amlhpc/jobs/local/requirements.py: refused within seconds, before
anything starts, naming everything missing), then the offline plan, Blob, the dataset,
and the simulated nodes.

Blob: when AMLHPC_BLOB_CONNECTION_STRING is set (e.g. by `make demo`) that Azurite is used;
otherwise one is started for the run with its data in .azurite/ (or $AMLHPC_AZURITE_DIR;
kept between runs, so a dataset uploaded once stays) and stopped afterwards. A staged input with no blobs and no
--data gets the profile's generated dataset; `--data INPUT=DIR` stages exactly DIR's files
(a Blob prefix of their own, amlhpc/jobs/local/datasets.py; an empty DIR is refused). The
same --name again starts a new run, the earlier one kept as NAME-<when it started>; with
--resume it continues from the checkpoint the previous run left, and a run that had already
finished says so and trains nothing (amlhpc/jobs/local/reruns.py). Ctrl-C, SIGTERM or a failure stop every process the run started
(amlhpc/jobs/local/processes.py). Exit status: 0 when every process succeeded, else the first
failing process's status; 2 for bad input or a machine that cannot run the recipe;
128+N after signal N.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from amlhpc.core import invocation, project
from amlhpc.core.errors import EXIT_FAILURE, Problem, UserError
from amlhpc.jobs.cli.options import guard
from amlhpc.jobs.local import processes
from amlhpc.jobs.local.faults import FaultSpec, RehearsalFaults
from amlhpc.jobs.runtime.base import contract

PROJECT_ROOT = project.root()
AZURITE_DIR_VARIABLE = "AMLHPC_AZURITE_DIR"
"""Where the rehearsal's own Azurite keeps its data (default .azurite/)."""
DEFAULT_NODES = 2
DEFAULT_PROCS_PER_NODE = 2
STDOUT = Console(highlight=False)
out = STDOUT


def _blob_endpoint(connection_string: str) -> str:
    match = re.search(r"BlobEndpoint=([^;]+)", connection_string)
    if not match:
        raise UserError([Problem(contract.BLOB_CONNECTION_STRING, "BlobEndpoint",
                                 "the connection string has no BlobEndpoint=...", "use Azurite's full connection string")],
                        "invalid Blob connection")
    return match.group(1).rstrip("/")


@contextlib.contextmanager
def local_blob():
    """(endpoint, connection string) of the Azurite to use: the caller's, or one we start."""
    given = os.environ.get(contract.BLOB_CONNECTION_STRING)
    if given:
        yield _blob_endpoint(given), given
        return
    from amlhpc.jobs.local import azurite

    folder = Path(os.environ.get(AZURITE_DIR_VARIABLE) or PROJECT_ROOT / ".azurite")
    try:
        server = azurite.start(folder)
    except (azurite.AzuriteNotInstalled, RuntimeError, TimeoutError) as exc:
        raise UserError([Problem("Azurite (the local Blob service)", "", f"did not start: {exc}",
                                 f"see {folder / 'azurite.log'}; {azurite.install_hint()}")],
                        "no local Blob") from None
    with server:
        yield server.blob_endpoint, server.connection_string


def _parse_data(pairs: list[str], recipe) -> dict[str, Path]:
    """--data INPUT=DIR pairs, checked against the recipe's inputs before anything starts: a
    folder with files in it, every one of them readable (the rehearsal stages exactly those)."""
    from amlhpc.jobs.data.walk import scan

    data, problems = {}, []
    for pair in pairs:
        name, sep, folder = pair.partition("=")
        if not sep or not name or not Path(folder).is_dir():
            problems.append(Problem("--data", pair, "is not INPUT=DIR with an existing folder",
                                    "e.g. --data cosmoflow=.scratch/demo/cosmoflow-data"))
            continue
        walked = scan(Path(folder))
        if walked.skipped:
            shown = "; ".join(f"{s.rel}: {s.reason}" for s in walked.skipped[:3])
            problems.append(Problem("--data", pair, f"{len(walked.skipped)} file(s) in {folder} cannot be staged ({shown})",
                                    "make them readable regular files, or move them out of the folder"))
            continue
        if not walked.files:
            problems.append(Problem("--data", pair, f"{folder} holds no files: the rehearsal would train on nothing "
                                    "(or on whatever an earlier run left in Blob)",
                                    "pass the folder that holds the dataset's files"))
            continue
        staged = [n for n, spec in recipe.inputs.items() if spec.mode == "stage"]
        if name not in staged:
            near = difflib.get_close_matches(name, staged, n=1)
            problems.append(Problem("--data", name, f"recipe {recipe.name!r} stages no input called {name!r}",
                                    (f"did you mean --data {near[0]}={folder}? " if near else "")
                                    + f"staged inputs: {', '.join(staged) or 'none'}"))
            continue
        data[name] = Path(folder)
    if problems:
        raise UserError(problems, "invalid --data")
    return data


def upload_inputs(plan, data: dict[str, Path], connection_string: str, echo, exact: bool = False) -> None:
    """Upload local folders to the staged inputs' prefixes (resumable: unchanged files skip).
    `exact`: the prefix must then hold the folder's files and nothing else (--data's own
    prefix, amlhpc/jobs/local/datasets.py), or the rehearsal is refused before it starts."""
    from amlhpc.jobs.data import upload
    from amlhpc.jobs.runtime.blob import blobio

    staged = {spec["name"]: spec for spec in plan.staged_inputs}
    for name, folder in data.items():
        spec = staged[name]
        client = blobio.container_client(spec["container"], connection_string=connection_string)
        report = upload.upload_directory(client, folder, spec["prefix"])
        echo(f"uploaded {folder} -> {spec['container']}/{spec['prefix']}: {report.uploaded} new, "
             f"{report.unchanged} unchanged, {report.bytes_in / 1e6:,.1f} MB as {report.bytes_stored / 1e6:,.1f} MB gzip")
        if exact and report.remote_only:
            raise UserError([Problem("--data", f"{name}={folder}",
                                     f"{spec['container']}/{spec['prefix']} also holds {len(report.remote_only)} blob(s) "
                                     f"that are not in the folder (e.g. {report.remote_only[0]}): staging would add them",
                                     "remove them from the local Blob, or rehearse from a copy of the folder")],
                            "rehearsal cannot start: its dataset is not exactly the folder")
        if exact:
            echo(f"input {name!r} stages exactly the {report.files} file(s) of {folder}")


@dataclass(frozen=True)
class RunOptions:
    """What `jobs run` was asked, checked later in `_start` (the recipe decides the size)."""

    recipe: str
    stack: str = "dev"
    outputs_file: Path | None = None
    nodes: int | None = None
    procs_per_node: int | None = None
    sets: tuple[str, ...] = ()
    name: str | None = None
    data: tuple[str, ...] = ()
    workdir: Path | None = None
    timeout: float = 1800
    quiet: bool = False
    managed: bool = False
    resume: bool = False
    max_restarts: int | None = None
    faults: tuple[str, ...] = ()
    as_json: bool = False


def run(
    recipe: Annotated[str, typer.Argument(help="Recipe name (the project's recipes/NAME.yaml, else the built-in one) or path.")],
    local: Annotated[bool, typer.Option("--local", help="Accepted, not needed: rehearsing on this machine is `run`'s only mode (Azure runs use `submit`).")] = False,
    stack: Annotated[str, typer.Option("--stack", help="Stack whose outputs the job is planned against.")] = "dev",
    outputs_file: Annotated[Path | None, typer.Option("--outputs", help="Stack outputs from a JSON file instead of the offline plan.")] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", help="Simulated nodes; wins over the local profile (default 2).")] = None,
    procs_per_node: Annotated[int | None, typer.Option("--procs-per-node", help="Processes per simulated node (CPU ranks; default 2).")] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help="Override a recipe key, as for submit; wins over the local profile.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Run name: its folder and checkpoint prefix; with --resume, the run to continue. Default <recipe>-local.")] = None,
    data: Annotated[list[str] | None, typer.Option("--data", metavar="INPUT=DIR", help="Stage exactly DIR's files for INPUT (uploaded to a Blob prefix of their own; default: the profile's generated dataset when the input has no blobs).")] = None,
    workdir: Annotated[Path | None, typer.Option("--workdir", help="Folder for the simulated nodes (default .rehearsal/<name>).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Stop every process after this many seconds.")] = 1800,
    quiet: Annotated[bool, typer.Option("--quiet", help="Show rank 0's lines and errors only.")] = False,
    managed: Annotated[bool, typer.Option("--managed", help="Rehearse a managed run: the supervision resubmits after a fault, resuming from the checkpoint (amlhpc/jobs/local/managed.py).")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run of this name from its latest checkpoint (a finished run trains nothing and says so). Without it a name that holds a run starts a new one, the earlier one set aside as NAME-<when it started>; with --managed a name in use is refused instead.")] = False,
    max_restarts: Annotated[int | None, typer.Option("--max-restarts", help="With --managed: attempts after the first.")] = None,
    fault: Annotated[list[str] | None, typer.Option("--fault", metavar="SPEC", help="Inject a fault (repeatable): KIND@KEY=VALUE,... with KIND preempt, hang, kill-host, slow, kill-controller (these with --managed), crash, error or stall, and gen=K / attempt=K to pick the restart generation and the attempt; e.g. hang@step=6,node=1, preempt@step=4,node=0,grace=30, kill-host@step=5,node=1,replace=no, slow@node=1,factor=3, kill-controller@phase=watch, error@step=3,rank=1. A fault that did not happen fails the command.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout (outcome, exit statuses, checkpoint, steps trained; of a managed run its record); the processes' lines go to stderr.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Run RECIPE on this machine as Azure ML would: N simulated nodes, real launcher, Azurite as Blob."""
    global out
    if as_json:  # stdout holds the result alone
        out = Console(highlight=False, stderr=True)
    options = RunOptions(recipe, stack, outputs_file, nodes, procs_per_node, tuple(sets or ()), name, tuple(data or ()),
                         workdir, timeout, quiet, managed, resume, max_restarts, tuple(fault or ()), as_json)
    try:
        with processes.supervised():
            guard(debug, lambda: _start(options))
    except processes.Interrupted as stop:
        again = invocation.command("jobs", f"run {recipe} --local" + (f" --name {name}" if name else "") + " --resume")
        out.print(f"[yellow]rehearsal interrupted ({stop}):[/] every process it started was stopped; continue it "
                  f"from its last checkpoint: {again}", soft_wrap=True, highlight=False)
        raise typer.Exit(stop.exit_code) from None
    finally:
        out = STDOUT


def _start(o: RunOptions) -> None:
    """Check what `run` was asked (the recipe, its size, --data, --fault, this machine), then rehearse."""
    if (o.procs_per_node is not None and o.procs_per_node < 1) or (o.nodes is not None and o.nodes < 1):
        raise UserError([Problem("command line", "--nodes/--procs-per-node", "must be 1 or more", "e.g. --nodes 2 --procs-per-node 2")],
                        "invalid rehearsal size")
    from amlhpc.jobs import recipes
    from amlhpc.jobs.local import datasets, faults, requirements

    overrides = recipes.parse_overrides(list(o.sets))
    r = recipes.load(o.recipe, overrides, local=True)
    uploads = _parse_data(list(o.data), r)
    extra: dict[str, object] = {}
    if o.managed and r.watchdog.hang_s is None:  # find a rehearsed hang in seconds, not minutes
        extra["watchdog.hang_s"] = 10
    for input_name, folder in uploads.items():  # exactly the folder's files: a prefix of their own
        extra[f"inputs.{input_name}.path"] = datasets.given_prefix(input_name, folder)
    if extra:
        r = recipes.load(o.recipe, {**overrides, **extra}, local=True)
    size = o.nodes or r.local.nodes or DEFAULT_NODES
    per_node = o.procs_per_node or r.local.processes_per_node or DEFAULT_PROCS_PER_NODE
    injected = faults.plan(o.faults, nodes=size, ranks=size * per_node, managed=o.managed)
    if o.resume and o.managed and not o.name:
        raise UserError([Problem("command line", "--resume", "continues a managed rehearsal by its name",
                                 "add --name RUN")], "invalid flags")
    requirements.check(r)  # before the plan, Blob, data or staging: a refusal takes seconds
    rehearse(r, stack=o.stack, outputs_file=o.outputs_file, nodes=size, procs_per_node=per_node,
             name=o.name, uploads=uploads, workdir=o.workdir, timeout=o.timeout, quiet=o.quiet,
             managed=Managed(injected, o.max_restarts, o.resume) if o.managed else None,
             resume=o.resume, as_json=o.as_json, faults=injected)


@dataclass(frozen=True)
class Managed:
    """A rehearsal of a managed run: the faults to inject (amlhpc/jobs/local/faults.py)."""

    faults: RehearsalFaults
    max_restarts: int | None
    resume: bool = False


def _earlier_run(folder: Path, run_name: str, recipe: str, resume: bool):
    """The earlier run the folder holds: continued (--resume), or set aside for a fresh one."""
    from amlhpc.jobs.local import reruns

    before = reruns.earlier(folder)
    if resume:
        if before is None:
            raise UserError([Problem("--resume", run_name, f"no earlier rehearsal of that name in {folder}",
                                     "drop --resume to start it, or name an earlier run: " + invocation.command("jobs", "list --local"))],
                            "nothing to resume")
        return before
    if before is not None:
        moved = reruns.set_aside(before)
        out.print(f"an earlier run of {run_name} ({before.outcome}, {before.attempts} attempt(s)) is kept as "
                  f"{moved.name} (its folder {moved}, its checkpoints under {before.recipe or recipe}/{before.key}); "
                  f"this run starts fresh. To continue that one instead: --name {moved.name} --resume",
                  highlight=False, soft_wrap=True)
    return None


def rehearse(r, *, stack: str, outputs_file: Path | None, nodes: int, procs_per_node: int, name: str | None,
             uploads: dict[str, Path], workdir: Path | None, timeout: float, quiet: bool,
             managed: Managed | None = None, resume: bool = False, as_json: bool = False,
             faults: RehearsalFaults | None = None) -> None:
    """Plan the job, start Blob, provide its data, run the simulated nodes (supervised when
    `managed`), print the summary. `faults`: the rank faults of a rehearsal without
    supervision (a managed one's are in `managed`)."""
    from amlhpc.jobs.local import control, datasets, folders, rehearsal, reruns
    from amlhpc.jobs.plan import build
    from amlhpc.jobs.plan import outputs as outputs_mod

    loaded = outputs_mod.load(stack, outputs_file=outputs_file, offline=outputs_file is None)
    # a managed run's name is its record's: a new one each time unless given (a name in use needs --resume)
    run_name = name or (f"{r.name}-managed-{time.strftime('%Y%m%d-%H%M%S')}" if managed else f"{r.name}-local")
    folder = workdir or folders.REHEARSALS / run_name
    continued = None if managed is not None else _earlier_run(folder, run_name, r.name, resume)
    key = continued.key if continued is not None else run_name
    plan = build.plan_job(r, loaded.outputs, nodes=nodes, processes_per_node=procs_per_node, name=run_name,
                          resume=key if key != run_name else None)
    if workdir is None:
        for old in folders.prune(folders.REHEARSALS, folders.KEEP_REHEARSALS, current=folder):
            out.print(f"[dim]removed an old rehearsal folder: {old.relative_to(PROJECT_ROOT)}[/]")
    snapshot = build.snapshot(plan.code_dirs)
    folders.touch(snapshot)
    folders.prune(folders.SNAPSHOTS, folders.KEEP_SNAPSHOTS, current=snapshot)
    out.print(f"[bold]rehearsal[/] {plan.name}: {nodes} simulated node(s) x {procs_per_node} process(es), "
              f"recipe {r.name}, planned for {plan.sku} on stack {stack} ({loaded.source} outputs); folder {folder}")

    def sink(proc, line: str) -> None:
        if quiet and proc.rank != 0 and "error" not in line.lower():
            return
        out.print(f"[dim]\\[n{proc.node}r{proc.local_rank}][/] {escape(line)}", markup=True, soft_wrap=True,
                  highlight=False)  # escaped: gloo's lines hold "[/path:line]", which rich takes for markup

    with control.announce(folder, "managed rehearsal" if managed else "rehearsal"), \
            local_blob() as (endpoint, connection):
        out.print(f"Blob: {endpoint}")
        containers = list(loaded.outputs.storage.containers.values())
        rehearsal.ensure_containers(containers, connection)
        if managed is None and continued is None:
            # a fresh run never resumes another's checkpoints (a pruned folder's are still in Blob)
            key = reruns.new_key(run_name, rehearsal.checkpoints_stored(plan.environment_variables, connection))
            if key != run_name:
                plan = build.plan_job(r, loaded.outputs, nodes=nodes, processes_per_node=procs_per_node, name=run_name,
                                      resume=key)
                out.print(f"checkpoints of an earlier run are stored under {r.name}/{run_name}: this run's go under "
                          f"{r.name}/{key}", highlight=False, soft_wrap=True)
        if managed is None:
            reruns.remember(folder, name=run_name, recipe=r.name, key=key,
                            started=continued.started if continued is not None else None)
        if uploads:
            upload_inputs(plan, uploads, connection, out.print, exact=True)
        datasets.provide(plan, r, uploads, connection, out.print, upload_inputs)
        if managed is not None:
            from amlhpc.jobs.local import managed as managed_rehearsal

            controller = managed.faults.controller
            try:
                done = managed_rehearsal.run_and_report(
                    r, loaded.outputs, plan, console=out, max_restarts=managed.max_restarts, snapshot=snapshot,
                    workdir=folder, procs_per_node=procs_per_node, blob_endpoint=endpoint, connection_string=connection,
                    containers=containers, sink=sink, timeout_s=timeout, resume=managed.resume,
                    faults=[managed_rehearsal.Fault.of(f) for f in managed.faults.on_node()],
                    rank_faults=managed.faults.in_rank(),
                    kill_controller_at=controller.phase if controller else None,
                    kill_controller_attempt=controller.attempt if controller else None,
                    cancel_when=control.watcher(folder))
            except managed_rehearsal.RunNameInUse as exc:
                raise UserError([Problem("--name", run_name, f"{exc}: a run name in use is not started again",
                                         "add --resume to continue it, or pick another --name")],
                                "run name in use") from None
            if as_json:
                _print_json({"run": run_name, "kind": "managed rehearsal", "folder": str(folder),
                             "state": done.record.state, "faultsMissing": done.missing, "record": done.record.to_json()})
            if done.missing:
                out.print(f"[red]rehearsal failed:[/] requested fault(s) did not happen: {'; '.join(done.missing)}",
                          highlight=False)
                raise typer.Exit(1)
            raise typer.Exit(0 if done.record.state == "succeeded" else 1)
        rank_faults = faults.in_rank() if faults is not None else []
        fault_log = folder / "faults" / "fired.log"
        fault_env = rank_fault_env(rank_faults, fault_log)
        result = rehearsal.rehearse(plan, snapshot=snapshot, workdir=folder, procs_per_node=procs_per_node,
                                    blob_endpoint=endpoint, connection_string=connection, containers=containers,
                                    sink=sink, timeout_s=timeout, stop_when=control.watcher(folder), extra_env=fault_env)
    missing = missing_rank_faults(rank_faults, fault_log)
    trained = reruns.trained_steps(folder, result.run_id)
    if as_json:
        failed = {str(rank): code for rank, code in result.exit_codes.items() if code != 0}
        outcome = ("canceled" if result.canceled else "failed" if failed else
                   "already finished" if continued is not None and trained is not None and trained.steps == 0 else "succeeded")
        _print_json({"run": run_name, "kind": "rehearsal", "outcome": outcome, "folder": str(folder),
                     "seconds": round(result.seconds, 3), "exitCodes": {str(k): v for k, v in result.exit_codes.items()},
                     "canceled": result.canceled, "checkpoint": result.checkpoint, "resumed": continued is not None,
                     "resumedFrom": trained.resumed_from if trained else None,
                     "lastStep": trained.last_step if trained else None, "faultsMissing": missing})
    if result.canceled:
        out.print(f"[yellow]rehearsal {result.plan.name} canceled[/] by {result.canceled.get('by', 'a user')}: every process "
                  f"stopped after {result.seconds:.1f} s; its record says canceled ({folder})", highlight=False,
                  soft_wrap=True)
        raise typer.Exit(EXIT_FAILURE)
    summarize(result, trained if continued is not None else None)
    for fault in rank_faults:
        out.print(("[red]fault did not happen:[/] " if fault.text in missing else "fault injected: ") + fault.text,
                  highlight=False)
    if missing:
        out.print(f"[red]rehearsal failed:[/] requested fault(s) did not happen: {'; '.join(missing)}", highlight=False)
        raise typer.Exit(EXIT_FAILURE)
    if not result.ok:
        first = next(code for _, code in sorted(result.exit_codes.items()) if code != 0)
        raise typer.Exit(first)


def rank_fault_env(rank_faults: list[FaultSpec], log: Path) -> dict[str, str]:
    """The variables arming rank faults in every process, their firings logged to `log` (fresh)."""
    from amlhpc.jobs.local import faults
    from amlhpc.jobs.runtime.base import faultpoints

    if not rank_faults:
        return {}
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    return {**faults.points_env(rank_faults), faultpoints.ENV_LOG: str(log)}


def missing_rank_faults(rank_faults: list[FaultSpec], log: Path) -> list[str]:
    """The rank faults the processes did not log as fired."""
    from amlhpc.jobs.runtime.base import faultpoints

    fired = {str(s.get("spec")) for s in faultpoints.fired_settings(log)} if rank_faults else set()
    return [f.text for f in rank_faults if f.text not in fired]


def _print_json(document: dict) -> None:
    import json
    import sys

    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def summarize(result, resumed=None) -> None:
    """Staging per node, the checkpoint, and how every process ended; of a continued run
    (`resumed`: what its training did, amlhpc.jobs.local.reruns.Trained) whether it trained at all."""
    staging = {k: v for k, v in result.reports.items() if "/staging-node" in k}
    if staging:
        table = Table(title="staging (per node)")
        for col in ("node", "files", "MB in (gzip)", "MB out", "seconds", "MB/s written"):
            table.add_column(col, justify="right")
        for _, doc in sorted(staging.items()):
            table.add_row(str(doc.get("node_index")), str(doc.get("files")), f"{doc.get('bytes_in', 0) / 1e6:,.1f}",
                          f"{doc.get('bytes_out', 0) / 1e6:,.1f}", f"{doc.get('seconds', 0):.2f}", f"{doc.get('mb_per_s', 0):,.1f}")
        out.print(table)
    if result.checkpoint:
        ck = result.checkpoint
        latest = ck.get("latest")
        version = latest.get("version") if isinstance(latest, dict) else latest
        out.print(f"checkpoint: Blob container [bold]{ck['container']}[/], prefix [bold]{ck['prefix']}[/], "
                  f"latest version {version or 'none'}")
    failed = {rank: code for rank, code in result.exit_codes.items() if code != 0}
    if not failed and resumed is not None and resumed.steps == 0:
        out.print(f"rehearsal {result.plan.name} had already finished: it resumed at step {resumed.last_step} and "
                  f"trained nothing (0 steps); {len(result.exit_codes)} processes in {result.seconds:.1f} s. To train "
                  "more, raise the recipe's steps or epochs (--set command=...) with --resume; to start over, drop --resume",
                  highlight=False, soft_wrap=True)
        return
    verdict = "[green]succeeded[/]" if not failed else f"[red]failed[/] (rank: status {failed})"
    trained = (f"; trained steps {resumed.resumed_from or 0}..{resumed.last_step}" if not failed and resumed is not None
               and resumed.steps else "")
    out.print(f"rehearsal {verdict}: {len(result.exit_codes)} processes in {result.seconds:.1f} s{trained}; reports "
              f"under {result.workdir}")
