"""The managed rehearsal: `python -m amlhpc.jobs run RECIPE --local --managed` with faults injected
at training steps or controller phases, never at wall-clock times.

The supervision that runs in Azure (amlhpc.jobs.managed.supervisor: the run's record with its
lease and cancel requests in the supervision container, the nodes' signed end records and
heartbeats and the checkpoints in the checkpoints container - Azurite here) drives attempts
that are local rehearsals (amlhpc.jobs.local.rehearsal): real processes on simulated nodes, the
job's own launcher and training. Only the job service is local (`LocalJobService`); it
reports each attempt in Azure ML's words (observation.py), so the classifier is the one the
controller uses. The revival check of revive.py runs every second, as Azure ML's schedule
would every few minutes, and starts a new controller (a thread here) when none holds the
record's lease.

Faults, each on one attempt (the first unless said otherwise) and, when `gen` is set, in one
restart generation of its launch; each deterministic (`jobs run --fault SPEC` asks for them:
amlhpc/jobs/local/faults.py; the ranks' own crash, error and stall are `rank_faults`, armed at
their fault point `training.fault` and read back from the points' log):

- `preempt` at step N on node K: node K's training stops at step N (a named fault point,
  amlhpc.jobs.runtime.base.faultpoints `training.step`), then its processes get SIGTERM (the launcher
  forwards it and uploads the last checkpoint) and SIGKILL `grace_s` later as the VM goes;
  the job fails as Azure ML reports a preemption (PreemptionError, node state `preempted`);
- `host_loss` at step N on node K: node K's processes get SIGKILL at step N - a host gone
  without a word (no end record); with `stays_lost` the simulated cluster gets no node in
  its place: it lists node K `unusable` and answers one node less capacity, and an attempt
  asking for more nodes than it has waits in the queue (shrink-and-continue; each attempt
  runs on the node count the supervision asks for);
- `hang` at step N on node K: node K's training is frozen (SIGSTOP) at step N; the
  launcher's watchdog must find it (exit 7) and name node K;
- `nccl` on node K: NCCL is told to use sockets there (NCCL_NET=Socket), and the launcher
  is shown `launcher_args` (bench.recovery gives it `--sysfs` of a GPU node without
  InfiniBand: a CPU machine has nothing for the preflight to check); its preflight must
  stop the job (exit 8);
- `slow` node K by a factor F: node K's own work per step takes F times longer
  (`training.compute`); the controller must name it a straggler;
- `throttle`: the attempt's Blob goes through a proxy answering 503 ServerBusy
  (bench.recovery brings the proxy);
- a controller killed at a phase of its loop (`kill_controller_at`: claim, claimed,
  submitted, watch, ended, backoff, record-write): it dies there (faultpoints.Crash, its
  lease left to lapse) and the revival check must replace it.

A fault that was asked for and did not happen is reported (`ManagedRehearsal.missing`) and
makes the command fail, never a success. Timings are shortened for one machine: the
supervision polls every second, backs off a second (doubling to four), holds a 15 s lease.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from amlhpc.jobs.local import rehearsal
from amlhpc.jobs.local.faults import CONTROLLER_PHASES, PREEMPT_GRACE_S, FaultSpec
from amlhpc.jobs.managed import revive as revival
from amlhpc.jobs.managed.evidence import Evidence
from amlhpc.jobs.managed.observation import Observation
from amlhpc.jobs.managed.policy import Target
from amlhpc.jobs.managed.record import Record, RecordStore, iso, now_utc
from amlhpc.jobs.managed.supervisor import Resume, Supervisor
from amlhpc.jobs.runtime.base import exit_codes, faultpoints, progress

PREEMPTION = ("UserError", "AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted "
                           "(rehearsal: node {node} was preempted)")
"""How Azure ML words a preempted job's error (see amlhpc/jobs/managed/classify.py); the rehearsal says the same."""
STOP_OTHERS_AFTER_S = 3.0
POLL_S, BACKOFF_S, BACKOFF_MAX_S, LEASE_S, REVIVE_EVERY_S = 1.0, 1.0, 4.0, 15, 1.0
STEP_FAULTS = ("preempt", "host_loss", "hang")
FAULT_KINDS = (*STEP_FAULTS, "nccl", "slow", "throttle")
SPEC_KINDS = {"preempt": "preempt", "hang": "hang", "kill-host": "host_loss", "slow": "slow"}
"""`--fault KIND@...` (amlhpc/jobs/local/faults.py) -> the Fault kind the rehearsal acts out."""


@dataclass(frozen=True)
class Fault:
    kind: str
    """One of FAULT_KINDS."""
    node: int = 0
    at_step: int | None = None
    """The training step it fires at (STEP_FAULTS)."""
    grace_s: float = PREEMPT_GRACE_S
    factor: float = 1.0
    attempt: int = 1
    launcher_args: tuple[str, ...] = ()
    """Extra arguments for node K's launcher (`python -m amlhpc.jobs.runtime.launch ARGS -- ...`)."""
    stays_lost: bool = False
    """host_loss: the cluster stays one node short afterwards (no capacity for the full count)."""
    gen: int | None = None
    """Only in this restart generation of the attempt's launch (0: its first run; None: the first it reaches)."""
    spec: str = ""
    """The --fault SPEC it came from (what the rehearsal prints)."""

    @classmethod
    def of(cls, spec: FaultSpec) -> Fault:
        """The node fault a --fault SPEC asks for (preempt, hang, kill-host, slow)."""
        return cls(SPEC_KINDS[spec.kind], spec.node, spec.step, grace_s=spec.grace_s, factor=spec.factor,
                   attempt=spec.attempt or 1, stays_lost=not spec.replace, gen=spec.gen, spec=spec.text)

    def describe(self) -> str:
        where = f" at step {self.at_step}" if self.at_step is not None else ""
        extra = f" x{self.factor:g}" if self.kind == "slow" else " (no replacement)" if self.stays_lost else ""
        generation = f", generation {self.gen}" if self.gen else ""
        asked = f" [--fault {self.spec}]" if self.spec else ""
        return f"{self.kind} on node {self.node}{where}{extra} (attempt {self.attempt}{generation}){asked}"


@dataclass
class Fired:
    """A fault that happened: when (wall time) and where."""

    fault: Fault
    at: datetime
    step: int | None = None


@dataclass
class LocalJob:
    name: str
    attempt: int
    cluster: str = ""
    nodes: int = 0
    """The nodes the attempt asked for (0: the plan's)."""
    status: str = "Queued"
    started_at: datetime | None = None
    ended_at: datetime | None = None
    seen_ended_at: datetime | None = None
    """When the controller first observed the end (its detection)."""
    first_step_at: datetime | None = None
    """When the training completed its first step of this attempt (after any restore)."""
    verdict_at: datetime | None = None
    """When a node's watchdog first reached a hang verdict (from its verdict file)."""
    error: tuple[str, ...] | None = None
    node_states: dict[int, str] = field(default_factory=dict)
    result: rehearsal.RehearsalResult | None = None
    procs: list[rehearsal.NodeProcess] = field(default_factory=list)
    canceled: bool = False
    faults: list[Fault] = field(default_factory=list)
    rank_faults: list[FaultSpec] = field(default_factory=list)
    """Faults its ranks act out at the fault point training.fault (crash, error, stall)."""
    fired: list[Fired] = field(default_factory=list)
    fired_specs: list[str] = field(default_factory=list)
    """The rank faults that fired (from the fault points' log)."""
    finished: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    """Set by a cancel (ends a job still waiting in the queue)."""

    def fired_kind(self, kind: str) -> Fired | None:
        return next((f for f in self.fired if f.fault.kind == kind), None)


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
                 echo: Callable[[str], None], timeout_s: float = 1800,
                 blob_override: dict[int, tuple[str, str]] | None = None, rank_faults: list[FaultSpec] | None = None):
        self.plan, self.snapshot, self.workdir, self.procs_per_node = plan, snapshot, workdir, procs_per_node
        self.blob_endpoint, self.connection_string, self.containers = blob_endpoint, connection_string, containers
        self.sink, self.faults, self.echo, self.timeout_s = sink, faults, echo, timeout_s
        self.blob_override = blob_override or {}
        self.rank_faults = rank_faults or []
        self.jobs: dict[str, LocalJob] = {}
        self.lost_hosts: set[int] = set()
        """Nodes lost for good (host_loss with stays_lost): the cluster is that many nodes short."""
        self.max_running = 0
        """The most attempts ever running at once (the supervision promises one)."""

    # JobService
    def submit(self, job: str, attempt: int, target: Target, environment: dict[str, str]) -> None:
        local = self.jobs[job] = LocalJob(job, attempt, target.cluster, nodes=target.nodes,
                                          faults=[f for f in self.faults if f.attempt == attempt],
                                          rank_faults=[f for f in self.rank_faults if (f.attempt or 1) == attempt])
        self.max_running = max(self.max_running, sum(not j.finished.is_set() for j in self.jobs.values()))
        threading.Thread(target=self._run, args=(local, environment), name=f"attempt-{attempt}", daemon=True).start()

    def observe(self, job: str) -> Observation | None:
        local = self.jobs.get(job)
        if local is None:
            return None
        error = local.error
        if local.finished.is_set() and local.seen_ended_at is None:
            local.seen_ended_at = now_utc()
        return Observation(status=local.status, error_code=error[0] if error else None,
                           error_message=error[1] if error else None, started_at=local.started_at,
                           ended_at=local.ended_at, node_states=tuple(local.node_states.values()),
                           error_codes=tuple(error[2:]) if error else (), capacity=self.capacity())

    def capacity(self) -> int:
        """The simulated cluster's answer: the plan's nodes less those lost for good."""
        return self.plan.instance_count - len(self.lost_hosts)

    def cancel(self, job: str) -> None:
        local = self.jobs[job]
        local.canceled = True
        local.stop.set()
        self._signal_nodes(local, signal.SIGTERM, nodes=None)

    @staticmethod
    def refusal(exc: BaseException) -> str | None:
        return None  # the local service refuses nothing for good

    # an attempt
    def _gate_dir(self, job: LocalJob, fault: Fault) -> Path:
        """Where node K's training says it reached the fault's step, and waits for its release."""
        return self.workdir / "faults" / job.name / str(job.faults.index(fault))

    def _fault_log(self, job: LocalJob) -> Path:
        return self.workdir / "faults" / job.name / "fired.log"

    def _node_env(self, job: LocalJob, nodes: int) -> dict[int, dict[str, str]]:
        """Each node's fault points (AMLHPC_FAULTPOINTS): the gates and slow steps of its node
        faults, every rank fault of the attempt (a rank's own point picks its rank)."""
        envs: dict[int, dict[str, str]] = {}
        points: dict[int, dict[str, list[dict[str, Any]]]] = {}
        for fault in job.faults:
            env, armed = envs.setdefault(fault.node, {}), points.setdefault(fault.node, {})
            gate = str(self._gate_dir(job, fault))
            selector = {"gen": fault.gen} if fault.gen is not None else {}
            if fault.kind in STEP_FAULTS:
                armed.setdefault("training.step", []).append({"action": "gate", "at_step": fault.at_step, "dir": gate,
                                                              **selector})
            elif fault.kind == "slow":
                armed.setdefault("training.compute", []).append({"action": "slow", "factor": fault.factor, "dir": gate,
                                                                 **selector})
            elif fault.kind == "nccl":
                env["NCCL_NET"] = "Socket"
        for rank_fault in job.rank_faults:
            name, setting = rank_fault.point()
            for node in range(nodes):
                points.setdefault(node, {}).setdefault(name, []).append(setting)
        for node, armed in points.items():
            if armed:
                envs.setdefault(node, {}).update({**faultpoints.env_for(armed),
                                                  faultpoints.ENV_LOG: str(self._fault_log(job))})
        if points:
            self._fault_log(job).parent.mkdir(parents=True, exist_ok=True)
        return envs

    def _node_command(self, job: LocalJob) -> dict[int, str]:
        launcher = "-m amlhpc.jobs.runtime.launch"
        return {f.node: self.plan.command.replace(launcher, f"{launcher} {' '.join(f.launcher_args)}", 1)
                for f in job.faults if f.launcher_args and launcher in self.plan.command}

    def _run(self, job: LocalJob, environment: dict[str, str]) -> None:
        endpoint, connection = self.blob_override.get(job.attempt, (self.blob_endpoint, self.connection_string))
        plan = replace(self.plan, instance_count=job.nodes) if job.nodes else self.plan
        if plan.instance_count > self.capacity():  # Azure ML would keep it queued: it waits for a cancel
            job.stop.wait()
            job.status, job.ended_at = "Canceled", now_utc()
            job.finished.set()
            return
        try:
            job.result = rehearsal.rehearse(
                plan, snapshot=self.snapshot, workdir=self.workdir, procs_per_node=self.procs_per_node,
                blob_endpoint=endpoint, connection_string=connection, containers=self.containers,
                sink=self.sink, timeout_s=self.timeout_s, run_id=job.name, extra_env=environment,
                node_env=self._node_env(job, plan.instance_count), node_command=self._node_command(job),
                started=lambda procs: self._started(job, procs),
                stop_grace_s=STOP_OTHERS_AFTER_S)
            codes = job.result.exit_codes
            failed = {rank: code for rank, code in codes.items() if code != 0}
            job.verdict_at = self._verdict_time(job)
            job.fired_specs = [str(s.get("spec")) for s in faultpoints.fired_settings(self._fault_log(job))]
            for fault in job.faults:
                node_codes = [code for rank, code in codes.items() if rank // self.procs_per_node == fault.node]
                if fault.kind == "nccl" and exit_codes.ExitCode.NCCL_SOCKETS in node_codes:
                    job.fired.append(Fired(fault, now_utc()))
            preempted = job.fired_kind("preempt")
            if job.canceled:
                job.status = "Canceled"
            elif preempted:
                job.status = "Failed"
                job.error = (PREEMPTION[0], PREEMPTION[1].format(node=preempted.fault.node), "UserError", "PreemptionError")
            elif not failed:
                job.status = "Completed"
            else:
                rank, code = min(failed.items())
                job.status, job.error = "Failed", ("UserError", f"process of rank {rank} exited with status {code}",
                                                   "UserError")
        except Exception as exc:  # noqa: BLE001 - the job failed to run at all: a service-side failure here
            job.status, job.error = "Failed", ("ServiceError", f"{type(exc).__name__}: {exc}", "ServiceError")
        finally:
            job.ended_at = now_utc()
            job.finished.set()

    def _started(self, job: LocalJob, procs: list[rehearsal.NodeProcess]) -> None:
        job.procs, job.status, job.started_at = procs, "Running", now_utc()
        threading.Thread(target=self._watch_first_step, args=(job,), name="first-step", daemon=True).start()
        for fault in job.faults:
            if fault.kind in (*STEP_FAULTS, "slow"):
                threading.Thread(target=self._inject, args=(job, fault), name="fault", daemon=True).start()

    def _progress_files(self, job: LocalJob) -> list[Path]:
        return [path for scratch in self.workdir.glob("node*/scratch") for path in progress.files(scratch, job.name)]

    def _watch_first_step(self, job: LocalJob) -> None:
        """When the attempt's training completed its first step (after restoring): for the benchmark."""
        first: dict[Path, int] = {}
        while not job.finished.wait(0.05):
            for path in self._progress_files(job):
                report = progress.read(path)
                if report is None:
                    continue
                start = first.setdefault(path, report.first_step if report.first_step is not None else report.step)
                if report.step > start:
                    job.first_step_at = now_utc()
                    return

    def _verdict_time(self, job: LocalJob) -> datetime | None:
        from datetime import UTC

        times = []
        verdicts = [p for scratch in self.workdir.glob("node*/scratch") for p in progress.files(scratch, job.name, name="verdict.json")]
        for path in verdicts:
            try:
                times.append(float(json.loads(path.read_text())["written"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return datetime.fromtimestamp(min(times), UTC) if times else None

    def _reached(self, job: LocalJob, fault: Fault) -> list[dict]:
        found = []
        for path in self._gate_dir(job, fault).glob("reached-*.json"):
            try:
                found.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return found

    def _inject(self, job: LocalJob, fault: Fault) -> None:
        """Wait (on files, not on time) until node K's training reached the fault's step, then act."""
        while not (reached := self._reached(job, fault)):
            if job.finished.wait(0.02):
                return
        step = reached[0].get("step")
        gate = self._gate_dir(job, fault)
        job.fired.append(Fired(fault, now_utc(), step if isinstance(step, int) else None))
        if fault.kind == "preempt":
            self.echo(f"rehearsal: preempting node {fault.node} of {job.name} at step {step} (SIGTERM, SIGKILL after "
                      f"{fault.grace_s:g}s)")
            job.node_states[fault.node] = "preempted"
            self._signal_nodes(job, signal.SIGTERM, nodes={fault.node})
            (gate / "release").touch()
            if not job.finished.wait(fault.grace_s):
                self._signal_nodes(job, signal.SIGKILL, nodes={fault.node})
        elif fault.kind == "host_loss":
            self.echo(f"rehearsal: node {fault.node} of {job.name} is lost at step {step} (SIGKILL, no word)"
                      + ("; the cluster gets no node in its place" if fault.stays_lost else ""))
            if fault.stays_lost:
                self.lost_hosts.add(fault.node)
                job.node_states[fault.node] = "unusable"
            self._signal_nodes(job, signal.SIGKILL, nodes={fault.node})
            (gate / "release").touch()
        elif fault.kind == "hang":
            stopped = [pid for p in job.procs if p.node == fault.node for pid in _trainings(p.process.pid)]
            self.echo(f"rehearsal: freezing the training on node {fault.node} of {job.name} at step {step} (SIGSTOP "
                      f"to {len(stopped)} process group(s)): the watchdog must find the hang")
            for pid in stopped:
                try:
                    os.killpg(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            (gate / "release").touch()  # it continues only when the watchdog's SIGCONT comes, followed by SIGTERM
        else:
            self.echo(f"rehearsal: node {fault.node} of {job.name} runs {fault.factor:g}x slower from step {step}")

    def _signal_nodes(self, job: LocalJob, signum: int, nodes: set[int] | None) -> None:
        for p in job.procs:
            if (nodes is None or p.node in nodes) and p.process.poll() is None:
                try:
                    os.killpg(p.process.pid, signum)
                except ProcessLookupError:
                    pass


class LocalControllers:
    """Controllers as threads, for the revival check (revive.ControllerLauncher)."""

    def __init__(self, make: Callable[[str, Resume | None], Supervisor], run: str, recipe: str,
                 echo: Callable[[str], None]):
        self.make, self.run, self.recipe, self.echo = make, run, recipe, echo
        self.threads: dict[str, threading.Thread] = {}
        self.outcome: dict[str, str] = {}
        self.started_at: dict[str, datetime] = {}
        self.crashed_at: dict[str, datetime] = {}

    def spawn(self, name: str, resume: Resume | None = None) -> None:
        def body() -> None:
            try:
                self.make(name, resume).start(self.run, self.recipe)
                self.outcome[name] = "Completed"
            except faultpoints.Crash as crash:
                self.crashed_at[name] = now_utc()
                self.outcome[name] = "Failed"
                self.echo(f"rehearsal: controller {name} killed at {crash.point}")
            except Exception as exc:  # noqa: BLE001 - a controller that failed: the revival check replaces it
                self.outcome[name] = "Failed"
                self.echo(f"rehearsal: controller {name} failed: {type(exc).__name__}: {exc}")

        self.started_at[name] = now_utc()
        thread = self.threads[name] = threading.Thread(target=body, name=f"controller-{name}", daemon=True)
        thread.start()

    # revive.ControllerLauncher
    def status(self, job: str) -> str | None:
        thread = self.threads.get(job)
        if thread is None:
            return None
        return "Running" if thread.is_alive() else self.outcome.get(job, "Failed")

    def cancel(self, job: str) -> None:
        self.echo(f"rehearsal: controller {job} hangs; a thread cannot be canceled")

    def start(self, run: str, previous: str) -> str:
        name = revival.controller_name(run)
        self.spawn(name)
        return name


@dataclass
class ManagedRehearsal:
    record: Record
    service: LocalJobService
    seconds: float
    controllers: LocalControllers
    requested: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """Faults asked for that did not happen: an error, never a success."""
    kill_fired_at: datetime | None = None


class RunNameInUse(Exception):
    pass


def _kill_when(phase: str, attempt: int | None = None) -> Callable[..., bool]:
    """Where in the run the controller dies: at the phase's first hit (in `attempt`, when
    given), except for record writes - the third write of the attempt (1 unless given), made
    while it runs (the first two are its claim and its submit, which `claimed` and `submitted` cover)."""
    if phase != "record-write":
        return lambda **ctx: attempt is None or ctx.get("attempt") == attempt
    seen = []

    def when(**ctx: Any) -> bool:
        if ctx.get("attempts", 0) >= (attempt or 1):
            seen.append(ctx)
        return len(seen) == 3

    return when


def rehearse_managed(mplan: Any, *, snapshot: Path, workdir: Path, procs_per_node: int, blob_endpoint: str,
                     connection_string: str, containers: list[str], sink: Callable, echo: Callable[[str], None],
                     faults: list[Fault], timeout_s: float = 1800, kill_controller_at: str | None = None,
                     kill_controller_attempt: int | None = None, rank_faults: list[FaultSpec] | None = None,
                     resume: bool = False, blob_override: dict[int, tuple[str, str]] | None = None,
                     policy_changes: dict[str, Any] | None = None,
                     cancel_when: Callable[[], dict[str, Any] | None] | None = None) -> ManagedRehearsal:
    """Supervise `mplan` (amlhpc.jobs.managed.render.ManagedPlan) on simulated nodes until it is done.
    RunNameInUse when its record exists and `resume` is not set. `cancel_when` is polled: a
    request it returns (`jobs cancel RUN --local`) goes to the supervision as a user's cancel.
    `faults` the rehearsal acts out on nodes; `rank_faults` the ranks act out at their fault
    point; the controller dies at `kill_controller_at` (in attempt `kill_controller_attempt`)."""
    from amlhpc.jobs.runtime.blob import blobio

    rehearsal.ensure_containers(sorted(containers), connection_string)
    storage = mplan.storage
    checkpoints = blobio.container_client(storage["container"], connection_string=connection_string)
    supervision = blobio.container_client(storage["supervision"], connection_string=connection_string)
    shortened = {"poll_s": POLL_S, "backoff_s": BACKOFF_S, "backoff_max_s": BACKOFF_MAX_S, "lease_s": LEASE_S,
                 "outage_backoff_max_s": 4.0}
    policy = replace(mplan.policy, **{**shortened, **(policy_changes or {})})
    store = RecordStore(supervision, storage["prefix"], lease_s=policy.lease_s)
    existing, _ = store.load()
    if existing is not None and not resume:
        raise RunNameInUse(f"run {mplan.run} exists ({existing.state}, {len(existing.attempts)} attempt(s)) in "
                           f"{mplan.record_blob}")
    service = LocalJobService(mplan.training, snapshot=snapshot, workdir=workdir, procs_per_node=procs_per_node,
                              blob_endpoint=blob_endpoint, connection_string=connection_string, containers=containers,
                              sink=sink, faults=faults, echo=echo, timeout_s=timeout_s, blob_override=blob_override,
                              rank_faults=rank_faults)

    def make(name: str, resume_token: Resume | None) -> Supervisor:
        evidence = Evidence(checkpoints, storage["prefix"], storage.get("writers", "rank0"), mplan.secret)
        return Supervisor(RecordStore(supervision, storage["prefix"], lease_s=policy.lease_s), service, evidence, policy,
                          controller=name, resume=resume_token, echo=echo)

    controllers = LocalControllers(make, mplan.run, mplan.recipe, echo)
    kill = None
    if kill_controller_at is not None:
        kill = faultpoints.arm(CONTROLLER_PHASES[kill_controller_at], faultpoints.crash, when=_kill_when(kill_controller_at, kill_controller_attempt))
    stop = threading.Event()

    def revive_loop() -> None:
        while not stop.wait(REVIVE_EVERY_S):
            try:
                revival.revive(store, controllers, mplan.run, echo=lambda line: echo(f"revival: {line}"))
            except Exception as exc:  # noqa: BLE001 - the next firing tries again, as the schedule would
                echo(f"revival check failed: {type(exc).__name__}: {exc}")

    started = time.monotonic()
    first = mplan.run if not resume else f"{mplan.run}-c{secrets.token_hex(2)}"
    store.add_controller(first, "started" if not resume else "resumed")
    controllers.spawn(first, Resume(secrets.token_hex(8), iso(now_utc()) or "") if resume else None)
    reviver = threading.Thread(target=revive_loop, name="revival", daemon=True)
    reviver.start()
    record = None
    asked = False
    try:
        while time.monotonic() - started < timeout_s:
            request = cancel_when() if cancel_when is not None and not asked else None
            if request:
                asked = True
                store.request_cancel(str(request.get("by") or "a user"))
                echo(f"cancel requested by {request.get('by', 'a user')}: the supervision stops the run")
            record, _ = store.load()
            if record is not None and record.done and not any(t.is_alive() for t in controllers.threads.values()):
                break
            time.sleep(0.2)
    finally:
        stop.set()
        if kill is not None:
            faultpoints.disarm(kill.name)
        for job in service.jobs.values():
            if not job.finished.is_set():
                service.cancel(job.name)
                job.finished.wait(60)
        for thread in controllers.threads.values():
            thread.join(10)
    record, _ = store.load()
    assert record is not None
    requested = [f.describe() for f in faults] + [f"{f.text} (attempt {f.attempt or 1})" for f in rank_faults or []]
    missing = [f.describe() for f in faults if f.kind != "throttle" and not any(
        fired.fault == f for job in service.jobs.values() for fired in job.fired)]
    missing += [f"{f.text} (attempt {f.attempt or 1})" for f in rank_faults or [] if not any(
        f.text in job.fired_specs for job in service.jobs.values() if job.attempt == (f.attempt or 1))]
    if kill is not None:
        requested.append(f"controller killed at {kill_controller_at}")
        if not kill.fired:
            missing.append(f"controller killed at {kill_controller_at}")
    kill_at = next(iter(controllers.crashed_at.values()), None)
    return ManagedRehearsal(record, service, time.monotonic() - started, controllers, requested, missing, kill_at)


def run_and_report(recipe: Any, outputs: Any, plan: Any, *, console, max_restarts: int | None = None,
                   **kwargs: Any) -> ManagedRehearsal:
    """Plan the managed run as submit would, rehearse it, print every attempt and the total."""
    from amlhpc.core.console import table
    from amlhpc.jobs.managed import render, report

    mplan = render.plan_managed(recipe, outputs, plan, max_restarts=max_restarts)
    console.print(f"[bold]managed rehearsal[/] {mplan.run}: up to {mplan.policy.max_restarts} restart(s) on "
                  f"{', '.join(map(str, mplan.policy.retry_on))}; record {mplan.record_blob} (Azurite)")
    done = rehearse_managed(mplan, echo=lambda line: console.print(f"[bold cyan]supervision:[/] {line}",
                                                                   highlight=False, soft_wrap=True), **kwargs)
    grid = table(*report.COLUMNS, title=f"managed run {mplan.run}: {done.record.state}")
    for row in report.rows(done.record):
        grid.add_row(*row)
    console.print(grid)
    for line in report.summary_lines(done.record)[len(done.record.attempts) + 1:]:
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"rehearsal took {done.seconds:.1f} s; node folders under {done.service.workdir}")
    keep_record(done.service.workdir, done.record)
    for fault in done.requested:
        console.print(("[red]fault did not happen:[/] " if fault in done.missing else "fault injected: ") + fault,
                      highlight=False)
    return done


RECORD_COPY = "supervision.json"
"""A copy of the run's record beside its node folders, for `jobs report` (the record itself is in Blob)."""


def keep_record(workdir: Path, record: Record) -> None:
    import contextlib

    with contextlib.suppress(OSError):
        (Path(workdir) / RECORD_COPY).write_text(json.dumps(record.to_json(), indent=2))
