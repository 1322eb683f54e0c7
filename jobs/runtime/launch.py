"""The in-job launcher: `python -m jobs.runtime.launch [options] -- <training command>`.

Azure ML starts it on every process of the job (one per GPU); each one, in order:

1. ranks from the launcher's variables (jobs.runtime.ranks);
2. staging (AMLHPC_STAGE_JSON, jobs.runtime.staging): local rank 0 of each node downloads
   the node's share while the node's other ranks wait;
3. GPU application clocks to maximum with --max-clocks (local rank 0, reset at the end);
4. the health gate (AMLHPC_HEALTH gate|warn|off): `python -m jobs.runtime.health` in a
   child process on every rank, with a wall-clock limit, so a broken node stops the job
   here (with its host and failed check in the log) instead of hanging the training;
5. pinning (AMLHPC_PIN auto|off, jobs.runtime.topology): this process's CPU affinity and
   the command's CUDA_VISIBLE_DEVICES order;
6. restore (AMLHPC_CHECKPOINT_JSON, jobs.runtime.checkpoint): local rank 0 downloads the
   latest committed version into the node's checkpoint folder, the others wait;
7. the training command, with AMLHPC_DATA_DIR_<NAME>, AMLHPC_FILE_LIST_<NAME>,
   AMLHPC_CHECKPOINT_DIR, AMLHPC_RESUME_DIR (when a version was restored) and the pinning
   variables set; while it runs, the uploading node's local rank 0 uploads the checkpoint
   folder every `interval_s`; SIGTERM/SIGINT/SIGHUP/SIGUSR1/SIGUSR2 are forwarded to the
   command's process group (SIGTERM is how a low-priority node is preempted), and the group
   is killed `--term-grace` seconds after a SIGTERM/SIGINT/SIGHUP if it has not exited;
8. a final upload once the command (and, for sharded checkpoints, every local rank's
   command) has exited; then the launcher exits with the command's status.

While the command runs, local rank 0 samples the node's GPUs, RDMA ports and host into
<report dir>/telemetry-node<k>.jsonl and MLflow (jobs.runtime.telemetry). The hang watchdog
(AMLHPC_WATCHDOG_JSON, jobs.runtime.watchdog) reads the step counter each process reports
through AMLHPC_PROGRESS_FILE and stops the command when it stops making progress; at the
end, local rank 0 writes the node's end record beside the checkpoints
(jobs.runtime.nodestatus) for the supervision.

Exit status: the command's own (128+N when signal N killed it), 0 when it died by a crash
signal after it reported a completed training (jobs.runtime.completion; the report's
`exit_after_completion` says so), or:
    2   bad input: flags, AMLHPC_* variables, rank variables (nothing was started)
    3   the health gate failed or timed out (the training did not start)
    4   staging failed or timed out
    5   the latest checkpoint could not be restored
    6   the command succeeded but its final checkpoint could not be uploaded
    7   the hang watchdog stopped the command: no progress for watchdog.hang_s
    8   NCCL would use TCP sockets between the nodes of an InfiniBand size (jobs/runtime/exit_codes.py)
    9   the node's managed identity cannot reach the job's storage with the role it needs
    126 the command is not executable, 127 it was not found

The connection string AMLHPC_BLOB_CONNECTION_STRING (Azurite) is removed from the
command's environment: the training never needs the account key.

Standard library plus azure-storage-blob / azure-identity (through the modules above):
ships in the image, imports nothing from the repository outside jobs.runtime.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jobs.runtime import contract
from jobs.runtime.errors import EXIT_USAGE, RuntimeInputError, RuntimeProblem
from jobs.runtime.exit_codes import EXIT_HANG, EXIT_NCCL_SOCKETS, EXIT_STORAGE_ACCESS

log = logging.getLogger("amlhpc.launch")

EXIT_HEALTH = 3
EXIT_STAGING = 4
EXIT_RESTORE = 5
EXIT_FINAL_UPLOAD = 6
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

RESTORE_WAIT_S = 3 * 3600.0
"""How long a node's other ranks wait for local rank 0's restore (it notices a dead leader sooner)."""
HEALTH_MODES = ("gate", "warn", "off")
PIN_MODES = ("auto", "off")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SECRET_VARIABLES = (contract.BLOB_CONNECTION_STRING,)


class LaunchFailed(Exception):
    """A phase before the training failed; carries the launcher's exit status."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class LaunchOptions:
    command: list[str]
    health: str = "off"
    health_full: bool = False
    health_timeout_s: float = 900.0
    pin: str = "auto"
    max_clocks: bool = False
    checkpoint_dir: Path | None = None
    term_grace_s: float = 30.0
    final_wait_s: float = 600.0
    report_dir: Path = Path(contract.DEFAULT_REPORT_DIR)
    sysfs: Path = Path("/sys")


@dataclass
class LaunchReport:
    """What happened on this process; local rank 0 writes it as launch-node<k>.json."""

    host: str
    rank: int
    node: int
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: staging, health, pinning, restore, training, final_upload."""
    staged_bytes: int = 0
    health: str | None = None
    pinning: dict | None = None
    restored_version: str | None = None
    uploaded_versions: list[str] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)
    command_status: int | None = None
    exit_code: int | None = None
    error: str | None = None
    completed: dict | None = None
    """What the training said when it finished: {"step", "checkpoint"} (jobs.runtime.progress)."""
    telemetry: dict | None = None
    """The node's telemetry summary (jobs.runtime.telemetry), on local rank 0."""
    exit_after_completion: dict | None = None
    """Set when the command died by a crash signal after it completed (jobs.runtime.completion):
    {"status", "signal", "step", "checkpoint"}; the launcher then exits 0."""


# --- options ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jobs.runtime.launch",
        usage="python -m jobs.runtime.launch [options] -- COMMAND [ARGS...]",
        description="Stage inputs, gate on node health, pin, restore the latest checkpoint, run COMMAND with "
                    "background checkpoint uploads. Exit: COMMAND's status, or 2 bad input, 3 health gate, "
                    "4 staging, 5 restore, 6 final upload, 7 hang, 8 NCCL on TCP on an InfiniBand size, 9 storage access, "
                    "126/127 COMMAND not executable/not found.")
    p.add_argument("--health", choices=HEALTH_MODES, default=None,
                   help=f"health gate before training; the flag wins over ${contract.HEALTH} (default: it, else off)")
    p.add_argument("--health-full", action="store_true", help="full repetitions (default: --quick before training)")
    p.add_argument("--health-timeout", type=float, default=900.0, metavar="S",
                   help="wall-clock limit for the health checks; a hung collective fails the gate (default 900)")
    p.add_argument("--pin", choices=PIN_MODES, default=None,
                   help=f"GPU order and CPU affinity per local rank; wins over ${contract.PIN} (default: it, else auto)")
    p.add_argument("--max-clocks", action="store_true",
                   help="set GPU application clocks to maximum for the job and reset them afterwards (needs root)")
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="local checkpoint folder (default: <scratch>/amlhpc-checkpoints/<run id>)")
    p.add_argument("--term-grace", type=float, default=30.0, metavar="S",
                   help="after forwarding SIGTERM/SIGINT/SIGHUP, SIGKILL the command this many seconds later (default 30)")
    p.add_argument("--final-wait", type=float, default=600.0, metavar="S",
                   help="with sharded checkpoints, how long local rank 0 waits for the node's other ranks to exit "
                        "before the final upload (default 600)")
    p.add_argument("--report-dir", type=Path, default=None,
                   help=f"per-node reports (default: ${contract.REPORT_DIR}, else {contract.DEFAULT_REPORT_DIR})")
    p.add_argument("--sysfs", type=Path, default=Path("/sys"), help=argparse.SUPPRESS)
    return p


def parse_options(argv: Sequence[str], environ: Mapping[str, str]) -> LaunchOptions:
    """Flags before `--`, the command after it; RuntimeInputError names what is wrong."""
    argv = list(argv)
    if "--" not in argv and {"-h", "--help"} & set(argv):
        _parser().parse_args(argv)  # prints the help and exits 0
    if "--" not in argv:
        raise RuntimeInputError.single("command line", "--", "no training command: put it after `--`",
                                       "python -m jobs.runtime.launch [options] -- python train.py ...")
    split = argv.index("--")
    flags, command = argv[:split], argv[split + 1:]
    if not command:
        raise RuntimeInputError.single("command line", "--", "nothing after `--`: the training command is missing",
                                       "python -m jobs.runtime.launch -- python train.py ...")
    args = _parser().parse_args(flags)
    problems = []
    health = args.health or environ.get(contract.HEALTH, "").strip() or "off"
    if health not in HEALTH_MODES:
        problems.append(RuntimeProblem(contract.HEALTH, "", f"must be one of {', '.join(HEALTH_MODES)}, got {health!r}",
                                       "set it in the recipe's `health` field, or pass --health"))
    pin = args.pin or environ.get(contract.PIN, "").strip() or "auto"
    if pin not in PIN_MODES:
        problems.append(RuntimeProblem(contract.PIN, "", f"must be one of {', '.join(PIN_MODES)}, got {pin!r}",
                                       "set it in the recipe's `pin` field, or pass --pin"))
    for name, value in (("--health-timeout", args.health_timeout), ("--term-grace", args.term_grace),
                        ("--final-wait", args.final_wait)):
        if value <= 0:
            problems.append(RuntimeProblem("command line", name, f"must be a positive number of seconds, got {value:g}"))
    if problems:
        raise RuntimeInputError(problems, title="the launcher's settings are not usable")
    report_dir = args.report_dir or Path(environ.get(contract.REPORT_DIR) or contract.DEFAULT_REPORT_DIR)
    return LaunchOptions(command, health, args.health_full, args.health_timeout, pin, args.max_clocks,
                         args.checkpoint_dir, args.term_grace, args.final_wait, report_dir, args.sysfs)


# --- node-local coordination -------------------------------------------------------------


def _node_dir(ranks, environ: Mapping[str, str], what: str) -> Path:
    """Node-local marker folder for this job and node (the forced scratch when set, as
    simulated nodes on one machine differ there; else the temp dir)."""
    base = Path(environ.get(contract.SCRATCH) or tempfile.gettempdir())
    return base / ".amlhpc-launch" / f"{ranks.run_id}-node{ranks.node_index}" / what


def _checkpoint_base(environ: Mapping[str, str], staged_scratch: str | None) -> Path:
    """Where the node's checkpoint folder goes: the scratch staging used, else the one it would pick."""
    if environ.get(contract.SCRATCH):
        return Path(environ[contract.SCRATCH])
    if staged_scratch:
        return Path(staged_scratch)
    from jobs.runtime import scratch

    try:
        return scratch.pick_scratch().path
    except scratch.ScratchError as exc:
        log.warning("no scratch for checkpoints (%s): using %s", exc, tempfile.gettempdir())
        return Path(tempfile.gettempdir())


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:120]


# --- the child process -----------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL if the launcher dies (no orphaned training)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class SignalForwarder:
    """Forwards signals to the command's process group; kills it `grace_s` after a stop signal."""

    def __init__(self, child: subprocess.Popen, grace_s: float, report: LaunchReport):
        self.child, self.grace_s, self.report = child, grace_s, report
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None
        self.done = False

    def install(self) -> None:
        for signum in FORWARDED_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        self.report.signals.append(name)
        if self.done:
            log.warning("%s received while finishing up: the final checkpoint upload goes on", name)
            return
        log.warning("%s received: forwarding it to the training command (pid %d)", name, self.child.pid)
        try:
            os.killpg(self.child.pid, signum)
        except ProcessLookupError:
            return
        if signum in STOPPING_SIGNALS and self._timer is None:
            self._timer = threading.Timer(self.grace_s, self._kill)
            self._timer.daemon = True
            self._timer.start()

    def _kill(self) -> None:
        if self.child.poll() is None:
            log.warning("the training command did not exit %gs after the stop signal: SIGKILL", self.grace_s)
            try:
                os.killpg(self.child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def finish(self) -> None:
        """The command has exited: stop the kill timer, keep catching signals (upload goes on)."""
        self.done = True
        if self._timer is not None:
            self._timer.cancel()

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell would report it (signal N -> 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


# --- the launcher ----------------------------------------------------------------------


class Launcher:
    """The phases for one process (see the module docstring)."""

    def __init__(self, options: LaunchOptions, environ: Mapping[str, str] | None = None):
        from jobs.runtime import ranks as ranks_module
        from jobs.runtime.checkpoint import settings_from_env
        from jobs.runtime.skufacts import load_sku_facts
        from jobs.runtime.staging import specs_from_env
        from jobs.runtime.watchdog import settings_from_env as watchdog_settings

        self.options = options
        self.environ = dict(os.environ if environ is None else environ)
        self.ranks = ranks_module.from_env(self.environ)  # RankError is a RuntimeInputError
        # Parse every input up front: bad input stops the job before anything is downloaded.
        problems: list[RuntimeProblem] = []
        self.sku = self.checkpoint = self.watchdog = self.guard = None
        self.specs = []
        for load, target in ((lambda: load_sku_facts(self.environ), "sku"),
                             (lambda: settings_from_env(self.environ), "checkpoint"),
                             (lambda: specs_from_env(self.environ), "specs"),
                             (lambda: watchdog_settings(self.environ), "watchdog")):
            try:
                setattr(self, target, load())
            except RuntimeInputError as exc:
                problems.extend(exc.problems)
        if problems:
            raise RuntimeInputError(problems, title="the job's runtime settings are not usable")
        self.child_env: dict[str, str] = {}
        self.report = LaunchReport(socket.gethostname(), self.ranks.rank, self.ranks.node_index)
        self.staged_scratch: str | None = None
        self.store = None
        self.checkpoint_dir: Path | None = None

    # 1b. NCCL settings for this node; stop before anything runs when NCCL would fall back to TCP
    def nccl_preflight(self) -> None:
        from jobs.runtime import nccl_env, nccl_transport

        try:
            notes = nccl_env.apply(self.environ, self.options.sysfs)
        except RuntimeInputError as exc:
            raise LaunchFailed(EXIT_USAGE, exc.render()) from None
        for note in notes:
            (log.warning if note.startswith("warning:") else log.info)("nccl: %s", note.removeprefix("warning: "))
        if self.sku is not None:
            problem = nccl_transport.preflight(self.sku.name, self.sku.infiniband, self.ranks.node_count,
                                               self.environ, self.options.sysfs)
            if problem:
                raise LaunchFailed(EXIT_NCCL_SOCKETS, problem)

    # 1c. the node's identity can read the inputs and write the checkpoints (fail in seconds, role named)
    def storage_preflight(self) -> None:
        from jobs.runtime import blobio
        from jobs.runtime.health import access

        problems = access.check_access(
            access.targets(self.specs, self.checkpoint), self.environ,
            credential_factory=lambda: blobio.credential_from_env(self.environ),
            client_factory=lambda t, credential: blobio.container_client(t.container, account_url=t.account_url,
                                                                          credential=credential))
        if problems:
            raise LaunchFailed(EXIT_STORAGE_ACCESS, "storage access: " + "; ".join(problems))

    # 2. staging
    def stage(self) -> None:
        if not self.specs:
            return
        from jobs.runtime import scratch, staging
        from jobs.runtime.nodebarrier import BarrierTimeout

        started = time.monotonic()
        try:
            result = staging.stage_inputs(self.specs, self.ranks, env=self.environ,
                                          options=staging.StageOptions(report_dir=self.options.report_dir))
        except (staging.StageConfigError, scratch.ScratchError) as exc:
            raise LaunchFailed(EXIT_USAGE, f"staging input: {exc}") from None
        except (staging.StagingError, BarrierTimeout, OSError) as exc:
            raise LaunchFailed(EXIT_STAGING, f"staging failed: {exc}") from None
        self.child_env.update(result.env_for(self.ranks.rank))
        self.staged_scratch = (result.scratch or {}).get("path")
        self.report.staged_bytes = result.bytes_out
        self.report.phases["staging"] = time.monotonic() - started

    # 4. health
    def health_env(self) -> dict[str, str]:
        """The gate's own rendezvous port (the command's + 1), so the training's port is
        never one the checks just closed."""
        from jobs.runtime.health.collective import rendezvous_address

        env = {k: v for k, v in self.environ.items() if k not in SECRET_VARIABLES}
        address = rendezvous_address(self.environ)
        if address is not None:
            env["MASTER_ADDR"], env["MASTER_PORT"] = address[0], str(address[1] + 1)
        return env

    def health_gate(self) -> None:
        if self.options.health == "off":
            return
        started = time.monotonic()
        command = [sys.executable, "-m", "jobs.runtime.health", "--mode", self.options.health,
                   "--report-dir", str(self.options.report_dir / "health"),
                   "--timeout", str(max(self.options.health_timeout_s - 30, 30))]
        if not self.options.health_full:
            command.append("--quick")
        if self.options.sysfs != Path("/sys"):
            command += ["--sysfs", str(self.options.sysfs)]
        log.info("health checks (%s): %s", self.options.health, " ".join(command[1:]))
        proc = subprocess.Popen(command, env=self.health_env())
        try:
            code = proc.wait(timeout=self.options.health_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        self.report.phases["health"] = time.monotonic() - started
        if code == 0:
            # In warn mode the checks exit 0 whatever they found: their report says what.
            self.report.health = "passed" if self.options.health == "gate" else "ran (warn: see the health report)"
            return
        if code == EXIT_USAGE:
            raise LaunchFailed(EXIT_USAGE, "the health checks rejected their input (see above)")
        if code is None:
            message = (f"the health checks did not finish in {self.options.health_timeout_s:.0f}s: a hung collective "
                       "means a node or the network is broken")
        elif code == EXIT_HEALTH:
            message = "health gate failed: see the failing host and check above"
        elif code == EXIT_NCCL_SOCKETS:
            message = "NCCL fell back to TCP sockets on an InfiniBand size: see the cause above"
        else:
            message = f"the health checks crashed (exit {exit_status(code)})"
        self.report.health = "fail"
        if self.options.health == "gate":
            raise LaunchFailed(EXIT_NCCL_SOCKETS if code == EXIT_NCCL_SOCKETS else EXIT_HEALTH, message)
        log.warning("%s; continuing (health: warn)", message)

    # 5. pinning
    def pin(self) -> None:
        if self.options.pin == "off":
            return
        from jobs.runtime import topology

        started = time.monotonic()
        available = frozenset(os.sched_getaffinity(0))
        found = topology.discover(self.options.sysfs, self.sku, available)
        plan = topology.plan_pinning(found, self.ranks.local_size, available, self.environ.get("CUDA_VISIBLE_DEVICES"))
        applied = topology.apply_pinning(plan, self.ranks.local_rank, self.environ)
        self.child_env.update(applied.env)
        mine = plan.for_rank(self.ranks.local_rank)
        self.report.pinning = {"source": plan.source, "gpus": list(mine.gpu_indices) if mine else [],
                               "cpus": topology.format_cpulist(applied.cpus), "notes": list(plan.notes), **applied.env}
        if mine:
            log.info("pinned local rank %d to GPU %s and CPUs %s (%s)", self.ranks.local_rank,
                     ",".join(map(str, mine.gpu_indices)), topology.format_cpulist(applied.cpus) or "unchanged", plan.source)
        for note in plan.notes:
            log.info("pinning: %s", note)
        self.report.phases["pinning"] = time.monotonic() - started

    # 6. restore
    def restore(self) -> None:
        if self.checkpoint is None:
            log.info("no %s: checkpoints are not uploaded or restored", contract.CHECKPOINT_JSON)
            return
        from jobs.runtime.nodebarrier import BarrierFailed, BarrierTimeout, NodeBarrier

        started = time.monotonic()
        barrier = NodeBarrier(_node_dir(self.ranks, self.environ, "restore"), RESTORE_WAIT_S, self.ranks.run_id)
        if self.ranks.is_node_leader:
            barrier.lead()
            try:
                version = self._restore_as_leader()
            except BaseException as exc:
                barrier.fail(str(exc))
                raise
            barrier.succeed({"checkpoint_dir": str(self.checkpoint_dir), "version": version})
        else:
            try:
                done = barrier.wait()
            except (BarrierFailed, BarrierTimeout) as exc:
                raise LaunchFailed(EXIT_RESTORE, f"restore on local rank 0 failed: {exc}") from None
            self.checkpoint_dir = Path(done["checkpoint_dir"])
            version = done.get("version")
        self.report.restored_version = version
        self.child_env[contract.CHECKPOINT_DIR] = str(self.checkpoint_dir)
        if version:
            self.child_env[contract.RESUME_DIR] = str(self.checkpoint_dir)
        self.report.phases["restore"] = time.monotonic() - started

    def _restore_as_leader(self) -> str | None:
        from jobs.runtime.checkpoint import (
            CheckpointError,
            CheckpointStore,
            container_from_settings,
        )
        from jobs.runtime.throttle import Throttle

        settings = self.checkpoint
        self.checkpoint_dir = self.options.checkpoint_dir or (
            _checkpoint_base(self.environ, self.staged_scratch) / "amlhpc-checkpoints" / _safe(self.ranks.run_id))
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        warning = settings.ingress_warning(self.ranks.node_count)
        if warning:
            log.warning("%s", warning)
        try:
            container = container_from_settings(settings, self.environ)
        except ValueError as exc:  # blobio.BlobConfigError: never holds a secret
            raise LaunchFailed(EXIT_USAGE, f"checkpoint storage: {exc}") from None
        self.store = CheckpointStore(container, settings.stream(self.ranks.node_index),
                                     throttle=Throttle.from_mbits_per_s(settings.cap_mbps))
        try:
            manifest = self.store.restore(self.checkpoint_dir)
        except CheckpointError as exc:
            raise LaunchFailed(EXIT_RESTORE, f"restore failed: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - storage errors: say which and stop
            hint = ""
            if type(exc).__name__ == "ClientAuthenticationError" or getattr(exc, "status_code", None) == 403:
                hint = ("; the node's identity (AZURE_CLIENT_ID) needs 'Storage Blob Data Contributor' on the "
                        "account (role assignments take minutes to propagate)")
            raise LaunchFailed(EXIT_RESTORE, f"restore failed: {type(exc).__name__}: {exc}{hint}") from None
        if manifest is None:
            log.info("no checkpoint under %s/%s: starting fresh", settings.container, settings.stream(self.ranks.node_index))
            return None
        log.info("resuming from checkpoint %s (%d files, %d bytes) in %s", manifest.version, len(manifest.files),
                 manifest.bytes, self.checkpoint_dir)
        return manifest.version

    @property
    def uploads(self) -> bool:
        """Whether this process uploads checkpoints (local rank 0 of a writing node)."""
        return (self.checkpoint is not None and self.store is not None and self.ranks.is_node_leader
                and self.checkpoint.is_writer(self.ranks.node_index))

    # 7. training
    def command_env(self) -> dict[str, str]:
        env = {k: v for k, v in self.environ.items() if k not in SECRET_VARIABLES}
        env.update(self.child_env)
        return env

    def train(self) -> int:
        from jobs.runtime import telemetry, watchdog
        from jobs.runtime.checkpoint import BackgroundUploader

        progress_dir = _node_dir(self.ranks, self.environ, "progress")
        self.child_env[contract.PROGRESS_FILE] = str(watchdog.progress_path(progress_dir, self.ranks.local_rank))
        uploader = None
        if self.uploads:
            uploader = BackgroundUploader(self.store, self.checkpoint_dir, self.checkpoint.interval_s, self.checkpoint.keep)
            uploader.mark_current()
        started = time.monotonic()
        log.info("starting: %s", " ".join(self.options.command))
        try:
            child = subprocess.Popen(self.options.command, env=self.command_env(), start_new_session=True,
                                     preexec_fn=_die_with_parent)
        except FileNotFoundError:
            raise LaunchFailed(EXIT_NOT_FOUND, f"command not found: {self.options.command[0]}") from None
        except PermissionError:
            raise LaunchFailed(EXIT_NOT_EXECUTABLE, f"command not executable: {self.options.command[0]}") from None
        forwarder = SignalForwarder(child, self.options.term_grace_s, self.report)
        forwarder.install()
        self.guard = watchdog.attach(self, child.pid, progress_dir)
        sampler = telemetry.start_for(self)  # local rank 0: node telemetry while the command runs
        if uploader is not None:
            uploader.start()
        try:
            returncode = child.wait()
        finally:
            forwarder.finish()
            self.guard.stop()
            if sampler is not None:
                self.report.telemetry = sampler.stop()
        status = self.report.command_status = exit_status(returncode)
        self.report.phases["training"] = time.monotonic() - started
        log.info("training command exited with %d after %.1fs", status, self.report.phases["training"])
        status = self._judge_exit(returncode, status)
        if self.guard.fired:
            status, self.report.error = EXIT_HANG, f"hang: {self.guard.fired.get('message')}"
        self._mark_exited(status)
        if uploader is not None:
            status = self._final_upload(uploader, status)
        forwarder.restore()
        return status

    def _judge_exit(self, returncode: int, status: int) -> int:
        """A command that crashed after it reported a completed training did its work: 0."""
        from jobs.runtime import completion, progress

        reading = progress.read(Path(self.child_env[contract.PROGRESS_FILE]))
        if reading is not None and reading.completed_step is not None:
            self.report.completed = {"step": reading.completed_step, "checkpoint": reading.completed_checkpoint}
        if status == 0:
            return 0
        stopped = any(name in self.report.signals for name in (s.name for s in STOPPING_SIGNALS))
        after = completion.after_completion(returncode, reading, stopped=stopped, hung=bool(self.guard.fired))
        if after is None:
            return status
        self.report.exit_after_completion = after.to_json()
        log.warning("%s", after.message())
        return 0

    # 8. final upload
    def _mark_exited(self, status: int) -> None:
        if self.checkpoint is None or self.checkpoint.writers == "rank0":
            return
        from jobs.runtime.nodebarrier import write_json_atomic

        write_json_atomic(_node_dir(self.ranks, self.environ, "exited") / f"rank-{self.ranks.local_rank}.json",
                          {"pid": os.getpid(), "status": status, "written": time.time()})

    def _wait_for_local_ranks(self) -> None:
        """Sharded checkpoints: every local rank's command must be done writing its shard."""
        if self.checkpoint.writers == "rank0" or self.ranks.local_size == 1:
            return
        folder = _node_dir(self.ranks, self.environ, "exited")
        deadline = time.monotonic() + self.options.final_wait_s
        while time.monotonic() < deadline:
            missing = [r for r in range(self.ranks.local_size) if not (folder / f"rank-{r}.json").exists()]
            if not missing:
                return
            time.sleep(0.2)
        log.warning("local rank(s) %s still running after %.0fs: uploading what is there", missing, self.options.final_wait_s)

    def _final_upload(self, uploader, status: int) -> int:
        from jobs.runtime.checkpoint import CheckpointError

        started = time.monotonic()
        self._wait_for_local_ranks()
        try:
            final = uploader.finish()
        except CheckpointError as exc:
            self.report.error = str(exc)
            if status == 0:
                log.error("%s", exc)
                return EXIT_FINAL_UPLOAD
            log.error("%s (the command had already failed with %d)", exc, status)
            return status
        finally:
            self.report.uploaded_versions = [r.version for r in uploader.results if r.version]
            self.report.phases["final_upload"] = time.monotonic() - started
        if final is not None and final.version:
            log.info("checkpoint %s is the latest in %s/%s", final.version, self.checkpoint.container,
                     self.checkpoint.stream(self.ranks.node_index))
        return status

    def write_report(self) -> None:
        if not self.ranks.is_node_leader:
            return
        from jobs.runtime.nodebarrier import write_json_atomic

        try:
            write_json_atomic(self.options.report_dir / f"launch-node{self.ranks.node_index:03d}.json",
                              self.report.__dict__)
        except OSError as exc:
            log.warning("could not write the launch report: %s", exc)

    def run(self) -> int:
        """All phases; returns the exit status."""
        from contextlib import ExitStack

        from jobs.runtime import clocks

        with ExitStack() as stack:
            try:
                self.nccl_preflight()
                self.storage_preflight()
                self.stage()
                if self.options.max_clocks and self.ranks.is_node_leader:
                    changes = stack.enter_context(clocks.max_application_clocks())
                    if not changes:
                        log.info("--max-clocks: no GPU clocks changed (NVML unavailable or no GPU)")
                    for change in changes:
                        log.info("clocks gpu%d: %s %s", change.index, change.status,
                                 change.reason or f"{change.memory_mhz}/{change.graphics_mhz} MHz")
                self.health_gate()
                self.pin()
                self.restore()
                code = self.train()
            except LaunchFailed as exc:
                log.error("%s", exc)
                self.report.error = str(exc)
                code = exc.code
        self.report.exit_code = code
        self.write_report()
        from jobs.runtime.watchdog import record_end

        record_end(self, code)
        return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ
    rank = environ.get("RANK") or environ.get("OMPI_COMM_WORLD_RANK") or "0"
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"[launch rank {rank}] %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    try:
        options = parse_options(argv, environ)
        launcher = Launcher(options, environ)
    except RuntimeInputError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_USAGE
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
