"""In-job restart agreement, and the records of one launch meeting another's.

- `restart-agreement`: every node's leader runs the launcher's restart Coordinator
  (amlhpc.jobs.runtime.launch.restart: node-local records, the job's records in Blob, the
  decision from the reports); its local rank's training command is played by a task that
  fails on one node at a seeded moment, and is stopped, as the launcher's stopper would,
  when the node's stop record appears. Each node reports the versions it holds (seeded:
  some nodes lack the newest); a node's report may be slow (a long tier verification,
  seeded up to 1.5 x agree_s). Faults: 503 storms on the restart records (some longer than
  every retry budget), lost replies on their writes, slow requests, a node partitioned.
- `launch-records`: a node runs one launch of a job that fails (its stop record, its exit
  records, its restore/outcome barrier's result), then a second launch with the same run id
  on the same node (Azure ML requeues a job under its name), whose local ranks start at
  seeded moments around their leader's.

Invariants:
- `split-decision`: the nodes of one generation did not all decide the same (restart from the
  same version, or end); a coordinator that raised counts as a node that ended without a word;
- `restored-missing`: the decision restores a version some node does not hold intact (local),
  or that Blob does not hold (blob);
- `stale-record`: a record of the earlier launch stopped a rank of this launch, or released it
  with the earlier launch's answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.coord.nodebarrier import BarrierFailed, BarrierTimeout, NodeBarrier
from amlhpc.jobs.runtime.launch import restart
from amlhpc.sim.faults import FaultPlan, RequestFault
from amlhpc.sim.scenario import Scenario, Violation
from amlhpc.sim.scheduler import Node
from amlhpc.sim.world import World

CONTAINER = "checkpoints"
PREFIX = "exp/run"
RUN_ID = "job-a1"


@dataclass
class NodeOutcome:
    decision: restart.Decision | None = None
    error: str | None = None
    report: dict[str, Any] = field(default_factory=dict)
    decided_at: float | None = None


class RestartAgreement(Scenario):
    name = "restart-agreement"
    summary = "every node's restart Coordinator agrees through Blob after one node's training fails"
    duration_s = 900.0

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        nodes = size or rng.randint(2, 5)
        agree = rng.choice([20.0, 30.0, 60.0])
        slow = rng.randrange(nodes) if rng.random() < 0.6 else None
        self.settings = {"nodes": nodes, "agree_s": agree, "fail_node": rng.randrange(nodes),
                         "fail_at_s": rng.uniform(1.0, 10.0), "peers_fail_s": rng.uniform(5.0, 120.0), "slow_node": slow,
                         "slow_s": rng.uniform(0.0, 1.5 * agree) if slow is not None else 0.0,
                         "lacks_newest": sorted(rng.sample(range(nodes), rng.randint(0, nodes - 1))),
                         "limit": rng.choice([1, 3])}
        plan = FaultPlan()
        names = [f"node-{k}" for k in range(nodes)]
        for _ in range(rng.choice([0, 0, 1, 1, 2])):
            kind = rng.choice(["busy", "busy", "lost-reply", "delay", "partition"])
            if kind == "busy":
                plan.add(RequestFault("busy", blob=f"{CONTAINER}/{PREFIX}/runs/*", nth=rng.randint(1, 30),
                                      duration_s=rng.choice([rng.uniform(2.0, 40.0), rng.uniform(150.0, 300.0)])))
            elif kind == "lost-reply":
                plan.add(RequestFault("lost-reply", op="put_blob", blob=f"{CONTAINER}/{PREFIX}/runs/*",
                                      nth=rng.randint(1, 2 * nodes), reset_s=rng.choice([None, 0.05])))
            elif kind == "delay":
                plan.add(RequestFault("delay", blob=f"{CONTAINER}/{PREFIX}/runs/*", nth=rng.randint(1, 40),
                                      delay_s=rng.uniform(0.5, 10.0)))
            else:
                plan.add(RequestFault("partition", node=rng.choice(names), nth=rng.randint(1, 20),
                                      duration_s=rng.uniform(2.0, 1.2 * agree)))
        return plan

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        world.container(CONTAINER)
        self.outcomes: dict[int, NodeOutcome] = {}
        for k in range(s["nodes"]):
            node = world.node(f"node-{k}")
            records = restart.NodeRecords(root / node.name / "restart", 0)
            outcome = self.outcomes[k] = NodeOutcome()
            world.spawn(f"command-{k}", self._command(world, k, records), node=node)
            world.spawn(f"coordinator-{k}", self._coordinator(world, node, k, records, outcome), node=node)

    def _held(self, k: int) -> list[dict[str, Any]]:
        versions = [{"name": "step-000000100", "step": 100, "tag": "t0"}]
        if k not in self.settings["lacks_newest"]:
            versions.insert(0, {"name": "step-000000200", "step": 200, "tag": "t0"})
        return versions

    def _command(self, world: World, k: int, records: restart.NodeRecords):
        s = self.settings

        def run() -> None:
            # The training runs until it fails (one node), its collectives fail after a peer's
            # (the others, `peers_fail_s` later: an NCCL error), or the node's leader asks it to
            # stop (the launcher's _RestartStopper, which looks every restart.POLL_S).
            started = world.now
            while True:
                if k == s["fail_node"] and world.now - started >= s["fail_at_s"]:
                    records.record_exit(0, 1, "exit", "exit 1")
                    return
                if world.now - started >= s["fail_at_s"] + s["peers_fail_s"]:
                    records.record_exit(0, 1, "exit", "exit 1 (NCCL error: a peer is gone)")
                    return
                if records.stop_requested() is not None:
                    records.record_exit(0, 137, "restart", "stopped for an in-job restart")
                    return
                world.sim.sleep(restart.POLL_S)
        return run

    def _coordinator(self, world: World, node: Node, k: int, records: restart.NodeRecords, outcome: NodeOutcome):
        s = self.settings

        def report() -> dict[str, Any]:
            if k == s["slow_node"]:
                world.sim.sleep(s["slow_s"])  # verifying the node's tier
            outcome.report = {"versions": self._held(k), "folder_files": False}
            return outcome.report

        def run() -> None:
            shared = restart.JobRecords(world.container(CONTAINER), PREFIX, RUN_ID, 0)
            hooks = restart.Hooks(report=report, apply=lambda decision: decision)
            coordinator = restart.Coordinator(generation=0, node=k, nodes=s["nodes"], local_size=1, records=records,
                                              shared=shared, limit=s["limit"], agree_s=s["agree_s"], hooks=hooks)
            try:
                outcome.decision = coordinator.watch()
            except Exception as exc:  # noqa: BLE001 - the launcher's thread turns this into the node's end
                outcome.error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                world.sim.note(world.sim.current(), "decision", f"the coordinator failed: {outcome.error}")
            else:
                d = outcome.decision
                world.sim.note(world.sim.current(), "decision", f"{d.result} {d.source or ''} {d.version or ''} "
                                                                f"({d.reason})")
            outcome.decided_at = world.now
        return run

    def finish(self, world: World) -> None:
        world.sim.run_until(lambda: all(o.decided_at is not None for o in self.outcomes.values()),
                            limit_s=self.duration_s)

    def check(self, world: World) -> list[Violation]:
        found: list[Violation] = []
        said = {}
        for k, outcome in sorted(self.outcomes.items()):
            if outcome.decision is not None:
                d = outcome.decision
                said[k] = (d.result, d.source, d.version, d.step) if d.result == "restart" else ("end",)
            elif outcome.error is not None:
                said[k] = ("end",)
            else:
                said[k] = ("undecided",)
        kinds = set(said.values())
        decided = [o.decided_at for o in self.outcomes.values() if o.decided_at is not None]
        self.metrics = {"decisions": {k: v[0] if len(v) == 1 else f"{v[0]} {v[2]}" for k, v in said.items()},
                        "agreed_in_s": round(max(decided) - min(decided), 2) if decided else None}
        if len(kinds) > 1:
            detail = ", ".join(f"node {k}: {' '.join(str(p) for p in v if p is not None)}"
                               + (f" ({self.outcomes[k].error})" if self.outcomes[k].error else "")
                               for k, v in said.items())
            found.append(Violation("split-decision", f"generation 0 decided differently: {detail}"))
        for k, outcome in self.outcomes.items():
            chosen = outcome.decision
            if chosen is None or chosen.result != "restart" or chosen.source != "local":
                continue
            lacking = [j for j in self.outcomes if not any(v["name"] == chosen.version for v in self._held(j))]
            if lacking:
                found.append(Violation("restored-missing", f"node {k} resumes from {chosen.version}, which node(s) "
                                                           f"{lacking} do not hold"))
                break
        return found


class LaunchRecords(Scenario):
    name = "launch-records"
    summary = "a second launch of a job on the same node meets the first launch's restart records and barrier"
    duration_s = 120.0

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        self.settings = {"local_size": rng.choice([2, 4]), "leader_late_s": rng.uniform(0.0, 3.0),
                         "gap_s": rng.uniform(5.0, 60.0), "first_fails": rng.random() < 0.8}
        return FaultPlan()

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        node = world.node("node-0")
        folder = root / "node-0" / ".amlhpc-launch" / f"{RUN_ID}-node0" / "restart"
        self.stale: list[str] = []
        self.answers: dict[int, Any] = {}

        def first_launch() -> None:
            records = restart.NodeRecords(folder, 0)
            barrier = NodeBarrier(records.outcome_dir, 60.0, RUN_ID)
            barrier.lead()
            if s["first_fails"]:
                records.request_stop({"node": 0, "local_rank": 1, "cause": "exit", "status": 1, "launch": 1})
            for rank in range(s["local_size"]):
                records.record_exit(rank, 1 if rank == 1 else 137, "exit" if rank == 1 else "restart")
            barrier.succeed({"result": "restart", "reason": "launch 1's answer", "launch": 1, "version": "step-1"})

        def second_launch_rank(rank: int):
            def run() -> None:
                world.sim.sleep(s["gap_s"] + (s["leader_late_s"] if rank == 0 else 0.0))
                records = restart.NodeRecords(folder, 0)
                barrier = NodeBarrier(records.outcome_dir, 30.0, RUN_ID)
                # The launcher's stopper looks for this generation's stop record while the command runs.
                stop = records.stop_requested()
                if stop is not None:
                    self.stale.append(f"local rank {rank} of launch 2 was stopped by a stop record of launch "
                                      f"{stop.get('launch', '?')} ({stop.get('cause')} on local rank "
                                      f"{stop.get('local_rank')})")
                if rank == 0:
                    barrier.lead()
                    world.sim.sleep(1.0)  # the coordinator runs; launch 2's own answer follows
                    barrier.succeed({"result": "end", "reason": "launch 2's answer", "launch": 2})
                    return
                try:
                    answer = barrier.wait()
                except (BarrierFailed, BarrierTimeout) as exc:
                    answer = {"error": str(exc)}
                self.answers[rank] = answer
                if answer.get("launch") not in (None, 2):
                    self.stale.append(f"local rank {rank} of launch 2 was released with launch {answer.get('launch')}'s "
                                      f"answer ({answer.get('reason')})")
            return run
        world.spawn("launch-1", first_launch, node=node)
        for rank in range(s["local_size"]):
            world.spawn(f"launch-2-rank-{rank}", second_launch_rank(rank), node=node)

    def check(self, world: World) -> list[Violation]:
        self.metrics = {"answers": {k: v.get("launch", v.get("error", "?")) for k, v in self.answers.items()}}
        return [Violation("stale-record", text) for text in self.stale[:1]]
