"""amlhpc.jobs.plan.cost: nodes x hours x price, a published figure, stack prices and limits."""

from __future__ import annotations

import pytest

from amlhpc.core import pricing, skus
from amlhpc.core.errors import UserError
from amlhpc.jobs.plan import cost


def test_nag_cosmoflow_figure():
    """NAG's CosmoFlow tutorial (2021): 4 x ND40rs_v2 x 11.5 h at $26.438/h = $1,216.15."""
    est = cost.estimate("Standard_ND40rs_v2", 4, 11.5)
    assert est.usd_per_node_hour == 26.438
    assert est.usd == 1216.15


def test_stack_price_from_the_outputs_wins():
    stack_prices = pricing.price_table(["Standard_ND96asr_v4"], {"Standard_ND96asr_v4": 20.0},
                                       location="swedencentral", reference="Pulumi.dev.yaml")
    est = cost.estimate("Standard_ND96asr_v4", 2, 10, stack_prices)
    assert est.usd == 400.0 and est.price_from_stack
    assert est.price_source == "Pulumi.dev.yaml: aml-hpc:prices.Standard_ND96asr_v4"
    assert est.notes("swedencentral") == []


def test_catalog_price_is_cited():
    est = cost.estimate("Standard_ND96asr_v4", 1, 1)
    assert "Azure Retail Prices API" in est.price_source and "2026-08" in est.price_source


def test_unpriced_size_needs_override():
    assert skus.get("Standard_ND128isr_GB300_v6").price is None
    with pytest.raises(UserError) as info:
        cost.estimate("Standard_ND128isr_GB300_v6", 1, 1)
    assert "aml-hpc:prices.Standard_ND128isr_GB300_v6" in info.value.render()


def test_h200_is_estimated_from_its_public_price():
    """ND H200 v5's public price (Retail Prices API, eastus2, 2026-08-20) makes estimates and
    cost warnings work for the flagship size."""
    est = cost.estimate("Standard_ND96isr_H200_v5", 2, 1)
    assert est.usd_per_node_hour == 84.8


def test_notes_for_low_priority_and_region():
    est = cost.estimate("Standard_ND96asr_v4", 1, 1, priority="LowPriority")
    notes = est.notes("swedencentral")
    assert any("upper bound" in n for n in notes) and any("eastus" in n and "swedencentral" in n for n in notes)


def test_limits():
    assert cost.over_limits(100, 200, 3000) == []
    reasons = cost.over_limits(5000, 1500, 3000)
    assert len(reasons) == 2 and "ceiling $1,500.00" in reasons[0] and "budget $3,000.00" in reasons[1]
