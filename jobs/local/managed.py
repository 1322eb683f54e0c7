"""The managed rehearsal: `python -m jobs run RECIPE --local --managed [--preempt-after S
[--preempt-node K]] [--hang-after S [--hang-node K]]`.

The supervision that runs in Azure (jobs.managed.supervisor: the run's record with its
lease, the nodes' end records and the checkpoints, all in Blob - Azurite here) drives
attempts that are local rehearsals (jobs.local.rehearsal): real processes on simulated
nodes, the job's own launcher and training. Only the job service is local
(`LocalJobService`); it reports each attempt in Azure ML's words (observation.py), so the
classifier is the one the controller uses. A fault hits the first attempt (a list of
faults: one attempt each, in order), as Azure delivers them:

- preemption of node K: its processes get SIGTERM (the launcher forwards it to the
  training and uploads the last checkpoint), then SIGKILL `--preempt-grace` seconds later
  as the VM goes; the job fails as Azure ML reports it (PreemptionError, the node in
  state `preempted`), and the other nodes' processes are stopped;
- a hang on node K: its training processes are stopped (SIGSTOP) - what a hung GPU call
  or a deadlocked collective looks like from outside; the launcher's watchdog finds no
  progress and stops the job (exit 7).

A fault's clock starts at the attempt's first reported step (start-up time varies with
the machine), so `--preempt-after 3` means three seconds into training. Timings are
shortened for one machine: the supervision polls every second and backs off a
second (doubling to four).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from jobs.local import rehearsal
from jobs.managed.evidence import Evidence
from jobs.managed.observation import Observation
from jobs.managed.record import Record, RecordStore, now_utc
from jobs.managed.supervisor import Supervisor
from jobs.runtime import contract

PREEMPTION = ("UserError", "AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted "
                           "(rehearsal: node {node} was preempted)")
"""How Azure ML words a preempted job's error (see jobs/managed/classify.py); the rehearsal says the same."""
STOP_OTHERS_AFTER_S = 3.0
POLL_S, BACKOFF_S, BACKOFF_MAX_S = 1.0, 1.0, 4.0


@dataclass(frozen=True)
class Fault:
    kind: str
    """preempt or hang."""
    after_s: float
    node: int = 0
    grace_s: float = 5.0
    after_checkpoint: bool = False
    """Start the clock only once the training saved a checkpoint on its node (what proves a resume)."""


@dataclass
class LocalJob:
    name: str
    attempt: int
    status: str = "Queued"
    started_at: datetime | None = None
    ended_at: datetime | None = None
    error: tuple[str, str] | None = None
    node_states: dict[int, str] = field(default_factory=dict)
    result: rehearsal.RehearsalResult | None = None
    procs: list[rehearsal.NodeProcess] = field(default_factory=list)
    canceled: bool = False
    fault_done: str | None = None
    finished: threading.Event = field(default_factory=threading.Event)


def _children(pid: int) -> list[int]:
    """Direct children of a process (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _trainings(launcher_pid: int) -> list[int]:
    """The launcher's training command(s): descendants that lead a process group of their own."""
    found, queue = [], [launcher_pid]
    while queue:
        for child in _children(queue.pop()):
            try:
                if os.getpgid(child) == child:
                    found.append(child)
                    continue
            except ProcessLookupError:
                continue
            queue.append(child)
    return found


class LocalJobService:
    """Attempts as rehearsals, one at a time, each in a thread of its own."""

    def __init__(self, plan: Any, *, snapshot: Path, workdir: Path, procs_per_node: int, blob_endpoint: str,
                 connection_string: str, containers: list[str], sink: Callable, faults: list[Fault],
                 echo: Callable[[str], None], timeout_s: float = 1800):
        self.plan, self.snapshot, self.workdir, self.procs_per_node = plan, snapshot, workdir, procs_per_node
        self.blob_endpoint, self.connection_string, self.containers = blob_endpoint, connection_string, containers
        self.sink, self.faults, self.echo, self.timeout_s = sink, faults, echo, timeout_s
        self.jobs: dict[str, LocalJob] = {}

    # JobService
    def submit(self, job: str, attempt: int) -> None:
        local = self.jobs[job] = LocalJob(job, attempt)
        threading.Thread(target=self._run, args=(local,), name=f"attempt-{attempt}", daemon=True).start()

    def observe(self, job: str) -> Observation | None:
        local = self.jobs.get(job)
        if local is None:
            return None
        error = local.error
        return Observation(status=local.status, error_code=error[0] if error else None,
                           error_message=error[1] if error else None, started_at=local.started_at,
                           ended_at=local.ended_at, node_states=tuple(local.node_states.values()))

    def cancel(self, job: str) -> None:
        local = self.jobs[job]
        local.canceled = True
        self._signal_nodes(local, signal.SIGTERM, nodes=None)

    # an attempt
    def _run(self, job: LocalJob) -> None:
        try:
            job.result = rehearsal.rehearse(
                self.plan, snapshot=self.snapshot, workdir=self.workdir, procs_per_node=self.procs_per_node,
                blob_endpoint=self.blob_endpoint, connection_string=self.connection_string, containers=self.containers,
                sink=self.sink, timeout_s=self.timeout_s, run_id=job.name, started=lambda procs: self._started(job, procs),
                stop_grace_s=STOP_OTHERS_AFTER_S)
            failed = {rank: code for rank, code in job.result.exit_codes.items() if code != 0}
            if job.canceled:
                job.status = "Canceled"
            elif job.fault_done == "preempt":
                job.status, job.error = "Failed", (PREEMPTION[0], PREEMPTION[1].format(node=self._fault(job).node))
            elif not failed:
                job.status = "Completed"
            else:
                rank, code = min(failed.items())
                job.status, job.error = "Failed", ("UserError", f"process of rank {rank} exited with status {code}")
        except Exception as exc:  # noqa: BLE001 - the job failed to run at all: a service-side failure here
            job.status, job.error = "Failed", ("ServiceError", f"{type(exc).__name__}: {exc}")
        finally:
            job.ended_at = now_utc()
            job.finished.set()

    def _fault(self, job: LocalJob) -> Fault | None:
        """Fault i hits attempt i + 1 (the command line gives one: the first attempt's)."""
        return self.faults[job.attempt - 1] if job.attempt <= len(self.faults) else None

    def _started(self, job: LocalJob, procs: list[rehearsal.NodeProcess]) -> None:
        job.procs, job.status, job.started_at = procs, "Running", now_utc()
        fault = self._fault(job)
        if fault is not None:
            threading.Thread(target=self._inject, args=(job, fault), name="fault", daemon=True).start()

    def _progress_files(self, job: LocalJob, node: int) -> list[Path]:
        folder = self.workdir / f"node{node}" / "scratch" / ".amlhpc-launch" / f"{job.name}-node{node}" / "progress"
        return list(folder.glob("rank-*.json"))

    def _saved_checkpoint(self, job: LocalJob) -> bool:
        folders = self.workdir.glob(f"node*/scratch/amlhpc-checkpoints/{job.name}")
        return any(p.is_file() and not p.name.endswith(".tmp") for folder in folders for p in folder.rglob("*"))

    def _inject(self, job: LocalJob, fault: Fault) -> None:
        while not self._progress_files(job, fault.node) or (fault.after_checkpoint and not self._saved_checkpoint(job)):
            if job.finished.wait(0.1):
                return
        if job.finished.wait(fault.after_s):
            return
        if fault.kind == "preempt":
            self.echo(f"rehearsal: preempting node {fault.node} of {job.name} (SIGTERM, SIGKILL after {fault.grace_s:g}s)")
            job.node_states[fault.node] = "preempted"
            job.fault_done = "preempt"
            self._signal_nodes(job, signal.SIGTERM, nodes={fault.node})
            if not job.finished.wait(fault.grace_s):
                self._signal_nodes(job, signal.SIGKILL, nodes={fault.node})
        else:
            stopped = [pid for p in job.procs if p.node == fault.node for pid in _trainings(p.process.pid)]
            self.echo(f"rehearsal: freezing the training on node {fault.node} of {job.name} (SIGSTOP to "
                      f"{len(stopped)} process group(s)): the watchdog must find the hang")
            job.fault_done = "hang"
            for pid in stopped:
                try:
                    os.killpg(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass

    def _signal_nodes(self, job: LocalJob, signum: int, nodes: set[int] | None) -> None:
        for p in job.procs:
            if (nodes is None or p.node in nodes) and p.process.poll() is None:
                try:
                    os.killpg(p.process.pid, signum)
                except ProcessLookupError:
                    pass


@dataclass
class ManagedRehearsal:
    record: Record
    service: LocalJobService
    seconds: float


def rehearse_managed(mplan: Any, *, snapshot: Path, workdir: Path, procs_per_node: int, blob_endpoint: str,
                     connection_string: str, containers: list[str], sink: Callable, echo: Callable[[str], None],
                     faults: list[Fault], timeout_s: float = 1800) -> ManagedRehearsal:
    """Supervise `mplan` (jobs.managed.render.ManagedPlan) on simulated nodes until it is done."""
    from jobs.runtime import blobio

    rehearsal.ensure_containers(sorted(containers), connection_string)
    checkpoint = json.loads(mplan.training.environment_variables[contract.CHECKPOINT_JSON])
    container = blobio.container_client(checkpoint["container"], connection_string=connection_string)
    policy = replace(mplan.policy, poll_s=POLL_S, backoff_s=BACKOFF_S, backoff_max_s=BACKOFF_MAX_S)
    store = RecordStore(container, checkpoint["prefix"])
    service = LocalJobService(mplan.training, snapshot=snapshot, workdir=workdir, procs_per_node=procs_per_node,
                              blob_endpoint=blob_endpoint, connection_string=connection_string, containers=containers,
                              sink=sink, faults=faults, echo=echo, timeout_s=timeout_s)
    supervisor = Supervisor(store, service, Evidence(container, checkpoint["prefix"], checkpoint.get("writers", "rank0")),
                            controller="local", echo=echo)
    started = time.monotonic()
    try:
        record = supervisor.start(mplan.run, mplan.recipe, policy)
    finally:
        for job in service.jobs.values():
            if not job.finished.is_set():
                service.cancel(job.name)
                job.finished.wait(60)
    return ManagedRehearsal(record, service, time.monotonic() - started)


def faults_from_flags(nodes: int, *, preempt_after: float | None, preempt_node: int, preempt_grace: float,
                      hang_after: float | None, hang_node: int, managed: bool) -> list[Fault]:
    """The faults the flags ask for; UserError for flags that do not fit together."""
    from core.errors import Problem, UserError

    problems = []
    wanted = [(flag, value) for flag, value in (("--preempt-after", preempt_after), ("--hang-after", hang_after))
              if value is not None]
    if wanted and not managed:
        problems.append(Problem("command line", wanted[0][0], "simulates a fault for the supervision to recover from",
                                "add --managed"))
    if len(wanted) > 1:
        problems.append(Problem("command line", "--preempt-after/--hang-after", "one fault per rehearsal",
                                "rehearse them one after the other"))
    for flag, value in wanted:
        if value < 0:
            problems.append(Problem("command line", flag, f"{value:g} seconds", "a number of seconds >= 0"))
    for flag, node in (("--preempt-node", preempt_node), ("--hang-node", hang_node)):
        if not 0 <= node < nodes:
            problems.append(Problem("command line", flag, f"node {node} does not exist ({nodes} simulated node(s))",
                                    f"pick 0..{nodes - 1}"))
    if problems:
        raise UserError(problems, "invalid rehearsal flags")
    if preempt_after is not None:
        return [Fault("preempt", preempt_after, preempt_node, preempt_grace)]
    if hang_after is not None:
        return [Fault("hang", hang_after, hang_node)]
    return []


def run_and_report(recipe: Any, outputs: Any, plan: Any, *, console, max_restarts: int | None = None,
                   **kwargs: Any) -> ManagedRehearsal:
    """Plan the managed run as submit would, rehearse it, print every attempt and the total."""
    from rich.table import Table

    from jobs.managed import render, report

    mplan = render.plan_managed(recipe, outputs, plan, max_restarts=max_restarts)
    console.print(f"[bold]managed rehearsal[/] {mplan.run}: up to {mplan.policy.max_restarts} restart(s) on "
                  f"{', '.join(map(str, mplan.policy.retry_on))}; record {mplan.record_blob} (Azurite)")
    done = rehearse_managed(mplan, echo=lambda line: console.print(f"[bold cyan]supervision:[/] {line}",
                                                                   highlight=False, soft_wrap=True), **kwargs)
    table = Table(*report.COLUMNS, title=f"managed run {mplan.run}: {done.record.state}")
    for row in report.rows(done.record):
        table.add_row(*row)
    console.print(table)
    for line in report.summary_lines(done.record)[len(done.record.attempts) + 1:]:
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"rehearsal took {done.seconds:.1f} s; node folders under {done.service.workdir}")
    keep_record(done.service.workdir, done.record)
    return done


RECORD_COPY = "supervision.json"
"""A copy of the run's record beside its node folders, for `jobs report` (the record itself is in Blob)."""


def keep_record(workdir: Path, record: Record) -> None:
    import contextlib

    with contextlib.suppress(OSError):
        (Path(workdir) / RECORD_COPY).write_text(json.dumps(record.to_json(), indent=2))
