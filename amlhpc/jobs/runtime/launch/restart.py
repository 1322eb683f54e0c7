"""In-job restart: a failed training run is restarted by the launchers of every node, inside the
same Azure ML job, from the newest versioned checkpoint every node holds on its NVMe.

Azure ML gives a job no way to replace a node: a node whose host is lost ends the job (the
managed run resubmits it). A process that crashes, an NCCL error, a hang the watchdog stops:
none of those needs a new job. So, per training run ("generation" g = 0, 1, ...):

1. every launcher runs its command; when it ends, the launcher records how (node-local
   `restart/<launch>/g<g>/rank-<lr>.exit.json`, under this launch's generation,
   amlhpc.jobs.runtime.base.launchid, so a later launch on the node never reads them): its status and
   cause (exit, hang, stopped by a signal);
2. the node's leader (local rank 0) watches those records, and the generation's failure key in
   the job's store (`restart/g<g>/failed`, create-only: the first failure anywhere; one `check`
   per poll). A failure, here or on another node, makes it write `stop.json`: every launcher of
   the node kills its command at once. A store that stops answering is node 0 lost: a failure
   too, and the job ends (exit 10) with that cause;
3. once its commands have all ended, the leader cancels the node's uploads, verifies what the
   node holds (tier.py: markers and SHA-256 of every file) and reports it to the store
   (`restart/g<g>/report/node-<k>`, and a counter; node 0 adds the committed latest version in
   Blob);
4. node 0 decides once every node has reported (`decide`: the newest version every node holds
   intact, or the committed one in Blob if that is newer, restored into the tier first, or
   none) or once `agree_s` has passed (the nodes that did not report are lost: end), and
   stores it as THE decision of the generation (`restart/g<g>/decision`, create-only,
   `compare_set`); every node adopts what the store holds, never a decision of its own.
   A restart is then confirmed by every node (a barrier, `restart/g<g>/confirmed`) before any
   node acts on it: a node cut off from node 0's store for longer than kvstore.RECONNECT_GRACE_S
   takes node 0 for lost and ends (exit 10) without confirming, so after CONFIRM_S the
   barrier fails, the next generation is failed and ended, and every node ends on that one
   record (exit 10) instead of restarting without it (a split: the others hung at rendezvous).
   A node cut off after it confirmed follows the restart it confirmed (the outcome can be a
   failure only if another node never confirmed: two nodes cut off at different moments, the
   one case left, which the next generation's own agreement ends).
   Versions newer than the decision's are deleted (the abandoned timeline). Its local ranks
   start their commands again with AMLHPC_RESUME_VERSION, AMLHPC_RESTART_GENERATION g+1 and a
   new timeline tag.

A node that ends instead proposes an end as the decision (the first proposal wins, so every
node ends with it): the launcher itself was told to stop (SIGTERM: preemption, a cancel); the
training writes checkpoint files outside the versioned tier (nodes cannot agree on those: a
rank-0 file exists on one node only); `local_restarts` restarts were spent (exit 11, for the
managed run to resubmit); its commands all ended well (done: nothing to restart here). Node 0
ends the generation with the hang's status (exit 7) when the node that hung, or missed its
first step, is the one that did so in the generation before: a restart on the same nodes
would meet it again, and the managed run's next attempt goes without it. A node
that cannot follow an adopted restart (its restore failed, its coordinator failed) publishes
a failure and an end for the next generation, so the others stop and end too; its
coordinator proposes an end in a `finally`, so no failure leaves the others waiting out
`agree_s`.

The job's store (amlhpc.jobs.runtime.coord.jobstore, on node 0) is the channel between nodes: a constant
number of operations per node per poll at any node count (where Blob polling made every node
list and read every node's report, O(N^2) requests per poll). Without a store (no rendezvous
host) only a single-node job restarts in-job.

Standard library only: ships in the image.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import clock
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.coord import pacing
from amlhpc.jobs.runtime.coord.agree import Barrier, Channel
from amlhpc.jobs.runtime.coord.kvstore import RECONNECT_GRACE_S, StoreLost
from amlhpc.jobs.runtime.coord.nodebarrier import BarrierFailed, BarrierTimeout, write_json_atomic
from amlhpc.jobs.runtime.launch.watchdog import FIRST_STEP

log = logging.getLogger("amlhpc.restart")

UNREAPED = "unreaped"
"""The exit record's cause when the command did not die within --kill-wait of its SIGKILL
(amlhpc.jobs.runtime.launch.reap): the node is lost, it restarts nothing."""
HANG_CAUSES = ("hang", FIRST_STEP)
"""The causes a node's watchdog gives (no progress; no first step within the run's deadline,
amlhpc.jobs.runtime.launch.watchdog.FIRST_STEP)."""


POLL_S = 0.1
"""How often the leader looks at its own node's exit records (files)."""
STORE_POLL_S = 0.5
"""How often it looks at the job's store (scaled with the node count: pacing.store_poll_s)."""
DECIDE_GRACE_S = 60.0
"""How long past agree_s a node waits for node 0's decision before it proposes an end itself."""
CONFIRM_S = 2 * RECONNECT_GRACE_S
"""How long the nodes wait for every node to confirm an adopted restart. Longer than the
store's grace (a node whose connection resets rides it out and still confirms); a node that
has not confirmed by then is cut off from node 0 for longer than the grace, and ends."""


# --- records ----------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


class NodeRecords:
    """The node-local records of one generation (every launcher of the node reads and writes
    them); `folder` is already this launch's (the launcher keys it by the launch generation)."""

    def __init__(self, folder: Path, generation: int):
        self.folder = Path(folder) / f"g{generation}"
        self.generation = generation

    def exit_path(self, local_rank: int) -> Path:
        return self.folder / f"rank-{local_rank}.exit.json"

    def record_exit(self, local_rank: int, status: int, cause: str, message: str = "", peer_silent: bool = False,
                    culprit: int | None = None) -> None:
        """`peer_silent`: the watchdog stopped the command because another node's launcher went
        silent (frozen or gone): that node cannot restart, so the job ends. `culprit`: the node
        the watchdog found stopped (a node that judges a hang is often the one left waiting)."""
        write_json_atomic(self.exit_path(local_rank), {"status": status, "cause": cause, "message": message,
                                                       "peer_silent": peer_silent, "written": clock.time(),
                                                       **({"culprit": culprit} if culprit is not None else {})})

    def exits(self, local_size: int) -> dict[int, dict[str, Any]]:
        found = {r: _read_json(self.exit_path(r)) for r in range(local_size)}
        return {r: d for r, d in found.items() if d is not None}

    @property
    def stop_path(self) -> Path:
        return self.folder / "stop.json"

    def request_stop(self, failure: dict[str, Any]) -> None:
        if not self.stop_path.exists():
            write_json_atomic(self.stop_path, failure)

    def stop_requested(self) -> dict[str, Any] | None:
        return _read_json(self.stop_path)

    @property
    def outcome_dir(self) -> Path:
        return self.folder / "outcome"


class JobAgreement:
    """One generation's keys in the job's store (see the module docstring)."""

    def __init__(self, channel: Channel, generation: int):
        self.base = channel
        self.channel = channel.scoped("restart", f"g{generation}")
        self.generation = generation

    def publish_failure(self, failure: dict[str, Any]) -> bool:
        """The generation's first failure anywhere; False when another node's was first."""
        return self.channel.decide(self.channel.key("failed"), failure)[1]

    def failure(self) -> dict[str, Any] | None:
        """One `check` while there is none."""
        found = self.channel.read(self.channel.key("failed"))
        return found if isinstance(found, dict) else None

    def report(self, node: int, document: dict[str, Any]) -> None:
        self.channel.publish(self.channel.key("report", f"node-{node}"), document)
        self.channel.count(self.channel.key("reports"))

    def reported(self) -> int:
        """How many reports were counted: a hint (a retried add counts twice), see `all_reported`."""
        return self.channel.count(self.channel.key("reports"), 0)

    def all_reported(self, nodes: int) -> bool:
        """Every node's report is in: the counter says so (one `add(key, 0)` per poll) and every
        node's own key confirms it (one `check`, only then), so an over-count never makes node 0
        decide without a report (nor `reports` wait on a key that is missing)."""
        return self.reported() >= nodes and self.channel.all_present(
            [self.channel.key("report", f"node-{k}") for k in range(nodes)])

    def reports(self, nodes: int) -> dict[int, dict[str, Any]]:
        """Every node's report (call once `reported()` says all are in: one call)."""
        found = self.channel.gather([self.channel.key("report", f"node-{k}") for k in range(nodes)])
        return {k: d for k, d in enumerate(found) if isinstance(d, dict)}

    def reports_so_far(self, nodes: int) -> dict[int, dict[str, Any]]:
        """The reports there are, when some never came (once, at the deadline: a check per node)."""
        present = [k for k in range(nodes) if self.channel.has(self.channel.key("report", f"node-{k}"))]
        found = self.channel.gather([self.channel.key("report", f"node-{k}") for k in present])
        return {k: d for k, d in zip(present, found, strict=True) if isinstance(d, dict)}

    def propose(self, decision: Decision) -> Decision:
        """Store `decision` unless one is there; the decision every node adopts."""
        stored, _ = self.channel.decide(self.channel.key("decision"), decision.to_json())
        return Decision.from_json(stored)

    def decision(self) -> Decision | None:
        """One `check` while there is none."""
        found = self.channel.read(self.channel.key("decision"))
        return Decision.from_json(found) if isinstance(found, dict) else None


def generation_failed(channel: Channel, generation: int) -> bool:
    """Whether the job's store holds a failure of `generation`. Every node that stops its uploads
    to report for a restart published or read that failure before it looked for the decision,
    so once the decision is stored this read sees it (the final upload relies on that:
    amlhpc.jobs.runtime.checkpoint.node). A store that is gone answers False."""
    try:
        return JobAgreement(channel, generation).failure() is not None
    except StoreLost:
        return False


# --- the decision -----------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    result: str
    """restart, or end."""
    reason: str
    source: str | None = None
    """local, blob or none (a restart from the start)."""
    version: str | None = None
    """The local version folder name (step-N) to resume from."""
    tag: str | None = None
    step: int | None = None
    blob_version: str | None = None
    exit_code: int | None = None
    resume: str | None = None
    """This node's version folder to resume from (filled in by the node, after `apply`)."""
    failure: dict[str, Any] | None = None
    """The generation's first failure (who, cause, status)."""
    unhealthy: dict[str, Any] | None = None
    """The node that failed its pre-restart health check: node, host, check, message."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, document: Any) -> Decision:
        document = document if isinstance(document, dict) else {}
        fields = {k: document.get(k) for k in cls.__dataclass_fields__}
        fields["result"] = str(fields.get("result") or "end")
        fields["reason"] = str(fields.get("reason") or "the decision record is unreadable")
        return cls(**fields)


def _key(version: dict[str, Any]) -> tuple[int, str, str]:
    return int(version["step"]), str(version["name"]), str(version["tag"])


def spent(limit: int) -> Decision:
    return Decision("end", f"{limit} in-job restart(s) spent (checkpoint.local_restarts)", exit_code=ExitCode.RESTARTS_EXHAUSTED)


def unhealthy_end(who: dict[str, Any]) -> Decision:
    """The end every node adopts when `who` failed its pre-restart health check."""
    return Decision("end", f"node {who.get('node')} ({who.get('host') or 'unknown host'}) failed the health check "
                           f"before the in-job restart ({who.get('check')}: {who.get('message')}): no node restarts on it; "
                           "the job ends for a new attempt without that node", exit_code=ExitCode.RESTART_HEALTH,
                    unhealthy=dict(who))


def decide(generation: int, limit: int, nodes: int, reports: dict[int, dict[str, Any]],
           ended: dict[int, dict[str, Any]], deadline_passed: bool) -> Decision | None:
    """What every node does after failed generation `generation`; None while answers are missing.
    A function of the reports alone, so every node decides the same."""
    if ended:
        node, record = min(ended.items())
        return Decision("end", f"node {node} ended the job ({record.get('reason', record.get('cause', '?'))})")
    sick = sorted(k for k, report in reports.items() if report.get("unhealthy"))
    if sick:
        return unhealthy_end(reports[sick[0]]["unhealthy"])
    missing = [k for k in range(nodes) if k not in reports]
    if missing:
        if not deadline_passed:
            return None
        return Decision("end", f"node(s) {', '.join(map(str, missing))} did not answer the restart: lost (a host that "
                               "is gone ends the Azure ML job; the managed run resubmits it)", exit_code=ExitCode.NODE_LOST)
    if generation >= limit:
        return spent(limit)
    held = [{_key(v) for v in reports[k].get("versions", [])} for k in range(nodes)]
    common = set.intersection(*held) if held else set()
    local = max(common) if common else None
    blob = reports.get(0, {}).get("blob_latest")
    if blob and (local is None or int(blob["step"]) > local[0]):
        return Decision("restart", f"the newest version every node holds is older than Blob's {blob['version']}",
                        "blob", blob.get("local"), blob.get("tag"), int(blob["step"]), blob["version"])
    if local is not None:
        return Decision("restart", "the newest version every node holds intact", "local", local[1], local[2], local[0])
    return Decision("restart", "no version is held by every node, none in Blob: the training starts over", "none")


# --- the node's leader ------------------------------------------------------------------


@dataclass
class Hooks:
    """What the coordinator asks of its launcher (keeps this module free of the launcher)."""

    report: Callable[[], dict[str, Any]]
    """Cancel the node's uploads; verify the tier; the node's report (versions, folder_files, blob_latest)."""
    apply: Callable[[Decision], Decision]
    """Prepare the node for the decision (restore from Blob, drop newer versions); may turn it into an end."""
    check: Callable[[], dict[str, Any] | None] = lambda: None
    """The node's quick health check before it takes part in a restart (amlhpc.jobs.runtime.health.quick):
    None when healthy, else {"host", "check", "message"} of the first failed check."""


def _stopped_node(failure: dict[str, Any]) -> Any:
    """The node a hang failure blames: the watchdog's culprit, else the node that reported it."""
    culprit = failure.get("culprit")
    return culprit if culprit is not None else failure.get("node")


class Coordinator:
    """Local rank 0's side of one generation (see the module docstring)."""

    def __init__(self, *, generation: int, node: int, nodes: int, local_size: int, records: NodeRecords,
                 shared: JobAgreement | None, limit: int, agree_s: float, hooks: Hooks,
                 clock_fn: Callable[[], float] | None = None, rng: random.Random | None = None):
        self.generation, self.node, self.nodes, self.local_size = generation, node, nodes, local_size
        self.records, self.shared, self.limit, self.agree_s, self.hooks = records, shared, limit, agree_s, hooks
        self.clock = clock_fn or clock.monotonic
        self.rng = rng or random.Random()
        self.failure: dict[str, Any] | None = None
        self.failed_at: float | None = None
        """Monotonic time the node learnt of the failure (for the report's recovery figures)."""
        self.adopted: Decision | None = None
        """The decision this node took part in through the store (None: none yet)."""
        self.lost: str | None = None
        """Why the job's store is gone, once it is (node 0 lost)."""
        self._again: tuple[Decision | None] | None = None

    @property
    def store_poll_s(self) -> float:
        return pacing.jittered(pacing.store_poll_s(STORE_POLL_S, self.nodes), self.rng)

    def _local_failure(self, exits: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
        for rank, record in sorted(exits.items()):
            if record["cause"] == "restart":  # killed by this very mechanism, after the failure
                continue
            if record["status"] != 0 or record["cause"] != "exit":
                return {"node": self.node, "local_rank": rank, **record}
        return None

    def _fail(self, failure: dict[str, Any]) -> None:
        if self.failure is None:
            self.failure, self.failed_at = failure, self.clock()
            log.warning("generation %d failed (node %s, local rank %s: %s, status %s): stopping the node's training",
                        self.generation, failure.get("node"), failure.get("local_rank"), failure.get("cause"),
                        failure.get("status"))
        self.records.request_stop(failure)

    def _store_lost(self, exc: StoreLost) -> None:
        self.lost = str(exc)
        log.error("%s", exc)
        self._fail({"node": 0, "cause": "lost", "status": int(ExitCode.NODE_LOST), "message": str(exc)})

    def run(self) -> Decision:
        """`watch`, and whatever happens, a decision in the store before this node leaves: a
        coordinator that fails proposes an end (or, past an adopted restart it cannot follow,
        a failure and an end of the next generation), so no node waits out agree_s for it."""
        decision: Decision | None = None
        try:
            decision = self.watch()
            return decision
        finally:
            if decision is None:
                self._leave(f"the restart coordinator of node {self.node} failed")

    def _leave(self, reason: str) -> None:
        if self.shared is None or self.lost is not None:
            return
        try:
            if self.adopted is not None and self.adopted.result == "restart":
                self._defect(reason)
            elif self.adopted is None:
                self.adopted = self.shared.propose(Decision("end", f"node {self.node} ended the job ({reason})"))
        except Exception as exc:  # noqa: BLE001 - nothing more to do: the others end at agree_s
            log.warning("could not tell the other nodes that this node ends: %s", exc)

    def _defect(self, reason: str, exit_code: int | None = None) -> Decision:
        """This node cannot follow the adopted restart: the next generation fails and ends at once
        (the end stored for it, which every node ends with)."""
        assert self.shared is not None
        following = JobAgreement(self.shared.base, self.generation + 1)
        following.publish_failure({"node": self.node, "cause": "ended", "status": exit_code, "message": reason})
        return following.propose(Decision("end", f"node {self.node} ended the job ({reason})", exit_code=exit_code))

    def _confirm(self, adopted: Decision) -> Decision:
        """Every node confirms the adopted restart before any acts on it (see the module
        docstring); a restart not confirmed by every node within CONFIRM_S ends every node."""
        assert self.shared is not None
        barrier = Barrier(self.shared.channel, "confirmed", self.nodes, CONFIRM_S)
        barrier.arrive()
        try:
            barrier.wait()
            return adopted
        except StoreLost as exc:
            # Confirmed, then cut off before the outcome came: it can be a failure only if another
            # node never confirmed, so this node follows the restart it confirmed, as the others do.
            log.error("generation %d: the store was lost after this node confirmed the restart; it follows the "
                      "restart (%s)", self.generation, exc)
            return adopted
        except BarrierTimeout as exc:
            # The first node to time out stores the failure; one whose confirmation completed the
            # barrier meanwhile stored success: the stored outcome is what every node follows.
            barrier.fail(f"the restart was not confirmed by every node within {CONFIRM_S:.0f}s ({exc}): a node cut "
                         "off from node 0 for longer than the store's grace ends", kind="lost")
            try:
                barrier.wait()
                return adopted
            except BarrierFailed as failed:
                reason = str(failed)
        except BarrierFailed as failed:
            reason = str(failed)
        log.error("generation %d: %s", self.generation, reason)
        ended = self._defect(reason, exit_code=int(ExitCode.NODE_LOST))
        return Decision("end", ended.reason, exit_code=ended.exit_code or int(ExitCode.NODE_LOST))

    def watch(self) -> Decision:
        """Until every local command has ended: spread a failure. Then the generation's outcome."""
        next_look = 0.0
        while True:
            exits = self.records.exits(self.local_size)
            local = self._local_failure(exits)
            if local is not None and self.failure is None:
                self._fail(local)
                if self.shared is not None and local["cause"] != "stopped":
                    try:
                        self.shared.publish_failure(local)
                    except StoreLost as exc:
                        self._store_lost(exc)
            if self.failure is None and self.shared is not None and self.clock() >= next_look:
                next_look = self.clock() + self.store_poll_s
                try:
                    remote = self.shared.failure()
                except StoreLost as exc:
                    self._store_lost(exc)
                    remote = None
                if remote is not None:
                    self._fail(remote)
            if len(exits) == self.local_size:
                return self._outcome(exits)
            clock.sleep(POLL_S)

    def _end(self, decision: Decision) -> Decision:
        """This node ends: its end is proposed as the generation's decision (the first proposal wins)."""
        if self.shared is not None and self.lost is None and self.adopted is None:
            try:
                self.adopted = self.shared.propose(Decision("end", f"node {self.node} ended the job ({decision.reason})",
                                                            exit_code=decision.exit_code))
            except StoreLost as exc:
                self.lost = str(exc)
        return decision

    def _outcome(self, exits: dict[int, dict[str, Any]]) -> Decision:
        if self.failure is None:
            return self._end(Decision("done", "every command of the node ended well"))
        if self.lost is not None:
            return Decision("end", f"node 0 is gone: {self.lost}", exit_code=ExitCode.NODE_LOST)
        if self.shared is not None:
            try:
                ended = self.shared.decision()  # another node ended the generation already
            except StoreLost as exc:
                self.lost = str(exc)
                return Decision("end", f"node 0 is gone: {exc}", exit_code=ExitCode.NODE_LOST)
            if ended is not None and ended.result != "restart":
                self.adopted = ended
                return ended
        unreaped = next((r for _, r in sorted(exits.items()) if r.get("cause") == UNREAPED), None)
        if unreaped is not None:
            return self._end(Decision("end", f"node {self.node} is lost: {unreaped.get('message')}",
                                      exit_code=ExitCode.NODE_LOST))
        if self.failure.get("cause") == "stopped" and self.failure.get("node") == self.node:
            return self._end(Decision("end", "the launcher was told to stop (preemption or a cancel)"))
        if self.limit <= 0:
            return self._end(Decision("end", "in-job restarts are off (checkpoint.local_restarts 0)"))
        if self.failure.get("peer_silent"):
            return self._end(Decision("end", f"{self.failure.get('message', 'a node went silent')}: a node whose "
                                             "launcher is frozen or gone cannot restart"))
        if self.nodes > 1 and self.shared is None:
            return self._end(Decision("end", f"{self.nodes} nodes and no coordination store to agree through"))
        if self.generation >= self.limit:
            return self._end(spent(self.limit))
        problem = self.hooks.check()
        if problem is not None:
            return self._unhealthy(problem)
        report = self.hooks.report()
        if report.get("folder_files"):
            return self._end(Decision("end", "the training keeps checkpoint files outside the versioned tier "
                                             "(common.save_state): the nodes cannot agree on those; a new attempt "
                                             "restores them from Blob"))
        if self.shared is None:
            found = decide(self.generation, self.limit, 1, {0: report}, {}, False)
            assert found is not None, "one node's own report always decides"
            decision = found
        else:
            try:
                decision = self._agree(report)
            except StoreLost as exc:
                self.lost = str(exc)
                return Decision("end", f"node 0 is gone: {exc}", exit_code=ExitCode.NODE_LOST)
        if decision.result == "restart":
            applied = self.hooks.apply(decision)
            if applied.result != "restart":
                self._leave(applied.reason)
            decision = applied
        return decision

    def _unhealthy(self, problem: dict[str, Any]) -> Decision:
        """This node failed its pre-restart check: it proposes the end before any report of its
        own, so node 0 can decide no restart without it (a decision needs every node's report,
        and the first proposal wins); its report then says why, for the others' records."""
        decision = unhealthy_end({"node": self.node, **problem})
        log.error("%s", decision.reason)
        if self.shared is not None and self.lost is None:
            try:
                self.adopted = self.shared.propose(decision)
                self.shared.report(self.node, {"versions": [], "unhealthy": decision.unhealthy, "written": clock.time()})
            except StoreLost as exc:
                self.lost = str(exc)
        return decision

    def _agree(self, report: dict[str, Any]) -> Decision:
        """Report, then adopt the generation's decision (node 0 makes it; see the module docstring)."""
        assert self.shared is not None
        self.shared.report(self.node, {**report, "written": clock.time()})
        deadline = self.clock() + self.agree_s
        while True:
            adopted = self.shared.decision()
            if adopted is None and self.node == 0:
                adopted = self._decide(deadline)
            if adopted is None and self.node != 0 and self.clock() > deadline + DECIDE_GRACE_S:
                adopted = self.shared.propose(Decision(
                    "end", f"node 0 made no restart decision within {self.agree_s:.0f}s (checkpoint.agree_s)",
                    exit_code=ExitCode.NODE_LOST))
            if adopted is not None:
                self.adopted = adopted
                if adopted.result == "restart" and self.nodes > 1:
                    return self._confirm(adopted)
                return adopted
            clock.sleep(self.store_poll_s)

    def _same_node_again(self) -> Decision | None:
        """Node 0: an end when the node that hung (or missed its first step) in this generation
        also did in the one before: a restart on the same nodes would meet it again, so the job
        ends with the hang's status and the managed run resubmits without that node (its end
        record names it). Read from the store, so every node adopts the same decision."""
        assert self.shared is not None
        if self.generation == 0:
            return None
        now, before = self.shared.failure(), JobAgreement(self.shared.base, self.generation - 1).failure()
        if not now or not before or now.get("cause") not in HANG_CAUSES or before.get("cause") not in HANG_CAUSES:
            return None
        if _stopped_node(now) != _stopped_node(before):
            return None
        return Decision("end", f"node {_stopped_node(now)} stopped again in in-job restart {self.generation} "
                               f"({now.get('cause')}: {now.get('message', '')}): restarting on the same nodes would meet "
                               "it again; the job ends for a new attempt without that node", exit_code=ExitCode.HANG)

    def _decide(self, deadline: float) -> Decision | None:
        """Node 0: the decision once every node reported or the deadline passed, stored."""
        assert self.shared is not None
        if self._again is None:
            self._again = (self._same_node_again(),)  # two store reads once per generation, not per poll
        if self._again[0] is not None:
            return self.shared.propose(self._again[0])
        if self.shared.all_reported(self.nodes):
            found = decide(self.generation, self.limit, self.nodes, self.shared.reports(self.nodes), {}, False)
        elif self.clock() > deadline:
            found = decide(self.generation, self.limit, self.nodes, self.shared.reports_so_far(self.nodes), {}, True)
        else:
            return None
        return self.shared.propose(found) if found is not None else None

