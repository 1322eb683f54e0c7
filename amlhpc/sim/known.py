"""The coordination defects exploration finds in the code as it is, each named, with one run
that shows it and the rule that recognises it in a sweep.

`CASES`: a defect's fixed run (a scenario, a seed, and the settings or faults that make the
defect happen there): its invariant fails while the defect is in the code. The tests hold
each as an expected failure (tests/sim/test_sim_defects.py); a fix turns one into a pass,
and the case then moves to the runs that must keep their invariants.

`cause(outcome)`: which known defect a sweep's violation is, or None for one nobody has
named (a new finding: replay its seed). A sweep passes when every violation it finds has a
cause here; once a defect is fixed its rule goes, and a seed that still breaks the invariant
fails the sweep.
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
    """The invariant it breaks."""
    settings: dict[str, Any] = field(default_factory=dict)
    faults: Callable[[], FaultPlan] | None = None


def _lost_reply(blob: str, nth: int, op: str = "put_blob") -> Callable[[], FaultPlan]:
    return lambda: FaultPlan([RequestFault("lost-reply", op=op, blob=blob, nth=nth, reset_s=0.05)])


LATEST_LOST_REPLY = "lost reply on the latest pointer deletes the manifest it names"
MANIFEST_LOST_REPLY = "lost reply on a manifest blocks newer commits"
PRUNE_READ_ORDER = "prune deletes the version latest names when a commit lands between its reads"
RESTART_SPLIT = "restart decisions diverge"
NO_GENERATION = "restart records and barriers carry no launch generation"
OVERLAPPING_REVIVALS = "two overlapping revivals start two controllers"
WALL_CLOCK_WATCHDOG = "a wall-clock step back blinds the watchdog"
MIXED_LISTING = "nodes list a dataset apart and stage shares of two versions"

CASES: list[Case] = [
    Case(LATEST_LOST_REPLY, "the pointer write applied, its reply lost: the retry's 412 is taken for another "
         "writer and the committed version's manifest is deleted", "checkpoint-commit", 1, "pointer-orphan",
         {"nodes": 2}, _lost_reply("checkpoints/exp/run/versions/latest", 2)),
    Case(LATEST_LOST_REPLY, "the same on a folder stream: every later upload fails reading the manifest `latest` "
         "names", "folder-upload", 1, "commits-stuck", {"settle_s": 120.0},
         _lost_reply("checkpoints/exp/run/latest", 2)),
    Case(MANIFEST_LOST_REPLY, "the manifest written, its reply lost: the retry's 409 raises PointerConflict, which "
         "the version uploader does not catch, and it retries that version first forever", "checkpoint-commit", 1,
         "commits-stuck", {"nodes": 2, "settle_s": 120.0}, _lost_reply("checkpoints/exp/run/versions/manifests/*", 1)),
    Case(PRUNE_READ_ORDER, "a prune by hand reads `latest`, an upload commits, the prune lists the new manifest as "
         "a dead committer's leftover and deletes it", "prune-race", 11, "pointer-orphan"),
    Case(RESTART_SPLIT, "a 503 storm delays one node's report past another node's deadline: one node restarts, "
         "the other ends", "restart-agreement", 139, "split-decision"),
    Case(RESTART_SPLIT, "a storm longer than the retry budget: the error escapes one node's coordinator without "
         "publishing `ended`, the others restart", "restart-agreement", 50, "split-decision"),
    Case(NO_GENERATION, "an earlier launch's stop record (same run id, same node) stops this launch's training",
         "launch-records", 0, "stale-record", {"first_fails": True}),
    Case(NO_GENERATION, "a local rank that arrives before its leader is released with the earlier launch's "
         "restart answer", "launch-records", 0, "stale-record", {"first_fails": False, "leader_late_s": 2.0}),
    Case(OVERLAPPING_REVIVALS, "two revival checks both list no live controller; each takes the lease in turn and "
         "starts one", "revival", 8, "two-controllers"),
    Case(WALL_CLOCK_WATCHDOG, "the wall clock steps back 5 s after the watchdog starts; progress files stamped "
         "before its start are ignored, and a hang right after is never judged", "watchdog-clock", 1, "hang-missed",
         {"nodes": 1, "hang_s": 30.0, "step_s": 1.0, "hang_at_s": 3.5, "clock_node": 0, "clock_step_s": -5.0,
          "clock_at_s": 0.3}),
    Case(MIXED_LISTING, "a dataset is re-uploaded while a job stages it: nodes list it at different moments, each "
         "stages its share of its own listing, and together they hold parts of both versions with files missing",
         "staging", 14, "mixed-dataset"),
]


def _faults_on(outcome: Outcome, *needles: str) -> bool:
    return any(all(n in fault for n in needles) for fault in outcome.faults)


def cause(outcome: Outcome) -> str | None:
    """The known defect behind an outcome's violations, or None (see the module docstring)."""
    kinds, name = outcome.kinds(), outcome.scenario
    if not kinds:
        return None
    if name in ("checkpoint-commit", "folder-upload"):
        latest = _faults_on(outcome, "lost-reply", "latest")
        manifest = _faults_on(outcome, "lost-reply", "manifests")
        if kinds <= {"pointer-orphan", "committed-deleted", "commits-stuck"} and latest:
            return LATEST_LOST_REPLY
        if kinds <= {"commits-stuck", "committed-deleted"} and manifest:
            return MANIFEST_LOST_REPLY
        return None
    rules = {"prune-race": ({"pointer-orphan", "committed-deleted"}, PRUNE_READ_ORDER),
             "restart-agreement": ({"split-decision"}, RESTART_SPLIT),
             "launch-records": ({"stale-record"}, NO_GENERATION),
             "revival": ({"two-controllers"}, OVERLAPPING_REVIVALS),
             "staging": ({"mixed-dataset"}, MIXED_LISTING)}
    if name in rules and kinds <= rules[name][0]:
        return rules[name][1]
    if name == "watchdog-clock" and kinds <= {"hang-missed", "false-hang"} and \
            float(outcome.settings.get("clock_step_s", 0.0)) < 0:
        return WALL_CLOCK_WATCHDOG
    return None
