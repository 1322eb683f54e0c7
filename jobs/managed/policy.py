"""The rules one managed run follows: how often to retry what, how long to wait, what it
may cost. Rendered at submit from the recipe's `managed` block and the stack's outputs,
carried to the controller as JSON, kept in the run's record.

Cost: an attempt costs nodes x hours running x the price per node-hour the submit
estimate used (low priority at the on-demand price: an upper bound, jobs/cost.py); the
controller adds its own node's hours at the controller cluster's price. The limit is the
smaller of the recipe's cost.ceiling_usd and the stack's monthly budget. The first attempt
is the one the user approved at submit; every further attempt is the controller's own
decision, so it starts one only while what was spent plus what one more attempt would cost
(the expected hours not yet run, at least a tenth of them) stays within the limit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from jobs.managed import causes

MIN_REMAINING_SHARE = 0.1
"""An attempt after a restart is budgeted at least this share of the expected hours (it
resumes from a checkpoint, but starting and restoring take time)."""


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

    def backoff(self, restart: int) -> float:
        """Seconds to wait before restart number `restart` (1, 2, ...): doubling, capped."""
        return min(self.backoff_max_s, self.backoff_s * 2 ** max(0, restart - 1))

    def attempt_usd(self, hours: float) -> float:
        return self.nodes * self.usd_per_node_hour * max(0.0, hours)

    def next_attempt_usd(self, hours_run: float) -> float:
        """What one more attempt is budgeted at: the expected hours not yet run, at least a share."""
        remaining = max(self.expected_hours - hours_run, self.expected_hours * MIN_REMAINING_SHARE)
        return self.attempt_usd(remaining)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["retry_on"] = list(self.retry_on)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Policy:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["retry_on"] = tuple(known.get("retry_on", causes.DEFAULT_RETRY_ON))
        return cls(**known)
