"""In-job restart agreement, and the records of one launch meeting another's.

- `restart-agreement`: every node's leader runs the launcher's restart Coordinator
  (amlhpc.jobs.runtime.launch.restart: node-local records, the generation's keys in the job's
  store through amlhpc.jobs.runtime.coord.agree.Channel, node 0's one decision that every node
  adopts) over the simulated rendezvous store node 0 hosts (amlhpc.sim.store); its local
  rank's training command is played by a task that fails on one node at a seeded moment, and
  is stopped, as the launcher's stopper would, when the node's stop record appears. Each node
  reports the versions it holds (seeded: some nodes lack the newest); a node's report may be
  slow (a long tier verification, seeded up to 1.5 x agree_s). Faults: a node killed (node 0
  too: the store goes with it), a node's store connection dropped once (the call lost before
  the store applied it, or applied and its reply lost), a node cut off from the store while
  node 0 lives (a partition, seeded: shorter than kvstore.RECONNECT_GRACE_S, which the node
  rides out, or longer, which makes it take node 0 for lost and end), a node whose
  verification fails (its coordinator raises) or that cannot follow the adopted restart (its
  restore fails), a slow store.
- `launch-records`: a node runs one launch of a job that fails (its stop record, its exit
  records, its restore/outcome barrier's result), then a second launch with the same run id
  on the same node (Azure ML requeues a job under its name), whose local ranks start at
  seeded moments around their leader's. Each launch keys its folder and its barrier by its
  launch generation (amlhpc.jobs.runtime.base.launchid), as the launcher does.

Invariants:
- `split-decision`: the live nodes of one generation did not all adopt the same decision
  (restart from the same version, or end), or a node restarts from another decision than the
  one adopted; a node that cannot follow an adopted restart must fail the next generation
  (its failure and an end stored) so the others stop at once; a node cut off from the store
  for longer than the grace ends (exit 10), and then no node restarts: the job ends on one
  decision (the generation's end, or the next generation's failure and end when its restart
  was adopted but never confirmed by every node);
- `undecided`: a live node's coordinator did not return (it waits for ever);
- `restored-missing`: the decision restores a version some node does not hold intact;
- `stale-record`: a record of the earlier launch stopped a rank of this launch, or released it
  with the earlier launch's answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import launchid
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.base.ranks import Ranks
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.coord.kvstore import decode
from amlhpc.jobs.runtime.coord.nodebarrier import BarrierFailed, BarrierTimeout, NodeBarrier
from amlhpc.jobs.runtime.launch import restart
from amlhpc.jobs.runtime.launch.launcher import _node_dir
from amlhpc.sim.faults import FaultPlan
from amlhpc.sim.scenario import Scenario, Violation
from amlhpc.sim.scheduler import Node
from amlhpc.sim.store import Drop, Partition
from amlhpc.sim.world import World

RUN_ID = "job-a1"


@dataclass
class NodeOutcome:
    decision: restart.Decision | None = None
    adopted: restart.Decision | None = None
    error: str | None = None
    report: dict[str, Any] = field(default_factory=dict)
    decided_at: float | None = None


class RestartAgreement(Scenario):
    name = "restart-agreement"
    summary = "every node's restart Coordinator agrees through the job's store after one node's training fails"
    duration_s = 900.0

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        nodes = size or rng.randint(2, 5)
        agree = rng.choice([20.0, 30.0, 60.0])
        slow = rng.randrange(nodes) if rng.random() < 0.6 else None
        self.settings = {"nodes": nodes, "agree_s": agree, "fail_node": rng.randrange(nodes),
                         "fail_at_s": rng.uniform(1.0, 10.0), "peers_fail_s": rng.uniform(5.0, 120.0), "slow_node": slow,
                         "slow_s": rng.uniform(0.0, 1.5 * agree) if slow is not None else 0.0,
                         "lacks_newest": sorted(rng.sample(range(nodes), rng.randint(0, nodes - 1))),
                         "limit": rng.choice([1, 3]), "store_ops_per_s": rng.choice([100_000.0, 2_000.0, 200.0]),
                         "kill_node": None, "kill_at_s": 0.0, "drop_node": None, "drop_call": 0, "drop_lost": "request",
                         "report_fails": None, "apply_fails": None}
        for _ in range(rng.choice([0, 0, 1, 1, 2])):
            kind = rng.choice(["kill", "drop", "report-fails", "apply-fails"])
            if kind == "kill":
                self.settings.update(kill_node=rng.randrange(nodes), kill_at_s=rng.uniform(1.0, 150.0))
            elif kind == "drop":
                self.settings.update(drop_node=rng.randrange(nodes), drop_call=rng.randint(1, 60))
            elif kind == "report-fails":
                self.settings["report_fails"] = rng.randrange(nodes)
            else:
                self.settings["apply_fails"] = rng.randrange(nodes)
        if self.settings["drop_node"] is not None:  # drawn last: the draws above stay what they were
            self.settings["drop_lost"] = rng.choice(["request", "reply"])
        self.settings.update(cut_node=None, cut_at_s=0.0, cut_s=0.0)
        if nodes > 1 and rng.random() < 0.3:  # after the draws above: they stay what they were
            self.settings.update(cut_node=rng.randrange(1, nodes), cut_at_s=rng.uniform(0.0, 40.0),
                                 cut_s=rng.choice([rng.uniform(2.0, 25.0), rng.uniform(35.0, 150.0)]))
        return FaultPlan()

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        self.outcomes: dict[int, NodeOutcome] = {}
        self.nodes = [world.node(f"node-{k}") for k in range(s["nodes"])]
        self.server = world.jobstore(self.nodes[0], ops_per_s=s["store_ops_per_s"])
        if s["drop_node"] is not None:
            self.server.drops[f"node-{s['drop_node']}"] = Drop(s["drop_call"], s["drop_lost"])
        if s.get("cut_node") is not None:
            self.server.partitions[f"node-{s['cut_node']}"] = Partition(s["cut_at_s"], s["cut_at_s"] + s["cut_s"])
        for k, node in enumerate(self.nodes):
            records = restart.NodeRecords(root / node.name / "restart", 0)
            outcome = self.outcomes[k] = NodeOutcome()
            world.spawn(f"command-{k}", self._command(world, k, records), node=node)
            world.spawn(f"coordinator-{k}", self._coordinator(world, node, k, records, outcome), node=node)
        if s["kill_node"] is not None:
            victim = self.nodes[s["kill_node"]]

            def kill() -> None:
                world.sim.sleep(s["kill_at_s"])
                world.sim.kill(victim)
            world.spawn("kill", kill)

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
            if k == s["report_fails"]:
                raise OSError(f"node {k}: verifying the tier failed (an unreadable marker)")
            outcome.report = {"versions": self._held(k), "folder_files": False}
            return outcome.report

        def apply(decision: restart.Decision) -> restart.Decision:
            if k == s["apply_fails"]:
                return restart.Decision("end", f"node {k} could not restore {decision.version}")
            return decision

        def run() -> None:
            channel = Channel(self.server.client(), node=k, nodes=s["nodes"], rng=random.Random(f"{world.seed}:{k}"))
            shared = restart.JobAgreement(channel, 0)
            hooks = restart.Hooks(report=report, apply=apply)
            coordinator = restart.Coordinator(generation=0, node=k, nodes=s["nodes"], local_size=1, records=records,
                                              shared=shared, limit=s["limit"], agree_s=s["agree_s"], hooks=hooks,
                                              rng=random.Random(f"{world.seed}:coordinator:{k}"))
            try:
                outcome.decision = coordinator.run()
            except Exception as exc:  # noqa: BLE001 - the launcher's thread turns this into the node's end
                outcome.error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                world.sim.note(world.sim.current(), "decision", f"the coordinator failed: {outcome.error}")
            else:
                d = outcome.decision
                world.sim.note(world.sim.current(), "decision", f"{d.result} {d.source or ''} {d.version or ''} "
                                                                f"({d.reason})")
            outcome.adopted = coordinator.adopted
            outcome.decided_at = world.now
        return run

    def _live(self) -> list[int]:
        return [k for k, node in enumerate(self.nodes) if not node.dead]

    def finish(self, world: World) -> None:
        world.sim.run_until(lambda: all(self.outcomes[k].decided_at is not None for k in self._live()),
                            limit_s=self.duration_s)

    @staticmethod
    def _said(d: restart.Decision | None) -> tuple:
        if d is None:
            return ("none",)
        return (d.result, d.source, d.version, d.step) if d.result == "restart" else ("end",)

    def _stored(self, key: str) -> Any:
        raw = self.server.data.get(key)
        return decode(raw) if raw else None

    def check(self, world: World) -> list[Violation]:
        found: list[Violation] = []
        live = self._live()
        node0_lost = self.nodes[0].dead
        undecided = [k for k in live if self.outcomes[k].decided_at is None]
        if undecided:
            found.append(Violation("undecided", f"node(s) {undecided} never left the restart agreement "
                                                f"({self.duration_s:.0f} virtual s)"))
        decided = [at for k in live if (at := self.outcomes[k].decided_at) is not None]
        self.metrics = {"decisions": {k: " ".join(str(p) for p in self._said(self.outcomes[k].decision) if p)
                                      for k in live},
                        "agreed_in_s": round(max(decided) - min(decided), 2) if decided else None,
                        "store_ops": sum(self.server.ops.values()), "store_drops": list(self.server.dropped),
                        "store_cut": dict(self.server.cut),
                        "exit_codes": {k: d.exit_code for k in live if (d := self.outcomes[k].decision) is not None
                                       and d.exit_code is not None}}
        adopted = {k: self._said(self.outcomes[k].adopted) for k in live if self.outcomes[k].adopted is not None}
        details = ", ".join(f"node {k}: {' '.join(str(p) for p in v if p is not None)}" for k, v in adopted.items())
        if len(set(adopted.values())) > 1:
            found.append(Violation("split-decision", f"generation 0 adopted differently: {details}"))
        stored = restart.Decision.from_json(self._stored("restart/g0/decision")) \
            if self._stored("restart/g0/decision") else None
        for k in live:
            outcome = self.outcomes[k]
            d = outcome.decision
            if d is None or outcome.decided_at is None:
                continue
            if d.result == "restart" and (stored is None or self._said(d) != self._said(stored)):
                found.append(Violation("split-decision", f"node {k} restarts from {d.version} but the generation's "
                                                         f"decision is {self._said(stored)}"))
            elif d.result != "restart" and stored is not None and stored.result == "restart" and not node0_lost:
                ended = self._stored("restart/g1/decision")
                if not (isinstance(ended, dict) and ended.get("result") == "end" and self._stored("restart/g1/failed")):
                    cut = " (cut off from the store: it ends alone)" if self.server.cut.get(f"node-{k}") else ""
                    found.append(Violation("split-decision", f"node {k} ends ({d.reason}) while generation 0 restarts, "
                                                             f"and generation 1 was not failed for the others{cut}"))
            elif d.result != "restart" and node0_lost and d.exit_code not in (None, ExitCode.NODE_LOST) and \
                    stored is None:
                found.append(Violation("split-decision", f"node 0 was lost and node {k} ends with {d.exit_code} "
                                                         f"({d.reason}), not as a lost node 0"))
        for k in live:
            chosen = self.outcomes[k].decision
            if chosen is None or chosen.result != "restart" or chosen.source != "local":
                continue
            lacking = [j for j in live if not any(v["name"] == chosen.version for v in self._held(j))]
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
        self.stale: list[str] = []
        self.answers: dict[int, Any] = {}

        def folder(launch: int) -> tuple[Path, str]:
            # As the launcher keys them: the node's folder of this run id, under this launch's
            # generation, here from torchrun's per-agent attempt folder (each launch's agent
            # makes its own with mkdtemp; the run id is the same).
            local_size = s["local_size"]
            env = {"TORCHELASTIC_ERROR_FILE": f"/tmp/torchelastic_launch{launch}/none_x/attempt_0/0/error.json",
                   "AZUREML_RUN_ID": RUN_ID}
            generation = launchid.node_generation(env, local_size)
            assert generation is not None
            ranks = Ranks(0, 0, local_size, local_size, "torch", RUN_ID)
            return _node_dir(ranks, {"AMLHPC_SCRATCH": str(root / "node-0")}, "restart", generation.value), \
                generation.value

        def first_launch() -> None:
            where, generation = folder(1)
            records = restart.NodeRecords(where, 0)
            barrier = NodeBarrier(records.outcome_dir, 60.0, RUN_ID, generation=generation)
            barrier.lead()
            if s["first_fails"]:
                records.request_stop({"node": 0, "local_rank": 1, "cause": "exit", "status": 1, "launch": 1})
            for rank in range(s["local_size"]):
                records.record_exit(rank, 1 if rank == 1 else 137, "exit" if rank == 1 else "restart")
            barrier.succeed({"result": "restart", "reason": "launch 1's answer", "launch": 1, "version": "step-1"})

        def second_launch_rank(rank: int):
            def run() -> None:
                world.sim.sleep(s["gap_s"] + (s["leader_late_s"] if rank == 0 else 0.0))
                where, generation = folder(2)
                records = restart.NodeRecords(where, 0)
                barrier = NodeBarrier(records.outcome_dir, 30.0, RUN_ID, generation=generation)
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
