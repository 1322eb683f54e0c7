"""The hang watchdog and the heartbeats nodes exchange through Blob.

Each node's launcher watchdog (amlhpc.jobs.runtime.launch.watchdog.Guard) looks every
`check_s` as its watch thread would: it reads its local ranks' progress files, writes the
node's heartbeat and reads every node's (one listing with metadata,
amlhpc.jobs.runtime.coord.nodestatus). The training is played by tasks that rewrite each
rank's progress file every step, as amlhpc.jobs.runtime.base.progress does; the file's
modification time is the node's wall clock, as the kernel stamps it.

- `watchdog-clock`: a few nodes train in step, then the training hangs at a seeded moment;
  one node's wall clock steps (back or forward, seeded) at a seeded moment;
- `heartbeats`: N nodes train; one node freezes (its launcher and training stop, its clock
  runs on) at a seeded moment, and the others' steps wait for it; every other node must
  judge the hang (the metrics say how many named the frozen node). Each watchdog also beats
  on the job's store (amlhpc.jobs.runtime.launch.liveness), as the launcher attaches it: the
  frozen node's pulse stops with it, and it must still be named in time; the metrics say how
  many store calls the busiest node made and the store's peak calls per second.
- `heartbeats-throttled`: N nodes train, none freezes; one node's heartbeat writes meet a 503
  storm (from its nth write, for 1.5-3x `hang_s`) and land late, or not at all, for longer
  than `hang_s`, while its launcher and its pulse on the job's store go on. No node may
  judge a hang (the metrics say how long its heartbeat was silent in the service);
- `hang-culprit`: N nodes train in lock step, each rank saying when its own work on a step
  is done and it waits for its peers (amlhpc.jobs.runtime.base.progress.compute_done); one
  node's training stops in its own work at a seeded step while its launcher runs on (the
  managed rehearsal's `hang` fault), and the others wait for it in the collective. Every
  node's watchdog, looking at a seeded phase, must name the stopped node: the end records
  name where the hang started (amlhpc.jobs.managed.classify), and one wrong name blames a
  waiting node.

Invariants:
- `hang-missed`: a node gave no verdict within hang_s + 3 x check_s of the hang (or of the
  freeze, for the nodes that still run). A training that hangs before its first progress
  report is judged by the watchdog's own rule for that case, at the run's deadline to its
  first step (watchdog.first_step_deadline: 5 minutes by default), not at hang_s: the verdict
  is due within 3 x check_s of that deadline, and the run lasts until then;
- `false-hang`: a verdict came while the training progressed, or named a node that progressed;
- `wrong-culprit` (`hang-culprit`): a verdict named a node other than the one whose training stopped;
- `heartbeat-missing` (`heartbeats` with `looks` set: N nodes look that many times, nothing
  frozen - the run the tests make at 1,000 nodes): a node's heartbeat is not in Blob with its progress.
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.coord import nodestatus, pacing
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.launch import watchdog
from amlhpc.jobs.runtime.launch.liveness import StoreLiveness
from amlhpc.sim.faults import FaultPlan, RequestFault
from amlhpc.sim.scenario import Scenario, Violation
from amlhpc.sim.scheduler import Node
from amlhpc.sim.world import ACCOUNT, World

CONTAINER = "checkpoints"
PREFIX = "exp/run"
RUN_ID = "job-w1"


def write_progress(path: Path, step: int, beats: int, first_step: int, wall: float, *, waiting: int | None = None,
                   busy: tuple[int, float] | None = None) -> None:
    """A progress report as amlhpc.jobs.runtime.base.progress writes it, stamped with the node's wall
    clock; `waiting`: the step whose own work is done (compute_done), `busy`: (step, own-work s)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"step": step, "beats": beats, "first_step": first_step, "resumed_from": None,
                               "waiting": waiting, "busy_s": busy[1] if busy else None,
                               "busy_step": busy[0] if busy else None, "pid": 1}))
    os.replace(tmp, path)
    os.utime(path, (wall, wall))


@dataclass
class Verdicts:
    found: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    """node -> (when, verdict)."""


def _guard(world: World, node: Node, index: int, folder: Path, local_size: int, settings: watchdog.WatchdogSettings,
           shared: bool) -> watchdog.Guard:
    return watchdog.Guard(settings=settings, node=index, local_rank=0, local_size=local_size, folder=folder,
                          child_pid=-1, term_grace_s=5.0,
                          shared=(world.container(CONTAINER), PREFIX, RUN_ID) if shared else None)


def _watched_node(world: World, root: Path, k: int, settings: watchdog.WatchdogSettings,
                  pulses: Pulses | None = None) -> tuple[Node, Path, Any]:
    """Node k with one rank: the node, its progress folder, and the maker of its watchdog (through
    Blob; with `pulses`, also beating on the job's store, as the launcher attaches it)."""
    node = world.node(f"node-{k}")
    folder = root / node.name
    folder.mkdir(parents=True)

    def make() -> watchdog.Guard:
        guard = _guard(world, node, k, folder, 1, settings, shared=True)
        if pulses is not None:
            channel = Channel(pulses.server.client(), node=k, nodes=pulses.nodes)
            guard.liveness = StoreLiveness(channel, k, settings.hang_s / 2, guard.clock)
            pulses.guards[k] = guard
        return guard
    return node, folder, make


@dataclass
class Pulses:
    """The job's store the watchdogs beat on, and each node's guard once made (its pulse task
    plays the launcher's pulse thread: watchdog.Guard.pulse every look interval)."""

    server: Any
    nodes: int
    guards: dict[int, watchdog.Guard] = field(default_factory=dict)

    def task(self, world: World, k: int, interval_s: float, until: float):
        def loop() -> None:
            while world.now < until:
                world.sim.sleep(interval_s)
                guard = self.guards.get(k)
                if guard is not None:
                    guard.pulse()
        return loop


def _watch(world: World, node: Node, make: Any, verdicts: Verdicts, until: float, progress: Path | None = None,
           jitter: random.Random | None = None):
    """The watchdog's looks; with `progress`, the node's one rank reports a step before each look
    (the training and its watchdog in one task: a run of many nodes with half the threads);
    with `jitter`, each look's wait is jittered as the launcher's (pacing.jittered), from that rng."""
    def loop() -> None:
        guard: watchdog.Guard = make()  # made in the node's task: it reads the node's clocks
        assert guard.settings is not None
        step = 0
        while world.now < until:
            interval = guard.settings.interval_s
            world.sim.sleep(pacing.jittered(interval, jitter) if jitter is not None else interval)
            if progress is not None:
                step += 1
                write_progress(progress, step, step, 1, node.clock.time())
            verdict = guard.check()
            if verdict:
                verdicts.found[node.name] = (world.now, verdict)
                world.sim.note(world.sim.current(), "verdict", f"{verdict.get('culprit')}: {verdict.get('message')}")
                return
    return loop


def _train(world: World, node: Node, folder: Path, local_size: int, step_s: float, stop_at: float):
    """A synchronous training: no step completes while a peer is frozen or gone (its collectives wait)."""
    def loop() -> None:
        step, beats = 0, 0
        while world.now < stop_at:
            world.sim.sleep(step_s)
            if world.now >= stop_at:
                return
            if any(peer.frozen or peer.dead for peer in world.sim.nodes):
                continue
            step += 1
            for rank in range(local_size):
                beats += 1
                write_progress(watchdog.progress_path(folder, rank), step, beats, 1, node.clock.time())
    return loop


class WatchdogClock(Scenario):
    name = "watchdog-clock"
    summary = "a training hangs while one node's wall clock steps; every node's watchdog must judge the hang"
    duration_s = 400.0

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        nodes = size or rng.randint(1, 3)
        hang = rng.choice([20.0, 30.0, 60.0])
        hang_at = rng.choice([rng.uniform(1.0, 8.0), rng.uniform(8.0, 90.0)])
        self.settings = {"nodes": nodes, "hang_s": hang, "step_s": rng.choice([0.5, 1.0, 2.0]), "hang_at_s": hang_at,
                         "clock_node": rng.randrange(nodes),
                         "clock_step_s": rng.choice([0.0, rng.uniform(-10.0, -1.0), rng.uniform(-300.0, -10.0),
                                                     rng.uniform(1.0, 300.0)]),
                         "clock_at_s": rng.choice([rng.uniform(0.0, 3.0), rng.uniform(0.0, hang_at + hang)])}
        return FaultPlan()

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        settings = watchdog.WatchdogSettings(hang_s=s["hang_s"])
        self.verdicts = Verdicts()
        # The training's first step lands at step_s (_train): one that hangs before it never
        # reports, and the watchdog judges it at its deadline to a first step.
        self.reported = s["step_s"] < s["hang_at_s"]
        self.due = s["hang_at_s"] + s["hang_s"] if self.reported else \
            watchdog.first_step_deadline(settings, 0, None).seconds
        # The last report lands at the last multiple of step_s before the hang: the watchdog may
        # judge hang_s after it, up to step_s before hang_at + hang_s.
        self.earliest = s["step_s"] * math.ceil(s["hang_at_s"] / s["step_s"] - 1) + s["hang_s"] if self.reported \
            else self.due
        self.until = self.due + 4 * settings.interval_s + 10.0
        world.container(CONTAINER)
        for k in range(s["nodes"]):
            node = world.node(f"node-{k}")
            folder = root / node.name / "progress"
            folder.mkdir(parents=True)
            make = lambda node=node, k=k, folder=folder: _guard(  # noqa: E731
                world, node, k, folder, 2, settings, shared=s["nodes"] > 1)
            world.spawn(f"train-{k}", _train(world, node, folder, 2, s["step_s"], s["hang_at_s"]), node=node)
            world.spawn(f"watchdog-{k}", _watch(world, node, make, self.verdicts, self.until), node=node)
            if k == s["clock_node"] and s["clock_step_s"]:
                world.spawn(f"clock-{k}", self._step_clock(world, node), node=node)
        self.interval = settings.interval_s

    def _step_clock(self, world: World, node: Node):
        def step() -> None:
            world.sim.sleep(self.settings["clock_at_s"])
            node.clock.step(self.settings["clock_step_s"])
            world.sim.note(node.name, "fault", f"wall clock stepped {self.settings['clock_step_s']:+.1f}s")
        return step

    def finish(self, world: World) -> None:
        world.run(self.until + 1.0)

    def check(self, world: World) -> list[Violation]:
        s = self.settings
        found = []
        late = self.due + 3 * self.interval + 5.0
        rule = "" if self.reported else f" (no first report: judged at the first-step deadline, {self.due:.0f}s)"
        self.metrics = {"verdicts": {n: round(t, 1) for n, (t, _) in self.verdicts.found.items()},
                        "due_s": round(self.due, 1)}
        for node in world.sim.nodes:
            seen = self.verdicts.found.get(node.name)
            if seen is None:
                found.append(Violation("hang-missed", f"{node.name} judged nothing by {world.now:.0f}s although the "
                                                      f"training stopped at {s['hang_at_s']:.0f}s (hang_s "
                                                      f"{s['hang_s']:.0f}, clock step {s['clock_step_s']:+.1f}s on "
                                                      f"node-{s['clock_node']} at {s['clock_at_s']:.0f}s){rule}"))
            elif seen[0] < self.earliest - 1.0:
                found.append(Violation("false-hang", f"{node.name} judged a hang at {seen[0]:.0f}s, before it was due "
                                                     f"at {self.due:.0f}s (the training stopped at "
                                                     f"{s['hang_at_s']:.0f}s){rule}: {seen[1].get('message')}"))
            elif seen[0] > late:
                found.append(Violation("hang-missed", f"{node.name} judged the hang only at {seen[0]:.0f}s (due by "
                                                      f"{late:.0f}s){rule}"))
        return found[:2]


class Heartbeats(Scenario):
    name = "heartbeats"
    summary = "N nodes watch each other through Blob heartbeats; one node freezes and every other must name it"
    duration_s = 200.0

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        nodes = size or rng.choice([4, 8, 16])
        self.settings = {"nodes": nodes, "hang_s": rng.choice([20.0, 30.0]), "step_s": rng.choice([2.0, 5.0]),
                         "frozen": rng.randrange(nodes), "freeze_at_s": rng.uniform(5.0, 20.0), "looks": None,
                         "check_s": None}
        return FaultPlan()

    def _lasts_s(self) -> float:
        """How long the run goes on after its start (the watch interval known)."""
        s = self.settings
        if s["looks"]:  # a few looks of every node, nothing frozen: no verdict, every heartbeat in Blob
            return s["looks"] * self.interval + 1.0
        return s["freeze_at_s"] + s["hang_s"] + 4 * self.interval + 10.0

    def _start_nodes(self, world: World, root: Path) -> None:
        """Every node's pulse on the job's store, its training and its watchdog (in the `looks` run
        the watchdog reports its node's step itself, before each look)."""
        s = self.settings
        settings = watchdog.WatchdogSettings(hang_s=s["hang_s"], check_s=s["check_s"] or s["hang_s"] / 4)
        self.interval = settings.interval_s
        self.verdicts = Verdicts()
        self.until = self._lasts_s()
        world.container(CONTAINER)
        self.pulses = Pulses(world.jobstore(), s["nodes"])
        for k in range(s["nodes"]):
            node, folder, make = _watched_node(world, root, k, settings, self.pulses)
            world.spawn(f"pulse-{k}", self.pulses.task(world, k, settings.interval_s, self.until), node=node)
            if s["looks"]:
                world.spawn(f"watchdog-{k}", _watch(world, node, make, self.verdicts, self.until,
                                                    watchdog.progress_path(folder, 0)), node=node)
                continue
            world.spawn(f"train-{k}", _train(world, node, folder, 1, s["step_s"], self.until), node=node)
            world.spawn(f"watchdog-{k}", _watch(world, node, make, self.verdicts, self.until), node=node)

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        self._start_nodes(world, root)
        if s["looks"]:
            return
        frozen = world.sim.nodes[s["frozen"]]

        def freeze() -> None:
            world.sim.sleep(s["freeze_at_s"])
            world.sim.freeze(frozen)
        world.spawn("freeze", freeze)

    def finish(self, world: World) -> None:
        world.run(self.until + 1.0)

    def _all_beat(self, world: World) -> list[Violation]:
        """No verdict while every node trains, and every node's heartbeat is in Blob, signed with its progress."""
        blobs = world.blob.accounts[ACCOUNT].containers[CONTAINER].blobs
        missing = [k for k in range(self.settings["nodes"])
                   if (blob := blobs.get(nodestatus.heartbeat_name(PREFIX, RUN_ID, k))) is None
                   or blob.metadata.get("state") != "training" or not blob.metadata.get("step")]
        calls = self.pulses.server.calls
        self.metrics = {"verdicts": len(self.verdicts.found), "heartbeats": self.settings["nodes"] - len(missing),
                        "peak_account_rps": world.blob.accounting.accounts[ACCOUNT].peak,
                        "store_calls_per_node_max": max(calls.values(), default=0),
                        "store_peak_ops_per_s": self.pulses.server.served.peak}
        found = [Violation("false-hang", f"{node} judged a hang while every node trained: {verdict.get('message')}")
                 for node, (_, verdict) in list(self.verdicts.found.items())[:1]]
        if missing:
            found.append(Violation("heartbeat-missing", f"{len(missing)} node(s) have no heartbeat with progress in "
                                                        f"Blob, e.g. node {missing[0]}"))
        return found

    def check(self, world: World) -> list[Violation]:
        s = self.settings
        if s["looks"]:
            return self._all_beat(world)
        frozen = f"node-{s['frozen']}"
        late = s["freeze_at_s"] + s["hang_s"] + 3 * self.interval + 10.0
        found = []
        named = 0
        for node in world.sim.nodes:
            if node.name == frozen:
                continue
            seen = self.verdicts.found.get(node.name)
            if seen is None or seen[0] > late:
                found.append(Violation("hang-missed", f"{node.name} judged nothing by {late:.0f}s after {frozen} "
                                                      f"froze at {s['freeze_at_s']:.0f}s"))
            elif seen[0] < s["freeze_at_s"]:
                found.append(Violation("false-hang", f"{node.name} judged a hang at {seen[0]:.0f}s, before anything "
                                                     f"stopped: {seen[1].get('message')}"))
            elif seen[1].get("culprit") == s["frozen"]:
                named += 1
        self.metrics = {"named": named, "of": s["nodes"] - 1,
                        "latest_verdict_s": round(max((t for t, _ in self.verdicts.found.values()), default=0.0), 1)}
        return found[:3]


class SlowHeartbeats(Heartbeats):
    name = "heartbeats-throttled"
    summary = "N nodes train; one node's heartbeat writes meet a 503 storm longer than hang_s: no node may judge a hang"

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        nodes = size or rng.choice([3, 4, 8])
        hang_s = rng.choice([20.0, 30.0])
        slow = rng.randrange(nodes)
        self.settings = {"nodes": nodes, "hang_s": hang_s, "step_s": rng.choice([2.0, 5.0]), "slow": slow,
                         "storm_after": rng.randint(2, 6), "storm_s": round(rng.uniform(1.5, 3.0) * hang_s, 1),
                         "looks": None, "check_s": None}
        # the storm starts at the slow node's nth heartbeat write, a step, never a time
        return FaultPlan().add(RequestFault("busy", op="put_blob", node=f"node-{slow}",
                                            blob=f"{CONTAINER}/{nodestatus.heartbeat_name(PREFIX, RUN_ID, slow)}",
                                            nth=self.settings["storm_after"], duration_s=self.settings["storm_s"]))

    def _lasts_s(self) -> float:
        s = self.settings
        return (s["storm_after"] + 1) * self.interval + s["storm_s"] + s["hang_s"] + 20.0

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        self._start_nodes(world, root)
        self.silence = 0.0
        name = nodestatus.heartbeat_name(PREFIX, RUN_ID, s["slow"])

        def measure() -> None:  # the slow node's heartbeat age in the service, each second (no request)
            blobs = world.blob.accounts[ACCOUNT].containers[CONTAINER].blobs
            while world.now < self.until:
                world.sim.sleep(1.0)
                if name in blobs:
                    self.silence = max(self.silence, world.now - blobs[name].modified)
        world.spawn("measure", measure)

    def check(self, world: World) -> list[Violation]:
        self.metrics = {"verdicts": len(self.verdicts.found), "max_heartbeat_silence_s": round(self.silence, 1),
                        "hang_s": self.settings["hang_s"]}
        return [Violation("false-hang", f"{node} judged a hang while every node trained (node "
                                        f"{self.settings['slow']}'s heartbeats held in a 503 storm): "
                                        f"{verdict.get('message')}")
                for node, (_, verdict) in list(self.verdicts.found.items())[:1]]


class HangCulprit(Scenario):
    name = "hang-culprit"
    summary = "one node's training stops in its own work while its peers wait for it; every watchdog must name it"
    duration_s = 120.0

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        nodes = size or rng.choice([2, 2, 3, 4])
        hang = rng.choice([10.0, 20.0])
        self.settings = {"nodes": nodes, "hang_s": hang, "own_s": rng.choice([0.05, 0.2, 1.0]),
                         "collective_s": rng.choice([0.01, 0.1]), "stopped": rng.randrange(nodes),
                         "stop_after_s": rng.uniform(4.0, 15.0),
                         "phases": [rng.uniform(0.0, hang / 6) for _ in range(nodes)]}
        self.jitter = random.Random(rng.random())
        return FaultPlan()

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        settings = watchdog.WatchdogSettings(hang_s=s["hang_s"])
        self.interval = settings.interval_s
        self.verdicts = Verdicts()
        self.stopped_at: float | None = None
        self.until = s["stop_after_s"] + s["own_s"] + s["collective_s"] + s["hang_s"] + 4 * self.interval + 10.0
        self.arrived: dict[int, set[int]] = {}
        self.parked: dict[int, list[Any]] = {}
        world.container(CONTAINER)
        for k in range(s["nodes"]):
            node, folder, make = _watched_node(world, root, k, settings)
            world.spawn(f"train-{k}", self._train(world, node, k, watchdog.progress_path(folder, 0)), node=node)
            world.spawn(f"watchdog-{k}", _watch(world, node, make, self.verdicts, self.until, jitter=self.jitter),
                        node=node, delay_s=s["phases"][k])

    def _train(self, world: World, node: Node, k: int, path: Path):
        """One rank per node: own work, compute_done (waiting), the collective with every node, report;
        the stopped node's training stops in the own work of its first step after `stop_after_s`."""
        s = self.settings

        def loop() -> None:
            beats = 0
            for step in range(1, 10_000):
                world.sim.sleep(s["own_s"])
                if k == s["stopped"] and world.now >= s["stop_after_s"]:
                    self.stopped_at = world.now
                    world.sim.note(node.name, "fault", f"training stopped in its own work on step {step}")
                    return
                beats += 1
                write_progress(path, step - 1, beats, 0, node.clock.time(), waiting=step, busy=(step, s["own_s"]))
                here = self.arrived.setdefault(step, set())
                here.add(k)
                if len(here) < s["nodes"]:
                    self.parked.setdefault(step, []).append(world.sim.current())
                    while len(self.arrived[step]) < s["nodes"] and world.now < self.until:
                        world.sim.park(self.until - world.now)
                    if len(self.arrived[step]) < s["nodes"]:
                        return
                else:
                    for task in self.parked.pop(step, []):
                        world.sim.wake(task)
                world.sim.sleep(s["collective_s"])
                beats += 1
                write_progress(path, step, beats, 0, node.clock.time(), busy=(step, s["own_s"]))
        return loop

    def finish(self, world: World) -> None:
        world.run(self.until + 1.0)

    def check(self, world: World) -> list[Violation]:
        s = self.settings
        late = self.until - 5.0
        found = []
        for node in world.sim.nodes:
            seen = self.verdicts.found.get(node.name)
            if seen is None or seen[0] > late:
                found.append(Violation("hang-missed", f"{node.name} judged nothing by {late:.0f}s after node-"
                                                      f"{s['stopped']}'s training stopped at {self.stopped_at}s"))
            elif self.stopped_at is None or seen[0] < self.stopped_at:
                found.append(Violation("false-hang", f"{node.name} judged a hang at {seen[0]:.0f}s, before anything "
                                                     f"stopped: {seen[1].get('message')}"))
            elif seen[1].get("culprit") != s["stopped"]:
                found.append(Violation("wrong-culprit", f"{node.name} named node {seen[1].get('culprit')}, not node "
                                                        f"{s['stopped']} whose training stopped in its own work: "
                                                        f"{seen[1].get('message')}"))
        self.metrics = {"verdicts": {n: [round(t, 1), v.get("culprit")] for n, (t, v) in self.verdicts.found.items()},
                        "stopped_at_s": None if self.stopped_at is None else round(self.stopped_at, 1)}
        return found[:3]
