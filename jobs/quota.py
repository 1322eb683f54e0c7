"""GPU quota: vCPUs a job (or a stack at full scale) needs per VM family, against what is left.

Azure counts quota in vCPUs per VM family and region for dedicated nodes; low-priority
nodes all draw on one regional `lowPriorityCores` bucket. Needs come from the catalog;
usage and limits come from Azure ML (`MLClient.compute.list_usage`, via jobs.submit),
passed in here as plain numbers so this module stays pure and testable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from infra import skus


@dataclass(frozen=True)
class Need:
    quota_name: str
    """The usage name Azure reports: the VM family, or lowPriorityCores."""
    vcpus: int
    skus: tuple[str, ...]
    clusters: tuple[str, ...]


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
        kind = "low-priority" if self.quota_name == skus.LOW_PRIORITY_QUOTA else "dedicated"
        return (f"request {self.needed - (self.available or 0)} more {kind} vCPUs of {self.quota_name} in {location} "
                "(Azure portal > Quotas > Machine learning), or use fewer nodes")


def quota_name(sku_name: str, priority: str) -> str:
    return skus.LOW_PRIORITY_QUOTA if priority == "LowPriority" else skus.get(sku_name).quota_family


def needs(requests: Iterable[tuple[str, str, str, int]]) -> list[Need]:
    """Aggregate (cluster, sku, priority, nodes) requests into vCPUs per quota bucket."""
    totals: dict[str, list] = {}
    for cluster, sku_name, priority, nodes in requests:
        name = quota_name(sku_name, priority)
        entry = totals.setdefault(name, [0, [], []])
        entry[0] += nodes * skus.get(sku_name).vcpus
        if sku_name not in entry[1]:
            entry[1].append(sku_name)
        entry[2].append(cluster)
    return [Need(k, v[0], tuple(v[1]), tuple(v[2])) for k, v in sorted(totals.items())]


def compare(wanted: list[Need], usage: dict[str, tuple[int, int]]) -> list[QuotaLine]:
    """Join needs with {quota name (case-insensitive): (used, limit)} from Azure."""
    lowered = {k.lower(): v for k, v in usage.items()}
    lines = []
    for need in wanted:
        used, limit = lowered.get(need.quota_name.lower(), (None, None))
        lines.append(QuotaLine(need.quota_name, need.vcpus, used, limit, need.clusters))
    return lines
