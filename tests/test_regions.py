"""Regions: any programmatic region name is valid (Azure adds regions; the list only helps
with suggestions and with saying what the catalog knows); display names and typos that are
not region-shaped are refused with the near match."""

from __future__ import annotations

import pytest

from amlhpc.core import regions


@pytest.mark.parametrize("name", ["eastus", "swedencentral", "eastus2euap", "usgovvirginia", "newregion3"])
def test_programmatic_names_are_valid(name):
    assert regions.check(name) is None


@pytest.mark.parametrize("name,near", [("East US", "eastus"), ("Sweden Central", "swedencentral"),
                                       ("west-europe", "westeurope"), ("UKSouth", "uksouth")])
def test_display_forms_get_the_programmatic_name(name, near):
    problem = regions.check(name)
    assert problem and "not an Azure region's programmatic name" in problem and near in problem


def test_unknown_but_valid_regions_are_not_known():
    assert regions.check("saudiarabiacentral") is None
    assert "saudiarabiacentral" not in regions.KNOWN and "eastus" in regions.KNOWN


def test_no_suggestion_when_nothing_is_near():
    assert regions.check("!!") == "'!!' is not an Azure region's programmatic name"
