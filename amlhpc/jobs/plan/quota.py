"""GPU quota for jobs: what a job (or a stack at full scale) needs per quota bucket, against
what Azure reports as used and allowed.

Needs come from the shared rule (amlhpc.core.quota), plus the region's dedicated total; usage and
limits come from Azure ML (`MLClient.compute.list_usage`, read by amlhpc.jobs.azure.submit into
`UsageRow`s), matched to the buckets by the service's own names (amlhpc.core.quota.usage_key).
Pure: no Azure SDK here.
"""

from __future__ import annotations

from dataclasses import dataclass

from amlhpc.core.quota import (  # noqa: F401 - re-exported for amlhpc.jobs.azure.submit
    DEDICATED_TOTAL_QUOTA,
    LOW_PRIORITY_QUOTA,
    UNLIMITED,
    Need,
    need_key,
    needs,
    usage_key,
    with_regional_total,
)


@dataclass(frozen=True)
class UsageRow:
    """One row of the service's usage list, as plain data."""

    name: str
    type: str
    id: str
    used: int
    limit: int

    @property
    def key(self) -> str | None:
        return usage_key(self.name, self.type, self.id)


@dataclass(frozen=True)
class QuotaLine:
    quota_name: str
    needed: int
    used: int | None
    limit: int | None
    """None: Azure reported no such bucket; UNLIMITED (-1): no limit of its own."""
    clusters: tuple[str, ...]
    label: str = ""
    """The service's name for the bucket ("Standard NDSH100v5 Family Cluster Dedicated vCPUs")."""

    @property
    def available(self) -> int | None:
        if self.limit is None or self.used is None or self.limit == UNLIMITED:
            return None
        return self.limit - self.used

    @property
    def ok(self) -> bool | None:
        if self.limit == UNLIMITED:
            return True
        return None if self.available is None else self.needed <= self.available

    def hint(self, location: str) -> str:
        if self.ok is not False:
            return ""
        kind = "low-priority" if self.quota_name == LOW_PRIORITY_QUOTA else "dedicated"
        bucket = self.label or self.quota_name
        return (f"request {self.needed - (self.available or 0)} more {kind} vCPUs of {bucket!r} in {location} "
                "(Azure portal > Quotas > Machine learning), or use fewer nodes")


def compare(wanted: list[Need], usage: list[UsageRow]) -> list[QuotaLine]:
    """Join needs (and the regional dedicated total) with the service's usage rows."""
    rows = {row.key: row for row in usage if row.key}
    lines = []
    for need in with_regional_total(wanted):
        row = rows.get(need_key(need))
        lines.append(QuotaLine(need.quota_name, need.vcpus, row.used if row else None, row.limit if row else None,
                               need.clusters, row.name if row else ""))
    return lines
