"""Where each VM size is offered: the data file is strict, the answer names the regions that
have a size, and a capture of Azure's Resource SKUs API refreshes it. The capture is shaped by
azure-mgmt-compute's own ResourceSku model, not by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
from azure.mgmt.compute.models import ResourceSku, ResourceSkuLocationInfo

from amlhpc.core import availability, skus
from amlhpc.core.skus import CatalogError
from amlhpc.infra.config import REPO_ROOT

TODAY = date(2026, 11, 23)


def test_every_catalog_size_has_a_recorded_offering():
    """A size added to skus.toml without its regions fails here, not at a user's `pulumi up`."""
    assert set(availability.OFFERINGS) == set(skus.CATALOG)


def test_every_offering_cites_a_dated_source():
    for offering in availability.OFFERINGS.values():
        source = availability.SOURCES[offering.source]
        assert source.url.startswith("https://") and source.as_of[:2] == "20"


def test_the_shipped_stacks_use_sizes_offered_in_their_regions():
    from amlhpc.infra.config import load_stack_config
    for stack in ("dev", "prod"):
        cfg = load_stack_config(stack)
        for cluster in cfg.clusters:
            assert availability.problem(cluster.sku, cfg.location, TODAY) is None, (stack, cluster.sku)


def test_a_size_missing_from_a_region_names_the_regions_that_have_it():
    message, fix = availability.problem("Standard_ND96isr_H100_v5", "brazilsouth", TODAY)
    assert "Standard_ND96isr_H100_v5 is not offered in brazilsouth" in message
    assert "eastus" in message and "swedencentral" in message and "(2025-06)" in message
    assert "az vm list-skus --all" in fix and "python -m amlhpc.core.availability refresh" in fix


def test_a_retired_size_is_offered_nowhere_after_its_date():
    message, fix = availability.problem("Standard_NC24s_v3", "eastus", TODAY)
    assert "retired on 2025-09-30" in message and "NCv3" in message
    assert "Standard_NC96ads_A100_v4" in fix


def test_a_region_seen_in_a_public_deployment_log_counts_with_its_own_source():
    """Standard_ND96isr_H100_v5 in southafricanorth: absent from the snapshot, shown deployed
    in a public walkthrough; the refusal for another region cites both sources."""
    h100 = availability.offering("Standard_ND96isr_H100_v5")
    assert h100.offered_in("southafricanorth", TODAY)
    assert dict(h100.seen_in) == {"southafricanorth": "azcluster-h100-southafricanorth"}
    source = availability.SOURCES["azcluster-h100-southafricanorth"]
    assert source.url.startswith("https://github.com/edwardsp/azcluster/") and source.as_of == "2026-05-24"
    message, _ = availability.problem("Standard_ND96isr_H100_v5", "brazilsouth", TODAY)
    assert "southafricanorth" in message and "southafricanorth: edwardsp/azcluster walkthrough" in message


def test_seen_in_needs_a_known_source_and_a_new_region(tmp_path):
    bad = tmp_path / "availability.toml"
    head = '[[size]]\nname = "Standard_ND96asr_v4"\nregions = ["eastus"]\nsource = "x"\n'
    tail = '[sources.x]\ntitle = "t"\nurl = "https://x"\nas_of = "2026"\n'
    bad.write_text(head + 'seen_in = { westus = "nowhere" }\n' + tail)
    with pytest.raises(CatalogError, match="seen_in.westus: source 'nowhere'"):
        availability.load(bad)
    bad.write_text(head + 'seen_in = { eastus = "x" }\n' + tail)
    with pytest.raises(CatalogError, match="already in regions"):
        availability.load(bad)


def test_unknown_keys_and_sources_fail_at_load(tmp_path):
    bad = tmp_path / "availability.toml"
    bad.write_text('[[size]]\nname = "Standard_ND96asr_v4"\nregions = ["eastus"]\nsource = "nowhere"\n'
                   '[sources.x]\ntitle = "t"\nurl = "https://x"\nas_of = "2026"\n')
    with pytest.raises(CatalogError, match="source 'nowhere' is not in"):
        availability.load(bad)
    bad.write_text('[[size]]\nname = "Standard_ND96asr_v4"\nregion = ["eastus"]\nsource = "x"\n'
                   '[sources.x]\ntitle = "t"\nurl = "https://x"\nas_of = "2026"\n')
    with pytest.raises(CatalogError, match="unknown key"):
        availability.load(bad)
    bad.write_text('[[size]]\nname = "Standard_Nope"\nregions = []\nsource = "x"\n'
                   '[sources.x]\ntitle = "t"\nurl = "https://x"\nas_of = "2026"\n')
    with pytest.raises(CatalogError, match="not a size of skus.toml"):
        availability.load(bad)


def _capture() -> list[dict]:
    """What `az vm list-skus -o json` prints, built with Azure's SDK model and serialised by it."""
    def sku(name: str, regions: list[str], resource_type: str = "virtualMachines") -> dict:
        model = ResourceSku(
            resource_type=resource_type, name=name, locations=[regions[0]],
            location_info=[ResourceSkuLocationInfo(location=r) for r in regions],
        )
        return model.as_dict()
    return [
        sku("Standard_ND96isr_H100_v5", ["eastus", "brazilsouth"]),
        sku("Standard_ND96isr_H100_v5", ["southcentralus"]),
        sku("Standard_NC24s_v3", ["eastus"]),
        sku("Standard_D2s_v5", ["eastus"]),
        sku("Standard_ND96asr_v4", ["eastus"], resource_type="disks"),
    ]


def test_refresh_rewrites_regions_from_a_capture(tmp_path):
    path = tmp_path / "availability.toml"
    path.write_text(availability.AVAILABILITY_FILE.read_text())
    updated = availability.refresh(_capture(), date(2026, 11, 23), path)
    assert updated == ["Standard_NC24s_v3", "Standard_ND96isr_H100_v5"]
    offerings, sources = availability.load(path)
    h100 = offerings["Standard_ND96isr_H100_v5"]
    assert h100.regions == {"eastus", "brazilsouth", "southcentralus"} and h100.source == "az-vm-list-skus"
    assert h100.seen_in == () and "azcluster-h100-southafricanorth" not in sources  # the capture supersedes
    assert sources["az-vm-list-skus"].as_of == "2026-11-23"
    # A retired size keeps its record; one the capture lacks keeps its old entry; the header stays.
    assert offerings["Standard_NC24s_v3"].retired == date(2025, 9, 30)
    assert offerings["Standard_ND96asr_v4"] == availability.OFFERINGS["Standard_ND96asr_v4"]
    assert path.read_text().startswith("# Where Azure offers each VM size")


def test_the_shipped_file_round_trips_through_render():
    offerings, sources = availability.load()
    text = availability.render(offerings, sources, availability._header(availability.AVAILABILITY_FILE))
    rewritten = Path(REPO_ROOT / "amlhpc" / "core" / "catalog" / "availability.toml").read_text()
    assert text == rewritten


def test_refresh_cli_refuses_a_table_capture_with_exit_2(tmp_path):
    capture = tmp_path / "skus.json"
    capture.write_text(json.dumps({"value": []}))
    result = subprocess.run([sys.executable, "-m", "amlhpc.core.availability", "refresh", str(capture)],
                            cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and "is not a JSON list of Resource SKUs" in result.stderr
    assert "Traceback" not in result.stderr
    result = subprocess.run([sys.executable, "-m", "amlhpc.core.availability"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and "usage: python -m amlhpc.core.availability refresh" in result.stderr


def test_a_size_with_no_known_region_is_not_refused_for_its_region():
    """MI300X and GB200/GB300 have no public region list: recorded as unknown (empty, with a
    source saying so), which the region check cannot hold against a stack."""
    for size in ("Standard_ND96isr_MI300X_v5", "Standard_ND128isr_NDR_GB200_v6", "Standard_ND128isr_GB300_v6"):
        assert availability.OFFERINGS[size].regions == frozenset()
        assert availability.problem(size, "swedencentral", date(2026, 11, 23)) is None
    # A list from a price snapshot of one region is partial: other regions are unknown, not refused.
    assert availability.problem("Standard_NC40ads_H100_v5", "swedencentral", date(2026, 11, 23)) is None
