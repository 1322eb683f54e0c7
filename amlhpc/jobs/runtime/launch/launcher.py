"""The in-job launcher: `python -m amlhpc.jobs.runtime.launch [options] -- <training command>`.

Azure ML starts it on every process of the job (one per GPU); each one, in order:

1. ranks from the launcher's variables (amlhpc.jobs.runtime.base.ranks);
2. staging (AMLHPC_STAGE_JSON, amlhpc.jobs.runtime.staging.stager): local rank 0 of each node downloads
   the node's share while the node's other ranks wait;
3. GPU application clocks to maximum with --max-clocks (local rank 0, reset at the end);
4. the health gate (AMLHPC_HEALTH gate|warn|off): `python -m amlhpc.jobs.runtime.health` in a
   child process on every rank, with a wall-clock limit, so a broken node stops the job
   here (with its host and failed check in the log) instead of hanging the training;
5. pinning (AMLHPC_PIN auto|off, amlhpc.jobs.runtime.node.topology): this process's CPU affinity and
   the command's CUDA_VISIBLE_DEVICES order;
6. restore (AMLHPC_CHECKPOINT_JSON, amlhpc.jobs.runtime.checkpoint): local rank 0 downloads the
   latest committed version of the checkpoint folder, and the newest versioned checkpoint
   into the node's tier (its own ranks' parts, or every part on another world size), the
   others wait;
7. the training command, with AMLHPC_DATA_DIR_<NAME>, AMLHPC_FILE_LIST_<NAME>,
   AMLHPC_CHECKPOINT_DIR, AMLHPC_RESUME_DIR (when a folder version was restored),
   AMLHPC_RESUME_VERSION (the versioned checkpoint to resume from), AMLHPC_RESTART_GENERATION,
   AMLHPC_CHECKPOINT_TAG and the pinning variables set; while it runs, local rank 0 uploads
   the checkpoint folder (writer nodes) and the node's parts of versioned checkpoints every
   `interval_s`; SIGTERM/SIGINT/SIGHUP/SIGUSR1/SIGUSR2 are forwarded to the command's process
   group (SIGTERM is how a low-priority node is preempted), and the group is killed
   `--term-grace` seconds after a SIGTERM/SIGINT/SIGHUP if it has not exited. When a command
   fails - a crash, an NCCL error, a hang the watchdog stops - the launchers of every node
   stop theirs, agree on a version and start the command again in the same job
   (amlhpc.jobs.runtime.launch.restart), up to `local_restarts` times;
8. a final upload once every local rank's command has exited; then the launcher exits with
   the command's status.

While the command runs, local rank 0 samples the node's GPUs, RDMA ports and host into
<report dir>/telemetry-node<k>.jsonl and MLflow (amlhpc.jobs.runtime.node.telemetry). The hang watchdog
(AMLHPC_WATCHDOG_JSON, amlhpc.jobs.runtime.launch.watchdog) reads the step counter each process reports
through AMLHPC_PROGRESS_FILE and stops the command when it stops making progress; at the
end, local rank 0 writes the node's end record beside the checkpoints
(amlhpc.jobs.runtime.coord.nodestatus) for the supervision.

Exit status: the command's own (128+N when signal N killed it), 0 when it died by a crash
signal after it reported a completed training (amlhpc.jobs.runtime.launch.completion; the report's
`exit_after_completion` says so), or one of amlhpc.jobs.runtime.base.exit_codes.ExitCode:
    2   bad input: flags, AMLHPC_* variables, rank variables (nothing was started)
    3   the health gate failed or timed out (the training did not start)
    4   staging failed or timed out
    5   the latest checkpoint could not be restored
    6   the command succeeded but its final checkpoint could not be uploaded
    7   the hang watchdog stopped the command: no progress for watchdog.hang_s
    8   NCCL would use TCP sockets between the nodes of an InfiniBand size
    9   the node's managed identity cannot reach the job's storage with the role it needs
    10  a node was lost: node 0 (its coordination store stopped answering), a node that did not
        answer an in-job restart, or a command not reaped --kill-wait seconds after its SIGKILL
    11  the training failed again after `local_restarts` in-job restarts
    13  a node failed the quick health check before an in-job restart (amlhpc.jobs.runtime.health.quick)
    126 the command is not executable, 127 it was not found

The connection string AMLHPC_BLOB_CONNECTION_STRING (Azurite) is removed from the
command's environment: the training never needs the account key. It gets a read-only SAS of
the checkpoint container instead (AMLHPC_BLOB_READ_SAS, valid a day), for a reshard load's
ranged reads; on Azure the training reads with the node's managed identity.

Standard library plus azure-storage-blob / azure-identity (through the modules above):
ships in the image, imports nothing from the repository outside amlhpc.jobs.runtime.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from amlhpc.jobs.runtime.base import clock, contract, faultpoints, launchid, progress
from amlhpc.jobs.runtime.base.errors import RuntimeInputError, RuntimeProblem
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.coord import jobstore
from amlhpc.jobs.runtime.coord.agree import Channel, farewell, greet
from amlhpc.jobs.runtime.coord.kvstore import StoreLost
from amlhpc.jobs.runtime.launch.reap import KILL_WAIT_S, Kills
from amlhpc.jobs.runtime.launch.standby import STANDBY_START_S, worth_keeping

if TYPE_CHECKING:  # imported where used, inside the phases (a launcher without checkpoints never loads them)
    from amlhpc.jobs.runtime.checkpoint.node import NodeCheckpoints
    from amlhpc.jobs.runtime.checkpoint.settings import CheckpointSettings
    from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore
    from amlhpc.jobs.runtime.coord.nodebarrier import NodeBarrier
    from amlhpc.jobs.runtime.health.quick import Baseline
    from amlhpc.jobs.runtime.launch.restart import NodeRecords
    from amlhpc.jobs.runtime.launch.standby import Standby
    from amlhpc.jobs.runtime.launch.watchdog import Guard, WatchdogSettings
    from amlhpc.jobs.runtime.node.skufacts import SkuFacts
    from amlhpc.jobs.runtime.staging.stagespec import StageSpec

log = logging.getLogger("amlhpc.launch")


BYE_WAIT_S = 120.0
"""How long node 0 keeps the store up at its end for the other nodes to finish with it."""
BYE = "launch/bye"
RESTORE_WAIT_S = 3 * 3600.0
"""How long a node's other ranks wait for local rank 0's restore (it notices a dead leader sooner)."""
HEALTH_MODES = ("gate", "warn", "off")
PIN_MODES = ("auto", "off")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SECRET_VARIABLES = (contract.BLOB_CONNECTION_STRING,)
"""Never passed to the training command; nor is AMLHPC_COORD_LISTEN_FD (a socket only the launcher holds)."""
STANDBY_READY = "AMLHPC_STANDBY_READY"
"""For the training: the file the warm standby for the next restart writes once it is ready."""
STANDBY_MODES = ("on", "off", "auto")


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
    kill_wait_s: float = KILL_WAIT_S
    """After a SIGKILL, how long to wait for the command before the node is reported lost (reap.py)."""


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
    restarts: list[dict] = field(default_factory=list)
    """In-job restarts: generation, the failure's cause and node, where it resumed from."""
    command_status: int | None = None
    exit_code: int | None = None
    error: str | None = None
    completed: dict | None = None
    """What the training said when it finished: {"step", "checkpoint"} (amlhpc.jobs.runtime.base.progress)."""
    telemetry: dict | None = None
    """The node's telemetry summary (amlhpc.jobs.runtime.node.telemetry), on local rank 0."""
    exit_after_completion: dict | None = None
    """Set when the command died by a crash signal after it completed (amlhpc.jobs.runtime.launch.completion):
    {"status", "signal", "step", "checkpoint"}; the launcher then exits 0."""
    lost: dict | None = None
    """Set when the command was not reaped after its SIGKILL (amlhpc.jobs.runtime.launch.reap): the node
    is lost: {"node", "pid", "waited_s", "after"}."""
    unhealthy: dict | None = None
    """The node that failed its health check before an in-job restart (this one or another):
    {"node", "host", "check", "message"} (amlhpc.jobs.runtime.health.quick)."""


# --- options ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m amlhpc.jobs.runtime.launch",
        usage="python -m amlhpc.jobs.runtime.launch [options] -- COMMAND [ARGS...]",
        description="Stage inputs, gate on node health, pin, restore the latest checkpoint, run COMMAND with "
                    "background checkpoint uploads. Exit: COMMAND's status, or 2 bad input, 3 health gate, "
                    "4 staging, 5 restore, 6 final upload, 7 hang, 8 NCCL on TCP on an InfiniBand size, 9 storage access, "
                    "10 a node lost, 11 in-job restarts spent, 13 a node failed its pre-restart health check, "
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
    p.add_argument("--kill-wait", type=float, default=KILL_WAIT_S, metavar="S",
                   help="after a SIGKILL of the command, report the node lost (exit 10) if it has not exited this many "
                        f"seconds later: a process in uninterruptible sleep is never reaped (default {KILL_WAIT_S:g})")
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
                                       "python -m amlhpc.jobs.runtime.launch [options] -- python train.py ...")
    split = argv.index("--")
    flags, command = argv[:split], argv[split + 1:]
    if not command:
        raise RuntimeInputError.single("command line", "--", "nothing after `--`: the training command is missing",
                                       "python -m amlhpc.jobs.runtime.launch -- python train.py ...")
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
                        ("--final-wait", args.final_wait), ("--kill-wait", args.kill_wait)):
        if value <= 0:
            problems.append(RuntimeProblem("command line", name, f"must be a positive number of seconds, got {value:g}"))
    if problems:
        raise RuntimeInputError(problems, title="the launcher's settings are not usable")
    report_dir = args.report_dir or Path(environ.get(contract.REPORT_DIR) or contract.DEFAULT_REPORT_DIR)
    return LaunchOptions(command, health, args.health_full, args.health_timeout, pin, args.max_clocks,
                         args.checkpoint_dir, args.term_grace, args.final_wait, report_dir, args.sysfs,
                         kill_wait_s=args.kill_wait)


# --- node-local coordination -------------------------------------------------------------


def _node_dir(ranks, environ: Mapping[str, str], what: str, launch: str = "") -> Path:
    """Node-local marker folder for this job, node and launch (the forced scratch when set, as
    simulated nodes on one machine differ there; else the temp dir). `launch` is the launch's
    generation (amlhpc.jobs.runtime.base.launchid): a next launch with the same run id on the same node
    never reads this one's records (stop requests, exit records, barriers, progress)."""
    base = Path(environ.get(contract.SCRATCH) or tempfile.gettempdir())
    return progress.launch_state_dir(base, ranks.run_id, ranks.node_index, launch, what)


def _checkpoint_base(environ: Mapping[str, str], staged_scratch: str | None) -> Path:
    """Where the node's checkpoint folder goes: the scratch staging used, else the one it would pick."""
    if environ.get(contract.SCRATCH):
        return Path(environ[contract.SCRATCH])
    if staged_scratch:
        return Path(staged_scratch)
    from amlhpc.jobs.runtime.node import scratch

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

    def __init__(self, child: subprocess.Popen, grace_s: float, report: LaunchReport, kills: Kills | None = None):
        self.child, self.grace_s, self.report = child, grace_s, report
        self.kills = kills or Kills()
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
        self._timer: threading.Timer | None = None
        self.done = False
        self.stopped: str | None = None
        """The stopping signal the launcher received (the job is being stopped: no in-job restart)."""

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
        if signum in STOPPING_SIGNALS:
            self.stopped = self.stopped or name
        if signum in STOPPING_SIGNALS and self._timer is None:
            self._timer = threading.Timer(self.grace_s, self._kill)
            self._timer.daemon = True
            self._timer.start()

    def _kill(self) -> None:
        if self.child.poll() is None:
            log.warning("the training command did not exit %gs after the stop signal: SIGKILL", self.grace_s)
            self.kills.kill_group(self.child.pid, f"{self.grace_s:g}s after {self.stopped or 'a stop signal'}")

    def finish(self) -> None:
        """The command has exited: stop the kill timer, keep catching signals (upload goes on)."""
        self.done = True
        if self._timer is not None:
            self._timer.cancel()

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


class _RestartStopper:
    """Kills the command's process group at once when the node's leader asks for it: the training
    failed somewhere in the job and every node restarts it (amlhpc/jobs/runtime/launch/restart.py)."""

    def __init__(self, records, pid: int, kills: Kills | None = None):
        self.records, self.pid = records, pid
        self.kills = kills or Kills()
        self.killed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="restart-stopper", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from amlhpc.jobs.runtime.launch.restart import POLL_S

        while not self._stop.wait(POLL_S):
            if self.records.stop_requested() is not None:
                self.killed = True
                self.kills.kill_group(self.pid, "stopped for an in-job restart")
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class _Standbys:
    """The warm standby of a Python training command (amlhpc.jobs.runtime.launch.standby): started once the
    running command has reported its first step (so it never competes with that start), taken
    by the next in-job restart. One thread starts them and lives as long as the launcher's
    training phase: a child gets SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG
    follows the thread), which is what the standby must do only when the launcher goes."""

    def __init__(self, command: list[str]):
        import queue

        from amlhpc.jobs.runtime.launch.standby import standby_command

        self.command = standby_command(command)
        self.argv = command
        self._lock = threading.Lock()
        self._standby: Standby | None = None
        self._closed = False
        self._requests: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self.note: str | None = None
        """What became of the last standby handed a run, when it did not take it."""
        self.start_s = STANDBY_START_S

    def prepare_after_first_step(self, child: subprocess.Popen, progress_file: Path, env: dict[str, str],
                                 ready_file: Path) -> None:
        if self.command is None:
            return
        ready_file.unlink(missing_ok=True)
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="standby", daemon=True)
            self._thread.start()
        self._requests.put((child, progress_file, env, ready_file))

    def _serve(self) -> None:
        from amlhpc.jobs.runtime.launch.standby import Standby, standby_command

        while (request := self._requests.get()) is not None:
            child, progress_file, env, ready_file = request
            while child.poll() is None and not progress_file.exists() and not self._closed:
                time.sleep(0.5)
            with self._lock:
                if self._closed or self._standby is not None or child.poll() is not None:
                    continue
                command = standby_command(self.argv, ready_file)
                assert command is not None, "served only for a command with a standby (prepare_after_first_step)"
                try:
                    self._standby = Standby(command, env, _die_with_parent, ready_file)
                    log.info("warm standby (pid %d) started for the next in-job restart", self._standby.process.pid)
                except OSError as exc:
                    log.warning("no warm standby for the next restart: %s", exc)

    def take(self, env: dict[str, str]) -> subprocess.Popen | None:
        with self._lock:
            standby, self._standby = self._standby, None
        if standby is None:
            return None
        child = standby.activate(env)
        if child is None:
            self.note = f"the warm standby was gone (exit {standby.process.returncode}): a cold start"
            log.warning("%s", self.note)
            standby.discard()
        elif not standby.took_it(self.start_s):
            self.note = (f"the warm standby (pid {child.pid}) did not take the run within {self.start_s:g}s "
                         "(stopped or wedged): killed, and the command started cold")
            log.warning("%s", self.note)
            try:
                os.killpg(child.pid, signal.SIGKILL)  # its own session: the group is the standby's
            except ProcessLookupError:
                pass
            standby.discard()
            return None
        return child

    def close(self) -> None:
        with self._lock:
            self._closed = True
            standby, self._standby = self._standby, None
        if standby is not None:
            standby.discard()
        if self._thread is not None:
            self._requests.put(None)


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell would report it (signal N -> 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


# --- the launcher ----------------------------------------------------------------------


@dataclass
class _Running:
    """One generation's running command and what watches it (Launcher._start_generation)."""

    generation: int
    records: NodeRecords
    coordinated: bool
    """Whether a failure (or node 0 lost) stops every node at once and the nodes decide the outcome."""
    outcome_barrier: NodeBarrier | None
    """The node barrier behind which the nodes' decision comes (coordinated only)."""
    started: float
    """time.monotonic() at the start."""
    child: subprocess.Popen
    kills: Kills
    forwarder: SignalForwarder
    guard: Guard
    stopper: _RestartStopper | None


class Launcher:
    """The phases for one process (see the module docstring)."""

    def __init__(self, options: LaunchOptions, environ: Mapping[str, str] | None = None):
        from amlhpc.jobs.runtime.base import ranks as ranks_module
        from amlhpc.jobs.runtime.checkpoint import settings_from_env
        from amlhpc.jobs.runtime.launch.watchdog import settings_from_env as watchdog_settings
        from amlhpc.jobs.runtime.node.skufacts import load_sku_facts
        from amlhpc.jobs.runtime.staging.stager import specs_from_env

        self.options = options
        self.environ = dict(os.environ if environ is None else environ)
        self.ranks = ranks_module.from_env(self.environ)  # RankError is a RuntimeInputError
        # Parse every input up front: bad input stops the job before anything is downloaded.
        problems: list[RuntimeProblem] = []
        self.sku: SkuFacts | None = None
        self.checkpoint: CheckpointSettings | None = None
        self.watchdog: WatchdogSettings | None = None
        self.guard: Guard | None = None
        self.specs: list[StageSpec] = []
        for load, target in ((lambda: load_sku_facts(self.environ), "sku"),
                             (lambda: settings_from_env(self.environ), "checkpoint"),
                             (lambda: specs_from_env(self.environ), "specs"),
                             (lambda: watchdog_settings(self.environ), "watchdog")):
            try:
                setattr(self, target, load())
            except RuntimeInputError as exc:
                problems.extend(exc.problems)
        self.coord_endpoint: jobstore.Endpoint | None = None
        try:
            self.coord_endpoint = jobstore.endpoint(self.environ)
        except RuntimeInputError as exc:
            problems.extend(exc.problems)
        if problems:
            raise RuntimeInputError(problems, title="the job's runtime settings are not usable")
        generation = launchid.node_generation(self.environ, self.ranks.local_size)
        if generation is None:
            raise RuntimeInputError.single("launch identity", "", launchid.refusal(self.ranks.local_size),
                                           launchid.REFUSAL_HINT)
        self.launch = generation.value
        """This launch's generation on this node: every node-local record and barrier carries it."""
        self.jobstore: jobstore.JobStore | None = None
        self.channel: Channel | None = None
        """The job's coordination store, on local rank 0 (amlhpc.jobs.runtime.coord.jobstore)."""
        self.child_env: dict[str, str] = {}
        self.report = LaunchReport(socket.gethostname(), self.ranks.rank, self.ranks.node_index)
        self.staged_scratch: str | None = None
        self.store: CheckpointStore | None = None
        self.checkpoint_dir: Path | None = None
        self.node_checkpoints: NodeCheckpoints | None = None
        self._forwarder: SignalForwarder | None = None
        self._standbys = _Standbys(self.options.command if self._standby_wanted() else [])
        self._first_run_s: float | None = None
        """The first run's time to its first step on this node (a restart's deadline derives from it)."""
        self._generation = 0
        """The training run under way, or the last one (0, then 1 after an in-job restart, ...)."""
        self._baseline: Baseline | None = None
        """The node as its training started, for the pre-restart health check (local rank 0, with restarts)."""

    def _dir(self, what: str) -> Path:
        return _node_dir(self.ranks, self.environ, what, self.launch)

    # 1a. the job's coordination store: node 0 binds its port before anything else opens a connection
    def open_coordination(self) -> None:
        """Across nodes always; on one node only for the health gate's process group."""
        if not self.ranks.is_node_leader:
            return
        if self.ranks.node_count <= 1 and (self.options.health == "off" or self.ranks.world_size <= 1):
            return
        try:
            self.jobstore = jobstore.open_for_node(self.environ, self.ranks.node_index, self.ranks.node_count,
                                                   self.ranks.world_size)
            if self.jobstore is not None:
                self.channel = Channel(self.jobstore.store, node=self.ranks.node_index, nodes=self.ranks.node_count)
                greet(self.channel, BYE)
        except jobstore.CoordinationUnavailable as exc:
            raise LaunchFailed(ExitCode.USAGE, f"coordination store: {exc}") from None
        except StoreLost as exc:
            raise LaunchFailed(ExitCode.NODE_LOST, f"coordination store: {exc}") from None
        if self.jobstore is not None:
            log.info("coordination store: %s %s at %s", "serving" if self.jobstore.serving else "connected to",
                     self.jobstore.backend, self.jobstore.where)

    def close_coordination(self, failing: bool = False) -> None:
        """Local rank 0 says goodbye; node 0 keeps serving until every node has (bounded), so no
        node loses the store while it still reads its last answers (the final commit)."""
        if self.jobstore is None or self.channel is None:
            return
        try:
            farewell(self.channel, BYE, hosting=self.jobstore.serving, wait_s=BYE_WAIT_S, failing=failing)
        except StoreLost:
            pass
        finally:
            self.jobstore.close()
            self.jobstore = None

    # 1b. NCCL settings for this node; stop before anything runs when NCCL would fall back to TCP
    def nccl_preflight(self) -> None:
        from amlhpc.jobs.runtime.node import nccl_env, nccl_transport

        try:
            notes = nccl_env.apply(self.environ, self.options.sysfs)
        except RuntimeInputError as exc:
            raise LaunchFailed(ExitCode.USAGE, exc.render()) from None
        for note in notes:
            (log.warning if note.startswith("warning:") else log.info)("nccl: %s", note.removeprefix("warning: "))
        if self.sku is not None:
            problem = nccl_transport.preflight(self.sku.name, self.sku.infiniband, self.ranks.node_count,
                                               self.environ, self.options.sysfs)
            if problem:
                raise LaunchFailed(ExitCode.NCCL_SOCKETS, problem)

    # 1c. the node's identity can read the inputs and write the checkpoints (fail in seconds, role named)
    def storage_preflight(self) -> None:
        from amlhpc.jobs.runtime.blob import blobio
        from amlhpc.jobs.runtime.health import access

        problems = access.check_access(
            access.targets(self.specs, self.checkpoint), self.environ,
            credential_factory=lambda: blobio.credential_from_env(self.environ),
            client_factory=lambda t, credential: blobio.container_client(t.container, account_url=t.account_url,
                                                                          credential=credential))
        if problems:
            raise LaunchFailed(ExitCode.STORAGE_ACCESS, "storage access: " + "; ".join(problems))

    # 2. staging
    def stage(self) -> None:
        if not self.specs:
            return
        from amlhpc.jobs.runtime.coord.nodebarrier import BarrierTimeout
        from amlhpc.jobs.runtime.node import scratch
        from amlhpc.jobs.runtime.staging import stager as staging

        started = time.monotonic()
        try:
            result = staging.stage_inputs(self.specs, self.ranks, env=self.environ,
                                          options=staging.StageOptions(report_dir=self.options.report_dir),
                                          channel=self.channel)
        except (staging.StageConfigError, scratch.ScratchError) as exc:
            raise LaunchFailed(ExitCode.USAGE, f"staging input: {exc}") from None
        except StoreLost as exc:
            raise LaunchFailed(ExitCode.NODE_LOST, f"staging: {exc}") from None
        except (staging.StagingError, BarrierTimeout, OSError) as exc:
            raise LaunchFailed(ExitCode.STAGING, f"staging failed: {exc}") from None
        self.child_env.update(result.env_for(self.ranks.rank))
        self.staged_scratch = (result.scratch or {}).get("path")
        self.report.staged_bytes = result.bytes_out
        self.report.phases["staging"] = time.monotonic() - started

    # 4. health
    def health_env(self) -> dict[str, str]:
        """The checks form their process group through the job's coordination store (on node 0,
        its port bound before staging): the gate needs no port of its own, so none can be taken
        from under it (the defect: a port probed at the start and bound after staging collided with
        staging's own outgoing connections)."""
        env = {k: v for k, v in self.environ.items() if k not in SECRET_VARIABLES + (contract.COORD_LISTEN_FD,)}
        if self.coord_endpoint is not None:
            env[contract.COORD_PORT] = str(self.jobstore.endpoint.port if self.jobstore is not None
                                           else self.coord_endpoint.port)
        return env

    def health_gate(self) -> None:
        if self.options.health == "off":
            return
        started = time.monotonic()
        command = [sys.executable, "-m", "amlhpc.jobs.runtime.health", "--mode", self.options.health,
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
        if code == ExitCode.USAGE:
            raise LaunchFailed(ExitCode.USAGE, "the health checks rejected their input (see above)")
        if code is None:
            message = (f"the health checks did not finish in {self.options.health_timeout_s:.0f}s: a hung collective "
                       "means a node or the network is broken")
        elif code == ExitCode.HEALTH:
            message = "health gate failed: see the failing host and check above"
        elif code == ExitCode.NCCL_SOCKETS:
            message = "NCCL fell back to TCP sockets on an InfiniBand size: see the cause above"
        else:
            message = f"the health checks crashed (exit {exit_status(code)})"
        self.report.health = "fail"
        if self.options.health == "gate":
            raise LaunchFailed(ExitCode.NCCL_SOCKETS if code == ExitCode.NCCL_SOCKETS else ExitCode.HEALTH, message)
        log.warning("%s; continuing (health: warn)", message)

    # 5. pinning
    def pin(self) -> None:
        if self.options.pin == "off":
            return
        from amlhpc.jobs.runtime.node import topology

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
        from amlhpc.jobs.runtime.coord.nodebarrier import BarrierFailed, BarrierTimeout, NodeBarrier

        started = time.monotonic()
        barrier = NodeBarrier(self._dir("restore"), RESTORE_WAIT_S, self.ranks.run_id, generation=self.launch)
        if self.ranks.is_node_leader:
            barrier.lead()
            try:
                version, resume = self._restore_as_leader()
            except BaseException as exc:
                barrier.fail(str(exc))
                raise
            barrier.succeed({"checkpoint_dir": str(self.checkpoint_dir), "version": version, "resume": resume})
        else:
            try:
                done = barrier.wait()
            except (BarrierFailed, BarrierTimeout) as exc:
                raise LaunchFailed(ExitCode.RESTORE, f"restore on local rank 0 failed: {exc}") from None
            self.checkpoint_dir = Path(done["checkpoint_dir"])
            version, resume = done.get("version"), done.get("resume")
        self.report.restored_version = version or (Path(resume).name if resume else None)
        self.child_env[contract.CHECKPOINT_DIR] = str(self.checkpoint_dir)
        if version:
            self.child_env[contract.RESUME_DIR] = str(self.checkpoint_dir)
        self._resume_from(resume)
        self.report.phases["restore"] = time.monotonic() - started

    def _resume_from(self, resume: str | None) -> None:
        if resume:
            self.child_env[contract.RESUME_VERSION] = resume
        else:
            self.child_env.pop(contract.RESUME_VERSION, None)

    def _restore_as_leader(self) -> tuple[str | None, str | None]:
        from amlhpc.jobs.runtime.checkpoint import CheckpointError
        from amlhpc.jobs.runtime.checkpoint.node import NodeCheckpoints

        settings = self.checkpoint
        assert settings is not None, "restore() calls this only with checkpoint settings"
        self.checkpoint_dir = self.options.checkpoint_dir or (
            _checkpoint_base(self.environ, self.staged_scratch) / "amlhpc-checkpoints" / _safe(self.ranks.run_id))
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        warning = settings.ingress_warning(self.ranks.node_count)
        if warning:
            log.warning("%s", warning)
        try:
            self.node_checkpoints = NodeCheckpoints(settings, node=self.ranks.node_index, nodes=self.ranks.node_count,
                                                    local_size=self.ranks.local_size, world=self.ranks.world_size,
                                                    checkpoint_dir=self.checkpoint_dir, environ=self.environ,
                                                    channel=self.channel)
        except (ValueError, CheckpointError) as exc:  # blobio.BlobConfigError (never holds a secret), a bad setting
            raise LaunchFailed(ExitCode.USAGE, f"checkpoint storage: {exc}") from None
        self.store = self.node_checkpoints.store
        try:
            manifest, resume = self.node_checkpoints.restore_at_start()
        except CheckpointError as exc:
            raise LaunchFailed(ExitCode.RESTORE, f"restore failed: {exc}") from None
        except StoreLost as exc:
            raise LaunchFailed(ExitCode.NODE_LOST, f"restore: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - storage errors: say which and stop
            hint = ""
            if type(exc).__name__ == "ClientAuthenticationError" or getattr(exc, "status_code", None) == 403:
                hint = ("; the node's identity (AZURE_CLIENT_ID) needs 'Storage Blob Data Contributor' on the "
                        "account (role assignments take minutes to propagate)")
            raise LaunchFailed(ExitCode.RESTORE, f"restore failed: {type(exc).__name__}: {exc}{hint}") from None
        if manifest is None and resume is None:
            log.info("no checkpoint under %s/%s: starting fresh", settings.container, settings.prefix)
        if manifest is not None:
            log.info("resuming from checkpoint %s (%d files, %d bytes) in %s", manifest.version, len(manifest.files),
                     manifest.bytes, self.checkpoint_dir)
        return (manifest.version if manifest else None), (str(resume) if resume else None)

    @property
    def restarts_allowed(self) -> int:
        """In-job restarts this job may make (0: a failed training ends the job, as it always did)."""
        return self.checkpoint.local_restarts if self.checkpoint is not None and self.checkpoint_dir else 0

    # 7. training
    def command_env(self) -> dict[str, str]:
        env = {k: v for k, v in self.environ.items() if k not in SECRET_VARIABLES + (contract.COORD_LISTEN_FD,)}
        env.update(self.child_env)
        if self.checkpoint is not None:  # Azurite: a read-only SAS for a reshard load's ranges, never the key
            from amlhpc.jobs.runtime.blob.blobhttp import read_sas

            sas = read_sas(self.environ, self.checkpoint.container)
            if sas:
                env[contract.BLOB_READ_SAS] = sas
        return env

    def train(self) -> int:
        from amlhpc.jobs.runtime.node import telemetry

        started = time.monotonic()
        if self.node_checkpoints is not None:
            self.node_checkpoints.start_uploads()
        if self.ranks.is_node_leader and self.restarts_allowed > 0:
            from amlhpc.jobs.runtime.health import quick

            try:
                self._baseline = quick.baseline(self.options.sysfs)
            except Exception as exc:  # noqa: BLE001 - the training goes on; restarts go unchecked
                log.warning("no baseline for the pre-restart health check (%s: %s)", type(exc).__name__, exc)
        sampler = telemetry.start_for(self)  # local rank 0: node telemetry while the training runs, restarts included
        try:
            status = self._generations()
        finally:
            if sampler is not None:
                self.report.telemetry = sampler.stop()
        self.report.phases["training"] = time.monotonic() - started
        self._standbys.close()
        self._mark_exited(status)
        if self.ranks.is_node_leader and self.node_checkpoints is not None:
            from amlhpc.jobs.runtime.launch.watchdog import record_end

            # The evidence first: a final upload that waits for a lost node's parts may be cut
            # short by the job's end, and a node without an end record reads as a vanished host.
            record_end(self, status, final_upload="pending")
            faultpoints.reach("launch.final-upload")
            status = self._final_upload(status)
        if self._forwarder is not None:
            self._forwarder.restore()
        return status

    def _generations(self) -> int:
        """The training command, run again after each in-job restart; the last run's status."""
        from amlhpc.jobs.runtime.checkpoint import tier

        generation = 0
        while True:
            self._generation = generation
            self.child_env[contract.RESTART_GENERATION] = str(generation)
            self.child_env[contract.CHECKPOINT_TAG] = tier.timeline_tag(self.ranks.run_id, generation)
            status, decision = self._run_generation(generation)
            if decision is None or decision.result != "restart":
                break
            if self._forwarder is not None:  # set by every run
                self._forwarder.restore()
            self.report.restarts.append({"generation": generation + 1, "cause": (decision.failure or {}).get("cause"),
                                         "failed_node": (decision.failure or {}).get("node"),
                                         "source": decision.source, "version": decision.version,
                                         "step": decision.step, "blob_version": decision.blob_version,
                                         "started": time.time()})
            log.warning("in-job restart %d: %s; resuming from %s", generation + 1, decision.reason,
                        f"{decision.version} ({decision.source})" if decision.version else "the start")
            self._resume_from(decision.resume)
            if self.node_checkpoints is not None:
                self.node_checkpoints.start_uploads(protect={decision.version} if decision.version else None)
            generation += 1
        return status

    def _run_generation(self, generation: int):
        """One run of the training command; returns (status, the node's decision or None)."""
        from amlhpc.jobs.runtime.launch import reap

        run = self._start_generation(generation)
        unreaped: reap.Unreaped | None = None
        try:
            returncode = reap.wait(run.child, run.kills, self.options.kill_wait_s)
        except reap.Unreaped as exc:
            unreaped, returncode = exc, -signal.SIGKILL
        finally:
            run.forwarder.finish()  # signals stay caught until the next run or the end of the final upload
            run.guard.stop()
            if run.stopper is not None:
                run.stopper.stop()
        if unreaped is not None:
            return self._lost(unreaped, run.records if run.coordinated else None, run.outcome_barrier)
        status = self.report.command_status = exit_status(returncode)
        log.info("training command exited with %d after %.1fs", status, time.monotonic() - run.started)
        status = self._judge_exit(returncode, status)
        if generation == 0:
            self._first_run_s = run.guard.watch.to_first_step_s
        cause, message = self._cause(run, status)
        return self._settle(run, status, cause, message)

    def _start_generation(self, generation: int) -> _Running:
        """The training command started for `generation`, with its signal forwarder, watchdog and
        (coordinated) restart stopper attached."""
        from amlhpc.jobs.runtime.launch import restart, watchdog

        progress_dir = self._dir("progress" if generation == 0 else f"progress-g{generation}")
        self.child_env[contract.PROGRESS_FILE] = str(watchdog.progress_path(progress_dir, self.ranks.local_rank))
        records = restart.NodeRecords(self._dir("restart"), generation)
        # With restarts, or across nodes with a store: a failure (or node 0 lost) stops every node at once.
        coordinated = self.restarts_allowed > 0 or (self.ranks.node_count > 1 and self._nodes_share_a_store())
        outcome_barrier = self._coordinator(generation, records) if coordinated else None
        started = time.monotonic()
        log.info("starting%s: %s", f" (in-job restart {generation})" if generation else "", " ".join(self.options.command))
        ready_file = self._dir("standby") / f"rank-{self.ranks.local_rank}-g{generation + 1}.ready"
        self.child_env[STANDBY_READY] = str(ready_file)
        child = self._spawn()
        kills = Kills()
        if coordinated and generation < self.restarts_allowed:
            self._standbys.prepare_after_first_step(child, Path(self.child_env[contract.PROGRESS_FILE]), self.command_env(),
                                                    ready_file)
        forwarder = self._forwarder = SignalForwarder(child, self.options.term_grace_s, self.report, kills)
        forwarder.install()
        guard = self.guard = watchdog.attach(self, child.pid, progress_dir, generation=generation,
                                             first_run_s=self._first_run_s, kills=kills)
        stopper = _RestartStopper(records, child.pid, kills) if coordinated else None
        return _Running(generation, records, coordinated, outcome_barrier, started, child, kills, forwarder, guard,
                        stopper)

    @staticmethod
    def _cause(run: _Running, status: int) -> tuple[str, str]:
        """Why the command ended (watchdog, signal, restart stop, or its own exit) and the message."""
        from amlhpc.jobs.runtime.launch import watchdog

        fired = run.guard.fired
        if fired and fired.get("kind") == watchdog.FIRST_STEP:
            return watchdog.FIRST_STEP, f"no first step: {fired.get('message')}"
        if fired:
            return "hang", f"hang: {fired.get('message')}"
        if run.forwarder.stopped:
            return "stopped", f"stopped by {run.forwarder.stopped}"
        if run.stopper is not None and run.stopper.killed:
            return "restart", "stopped for an in-job restart"
        return "exit", f"exit {status}"

    def _settle(self, run: _Running, status: int, cause: str, message: str):
        """The node's status after the command ended: its own (uncoordinated), or the one the
        nodes' outcome decides; returns (status, the decision or None)."""
        from amlhpc.jobs.runtime.launch import restart

        if not run.coordinated:
            if cause in restart.HANG_CAUSES:
                status, self.report.error = ExitCode.HANG, message
            return status, None
        fired = run.guard.fired or {}
        run.records.record_exit(self.ranks.local_rank, status, cause, message,
                                peer_silent=bool(cause == "hang" and fired.get("peer_silent")),
                                culprit=fired.get("culprit") if cause in restart.HANG_CAUSES else None)
        decision = self._outcome(run.outcome_barrier)
        if decision.result == "restart":
            return status, decision
        if decision.exit_code is not None:
            status = decision.exit_code
        elif cause in restart.HANG_CAUSES or (cause == "restart" and (decision.failure or {}).get("cause") in restart.HANG_CAUSES):
            status = ExitCode.HANG
        elif cause == "restart":
            status = int((decision.failure or {}).get("status") or status)
        if decision.result == "end":
            self.report.error = f"{decision.reason}" + (f" (after {message})" if cause != "exit" else "")
            self.report.unhealthy = decision.unhealthy
            log.error("the job ends: %s", decision.reason)
        return status, decision

    def _lost(self, unreaped, records, outcome_barrier):
        """The command outlived its SIGKILL by --kill-wait: the node is lost (reap.py). With in-job
        restarts its exit record says so, and its node's coordinator ends the job instead of
        restarting on a GPU the process still holds."""
        from amlhpc.jobs.runtime.launch import restart

        log.error("%s", unreaped)
        self.report.error = str(unreaped)
        self.report.lost = {"node": self.ranks.node_index, "pid": unreaped.pid, "waited_s": round(unreaped.waited_s, 1),
                            "after": unreaped.why}
        status = ExitCode.NODE_LOST
        if records is None:
            return status, None
        records.record_exit(self.ranks.local_rank, status, restart.UNREAPED, str(unreaped))
        decision = self._outcome(outcome_barrier)
        if decision.result == "restart":  # another local rank's coordinator cannot have seen this: never
            decision = restart.Decision("end", str(unreaped), exit_code=ExitCode.NODE_LOST)
        return status, decision

    def _nodes_share_a_store(self) -> bool:
        """Whether the nodes coordinate through a store (every local rank must answer alike:
        only local rank 0 holds it, the others know from the job's variables)."""
        return self.coord_endpoint is not None

    def _standby_wanted(self) -> bool:
        mode = self.environ.get(contract.STANDBY, "").strip() or "auto"
        if mode not in STANDBY_MODES:
            log.warning("%s=%r is not one of %s: auto", contract.STANDBY, mode, ", ".join(STANDBY_MODES))
            mode = "auto"
        return mode == "on" or (mode == "auto" and worth_keeping(os.cpu_count(), self.ranks.local_size))

    def _spawn(self) -> subprocess.Popen:
        """The training command: the warm standby made it (after an in-job restart), or a cold start."""
        self._standbys.note = None
        child = self._standbys.take(self.command_env())
        if self._standbys.note and self.report.restarts:
            self.report.restarts[-1]["standby"] = self._standbys.note
        if child is not None:
            log.info("the warm standby (pid %d) runs the command: its interpreter and torch are loaded", child.pid)
            return child
        try:
            return subprocess.Popen(self.options.command, env=self.command_env(), start_new_session=True,
                                    preexec_fn=_die_with_parent)
        except FileNotFoundError:
            raise LaunchFailed(ExitCode.NOT_FOUND, f"command not found: {self.options.command[0]}") from None
        except PermissionError:
            raise LaunchFailed(ExitCode.NOT_EXECUTABLE, f"command not executable: {self.options.command[0]}") from None

    def _coordinator(self, generation: int, records):
        """Local rank 0: the node's side of the generation, in a thread, its decision behind a node barrier."""
        from amlhpc.jobs.runtime.coord.nodebarrier import NodeBarrier
        from amlhpc.jobs.runtime.launch import restart

        barrier = NodeBarrier(records.outcome_dir, RESTORE_WAIT_S, self.ranks.run_id, generation=self.launch)
        if not self.ranks.is_node_leader:
            return barrier
        shared = restart.JobAgreement(self.channel, generation) if self.channel is not None else None
        hooks = restart.Hooks(report=self._restart_report, apply=self._apply_restart, check=self._restart_check)
        coordinator = restart.Coordinator(generation=generation, node=self.ranks.node_index,
                                          nodes=self.ranks.node_count, local_size=self.ranks.local_size,
                                          records=records, shared=shared, limit=self.restarts_allowed,
                                          agree_s=self.checkpoint.agree_s if self.checkpoint else 300.0, hooks=hooks)
        barrier.lead()

        def run() -> None:
            try:
                decision = coordinator.run()
                barrier.succeed({**decision.to_json(), "failure": coordinator.failure})
            except BaseException as exc:  # noqa: BLE001 - the node's ranks must hear of it, then end
                log.exception("the restart coordinator failed")
                barrier.fail(f"the restart coordinator failed: {type(exc).__name__}: {exc}")

        thread = threading.Thread(target=run, name="restart-coordinator", daemon=True)
        thread.start()
        return barrier

    def _outcome(self, barrier):
        from amlhpc.jobs.runtime.coord.nodebarrier import BarrierFailed, BarrierTimeout
        from amlhpc.jobs.runtime.launch import restart

        try:
            result = barrier.wait()
        except (BarrierFailed, BarrierTimeout) as exc:
            return restart.Decision("end", f"no restart decision on this node: {exc}")
        return restart.Decision.from_json(result)

    def _restart_check(self) -> dict | None:
        """The node's quick health check before it takes part in an in-job restart: what changed
        since its training started (amlhpc.jobs.runtime.health.quick); None when healthy."""
        from amlhpc.jobs.runtime.health import quick

        if self._baseline is None:
            return None
        try:
            failed = quick.before_restart(self._baseline, self.options.sysfs, node=self.ranks.node_index)
        except Exception as exc:  # noqa: BLE001 - a fault of the check itself is no fault of the node
            log.warning("the pre-restart health check could not run (%s: %s): restarting without it",
                        type(exc).__name__, exc)
            return None
        if not failed:
            return None
        return {"host": self.report.host, "azure_node_id": self.environ.get("AZ_BATCH_NODE_ID"),
                "check": failed[0].check, "message": "; ".join(r.line() for r in failed)}

    def _restart_report(self) -> dict:
        report = self.node_checkpoints.restart_report() if self.node_checkpoints is not None else {"versions": []}
        return {**report, "host": self.report.host}

    def _apply_restart(self, decision):
        if self.node_checkpoints is None:
            from amlhpc.jobs.runtime.checkpoint import tier

            assert self.checkpoint_dir is not None, "restarts are allowed only with a checkpoint folder"
            tier.discard_after(self.checkpoint_dir, decision.step if decision.source == "local" else None)
            return decision
        return self.node_checkpoints.apply(decision)

    def _judge_exit(self, returncode: int, status: int) -> int:
        """A command that crashed after it reported a completed training did its work: 0."""
        from amlhpc.jobs.runtime.launch import completion

        reading = progress.read(Path(self.child_env[contract.PROGRESS_FILE]))
        if reading is not None and reading.completed_step is not None:
            self.report.completed = {"step": reading.completed_step, "checkpoint": reading.completed_checkpoint}
        if status == 0:
            return 0
        stopped = any(name in self.report.signals for name in (s.name for s in STOPPING_SIGNALS))
        after = completion.after_completion(returncode, reading, stopped=stopped, hung=bool(self.guard is not None and self.guard.fired))
        if after is None:
            return status
        self.report.exit_after_completion = after.to_json()
        log.warning("%s", after.message())
        return 0

    # 8. final upload
    def _mark_exited(self, status: int) -> None:
        if self.checkpoint is None:
            return
        from amlhpc.jobs.runtime.coord.nodebarrier import write_json_atomic

        write_json_atomic(self._dir("exited") / f"rank-{self.ranks.local_rank}.json",
                          {"pid": os.getpid(), "status": status, "written": time.time()})

    def _wait_for_local_ranks(self) -> None:
        """Every local rank's command must be done writing its part before the last upload."""
        if self.ranks.local_size == 1:
            return
        folder = self._dir("exited")
        deadline = clock.monotonic() + self.options.final_wait_s
        while clock.monotonic() < deadline:
            missing = [r for r in range(self.ranks.local_size) if not (folder / f"rank-{r}.json").exists()]
            if not missing:
                return
            clock.sleep(0.2)
        log.warning("local rank(s) %s still running after %.0fs: uploading what is there", missing, self.options.final_wait_s)

    def _last_run_failed(self) -> bool:
        """Node 0's question at the final upload: did the last training run fail on any node (so a
        node may have stopped its uploads for an in-job restart that did not come)?"""
        from amlhpc.jobs.runtime.launch import restart

        return self.channel is not None and restart.generation_failed(self.channel, self._generation)

    def _final_upload(self, status: int) -> int:
        started = time.monotonic()
        self._wait_for_local_ranks()
        assert self.node_checkpoints is not None, "run() uploads only with node checkpoints"
        try:
            errors = self.node_checkpoints.finish(self.options.final_wait_s, generation_failed=self._last_run_failed)
        finally:
            self.report.uploaded_versions = list(self.node_checkpoints.uploaded)
            self.report.phases["final_upload"] = time.monotonic() - started
        if errors:
            self.report.error = "; ".join(errors)
            if status == 0:
                log.error("%s", self.report.error)
                return ExitCode.FINAL_UPLOAD
            log.error("%s (the command had already failed with %d)", self.report.error, status)
        return status

    def write_report(self) -> None:
        if not self.ranks.is_node_leader:
            return
        from amlhpc.jobs.runtime.coord.nodebarrier import write_json_atomic

        try:
            write_json_atomic(self.options.report_dir / f"launch-node{self.ranks.node_index:03d}.json",
                              self.report.__dict__)
        except OSError as exc:
            log.warning("could not write the launch report: %s", exc)

    def run(self) -> int:
        """All phases; returns the exit status."""
        from contextlib import ExitStack

        from amlhpc.jobs.runtime.node import clocks

        with ExitStack() as stack:
            try:
                self.open_coordination()
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
        from amlhpc.jobs.runtime.launch.watchdog import record_end

        record_end(self, code)
        self.close_coordination(failing=code != ExitCode.OK)
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
        return ExitCode.USAGE
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
