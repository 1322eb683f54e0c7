"""GPU quota: the vCPUs clusters or a job need per Azure quota bucket. One rule for the
offline plan (every cluster at maxNodes) and `jobs quota` (a job, or the stack).

Azure counts dedicated vCPUs per VM family and region; low-priority nodes all draw on
one regional `lowPriorityCores` bucket (Microsoft Learn, "Manage and increase quotas for
resources with Azure Machine Learning", 2026-08).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from core import skus

LOW_PRIORITY_QUOTA = "lowPriorityCores"
"""Low-priority (spot) vCPUs share one regional bucket across families."""


@dataclass(frozen=True)
class Need:
    quota_name: str
    """The usage name Azure checks: the VM family for dedicated, lowPriorityCores otherwise."""
    priority: str
    vcpus: int
    skus: tuple[str, ...]
    families: tuple[str, ...]
    clusters: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"quotaName": self.quota_name, "priority": self.priority, "vcpusNeeded": self.vcpus,
                "families": list(self.families), "clusters": list(self.clusters)}


def quota_name(sku_name: str, priority: str) -> str:
    return LOW_PRIORITY_QUOTA if priority == "LowPriority" else skus.get(sku_name).quota_family


def needs(requests: Iterable[tuple[str, str, str, int]]) -> list[Need]:
    """Aggregate (cluster, size, priority, nodes) requests into vCPUs per quota bucket."""
    totals: dict[tuple[str, str], tuple[int, list[str], list[str], list[str]]] = {}
    for cluster, sku_name, priority, nodes in requests:
        sku = skus.get(sku_name)
        key = (quota_name(sku.name, priority), "LowPriority" if priority == "LowPriority" else "Dedicated")
        vcpus, sizes, families, clusters = totals.get(key, (0, [], [], []))
        totals[key] = (vcpus + nodes * sku.vcpus, sizes, families, clusters)
        for bucket, value in ((sizes, sku.name), (families, sku.quota_family)):
            if value not in bucket:
                bucket.append(value)
        clusters.append(cluster)
    return [Need(name, priority, vcpus, tuple(sizes), tuple(sorted(families)), tuple(clusters))
            for (name, priority), (vcpus, sizes, families, clusters) in sorted(totals.items())]
