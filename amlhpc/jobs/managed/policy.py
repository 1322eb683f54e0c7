"""The rules one managed run follows: how often to retry what, how long to wait, where an
attempt runs, what it may cost. Rendered at submit from the recipe's `managed` block and
the stack's outputs and carried to the controller in its own job definition
(AMLHPC_MANAGED_JSON). The controller takes its rules from there only: the copy in the
run's record is for people reading it, never read back (a blob is not where orders come
from).

Cost: an attempt is charged from its submission - queued and preparing time included -
to its end, at nodes x the price per node-hour of the cluster it runs on (low priority at
the on-demand price: an upper bound, amlhpc/jobs/plan/cost.py); the controller adds its own node's
hours. The limit is the smaller of the recipe's cost.ceiling_usd and the stack's monthly
budget, and it binds all attempts together:

- between attempts, the next one starts only while what was spent plus what it would cost
  (the expected hours not yet run, at least a tenth of them) stays within the limit;
- during an attempt, at every look, the controller cancels it when what was spent plus
  the cost of the time to the next checkpoint would pass the limit (work after the last
  checkpoint is lost either way; stopping now saves the money). It acts only at its looks,
  so the total passes the limit by at most one polling interval's cost, plus what the job
  costs while Azure ML stops it.

Where an attempt runs: the recipe's cluster, then each cluster of `managed.fallback_clusters`
in order. The next attempt moves one cluster on after an attempt queued longer than
`managed.queue_timeout_s`, or after `managed.fallback_after_preemptions` preemptions on
the cluster (LowPriority first, then Dedicated).

On how many nodes (shrink-and-continue, `shrink_nodes`): the target's count, except after a
node was lost and the next attempt could not get the full count (queue timeout, or the
cluster's capacity answer): then the next smaller count of `shrink_nodes` (from the
recipe's `managed.min_nodes`), down to the smallest, before moving to the next cluster.
Cost is node-hours: an attempt on fewer nodes costs less per hour and is expected to run
longer, so the budget for the rest of the run does not depend on the count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from amlhpc.jobs.managed import causes

MIN_REMAINING_SHARE = 0.1
"""An attempt after a restart is budgeted at least this share of the expected hours (it
resumes from a checkpoint, but starting and restoring take time)."""
DEFAULT_TEMPLATE = "managed/training-job.yml"


@dataclass(frozen=True)
class Target:
    """A cluster an attempt can run on, with the training job template rendered for it."""

    cluster: str
    nodes: int
    usd_per_node_hour: float
    priority: str = "Dedicated"
    template: str = DEFAULT_TEMPLATE
    """Path of the job template inside the controller's code snapshot."""
    max_nodes: int = 0
    """The cluster's maxNodes (stack outputs), for its capacity answer; 0: unknown."""

    @property
    def usd_per_hour(self) -> float:
        return self.nodes * self.usd_per_node_hour


@dataclass(frozen=True)
class Policy:
    nodes: int
    usd_per_node_hour: float
    expected_hours: float
    max_restarts: int = 3
    retry_on: tuple[str | int, ...] = causes.DEFAULT_RETRY_ON
    backoff_s: float = 60.0
    backoff_max_s: float = 900.0
    limit_usd: float | None = None
    limit_source: str = ""
    controller_usd_per_hour: float = 0.0
    poll_s: float = 30.0
    targets: tuple[Target, ...] = field(default_factory=tuple)
    """Where attempts run, in fallback order; empty: one unnamed target of `nodes` at `usd_per_node_hour`."""
    queue_timeout_s: float | None = None
    """An attempt queued longer than this is canceled and resubmitted on the next target."""
    fallback_after_preemptions: int = 2
    """Preemptions on one target after which the next attempt goes to the next target."""
    checkpoint_interval_s: float | None = None
    """The training's checkpoint interval (recipe checkpoint.interval_s), for the budget stop."""
    straggler_factor: float | None = 1.5
    """The slowdown to name: a node whose own work per step (before waiting for peers, timed on
    the device) stays this many times its peers' median is named a straggler after
    `straggler_looks` windows in a row; the rule is robust to per-step noise
    (amlhpc.jobs.managed.stragglers)."""
    straggler_looks: int = 3
    stall_s: float = 900.0
    """An attempt Azure ML reports Paused, Unknown or NotResponding this long is canceled and retried."""
    silent_node_s: float | None = 1800.0
    """An attempt Azure ML reports Running while a node's heartbeat has not changed this long
    (the controller's own clock; a node that never wrote one: from the first heartbeat of any
    node) is canceled and retried, the silent node named; None: off."""
    lease_s: int = 60
    """The record's lease (Blob: 15..60 s); a controller silent this long is replaced."""
    outage_backoff_max_s: float = 300.0
    """While Azure or storage does not answer, looks back off up to this; supervision never gives up."""
    shrink_nodes: tuple[int, ...] = ()
    """Shrink-and-continue: the node counts below the targets' that an attempt may use after a
    lost node when the cluster cannot give the full count, largest first; each is one the
    training's global batch splits over (render.py, from managed.min_nodes). Empty: never."""

    def __post_init__(self) -> None:
        if not self.targets:
            object.__setattr__(self, "targets", (Target("", self.nodes, self.usd_per_node_hour),))

    def target(self, index: int) -> Target:
        return self.targets[max(0, min(index, len(self.targets) - 1))]

    def backoff(self, restart: int) -> float:
        """Seconds to wait before restart number `restart` (1, 2, ...): doubling, capped."""
        return min(self.backoff_max_s, self.backoff_s * 2 ** max(0, restart - 1))

    def outage_wait(self, failures: int) -> float:
        """Seconds before the next look after `failures` failed looks in a row: doubling, capped."""
        return min(self.outage_backoff_max_s, self.poll_s * 2 ** max(0, min(failures - 1, 16)))

    def attempt_usd(self, hours: float, target: Target | None = None) -> float:
        return (target or self.targets[0]).usd_per_hour * max(0.0, hours)

    def next_attempt_usd(self, node_hours_run: float, target: Target | None = None) -> float:
        """What one more attempt is budgeted at: the expected node-hours not yet run (at least a
        share) at the target's price per node-hour - the same on fewer nodes, which run longer."""
        target = target or self.targets[0]
        planned = self.expected_hours * target.nodes
        remaining = max(planned - node_hours_run, planned * MIN_REMAINING_SHARE)
        return target.usd_per_node_hour * remaining

    def smaller(self, nodes: int, capacity: int | None = None) -> int | None:
        """The count a shrunk attempt uses after one on `nodes` could not get them: the largest
        of `shrink_nodes` below `nodes` (and within `capacity`, when the cluster said); None
        when there is none (then the run moves on to the next cluster)."""
        return next((n for n in sorted(self.shrink_nodes, reverse=True)
                     if n < nodes and (capacity is None or n <= capacity)), None)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["retry_on"] = list(self.retry_on)
        data["targets"] = [asdict(t) for t in self.targets]
        data["shrink_nodes"] = list(self.shrink_nodes)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Policy:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["retry_on"] = tuple(known.get("retry_on", causes.DEFAULT_RETRY_ON))
        known["targets"] = tuple(Target(**{k: v for k, v in t.items() if k in Target.__dataclass_fields__})
                                 for t in known.get("targets") or ())
        known["shrink_nodes"] = tuple(known.get("shrink_nodes") or ())
        return cls(**known)
