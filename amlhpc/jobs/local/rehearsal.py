"""Rehearse a recipe on this machine the way Azure ML would run it.

The job is planned exactly as for Azure (`amlhpc.jobs.plan.build.plan_job` against the stack's outputs),
its code snapshot is copied into one working folder per simulated node, and every process
runs the job's own command - `python -m amlhpc.jobs.runtime.launch -- <training command>` - with the
variables Azure ML's launcher sets (torch.distributed or OpenMPI ranks, MASTER_ADDR/PORT)
plus the job's `AMLHPC_*` variables. Only two things change, both at the seams:

- Blob is Azurite: the stage and checkpoint account URLs point at it and
  `AMLHPC_BLOB_CONNECTION_STRING` carries its (per-start, generated) key instead of the
  node's managed identity.
- Each simulated node gets its own scratch folder (`AMLHPC_SCRATCH`), as each real node has
  its own NVMe.

Staging, the health gate (GPU checks skipped on a CPU), pinning, training over gloo and
checkpoints all run through the same code as in the cloud. A second rehearsal with the same
`name` uses the same checkpoint prefix and resumes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.core import invocation
from amlhpc.core.errors import Problem, UserError
from amlhpc.jobs.local import processes
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.launch import standby

# Variables that only make sense on an Azure node (identity) or would point the rehearsal
# at real Azure; the seam replaces them.
_AZURE_ONLY = ("AZURE_CLIENT_ID",)
_MPI_DISTRIBUTIONS = ("mpi", "tensorflow")
FAILURE_GRACE_S = 30.0
"""After one process fails, how long the others get to notice before they are stopped."""
STOP_GRACE_S = 20.0
"""How long a stopped rank gets (its launcher's final checkpoint upload included) before SIGKILL."""


@dataclass
class NodeProcess:
    node: int
    local_rank: int
    rank: int
    process: subprocess.Popen
    lines: list[str] = field(default_factory=list)


@dataclass
class RehearsalResult:
    plan: Any
    """The JobPlan that was rehearsed."""
    workdir: Path
    exit_codes: dict[int, int]
    """Global rank -> exit status."""
    seconds: float
    reports: dict[str, dict[str, Any]]
    """File name -> per-node JSON report (staging, launch, health) from every node."""
    checkpoint: dict[str, Any] | None
    """Where checkpoints went: container, prefix and the committed version, if any."""
    run_id: str = ""
    """This attempt's run id (AZUREML_RUN_ID): its launchers' progress files carry it."""
    canceled: dict[str, Any] | None = None
    """The cancel request that stopped it (`jobs cancel RUN --local`, amlhpc/jobs/local/control.py)."""

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.exit_codes.values())


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
RESERVED_LOW = 20000
"""Where the rehearsal's training port is drawn from, below Linux's ephemeral range."""


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux's default 32768-60999)."""
    try:
        low, high = (int(p) for p in path.read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def training_port(rng=None) -> int:
    """A port for the training's own rendezvous (MASTER_PORT), free now and outside the
    ephemeral range, so no outgoing connection (staging's, the checkpoints') can be given it
    before the training's rank 0 binds it (the defect: a port probed from the ephemeral range was
    taken in between, 40 of 40 draws). The coordination store's port is stricter still:
    bound once by the rehearsal and handed to node 0 (`coordination_listener`)."""
    import random

    rng = rng or random.Random()
    low, _ = ephemeral_range()
    top = max(RESERVED_LOW + 1000, min(low, 32768)) - 1
    for _ in range(200):
        port = rng.randint(RESERVED_LOW, top)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {RESERVED_LOW}-{top} on 127.0.0.1 for the training's rendezvous")


def coordination_listener() -> socket.socket:
    """The job's coordination store's port, bound here before any rank starts and inherited by
    node 0's local rank 0 (AMLHPC_COORD_LISTEN_FD): reserved, never probed."""
    from amlhpc.jobs.runtime.coord.jobstore import reserve

    listener = reserve(0, "127.0.0.1")
    listener.set_inheritable(True)
    return listener


def redirect_blob(env: dict[str, str], blob_endpoint: str, connection_string: str) -> dict[str, str]:
    """The job's variables with Blob pointed at Azurite and Azure-only identity removed."""
    env = {k: v for k, v in env.items() if k not in _AZURE_ONLY}
    if contract.STAGE_JSON in env:
        specs = json.loads(env[contract.STAGE_JSON])
        for spec in specs:
            spec["account_url"] = blob_endpoint
        env[contract.STAGE_JSON] = json.dumps(specs, separators=(",", ":"))
    if contract.CHECKPOINT_JSON in env:
        ckpt = json.loads(env[contract.CHECKPOINT_JSON])
        ckpt["account_url"] = blob_endpoint
        env[contract.CHECKPOINT_JSON] = json.dumps(ckpt, separators=(",", ":"))
    env[contract.BLOB_CONNECTION_STRING] = connection_string
    return env


def rank_env(distribution: str, *, node: int, local_rank: int, nodes: int, procs_per_node: int,
             master_port: int) -> dict[str, str]:
    """What Azure ML's launcher sets for one process (PyTorch or MPI distribution)."""
    rank = node * procs_per_node + local_rank
    world = nodes * procs_per_node
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)}
    if distribution in _MPI_DISTRIBUTIONS:
        env.update({
            "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(procs_per_node),
            "OMPI_COMM_WORLD_NODE_RANK": str(node),
        })
    else:
        env.update({
            "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(procs_per_node), "NODE_RANK": str(node), "GROUP_RANK": str(node),
        })
    return env


CODE_ENTRIES = ".code-entries"
"""In each node's folder: the snapshot's top-level names copied there last time (removed before
the next copy, so a file the team deleted does not linger beside the job's outputs)."""


def prepare_nodes(snapshot: Path, workdir: Path, nodes: int) -> list[Path]:
    """One working folder per node holding its own copy of the job's code (as Azure ML
    gives each node: the whole snapshot, aml-hpc's runtime and the team's code beside it),
    plus its scratch. Earlier outputs are kept: a rerun resumes."""
    entries = sorted(p.name for p in snapshot.iterdir())
    folders = []
    for node in range(nodes):
        folder = workdir / f"node{node}"
        listed = folder / CODE_ENTRIES
        previous = listed.read_text().split("\n") if listed.is_file() else ["amlhpc"]
        for name in dict.fromkeys([*previous, *entries]):
            old = folder / name
            if name and (old.is_dir() and not old.is_symlink()):
                shutil.rmtree(old)
            elif name and (old.is_file() or old.is_symlink()):
                old.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        for name in entries:
            source = snapshot / name
            if source.is_dir():
                shutil.copytree(source, folder / name)
            else:
                shutil.copy2(source, folder / name)
        listed.write_text("\n".join(entries))
        (folder / "scratch").mkdir(parents=True, exist_ok=True)
        folders.append(folder)
    return folders


REHEARSAL_TELEMETRY_INTERVAL_S = "1"
"""AMLHPC_TELEMETRY_INTERVAL_S for a rehearsal, unless the caller's environment sets one."""
REHEARSAL_COORD_GRACE_S = "10"
"""AMLHPC_COORD_GRACE_S for a rehearsal, unless the caller's environment sets one."""

LOG_DIR = "user_logs"
"""Each process's output, as Azure ML keeps it: node<K>/user_logs/std_log_process_<rank>.txt
(appended by every attempt; `jobs logs` and `jobs report` read them)."""


def log_path(folder: Path, rank: int) -> Path:
    return folder / LOG_DIR / f"std_log_process_{rank}.txt"


ATTEMPT_MARK = "aml_hpc_attempt"
"""The key of the line a rehearsal writes into every process log when an attempt starts:
`{"aml_hpc_attempt": RUN_ID, "started_at": ISO}`. In Azure each attempt is a job with logs
of its own; here the attempts of a run append to one file per rank, and the line says where
each begins (the report draws every attempt apart, amlhpc/jobs/report/records.py)."""


def mark_attempt_start(folders: list[Path], procs_per_node: int, run_id: str, started: float) -> None:
    from datetime import UTC, datetime

    line = json.dumps({ATTEMPT_MARK: run_id, "started_at": datetime.fromtimestamp(started, UTC).isoformat()}) + "\n"
    for node, folder in enumerate(folders):
        for local_rank in range(procs_per_node):
            path = log_path(folder, node * procs_per_node + local_rank)
            with contextlib.suppress(OSError):  # the record of a rehearsal must not fail it
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a") as log:
                    log.write(line)


def _pump(proc: NodeProcess, sink: Callable[[NodeProcess, str], None], log: Path | None = None) -> None:
    assert proc.process.stdout is not None
    with contextlib.ExitStack() as stack:
        kept = None
        if log is not None:
            with contextlib.suppress(OSError):  # a full disk must not stop the rehearsal
                log.parent.mkdir(parents=True, exist_ok=True)
                kept = stack.enter_context(log.open("a", buffering=1))
        for raw in proc.process.stdout:
            line = raw.rstrip("\n")
            proc.lines.append(line)
            if kept is not None:
                with contextlib.suppress(OSError):
                    kept.write(line + "\n")
            sink(proc, line)


def run_processes(plan: Any, folders: list[Path], base_env: dict[str, str], *, procs_per_node: int,
                  sink: Callable[[NodeProcess, str], None], timeout_s: float,
                  started: Callable[[list[NodeProcess]], None] | None = None,
                  stop_grace_s: float | None = None, node_env: dict[int, dict[str, str]] | None = None,
                  node_command: dict[int, str] | None = None,
                  stop_when: Callable[[], Any] | None = None) -> dict[int, int]:
    """Start every process of every simulated node; stop the rest `stop_grace_s` (default
    FAILURE_GRACE_S) after one fails (as Azure ML does); return global rank -> exit status.
    `started` sees the processes once they run, `node_env` adds variables to one node's
    processes and `node_command` replaces its command (the managed rehearsal injects faults
    through them); `stop_when` is polled, and when it returns something (a cancel request)
    every process is stopped. However this ends - an
    error, Ctrl-C, SIGTERM (amlhpc/jobs/local/processes.py) - every process it started is stopped
    before it returns."""
    nodes = len(folders)
    port = training_port()
    listener = coordination_listener()
    procs: list[NodeProcess] = []
    codes: dict[int, int] = {}
    try:
        for node, folder in enumerate(folders):
            for local_rank in range(procs_per_node):
                env = {**base_env, **(node_env or {}).get(node, {}),
                       **rank_env(plan.distribution, node=node, local_rank=local_rank, nodes=nodes,
                                  procs_per_node=procs_per_node, master_port=port)}
                env[contract.SCRATCH] = str(folder / "scratch")
                env[contract.COORD_PORT] = str(listener.getsockname()[1])
                inherit: tuple[int, ...] = ()
                if node == 0 and local_rank == 0:
                    env[contract.COORD_LISTEN_FD] = str(listener.fileno())
                    inherit = (listener.fileno(),)
                process = subprocess.Popen(
                    ["bash", "-c", (node_command or {}).get(node, plan.command)], cwd=folder, env=env, text=True, bufsize=1,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=inherit, **processes.popen_kwargs(),
                )
                procs.append(NodeProcess(node, local_rank, node * procs_per_node + local_rank, process))
        listener.close()  # node 0 holds it now
        pumps = [threading.Thread(target=_pump, args=(p, sink, log_path(folders[p.node], p.rank)), daemon=True)
                 for p in procs]
        for t in pumps:
            t.start()
        if started is not None:
            started(procs)
        _wait_all(procs, codes, sink, timeout_s, FAILURE_GRACE_S if stop_grace_s is None else stop_grace_s, stop_when)
        drained = time.monotonic() + 5  # a leftover grandchild may hold a pipe open: do not wait on it
        for t in pumps:
            t.join(timeout=max(0.0, drained - time.monotonic()))
    finally:
        listener.close()
        _stop(procs, codes)
    return codes


def _wait_all(procs: list[NodeProcess], codes: dict[int, int], sink, timeout_s: float, stop_grace_s: float,
              stop_when: Callable[[], Any] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    while len(codes) < len(procs):
        request = stop_when() if stop_when is not None else None
        if request:
            sink(procs[0], f"rehearsal canceled by {request.get('by', 'a user')}: stopping every process")
            _stop(procs, codes)
            break
        for p in procs:
            if p.rank in codes:
                continue
            status = p.process.poll()
            if status is not None:
                codes[p.rank] = status
                if status != 0 and failed_at is None:
                    failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > stop_grace_s:
            _stop(procs, codes)  # the others had their chance to notice; Azure ML would cancel the job
        if time.monotonic() > deadline:
            sink(procs[0], f"rehearsal timed out after {timeout_s:.0f} s: stopping every process")
            _stop(procs, codes)
        time.sleep(0.2)


def _stop(procs: list[NodeProcess], codes: dict[int, int], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each running rank's process group (the launcher passes it on to the training
    command and uploads a last checkpoint), SIGKILL the groups still there after `grace_s`."""
    running = [p for p in procs if p.rank not in codes and p.process.poll() is None]
    for p in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        if p.rank in codes:
            continue
        code = processes.wait(p.process, max(0.0, deadline - time.monotonic()))
        if code is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.process.pid, signal.SIGKILL)
            code = p.process.wait()
        codes[p.rank] = code


def collect_reports(folders: list[Path], report_dir: str) -> dict[str, dict[str, Any]]:
    reports = {}
    for folder in folders:
        for path in sorted((folder / report_dir).glob("*.json")):
            try:
                reports[f"{folder.name}/{path.name}"] = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
    return reports


def checkpoint_state(env: dict[str, str], connection_string: str) -> dict[str, Any] | None:
    """The committed checkpoint under the job's prefix (reads the `latest` pointer)."""
    if contract.CHECKPOINT_JSON not in env:
        return None
    from azure.core.exceptions import ResourceNotFoundError

    from amlhpc.jobs.runtime.blob import blobio

    ckpt = json.loads(env[contract.CHECKPOINT_JSON])
    client = blobio.container_client(ckpt["container"], connection_string=connection_string)
    state: dict[str, Any] = {"container": ckpt["container"], "prefix": ckpt["prefix"], "latest": None}
    for pointer in (f"{ckpt['prefix']}/versions/latest", f"{ckpt['prefix']}/latest", f"{ckpt['prefix']}/node-0/latest"):
        try:
            text = client.get_blob_client(pointer).download_blob().readall().decode()
        except ResourceNotFoundError:
            continue
        try:
            state["latest"] = json.loads(text)
        except json.JSONDecodeError:
            state["latest"] = text.strip()
        state["pointer"] = pointer
        break
    return state


def checkpoints_stored(env: dict[str, str], connection_string: str) -> bool:
    """Whether any blob is stored under the job's checkpoint prefix (a run of that name checkpointed)."""
    if contract.CHECKPOINT_JSON not in env:
        return False
    from amlhpc.jobs.runtime.blob import blobio

    ckpt = json.loads(env[contract.CHECKPOINT_JSON])
    client = blobio.container_client(ckpt["container"], connection_string=connection_string)
    if not client.exists():
        return False
    return next(iter(client.list_blobs(name_starts_with=ckpt["prefix"].rstrip("/") + "/")), None) is not None


def ensure_containers(containers: list[str], connection_string: str) -> None:
    """The stack declares its containers; in Azurite the rehearsal creates them."""
    from azure.core.exceptions import ResourceExistsError

    from amlhpc.jobs.runtime.blob import blobio

    for name in containers:
        try:
            blobio.container_client(name, connection_string=connection_string).create_container()
        except ResourceExistsError:
            pass


def check_dataset(plan: Any, connection_string: str) -> None:
    """Staged inputs must exist in Azurite before the job starts, as in Azure."""
    from amlhpc.jobs.runtime.blob import blobio

    problems = []
    for spec in plan.staged_inputs:
        client = blobio.container_client(spec["container"], connection_string=connection_string)
        prefix = spec.get("prefix", "").rstrip("/") + "/"
        if not client.exists() or next(iter(client.list_blobs(name_starts_with=prefix)), None) is None:
            problems.append(Problem(
                plan.recipe_file or plan.recipe, f"inputs.{spec['name']}",
                f"no blobs under {spec['container']}/{prefix} in the local Blob (Azurite)",
                f"upload them first: {invocation.command('jobs', f'data upload DIR --stack {plan.stack}')} --prefix {prefix.rstrip('/')} "
                f"--connection-string-env {contract.BLOB_CONNECTION_STRING} (or pass --data {spec['name']}=DIR)"))
    if problems:
        raise UserError(problems, "rehearsal cannot start: its dataset is missing")


def rehearsal_environment(env: dict[str, str], ranks_on_machine: int) -> dict[str, str]:
    """The environment every simulated node's processes start from: this one's, the job's `env`
    on top, and what a rehearsal on one machine changes (each default yields to the caller's)."""
    base = {**os.environ, **env}
    # `python` in the job's command is this interpreter, as the image's python is in Azure.
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    base.pop("PYTHONPATH", None)  # the node's code folder is the job's import root
    base["PYTHONUNBUFFERED"] = "1"
    # A rehearsal trains for seconds, not hours: sample the nodes every second (the job's 30 s
    # default would leave its report's utilisation and memory plots a point or two).
    base.setdefault(contract.TELEMETRY_INTERVAL_S, REHEARSAL_TELEMETRY_INTERVAL_S)
    # The nodes are processes of one machine: no network flap to ride out, so a lost node 0 ends
    # the others in seconds (a job's default grace is kvstore.RECONNECT_GRACE_S).
    base.setdefault(contract.COORD_GRACE_S, REHEARSAL_COORD_GRACE_S)
    # The simulated nodes share this machine's CPUs: the launcher's `auto` counts one node's
    # ranks, so a standby importing torch beside every rank would slow the training it waits on.
    if not standby.worth_keeping(os.cpu_count(), ranks_on_machine):
        base.setdefault(contract.STANDBY, "off")
    # ... and each rank's intra-op threads are its share of them: torch starts a thread per CPU
    # in every process, so 2 simulated nodes of one rank on 2 CPUs ran 4 threads on 2, and a
    # thread waiting for a CPU held its step (3 rehearsals side by side: 52.9 s of the ranks'
    # CPU with torch's default, 32.5 s with one thread each; bench/RESULTS.md, "The suite's wall time").
    base.setdefault("OMP_NUM_THREADS", str(threads_per_rank(os.cpu_count(), ranks_on_machine)))
    return base


def threads_per_rank(cpus: int | None, ranks_on_machine: int) -> int:
    """Each rank's share of the machine's CPUs, at least one."""
    return max(1, (cpus or 1) // max(ranks_on_machine, 1))


def rehearse(plan: Any, *, snapshot: Path, workdir: Path, procs_per_node: int, blob_endpoint: str,
             connection_string: str, containers: list[str], sink: Callable[[NodeProcess, str], None],
             timeout_s: float = 1800, run_id: str | None = None, extra_env: dict[str, str] | None = None,
             **process_hooks: Any) -> RehearsalResult:
    """Run `plan` locally: one folder and `procs_per_node` processes per simulated node.

    containers: the stack's Blob containers (outputs storage.containers), created in Azurite.
    run_id: the job's run id (default: a new one per call); extra_env: variables the job
    gets on top of its own (what a managed run's controller adds per attempt);
    process_hooks go to run_processes.
    """
    ensure_containers(sorted(containers), connection_string)
    check_dataset(plan, connection_string)
    folders = prepare_nodes(snapshot, workdir, plan.instance_count)
    env = redirect_blob({**plan.environment_variables, **(extra_env or {})}, blob_endpoint, connection_string)
    base = rehearsal_environment(env, plan.instance_count * procs_per_node)
    # Each attempt is a new job run, as AZUREML_RUN_ID is in Azure: node-local markers of an
    # earlier attempt in the same folders must not be taken for this one's.
    base[contract.RUN_ID] = run_id or f"{plan.name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    # Azure ML's own id comes first (amlhpc/jobs/runtime/base/jobid.py): one in the caller's environment
    # (a rehearsal inside an Azure ML job) must not make every attempt share it.
    base["AZUREML_RUN_ID"] = base[contract.RUN_ID]
    started, started_at = time.monotonic(), time.time()
    canceled: dict[str, Any] = {}
    asked = process_hooks.pop("stop_when", None)

    def stop_when() -> Any:
        request = asked() if asked is not None else None
        if request:
            canceled.update(request)
        return request

    mark_attempt_start(folders, procs_per_node, base[contract.RUN_ID], started_at)
    codes = run_processes(plan, folders, base, procs_per_node=procs_per_node, sink=sink, timeout_s=timeout_s,
                          stop_when=stop_when, **process_hooks)
    note_attempt(workdir, plan, base[contract.RUN_ID], started_at, time.time(), procs_per_node, codes,
                 canceled=canceled or None)
    report_dir = env.get(contract.REPORT_DIR, contract.DEFAULT_REPORT_DIR)
    keep_attempt_reports(workdir, folders, report_dir, started_at)
    return RehearsalResult(plan, workdir, codes, time.monotonic() - started, collect_reports(folders, report_dir),
                           checkpoint_state(env, connection_string), base[contract.RUN_ID], canceled or None)


ATTEMPTS_FILE = "attempts.jsonl"
"""One line per rehearsal of the folder's run (each an attempt, as a job in Azure would be):
when it ran, its size, its price per node-hour at the planned size, how its processes
ended. `jobs report` reads it."""


ATTEMPT_REPORTS = "attempts"
"""`attempts/<n>/node<K>/`: the launcher's and staging's reports of attempt n, kept when it
ends (the next attempt writes the nodes' own copies anew), so the report shows every
attempt's staging and timeline, as a managed run's jobs each keep theirs in Azure."""
KEPT_REPORTS = ("launch-node*.json", "staging-node*.json")


def keep_attempt_reports(workdir: Path, folders: list[Path], report_dir: str, started: float) -> None:
    """Copy what this attempt's launchers wrote (a report older than the attempt, left by an
    earlier one on a node that wrote none this time, is not this attempt's)."""
    try:
        number = len((workdir / ATTEMPTS_FILE).read_text().splitlines())
    except OSError:
        return
    for folder in folders:
        for pattern in KEPT_REPORTS:
            for path in (folder / report_dir).glob(pattern):
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime < started:
                        continue
                target = workdir / ATTEMPT_REPORTS / str(number) / folder.name / path.name
                with contextlib.suppress(OSError):  # the record of a rehearsal must not fail it
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)


def note_attempt(workdir: Path, plan: Any, run_id: str, started: float, ended: float, procs_per_node: int,
                 codes: dict[int, int], canceled: dict[str, Any] | None = None) -> None:
    from datetime import UTC, datetime

    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    estimate = getattr(plan, "estimate", None)
    line: dict[str, Any] = {"run_id": run_id, "started_at": iso(started), "ended_at": iso(ended), "seconds": round(ended - started, 3),
            "nodes": plan.instance_count, "processes_per_node": procs_per_node, "sku": plan.sku,
            "usd_per_node_hour": getattr(estimate, "usd_per_node_hour", None),
            "price_source": getattr(estimate, "price_source", None),
            "exit_codes": {str(rank): code for rank, code in sorted(codes.items())}}
    if canceled:
        line["canceled"] = {"by": canceled.get("by"), "at": iso(float(canceled.get("at") or ended))}
    with contextlib.suppress(OSError):  # the record of a rehearsal must not fail it
        with (workdir / ATTEMPTS_FILE).open("a") as out:
            out.write(json.dumps(line) + "\n")
