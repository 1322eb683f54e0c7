"""GPU quota: the vCPUs clusters or a job need per Azure quota bucket, and how the service
names those buckets. One rule for the offline plan (every cluster at maxNodes) and `jobs quota`
(a job, or the stack).

Azure counts dedicated vCPUs per VM family and region, and all dedicated vCPUs of a region
together; low-priority nodes all draw on one regional bucket (Microsoft Learn, "Manage and
increase quotas for resources with Azure Machine Learning", 2026-08).

Azure ML's list-usages response (REST `GET .../locations/{location}/usages`, shaped as in
Azure/azure-rest-api-specs specification/machinelearningservices examples/Usage/list.json,
api-version 2024-10-01) names the buckets in words, not by the compute family id:
"Standard NDSH100v5 Family Cluster Dedicated vCPUs" (type .../vmFamily/usages) for the family
standardNDSH100v5Family, "Total Cluster Dedicated Regional vCPUs" (.../dedicatedCores/usages)
and "Total Cluster LowPriority Regional vCPUs" (.../lowPriorityCores/usages). It repeats
the family rows per workspace and per cluster (.../workspaces/usages, .../computes/usages):
those are what one workspace or cluster uses, not the subscription's bucket, and are skipped.
A limit of -1 means no limit of its own (family rows of low-priority vCPUs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from amlhpc.core import skus

LOW_PRIORITY_QUOTA = "lowPriorityCores"
"""Low-priority (spot) vCPUs share one regional bucket across families."""
DEDICATED_TOTAL_QUOTA = "dedicatedCores"
"""All dedicated vCPUs of a region, across families."""
UNLIMITED = -1


@dataclass(frozen=True)
class Need:
    quota_name: str
    """The bucket Azure checks: the VM family for dedicated, lowPriorityCores or dedicatedCores."""
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


def with_regional_total(wanted: list[Need]) -> list[Need]:
    """`wanted` plus the region's dedicated total (every dedicated family counts against it)."""
    dedicated = [n for n in wanted if n.priority == "Dedicated"]
    if not dedicated:
        return list(wanted)
    total = Need(DEDICATED_TOTAL_QUOTA, "Dedicated", sum(n.vcpus for n in dedicated),
                 tuple(s for n in dedicated for s in n.skus), tuple(sorted({f for n in dedicated for f in n.families})),
                 tuple(c for n in dedicated for c in n.clusters))
    return [*wanted, total]


def _words(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def usage_key(name: str, usage_type: str = "", usage_id: str = "") -> str | None:
    """The bucket a service usage row is about: a family id's words + "dedicated"/"lowpriority",
    lowPriorityCores, dedicatedCores, or None for rows that are not a subscription bucket."""
    kind = usage_type.lower()
    if "/workspace" in kind or "/computes/" in kind:
        return None
    if kind.endswith("lowprioritycores/usages") or _words(name) == "totalclusterlowpriorityregionalvcpus":
        return LOW_PRIORITY_QUOTA
    if kind.endswith("dedicatedcores/usages") or _words(name) == "totalclusterdedicatedregionalvcpus":
        return DEDICATED_TOTAL_QUOTA
    for text in (name, usage_id.rsplit("/", 1)[-1]):
        match = re.fullmatch(r"(.*family)cluster(dedicated|lowpriority)vcpus", _words(text))
        if match:
            return f"{match.group(1)}:{match.group(2)}"
    return None


def need_key(need: Need) -> str:
    """The usage_key() of the service row that bounds `need`."""
    if need.quota_name in (LOW_PRIORITY_QUOTA, DEDICATED_TOTAL_QUOTA):
        return need.quota_name
    return f"{_words(need.quota_name)}:dedicated"


def rdma_cluster_request(cluster: str, sku: skus.Sku, nodes: int, location: str) -> str:
    """The support request that raises Azure ML's node limit for a communication-enabled cluster on an
    RDMA-enabled family (skus.toml [[limit]] azureml.rdma_cluster_nodes), in words a person can file:
    `infra plan` and `jobs submit` say the same."""
    found = skus.limit("azureml", "rdma_cluster_nodes")
    return (f"open a technical support request to the Azure Machine Learning product team (Azure portal > Help + "
            f"support > Create a support request; Issue type: Technical; Service: Machine Learning) asking for "
            f"{nodes} nodes in one communication-enabled cluster ({cluster!r}, {sku.name}, family {sku.quota_family}, "
            f"{location}); until it is granted keep maxNodes at {found.value}")
