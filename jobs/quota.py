"""GPU quota for jobs: what a job (or a stack at full scale) needs per quota bucket, against
what Azure reports as used and allowed.

Needs come from the shared rule (core.quota); usage and limits come from Azure ML
(`MLClient.compute.list_usage`, via jobs.submit), passed in here as plain numbers so this
module stays pure and testable.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.quota import LOW_PRIORITY_QUOTA, Need, needs  # noqa: F401 - re-exported for jobs.submit


@dataclass(frozen=True)
class QuotaLine:
    quota_name: str
    needed: int
    used: int | None
    limit: int | None
    clusters: tuple[str, ...]

    @property
    def available(self) -> int | None:
        return None if self.limit is None or self.used is None else self.limit - self.used

    @property
    def ok(self) -> bool | None:
        return None if self.available is None else self.needed <= self.available

    def hint(self, location: str) -> str:
        if self.ok is not False:
            return ""
        kind = "low-priority" if self.quota_name == LOW_PRIORITY_QUOTA else "dedicated"
        return (f"request {self.needed - (self.available or 0)} more {kind} vCPUs of {self.quota_name} in {location} "
                "(Azure portal > Quotas > Machine learning), or use fewer nodes")


def compare(wanted: list[Need], usage: dict[str, tuple[int, int]]) -> list[QuotaLine]:
    """Join needs with {quota name (case-insensitive): (used, limit)} from Azure."""
    lowered = {k.lower(): v for k, v in usage.items()}
    lines = []
    for need in wanted:
        used, limit = lowered.get(need.quota_name.lower(), (None, None))
        lines.append(QuotaLine(need.quota_name, need.vcpus, used, limit, need.clusters))
    return lines
