"""amlhpc.core.quota and amlhpc.jobs.plan.quota: vCPUs per bucket (family, regional dedicated total, low priority)
and the service's names for the buckets (Azure/azure-rest-api-specs
machinelearningservices examples/Usage/list.json, api-version 2024-10-01)."""

from __future__ import annotations

import pytest

from amlhpc.core.quota import usage_key
from amlhpc.jobs.plan import quota


def row(name, used, limit, kind="vmFamily", rid=""):
    return quota.UsageRow(name, f"Microsoft.MachineLearningServices/{kind}/usages", rid, used, limit)


def test_needs_by_family_and_low_priority():
    needs = quota.needs([("nd-a100", "Standard_ND96asr_v4", "LowPriority", 2),
                         ("nd-h100", "Standard_ND96isr_H100_v5", "Dedicated", 8),
                         ("nc", "Standard_NC24ads_A100_v4", "LowPriority", 1)])
    by_name = {n.quota_name: n for n in needs}
    assert by_name["lowPriorityCores"].vcpus == 2 * 96 + 24
    assert by_name["standardNDSH100v5Family"].vcpus == 8 * 96


@pytest.mark.parametrize("name, kind, rid, key", [
    # the names of the specs' example
    ("Standard NCv3 Family Cluster Dedicated vCPUs", "vmFamily", "", "standardncv3family:dedicated"),
    ("Standard NC Family Cluster LowPriority vCPUs", "vmFamily", "", "standardncfamily:lowpriority"),
    ("Total Cluster Dedicated Regional vCPUs", "dedicatedCores", "", "dedicatedCores"),
    ("Total Cluster LowPriority Regional vCPUs", "lowPriorityCores", "", "lowPriorityCores"),
    ("Standard DSv2 Family Cluster Dedicated vCPUs", "workspaces", "", None),
    ("Standard NC Family Cluster Dedicated vCPUs", "workspace/computes", "", None),
    ("Clusters", "totalCores", "", None),
    # a localized name: the id still says which bucket
    ("Familie NDSH100v5", "vmFamily", "/subscriptions/x/usages/Standard_NDSH100v5_Family_Cluster_Dedicated_vCPUs",
     "standardndsh100v5family:dedicated"),
])
def test_service_names_map_to_buckets(name, kind, rid, key):
    assert usage_key(name, f"Microsoft.MachineLearningServices/{kind}/usages", rid) == key


def test_catalog_families_match_the_service_names():
    """standardNDSv2Family <-> 'Standard NDSv2 Family Cluster Dedicated vCPUs', and so on for each size."""
    from amlhpc.core import skus

    for sku in skus.CATALOG.values():
        words = sku.quota_family.removeprefix("standard").removeprefix("Standard").removesuffix("Family")
        need = quota.needs([("c", sku.name, "Dedicated", 1)])[0]
        assert quota.need_key(need) == usage_key(f"Standard {words} Family Cluster Dedicated vCPUs", "x/vmFamily/usages")


def test_compare_flags_shortfall_and_the_regional_total():
    needs = quota.needs([("nd-h100", "Standard_ND96isr_H100_v5", "Dedicated", 8)])
    lines = {line.quota_name: line for line in quota.compare(needs, [
        row("Standard NDSH100v5 Family Cluster Dedicated vCPUs", 96, 384),
        row("Total Cluster Dedicated Regional vCPUs", 0, 1000, "dedicatedCores")])}
    family = lines["standardNDSH100v5Family"]
    assert family.available == 288 and family.ok is False
    assert "request 480 more dedicated vCPUs of 'Standard NDSH100v5 Family Cluster Dedicated vCPUs'" in family.hint("eastus")
    assert lines["dedicatedCores"].ok is True
    assert all(line.ok is None for line in quota.compare(needs, []))


def test_minus_one_is_no_limit():
    needs = quota.needs([("nd", "Standard_ND96asr_v4", "LowPriority", 100)])
    line = quota.compare(needs, [row("Total Cluster LowPriority Regional vCPUs", 0, -1, "lowPriorityCores")])[0]
    assert line.ok is True and line.available is None
