"""The hang watchdog: stop a job whose training no longer makes progress.

Settings: AMLHPC_WATCHDOG_JSON (docs/contracts.md section 4), set by the job builder from
the recipe's `watchdog` block:

    {"hang_s": 1200,       # no progress for this long is a hang
     "startup_s": null,    # optional: limit from the command's start to its first report
                           #   (default: first_step_deadline below)
     "check_s": null}      # optional: how often to look (default hang_s / 6, 1..60 s)

How it decides, on every node (the launcher's local rank 0 looks, every local rank acts):

- each training process reports its step (amlhpc.jobs.runtime.base.progress); a rank's progress is a
  change in its report;
- the node hangs when no rank on it progressed for `hang_s`, or when one rank stopped for
  `hang_s` while the node's other ranks go on. Every run of the command (the first and each
  in-job restart) has a deadline to its first report (`first_step_deadline`): `startup_s`
  when the recipe sets it; else, for an in-job restart, 3x the first run's time to its first
  step on this node, at least `hang_s` and 30 s; for the first run, 3x `hang_s`, at least
  5 minutes. Missing it is a hang of its own kind (`"kind": "first-step"`): a restart stuck at
  rendezvous, in a standby that never ran the command, or in a GPU that fell off the bus;
- across nodes, with checkpoints configured, every node's rank 0 writes a heartbeat to
  Blob (amlhpc.jobs.runtime.coord.nodestatus) and reads the others': a node whose heartbeat says it made
  no progress for `hang_s`, or that stopped writing heartbeats for `hang_s` (its launcher is
  frozen or gone, so it cannot stop itself), is named and the job is stopped from the
  nodes that still run. Ages are compared in the storage service's time, never across
  node clocks. A peer silent in Blob whose launcher still beats on the job's store is late
  (Blob throttled), not frozen (amlhpc.jobs.runtime.launch.liveness).

Blob is the shared signal rather than the rendezvous (MASTER_ADDR): it needs no port
beyond the job's own, keeps working when the training's collectives are the thing that
hung, and leaves a record the supervision reads after the job is gone.

On a verdict, rank 0 writes it into the node's local folder; every local rank's launcher
sends its command SIGCONT (a stopped process must see the signal), SIGTERM, and SIGKILL
after `--term-grace`, and exits with amlhpc.jobs.runtime.base.exit_codes.ExitCode.HANG. The node's end record
names the node the hang started on: when every node stopped, the node whose ranks are not
waiting for their peers (they stopped in their own work: amlhpc.jobs.runtime.base.progress.compute_done)
while the others wait for it; without that signal, the node that stopped first.

Heartbeats also carry the node's time per step in its own work (`busy`: the slowest of its
ranks, median of their latest STEP_WINDOW steps, as each rank's training measured them:
amlhpc.jobs.runtime.base.progress), from which the managed run's controller
names a node persistently slower than its peers (amlhpc.jobs.managed.stragglers). With a managed
run's key (AMLHPC_EVIDENCE_KEY) heartbeats and the end record are signed, and heartbeats
that do not verify are not taken for a peer's.

Standard library plus azure-storage-blob (through amlhpc.jobs.runtime.coord.nodestatus): ships in the image.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import statistics
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from amlhpc.jobs.runtime.base import clock as clock_seam
from amlhpc.jobs.runtime.base import progress
from amlhpc.jobs.runtime.base.contract import EVIDENCE_KEY, WATCHDOG_JSON
from amlhpc.jobs.runtime.base.errors import RuntimeInputError, RuntimeProblem, load_json_object
from amlhpc.jobs.runtime.coord import nodestatus, pacing
from amlhpc.jobs.runtime.coord.nodebarrier import write_json_atomic
from amlhpc.jobs.runtime.launch.liveness import StoreLiveness

log = logging.getLogger("amlhpc.watchdog")

VERDICT_FILE = "verdict.json"
POLL_VERDICT_S = 0.5
BLOB_LOOKS = 6
"""This node's latest looks whose Blob time says how late a live peer's heartbeat may be (Guard.blob_lag_s)."""
STEP_WINDOW = progress.OWN_WORK_WINDOW
"""Latest steps per rank whose own-work time make the node's step time (a median: one slow step is not a straggler)."""
_FIX = "the job builder sets it from the recipe's `watchdog` block; resubmit, or correct the JSON by hand"
FIRST_STEP_FACTOR = 3.0
"""A run's deadline to its first step, in multiples of what it is derived from (the first run's
time to its first step; the first run's own: hang_s): a restart also restores a checkpoint and
may start cold, and a loaded node is slower than the first start showed."""
FIRST_RUN_FLOOR_S = 300.0
"""The first run's deadline at least: a large model's first step (load, compile, warm-up) takes minutes."""
RESTART_FLOOR_S = 30.0
"""A restart's deadline at least: a first run that reached its first step in seconds says little
about a cold restart's interpreter, imports and rendezvous on a busy node."""
FIRST_STEP = "first-step"
"""The verdict's `kind` when a run missed its deadline to its first step (else "hang")."""


@dataclass(frozen=True)
class WatchdogSettings:
    hang_s: float
    startup_s: float | None = None
    check_s: float | None = None

    @property
    def interval_s(self) -> float:
        return self.check_s or min(60.0, max(1.0, self.hang_s / 6))


@dataclass(frozen=True)
class FirstStepDeadline:
    """How long a run of the command may take to its first progress report, and why that long."""

    seconds: float
    reason: str


def first_step_deadline(settings: WatchdogSettings, generation: int, first_run_s: float | None) -> FirstStepDeadline:
    """The deadline of run `generation` (0: the first; n: in-job restart n) to its first step;
    `first_run_s`: the first run's time to its first step on this node (None: it never got there)."""
    if settings.startup_s is not None:
        return FirstStepDeadline(settings.startup_s, "watchdog.startup_s")
    if generation == 0 or first_run_s is None:
        seconds = max(FIRST_RUN_FLOOR_S, FIRST_STEP_FACTOR * settings.hang_s)
        return FirstStepDeadline(seconds, f"{FIRST_STEP_FACTOR:g}x watchdog.hang_s, at least {FIRST_RUN_FLOOR_S:.0f}s; "
                                          "set watchdog.startup_s to choose")
    seconds = max(settings.hang_s, RESTART_FLOOR_S, FIRST_STEP_FACTOR * first_run_s)
    return FirstStepDeadline(seconds, f"{FIRST_STEP_FACTOR:g}x the first run's {first_run_s:.0f}s to its first step, at "
                                      f"least watchdog.hang_s and {RESTART_FLOOR_S:.0f}s; set watchdog.startup_s to choose")


def parse_settings(text: str, reference: str = WATCHDOG_JSON) -> WatchdogSettings:
    data = load_json_object(text, reference, _FIX)
    problems: list[RuntimeProblem] = []
    values: dict[str, float | None] = {}
    for key, required in (("hang_s", True), ("startup_s", False), ("check_s", False)):
        value = data.get(key)
        if value is None and not required:
            values[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            problems.append(RuntimeProblem(reference, key, f"must be a positive number of seconds, got {value!r}", _FIX))
            continue
        values[key] = float(value)
    unknown = sorted(set(data) - {"hang_s", "startup_s", "check_s"})
    if unknown:
        problems.append(RuntimeProblem(reference, unknown[0], "unknown key", "allowed: hang_s, startup_s, check_s"))
    if problems:
        raise RuntimeInputError(problems, title=f"{reference} is not usable")
    return WatchdogSettings(values["hang_s"], values["startup_s"], values["check_s"])  # type: ignore[arg-type]


def settings_from_env(environ: Mapping[str, str] | None = None) -> WatchdogSettings | None:
    """The settings, or None when AMLHPC_WATCHDOG_JSON is unset (no watchdog)."""
    environ = os.environ if environ is None else environ
    text = environ.get(WATCHDOG_JSON, "").strip()
    return parse_settings(text) if text else None


def progress_path(folder: Path, local_rank: int) -> Path:
    """The progress file of one local rank inside the node's progress folder."""
    return folder / f"rank-{local_rank}.json"


# --- the node's view (pure: clock passed in) ---------------------------------------------


@dataclass
class NodeWatch:
    """What rank 0 knows about its node's ranks; `verdict` says whether the node hangs."""

    settings: WatchdogSettings | None
    """None: progress is recorded (for the end record) but never judged."""
    node: int
    local_size: int
    started: float
    """Monotonic time the training command started."""
    deadline: FirstStepDeadline | None = None
    """The run's deadline to its first report (None: not judged before one)."""
    generation: int = 0
    changed: dict[int, float] = field(default_factory=dict)
    """Local rank -> monotonic time of its last progress."""
    steps: dict[int, int] = field(default_factory=dict)
    markers: dict[int, tuple[int, int]] = field(default_factory=dict)
    first_step: int | None = None
    waiting: dict[int, bool] = field(default_factory=dict)
    """Local rank -> whether it waits for its peers (ranks that report it)."""
    busy: dict[int, deque] = field(default_factory=dict)
    """Local rank -> (step, own-work seconds) of the steps its reports showed this watch (for a
    training whose reports carry no median of their own)."""
    medians: dict[int, float | None] = field(default_factory=dict)
    """Local rank -> the median own-work time of its latest STEP_WINDOW steps, as it reported
    (None: it has not measured that many yet)."""
    first_report_at: float | None = None
    """Monotonic time of the node's first progress report."""

    def observe(self, local_rank: int, report: progress.Progress | None, now: float) -> None:
        if report is None or self.markers.get(local_rank) == report.marker:
            return
        self.markers[local_rank] = report.marker
        if not self.changed:
            self.first_report_at = now
        self.changed[local_rank] = now
        self.steps[local_rank] = report.step
        if self.first_step is None:
            self.first_step = report.first_step if report.first_step is not None else report.step
        if report.waiting is not None or report.busy_s is not None:
            self.waiting[local_rank] = report.waiting is not None
        if report.busy_s is not None:  # the own-work time of the step it waits on, or of the one it just finished
            step = report.busy_step if report.busy_step is not None else \
                report.waiting if report.waiting is not None else report.step
            window = self.busy.setdefault(local_rank, deque(maxlen=STEP_WINDOW))
            if not window or window[-1][0] != step:
                window.append((step, report.busy_s))
        if report.busy_steps is not None:  # None until the window is full (a restart's new process too)
            self.medians[local_rank] = report.busy_median_s

    @property
    def to_first_step_s(self) -> float | None:
        """Seconds from the command's start to the node's first progress report."""
        return None if self.first_report_at is None else self.first_report_at - self.started

    @property
    def before_first_step(self) -> bool:
        return not self.changed

    @property
    def step(self) -> int | None:
        return max(self.steps.values()) if self.steps else None

    @property
    def busy_s(self) -> float | None:
        """The node's own-work time per step: its slowest rank's median over its latest
        STEP_WINDOW steps, as the rank measured them (every step). None until every rank that
        measures has a full window: a warm-up's first steps are no evidence. A training that
        reports no median (a runtime before it did): the median of the steps seen here."""
        if self.medians:
            known = [m for m in self.medians.values() if m is not None]
            return max(known) if known and len(known) == len(self.medians) else None
        medians = [statistics.median(b for _, b in window) for window in self.busy.values() if window]
        return max(medians) if medians else None

    @property
    def all_waiting(self) -> bool | None:
        """Whether every rank of the node waits for its peers; None when the training does not say."""
        if not self.waiting:
            return None
        return len(self.waiting) == len(self.changed) and all(self.waiting.values())

    def age(self, now: float) -> float | None:
        """Seconds since any rank of the node progressed; None before the first report."""
        return now - max(self.changed.values()) if self.changed else None

    def verdict(self, now: float) -> str | None:
        if self.settings is None:
            return None
        limit = self.settings.hang_s
        if not self.changed:
            deadline = self.deadline or first_step_deadline(self.settings, self.generation, None)
            if now - self.started > deadline.seconds:
                run = f"in-job restart {self.generation}" if self.generation else "the training"
                return (f"no rank on node {self.node} reported a first step within {deadline.seconds:.0f}s of the start "
                        f"of {run} ({deadline.reason})")
            return None
        age = self.age(now)
        assert age is not None
        if age > limit:
            return (f"no rank on node {self.node} progressed for {age:.0f}s (last step {self.step}; "
                    f"watchdog.hang_s {limit:.0f}s)")
        for rank, when in sorted(self.changed.items()):
            if now - when > limit:
                return (f"local rank {rank} on node {self.node} stopped at step {self.steps[rank]} {now - when:.0f}s ago "
                        f"while the node's other ranks go on (watchdog.hang_s {limit:.0f}s)")
        return None


class Stall(NamedTuple):
    """A peer judged stalled (stalled_peer)."""

    node: int
    message: str
    silent: bool
    """It wrote no heartbeat (its launcher frozen or gone), rather than heartbeats without progress."""


def silence_s(beat: nodestatus.Heartbeat, service_now, since=None) -> float:
    """Seconds since a peer's heartbeat was written (service time), counted from `since` at the earliest."""
    return (service_now - (max(beat.written, since) if since else beat.written)).total_seconds()


def stalled_peer(me: int, beats: Mapping[int, nodestatus.Heartbeat], service_now, hang_s: float,
                 since=None, blob_lag_s: float = 0.0, alive: Callable[[int], bool] | None = None) -> Stall | None:
    """The first other node that made no progress, or went silent, for `hang_s` (service time).
    `since`: when this node's watch began (its first heartbeat); a peer is judged from then at
    the earliest, so the time every node spent restarting the training is nobody's hang.
    `blob_lag_s`: how late a live peer's heartbeat may land when Blob is slow (Guard.blob_lag_s):
    silence counts from past it. `alive(node)`: whether the peer's launcher still beats on the
    job's store (liveness.py): a silent peer that does is late in Blob, not frozen."""
    for node, beat in sorted(beats.items()):
        if node == me or beat.state == "ended":
            continue
        silent = silence_s(beat, service_now, since)
        if silent > hang_s + blob_lag_s:
            if alive is not None and alive(node):
                log.info("watchdog: node %d's heartbeat is %.0fs old in Blob but its launcher beats on the job's "
                         "store: late, not frozen", node, silent)
                continue
            return Stall(node, f"node {node} ({beat.host or 'unknown host'}) wrote no heartbeat for {silent:.0f}s: "
                               "its launcher is frozen or gone", True)
        age = beat.age_at(service_now) if not since or beat.written >= since else None
        if age is not None and age > hang_s:
            if (service_now - beat.written).total_seconds() > (beat.age_s or 0.0):
                # Most of that is the heartbeat's own silence (a live launcher writes one every
                # look): its launcher froze or went. Judged as silence once that passes hang_s,
                # at most age_s later: a silent peer can take part in no in-job restart.
                continue
            return Stall(node, f"node {node} ({beat.host or 'unknown host'}) made no progress for {age:.0f}s "
                               f"(step {beat.step})", False)
    return None


def _peers_stopped_with_us(all_waiting: bool | None, going_ages: list[float], settings: WatchdogSettings) -> bool:
    """Whether to judge at the next look instead of blaming this node now.

    This node's ranks wait for their peers, and every peer that seems to go on has made no
    progress for nearly as long (within two looks of the limit): they stopped on the same
    collective, and only the order of the reports put the peer under the limit. At the next
    look its age is past the limit too, and the hang is judged on every node's evidence
    (never this node first, by a race)."""
    return bool(going_ages) and bool(all_waiting) and all(
        age > settings.hang_s - 2 * settings.interval_s for age in going_ages)


def _stopping_with_peer(own_age: float | None, peer_silent: bool, settings: WatchdogSettings) -> bool:
    """Whether to judge at the next look instead of naming a peer that made no progress.

    This node made no progress for nearly as long (within two looks of the limit): both
    stopped at about the same moment, and the peer's age, measured from the service's
    one-second write times, came out past the limit first. Its own verdict follows within
    two looks, and then every node's evidence decides (the node not waiting for its peers
    is where the hang started), never which node looked first. A silent peer is named at
    once: its launcher is frozen or gone."""
    return not peer_silent and own_age is not None and own_age > settings.hang_s - 2 * settings.interval_s


def _stopped_in_own_work(me: int, mine_waiting: bool | None, beats: Mapping[int, nodestatus.Heartbeat]) -> tuple[int, str] | None:
    """When every node stopped: the node whose ranks are not waiting for their peers while
    the others wait for it (where a synchronous job's hang started), or None when the
    training does not say or it is not clear."""
    states = {n: b.waiting for n, b in beats.items() if n != me and b.state != "ended"}
    states[me] = mine_waiting
    if any(v is None for v in states.values()) or len(states) < 2:
        return None
    working = sorted(n for n, waiting in states.items() if not waiting)
    if len(working) != 1:
        return None
    waiting = sorted(n for n in states if n != working[0])
    return working[0], (f"node {working[0]} stopped in its own work while node(s) {', '.join(map(str, waiting))} "
                        "wait for it")


# --- threads in the launcher ----------------------------------------------------------


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Guard:
    """Attached to one launcher's training command: rank 0 watches the node (and, through
    Blob, its peers); every rank stops its command when a verdict appears."""

    def __init__(self, *, settings: WatchdogSettings | None, node: int, local_rank: int, local_size: int,
                 folder: Path, child_pid: int, term_grace_s: float, shared: tuple[Any, str, str] | None = None,
                 clock=None, nodes: int = 1):
        self.settings, self.node, self.local_rank, self.local_size = settings, node, local_rank, local_size
        self.folder, self.child_pid, self.term_grace_s, self.shared = folder, child_pid, term_grace_s, shared
        self.clock = clock or clock_seam.monotonic
        self.nodes = nodes
        self.key: str | None = None
        """The managed run's evidence key: heartbeats are signed, and peers' verified."""
        self.verdict_path = folder / VERDICT_FILE
        self.watch = NodeWatch(settings, node, local_size, self.clock())
        self.fired: dict | None = None
        self.first_beat: datetime | None = None
        self._blob_s: deque[float] = deque(maxlen=BLOB_LOOKS)
        """Seconds this node's latest looks spent in Blob (its heartbeat's write and the listing)."""
        self.liveness: StoreLiveness | None = None
        """This node's pulse on the job's store and its peers' (liveness.py), on a job of several nodes."""
        self._look_began: float | None = None
        self._look_ended = self.clock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.host = socket.gethostname()
        self.kills: Any = None
        """The launcher's record of its SIGKILLs (amlhpc.jobs.runtime.launch.reap.Kills), when it keeps one."""

    def start(self) -> Guard:
        if self.settings is None:
            return self
        if self.local_rank == 0:
            self._threads.append(threading.Thread(target=self._watch_loop, name="watchdog", daemon=True))
            if self.liveness is not None and self.shared is not None:
                self._threads.append(threading.Thread(target=self._pulse_loop, name="watchdog-pulse", daemon=True))
        self._threads.append(threading.Thread(target=self._verdict_loop, name="watchdog-verdict", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)

    # rank 0: look
    def _read_local(self) -> None:
        # The folder is this launch's and this training run's alone (the launcher keys it by the
        # launch generation and the restart generation): whatever is in it is this command's
        # progress, and its age is measured on the monotonic clock when the report changes, never
        # from file times against the wall clock (a clock stepped back 5 s hid every report).
        now = self.clock()
        for rank in range(self.local_size):
            self.watch.observe(rank, progress.read(progress_path(self.folder, rank)), now)

    def check(self) -> dict | None:
        """One look: the verdict document, or None while the node and its peers progress."""
        self._look_began = self.clock()
        try:
            return self._look()
        finally:
            self._look_began, self._look_ended = None, self.clock()

    def turning(self) -> bool:
        """Whether the look loop turns: a look under way (held in Blob's retries too), or one
        that ended less than hang_s ago."""
        assert self.settings is not None
        return self._look_began is not None or self.clock() - self._look_ended < self.settings.hang_s

    def pulse(self) -> None:
        """One beat on the job's store while the looks turn, and one reading of each peer whose
        Blob heartbeat is half-silent (liveness.py); the pulse thread's body."""
        assert self.liveness is not None
        if self.turning():
            self.liveness.pulse()

    def _pulse_loop(self) -> None:
        assert self.settings is not None and self.liveness is not None
        while not self._stop.wait(self.settings.interval_s) and not self.liveness.failed:
            self.pulse()

    def _suspect_quiet_peers(self, peers: Mapping[int, nodestatus.Heartbeat], written) -> None:
        """Name the peers whose Blob heartbeat is half-silent to the pulse thread (none on a healthy job)."""
        assert self.settings is not None and self.liveness is not None
        self.liveness.suspect({node for node, beat in peers.items() if node != self.node and beat.state != "ended"
                               and silence_s(beat, written, self.first_beat) > self.settings.hang_s / 2})

    def _look(self) -> dict | None:
        assert self.settings is not None
        self._read_local()
        now = self.clock()
        mine = self.watch.verdict(now)
        kind = FIRST_STEP if self.watch.before_first_step else "hang"
        if self.shared is None:
            return {"culprit": self.node, "message": mine, "kind": kind} if mine else None
        container, prefix, run_id = self.shared
        started = self.clock()
        try:
            written = nodestatus.write_heartbeat(container, prefix, run_id, self.node, step=self.watch.step,
                                                 age_s=self.watch.age(now), first_step=self.watch.first_step,
                                                 host=self.host, busy_s=self.watch.busy_s,
                                                 waiting=self.watch.all_waiting, key=self.key)
            peers = nodestatus.read_heartbeats(container, prefix, run_id, verify=self.key) if written else {}
        except Exception as exc:  # noqa: BLE001 - storage trouble must not stop training: judge locally
            log.warning("watchdog heartbeat failed (judging this node alone): %s: %s", type(exc).__name__, exc)
            return {"culprit": self.node, "message": mine, "kind": kind} if mine else None
        finally:
            self._blob_s.append(self.clock() - started)
        self.first_beat = self.first_beat or written
        if written and self.liveness is not None:
            self._suspect_quiet_peers(peers, written)
        stalled = stalled_peer(self.node, peers, written, self.settings.hang_s, self.first_beat, self.blob_lag_s,
                               self.liveness.alive if self.liveness is not None else None) if written else None
        if mine and kind == FIRST_STEP:
            # Every node judges its own start; peers stuck before theirs too (waiting for this
            # one at rendezvous, or stuck themselves) cannot tell whose start failed.
            going = sorted(n for n, b in peers.items() if n != self.node and b.state != "ended" and b.step is not None
                           and b.written >= (self.first_beat or written)
                           and (b.age_at(written) or 0) <= self.settings.hang_s) if written is not None else []
            went = f", while node(s) {', '.join(map(str, going))} reached theirs" if going else ""
            return {"culprit": self.node, "message": mine + went, "kind": kind}
        if mine:
            others = {n: b.age_at(written) for n, b in peers.items()
                      if n != self.node and b.state != "ended"} if written is not None else {}
            going = sorted(n for n, age in others.items() if (age or 0) <= self.settings.hang_s)
            if _peers_stopped_with_us(self.watch.all_waiting, [others[n] or 0 for n in going], self.settings):
                return None
            if going:
                return {"culprit": self.node, "message": f"{mine}, while node(s) {', '.join(map(str, going))} go on"}
            blamed = _stopped_in_own_work(self.node, self.watch.all_waiting, peers)
            if blamed is not None:
                return {"culprit": blamed[0], "message": f"{mine}; {blamed[1]}"}
            # every node stopped: the one that stopped first is where it started
            first = max(others.items(), key=lambda item: item[1] or 0, default=(None, None))
            if first[0] is not None and (first[1] or 0) > (self.watch.age(now) or 0) + self.settings.interval_s:
                return {"culprit": first[0], "message": f"{mine}; node {first[0]} stopped first ({first[1]:.0f}s ago)"}
            return {"culprit": self.node, "message": mine}
        if stalled is not None:
            if _stopping_with_peer(self.watch.age(now), stalled.silent, self.settings):
                return None
            # A silent peer's launcher is frozen or gone: it can take part in no restart.
            return {"culprit": stalled.node, "message": stalled.message, "peer_silent": stalled.silent}
        return None

    @property
    def blob_lag_s(self) -> float:
        """How late a live peer's heartbeat may land: twice the longest Blob time of this node's
        latest looks. Blob slow for this node (throttled: each write retried after 503s) is slow
        for its peers on the same account, their heartbeats late by as much as their own look
        and this listing by as much again; a peer silent only that long is not taken for frozen
        (a 503 storm made one node's heartbeats 11 s late against a 10 s hang_s, and its healthy
        peer ended the job). It narrows that, not closes it: a peer throttled far more than this
        node is still judged at hang_s plus this. Next to a healthy Blob (tens of milliseconds) it
        changes nothing."""
        return 2 * max(self._blob_s, default=0.0)

    @property
    def look_s(self) -> float:
        """Seconds to the next look: the setting, longer on a job large enough that every node's
        listing of the heartbeats would pass half Azure's per-blob target (pacing.blob_poll_s),
        jittered so the nodes do not look in lock step."""
        assert self.settings is not None
        return pacing.jittered(pacing.blob_poll_s(self.settings.interval_s, self.nodes if self.shared else 1))

    def _watch_loop(self) -> None:
        while not self._stop.wait(self.look_s):
            try:
                verdict = self.check()
            except Exception:  # noqa: BLE001 - a watchdog bug must not take the training down
                log.exception("watchdog check failed")
                continue
            if verdict:
                verdict.setdefault("kind", "hang")
                verdict.update({"node": self.node, "host": self.host, "step": self.watch.step, "written": clock_seam.time()})
                log.error("hang: %s; stopping the training on node %d", verdict["message"], self.node)
                write_json_atomic(self.verdict_path, verdict)
                return

    # every rank: act
    def _verdict_loop(self) -> None:
        while not self._stop.wait(POLL_VERDICT_S):
            verdict = _read_json(self.verdict_path)  # the folder is this run's: any verdict in it is
            if verdict:
                self.fired = verdict
                self._stop_command()
                return

    def _stop_command(self) -> None:
        for signum in (signal.SIGCONT, signal.SIGTERM):
            try:
                os.killpg(self.child_pid, signum)
            except ProcessLookupError:
                return
        deadline = clock_seam.monotonic() + self.term_grace_s
        while clock_seam.monotonic() < deadline and not self._stop.is_set():
            try:
                os.killpg(self.child_pid, 0)
            except ProcessLookupError:
                return
            clock_seam.sleep(0.2)
        if self.kills is not None:
            self.kills.kill_group(self.child_pid, "stopped by the hang watchdog")
            return
        try:
            os.killpg(self.child_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def end_fields(self) -> dict[str, Any]:
        """What the node's end record says about progress and a hang."""
        if self.local_rank == 0:
            self._read_local()
        fields: dict[str, Any] = {"first_step": self.watch.first_step, "last_step": self.watch.step,
                                  "busy_s": self.watch.busy_s}
        if self.fired:
            fields["hang"] = {"culprit": self.fired.get("culprit"), "message": self.fired.get("message"),
                              "kind": self.fired.get("kind", "hang")}
        return fields


# --- the launcher's two calls ----------------------------------------------------------


def attach(launcher, child_pid: int, folder: Path, *, generation: int = 0, first_run_s: float | None = None,
           kills: Any = None) -> Guard:
    """Start the guard for a launcher's training command (`folder`: the node's progress folder;
    `generation`: 0, or the in-job restart it runs; `first_run_s`: the first run's time to its
    first step on this node, from which a restart's deadline to its own is derived)."""
    shared = None
    if launcher.ranks.is_node_leader and launcher.checkpoint is not None and launcher.store is not None:
        shared = (launcher.store.container, launcher.checkpoint.prefix, launcher.ranks.run_id)
    guard = Guard(settings=launcher.watchdog, node=launcher.ranks.node_index, local_rank=launcher.ranks.local_rank,
                  local_size=launcher.ranks.local_size, folder=folder, child_pid=child_pid,
                  term_grace_s=launcher.options.term_grace_s, shared=shared, nodes=launcher.ranks.node_count)
    guard.key = launcher.environ.get(EVIDENCE_KEY) or None
    guard.kills = kills
    if shared is not None and launcher.channel is not None and launcher.watchdog is not None \
            and launcher.ranks.node_count > 1:
        guard.liveness = StoreLiveness(launcher.channel, launcher.ranks.node_index, launcher.watchdog.hang_s / 2,
                                       guard.clock)
    guard.watch.generation = generation
    if launcher.watchdog is not None:
        guard.watch.deadline = first_step_deadline(launcher.watchdog, generation, first_run_s)
    return guard.start()


def record_end(launcher, code: int, *, final_upload: str = "done") -> None:
    """Local rank 0: the node's end record beside the checkpoints, for the supervision.
    `final_upload` "pending": written before the final upload too, so a node stopped during it
    (Azure ML kills the job's other processes once one node's failed) still leaves its
    evidence; the record after the upload overwrites it. Never raises: a storage error here
    must not change the job's exit status."""
    if not launcher.ranks.is_node_leader or launcher.checkpoint is None:
        return
    guard: Guard | None = getattr(launcher, "guard", None)
    report = launcher.report
    record = {"node": launcher.ranks.node_index, "host": report.host, "azure_node_id": launcher.environ.get("AZ_BATCH_NODE_ID"),
              "exit_code": code, "command_status": report.command_status, "error": report.error,
              "signals": list(report.signals), "restored_version": report.restored_version, "health": report.health,
              "restarts": list(getattr(report, "restarts", [])),
              "phases": {k: round(v, 3) for k, v in report.phases.items()}, "written": clock_seam.time(),
              "completed": report.completed, "exit_after_completion": report.exit_after_completion,
              "final_upload": final_upload, "lost": getattr(report, "lost", None),
              "unhealthy": getattr(report, "unhealthy", None), **(guard.end_fields() if guard else {})}
    try:
        container = launcher.store.container if launcher.store is not None else None
        if container is None:
            from amlhpc.jobs.runtime.checkpoint import container_from_settings

            container = container_from_settings(launcher.checkpoint, launcher.environ)
        prefix, run_id, node = launcher.checkpoint.prefix, launcher.ranks.run_id, launcher.ranks.node_index
        key = launcher.environ.get(EVIDENCE_KEY) or None
        nodestatus.write_end(container, prefix, run_id, node, record, key=key)
        nodestatus.write_heartbeat(container, prefix, run_id, node, step=record.get("last_step"), age_s=None,
                                   first_step=record.get("first_step"), host=report.host, state="ended", key=key)
    except Exception as exc:  # noqa: BLE001 - best effort: the exit status is the primary signal
        log.warning("could not write the node's end record: %s: %s", type(exc).__name__, exc)
