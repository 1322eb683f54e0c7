"""The coordination defects exploration finds in the code as it is, each named, with one run
that shows it and the rule that recognises it in a sweep; and the defects it found before
that the code no longer has, each with the run that showed it.

`CASES`: a remaining defect's fixed run (a scenario, a seed, and the settings or faults that
make the defect happen there): its invariant fails while the defect is in the code. The
tests hold each as a strict expected failure (tests/sim/test_sim_defects.py); a fix turns one
into an unexpected pass, and the case then moves to `FIXED`.

`FIXED`: the runs that showed the defects since fixed. The tests run each as a plain test:
its invariant must hold, and its fault must fire (a run whose fault never fires proves
nothing).

`cause(outcome)`: which remaining defect a sweep's violation is, or None for one nobody has
named (a new finding, or a fixed defect come back: replay its seed). A sweep passes when
every violation it finds has a cause here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amlhpc.sim.faults import FaultPlan, RequestFault
from amlhpc.sim.scenario import Outcome


@dataclass(frozen=True)
class Case:
    defect: str
    """Its name, as the sweeps report it."""
    what: str
    scenario: str
    seed: int
    kind: str
    """The invariant it breaks (or broke)."""
    settings: dict[str, Any] = field(default_factory=dict)
    faults: Callable[[], FaultPlan] | None = None


def _lost_reply(blob: str, nth: int, op: str = "put_blob") -> Callable[[], FaultPlan]:
    return lambda: FaultPlan([RequestFault("lost-reply", op=op, blob=blob, nth=nth, reset_s=0.05)])


# --- remaining -------------------------------------------------------------------------
CASES: list[Case] = []  # none remains: each defect found so far is fixed (FIXED below)

# --- fixed -----------------------------------------------------------------------------
LATEST_LOST_REPLY = "lost reply on the latest pointer deletes the manifest it names"
MANIFEST_LOST_REPLY = "lost reply on a manifest blocks newer commits"
PRUNE_READ_ORDER = "prune deletes the version latest names when a commit lands between its reads"
RESTART_SPLIT = "restart decisions diverge"
NO_GENERATION = "restart records and barriers carry no launch generation"
OVERLAPPING_REVIVALS = "two overlapping revivals start two controllers"
WALL_CLOCK_WATCHDOG = "a wall-clock step back blinds the watchdog"
STORE_DROP = "a node whose store connection drops once takes node 0 for lost and ends alone"
MIXED_LISTING = "nodes list a dataset apart and stage shares of two versions"
MISSED_LEADS = "a follower that missed node 0's leads never stages the versions every node holds"
LONG_PARTITION = "a node cut off from node 0's store past the grace ends alone while the others restart"
REWRITTEN_BLOCKS_COMMITS = "a manifest another job rewrote stops every later commit of the run"
REWRITTEN_BLOCKS_PRUNE = "a kept manifest another job rewrote fails retention after every commit"
CONFLICT_WITHDRAWS_SEEN = "a pointer conflict after a lost reply withdraws a version the controller pinned"

FIXED: list[Case] = [
    Case(LATEST_LOST_REPLY, "the pointer write applied, its reply lost: the retry's 412 was taken for another "
         "writer and the committed version's manifest deleted; now the writer reads the pointer back "
         "(blob/writes.py)", "checkpoint-commit", 1, "pointer-orphan",
         {"nodes": 2}, _lost_reply("checkpoints/exp/run/versions/latest", 2)),
    Case(LATEST_LOST_REPLY, "the same on a folder stream: every later upload failed reading the manifest `latest` "
         "named", "folder-upload", 1, "commits-stuck", {"settle_s": 120.0},
         _lost_reply("checkpoints/exp/run/latest", 2)),
    Case(MANIFEST_LOST_REPLY, "the manifest written, its reply lost: the retry's 409 raised PointerConflict and the "
         "version uploader retried that version first for ever; now the manifest is read back", "checkpoint-commit",
         1, "commits-stuck", {"nodes": 2, "settle_s": 120.0}, _lost_reply("checkpoints/exp/run/versions/manifests/*", 1)),
    Case(PRUNE_READ_ORDER, "a prune by hand read `latest`, an upload committed, the prune listed the new manifest as "
         "a dead committer's leftover and deleted it; now prune lists first", "prune-race", 11, "pointer-orphan"),
    Case(RESTART_SPLIT, "a node's report later than another node's deadline: each node decided on its own deadline "
         "from the reports it had read; now node 0 stores one decision that every node adopts", "restart-agreement",
         139, "split-decision", {"nodes": 3, "agree_s": 20.0, "slow_node": 2, "slow_s": 25.0, "lacks_newest": []}),
    Case(RESTART_SPLIT, "an error escaping one node's coordinator left the others to restart without it; now the "
         "coordinator proposes an end in a `finally`", "restart-agreement", 50, "split-decision",
         {"report_fails": 2}),
    Case(NO_GENERATION, "an earlier launch's stop record (same run id, same node) stopped this launch's training; "
         "now a launch's records are keyed by its generation", "launch-records", 0, "stale-record",
         {"first_fails": True}),
    Case(NO_GENERATION, "a local rank that arrived before its leader was released with the earlier launch's "
         "restart answer", "launch-records", 0, "stale-record", {"first_fails": False, "leader_late_s": 2.0}),
    Case(OVERLAPPING_REVIVALS, "two revival checks both listed no live controller and each started one; now a "
         "revival lists again after taking the lease", "revival", 8, "two-controllers"),
    Case(WALL_CLOCK_WATCHDOG, "the wall clock stepped back 5 s after the watchdog started; progress filtered by "
         "file times hid a hang right after; now ages are monotonic", "watchdog-clock", 1, "hang-missed",
         {"nodes": 1, "hang_s": 30.0, "step_s": 1.0, "hang_at_s": 3.5, "clock_node": 0, "clock_step_s": -5.0,
          "clock_at_s": 0.3}),
    Case(STORE_DROP, "one node's connection to the job's store reset once while node 0 lived: any transport error "
         "was taken for node 0 gone, the node ended with exit 10 alone and the others adopted node 0's restart; now "
         "a call is tried again (and the connection opened again) for kvstore.RECONNECT_GRACE_S first",
         "restart-agreement", 19, "split-decision", {"drop_lost": "request"}),
    Case(STORE_DROP, "the same reset after the store applied the call (its reply lost)", "restart-agreement", 19,
         "split-decision", {"drop_lost": "reply"}),
    Case(MIXED_LISTING, "a dataset re-uploaded while a job staged it: nodes listed it at different moments, each "
         "staged its share of its own listing, and together they held parts of both versions with files missing; now "
         "an upload writes a new version and commits its manifest last, and the nodes agree on one manifest through "
         "the job's store", "staging", 14, "mixed-dataset"),
    Case(MISSED_LEADS, "a follower's pending-record write lost its reply and its retry took a minute while node 0 "
         "led version after version; followers staged only the version led then, and the last one led was one that "
         "follower never held (its last save failed), so every older version they all held stayed pending and "
         "`latest` stopped moving, with no error; now node 0 keeps a log of its leads on the job's store (one "
         "create-only key each) and a follower stages the newest led version it holds, then the older ones, until a "
         "commit settles them", "checkpoint-commit", 8, "commits-stuck", {"short_node": 3}),
    Case(LONG_PARTITION, "node 1 reported, then was cut off from node 0's store for 46 s (past kvstore."
         "RECONNECT_GRACE_S) while node 0 decided a restart: node 1 took node 0 for lost and ended with exit 10, the "
         "others restarted without it (and would hang at rendezvous); now every node confirms an adopted restart "
         "(restart.CONFIRM_S), and one that never does ends every node on the next generation's failure and end",
         "restart-agreement", 6, "split-decision",
         {"cut_node": 1, "cut_at_s": 10.2, "cut_s": 46.0, "kill_node": None, "apply_fails": None, "report_fails": None,
          "drop_node": None}),
    Case(REWRITTEN_BLOCKS_COMMITS, "another job rewrote the manifest `latest` named; each later upload read that "
         "version through its checked pointer to reuse its unchanged files, was refused (UnsafeCheckpoint) and "
         "committed nothing, in this attempt and the next; now an unusable previous version is uploaded past whole",
         "restore-pin", 4, "commit-refused"),
    Case(REWRITTEN_BLOCKS_PRUNE, "retention read every kept manifest through its checked digest and raised on the "
         "rewritten one, after the commit: every upload reported a failure for a version it had committed; now "
         "retention deletes no data blob while such a version is kept", "restore-pin", 49, "commit-refused"),
    Case(CONFLICT_WITHDRAWS_SEEN, "the run's pointer write applied, its reply lost, and another job moved the pointer "
         "before the retry: the retry's conflict withdrew the version's manifest, though the controller had seen it "
         "committed and pinned it for the next attempt, which then restored nothing; now a conflict keeps the manifest",
         "restore-pin", 45, "seen-deleted"),
]


def cause(outcome: Outcome) -> str | None:
    """The remaining defect behind an outcome's violations, or None (see the module docstring)."""
    # One rule per remaining defect goes here (a scenario and the kinds it breaks); none remains.
    del outcome
    return None
