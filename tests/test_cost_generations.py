"""`jobs estimate` and `jobs quota` know every catalog size: a priced size is costed at its
catalog price, an unpriced one (ND H200 v5, MI300X, GB200/GB300: no public price recorded)
says how to get one, and every size needs vCPUs of its own quota family."""

from __future__ import annotations

import pytest

from amlhpc.core import skus
from amlhpc.core.errors import UserError
from amlhpc.core.skus import Price
from amlhpc.jobs.plan import cost, quota

NEW = ["Standard_ND96isr_H200_v5", "Standard_ND96isr_MI300X_v5", "Standard_ND128isr_NDR_GB200_v6",
       "Standard_ND128isr_GB300_v6", "Standard_NC40ads_H100_v5", "Standard_NC80adis_H100_v5", "Standard_NC48ads_A100_v4"]


@pytest.mark.parametrize("name", skus.names())
def test_every_size_is_costed_or_says_how_to_price_it(name):
    sku = skus.get(name)
    if sku.price is not None:
        estimate = cost.estimate(name, 2, 1.5)
        assert estimate.usd == round(2 * 1.5 * sku.price.usd_per_hour, 2)
        return
    with pytest.raises(UserError) as info:
        cost.estimate(name, 2, 1.5)
    text = info.value.render()
    assert f"aml-hpc:prices.{name}" in text and f"python -m amlhpc.core.catalog refresh --size {name}" in text
    stack = {name: Price(120.0, "eastus", "stack", "Pulumi.dev.yaml: aml-hpc:prices")}
    assert cost.estimate(name, 2, 1.5, stack).usd == 360.0


@pytest.mark.parametrize("name", NEW)
def test_every_new_size_needs_its_own_quota_family(name):
    sku = skus.get(name)
    (need,) = quota.needs([("c", name, "Dedicated", 3)])
    assert need.quota_name == sku.quota_family and need.vcpus == 3 * sku.vcpus
    (low,) = quota.needs([("c", name, "LowPriority", 3)])
    assert low.quota_name == "lowPriorityCores"


def test_the_new_nc_sizes_are_priced():
    for name in ("Standard_NC40ads_H100_v5", "Standard_NC80adis_H100_v5", "Standard_NC48ads_A100_v4"):
        assert skus.get(name).price.usd_per_hour > 0
