"""jobs.quota: vCPUs per family (dedicated) or lowPriorityCores, against usage."""

from __future__ import annotations

from jobs import quota


def test_needs_by_family_and_low_priority():
    needs = quota.needs([("nd-a100", "Standard_ND96asr_v4", "LowPriority", 2),
                         ("nd-h100", "Standard_ND96isr_H100_v5", "Dedicated", 8),
                         ("nc", "Standard_NC24ads_A100_v4", "LowPriority", 1)])
    by_name = {n.quota_name: n for n in needs}
    assert by_name["lowPriorityCores"].vcpus == 2 * 96 + 24
    assert by_name["standardNDSH100v5Family"].vcpus == 8 * 96


def test_compare_flags_shortfall_case_insensitively():
    needs = quota.needs([("nd-h100", "Standard_ND96isr_H100_v5", "Dedicated", 8)])
    lines = quota.compare(needs, {"StandardNDSH100v5Family": (96, 384)})
    assert lines[0].available == 288 and lines[0].ok is False
    assert "request 480 more dedicated vCPUs" in lines[0].hint("eastus")
    assert quota.compare(needs, {})[0].ok is None
