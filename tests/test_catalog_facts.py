"""The catalog's facts against Microsoft's: prices are Linux meters in the right region, sizes and
figures as Microsoft Learn and Azure's files give them, conflicts between Microsoft's sources kept
with both sources, availability lists that know when they are partial, refusal texts that name
real commands, and every fact listed with its source and date.

The recorded Retail Prices API answer is tests/fixtures/catalog-refresh/retail-linux-prices.json
(its README says what it holds)."""

from __future__ import annotations

import json
import re
import shutil
from datetime import date
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from typer.testing import CliRunner

from amlhpc.core import availability, nccl, skus
from amlhpc.core.catalog import facts, refresh
from tests.test_catalog_refresh import FIXTURES, RecordedAzure

TODAY = date(2026, 11, 28)
RECORDED = json.loads((FIXTURES / "retail-linux-prices.json").read_text())["Items"]


class RecordedPrices(RecordedAzure):
    """The Retail Prices API answering from the recorded answer, per armSkuName."""

    def __init__(self, items=None):
        super().__init__()
        self.items = RECORDED if items is None else items

    def answer(self, url: str) -> dict:
        flt = parse_qs(urlsplit(url).query)["$filter"][0]
        size = re.search(r"armSkuName eq '([^']+)'", flt).group(1)
        items = [i for i in self.items if i["armSkuName"] == size]
        return {"Items": items, "NextPageLink": None, "Count": len(items)}


@pytest.fixture
def catalog(tmp_path):
    skus_file, availability_file = tmp_path / "skus.toml", tmp_path / "availability.toml"
    shutil.copy(skus.CATALOG_FILE, skus_file)
    shutil.copy(availability.AVAILABILITY_FILE, availability_file)
    return skus_file, availability_file


def run_refresh(catalog, transport, sizes=(), regions=(), check=False):
    lines: list[str] = []
    found = refresh.refresh(sizes=list(sizes), regions=list(regions), subscription=None,
                            retail=refresh.retail_client(transport), arm=None, today=TODAY,
                            skus_file=catalog[0], availability_file=catalog[1], check=check, echo=lines.append)
    return found, "\n".join(lines)


class TestPricesAreLinuxMeters:
    def test_refresh_against_the_recorded_answer_yields_exactly_the_catalogs_prices(self, catalog):
        """Done when: `catalog refresh` on the recorded Retail Prices answer changes no price:
        every catalog price is the Linux pay-as-you-go meter of its size in its region."""
        found, printed = run_refresh(catalog, RecordedPrices())
        assert [c for c in found.changes if c.what.startswith("price")] == [], printed
        priced = {i["armSkuName"] for i in RECORDED}
        assert set(found.confirmed) == priced, printed
        assert catalog[0].read_text() == skus.CATALOG_FILE.read_text()
        for name in priced:
            linux = {i["armRegionName"]: i["retailPrice"] for i in RECORDED if i["armSkuName"] == name
                     and not any(w in i["productName"] + i["skuName"] for w in ("Windows", "Spot", "Low Priority"))}
            price = skus.get(name).price
            assert linux[price.region] == price.usd_per_hour, name

    @pytest.mark.parametrize("name, linux, windows", [("Standard_NC48ads_A100_v4", 7.346, 9.554),
                                                      ("Standard_NC80adis_H100_v5", 13.96, 17.64)])
    def test_the_nc_prices_are_linux_not_windows(self, name, linux, windows):
        """The 2026-11-09 snapshot had recorded the Windows meters: Linux + $0.046 per vCPU-hour."""
        sku = skus.get(name)
        assert sku.price.usd_per_hour == linux
        assert round(linux + 0.046 * sku.vcpus, 3) == windows
        assert "Windows meters" in skus.SOURCES[sku.price.source].title

    def test_windows_meters_spelt_win_are_not_prices(self):
        """Some series write ' Win' instead of ' Windows' (SkyPilot's Azure fetcher filters both)."""
        items = [dict(RECORDED[0], productName="Virtual Machines NCCads Srs Win", retailPrice=99.0)]
        assert refresh.linux_on_demand(items) == {}

    def test_h200_has_its_dated_public_price(self):
        price = skus.get("Standard_ND96isr_H200_v5").price
        assert (price.usd_per_hour, price.region, price.as_of) == (84.8, "eastus2", "2026-08-20")
        source = skus.SOURCES[price.source]
        assert "Retail Prices API" in source.title and source.url.startswith("https://prices.azure.com/")
        assert "No reference price" not in skus.get("Standard_ND96isr_H200_v5").notes


class TestRefreshPricesInTheRightRegion:
    def test_a_size_priced_only_elsewhere_is_reported_not_priced_in_the_first_region_by_name(self, catalog):
        """No catalog price, no eastus meter: the alphabetically first region (centralindia here)
        is no answer. The refresh says where Azure prices it and writes nothing."""
        text = catalog[0].read_text().replace(
            '[sku.price]\nusd_per_hour = 48.0\nregion = "eastus2"\nas_of = "2026-09-19"\n'
            'source = "mi300x-price-snapshot"     # Linux pay-as-you-go, $6.00 per GPU-hour\n', "")
        catalog[0].write_text(text)
        mi300x = [i for i in RECORDED if i["armSkuName"] == "Standard_ND96is_MI300X_v5"]
        extra = dict(mi300x[0], armRegionName="centralindia", location="IN Central", retailPrice=51.0)
        found, printed = run_refresh(catalog, RecordedPrices(mi300x + [extra]), sizes=["Standard_ND96is_MI300X_v5"])
        assert not found.changes and catalog[0].read_text() == text
        assert "prices it only in centralindia, eastus2, swedencentral, westus3" in printed
        assert "--region <one of them>" in printed
        found, printed = run_refresh(catalog, RecordedPrices(mi300x + [extra]), sizes=["Standard_ND96is_MI300X_v5"],
                                     regions=["eastus2"])
        new = skus._load(catalog[0])[0]["Standard_ND96is_MI300X_v5"].price
        assert (new.usd_per_hour, new.region) == (48.0, "eastus2")


class TestFactsAgreeWithLearn:
    """Microsoft Learn's size tables (MicrosoftDocs/azure-compute-docs, read 2026-11-28)."""

    def test_mi300x_local_nvme(self):
        sku = skus.get("Standard_ND96isr_MI300X_v5")
        assert (sku.nvme_devices, sku.nvme_total_gib, sku.temp_disk_gib) == (8, 28000, 1000)

    @pytest.mark.parametrize("name", ["Standard_ND128isr_NDR_GB200_v6", "Standard_ND128isr_GB300_v6",
                                      "Standard_ND128isrG5_GB300_v6"])
    def test_grace_blackwell_nvme_and_front_end_nic(self, name):
        sku = skus.get(name)
        assert (sku.nvme_devices, sku.nvme_total_gib, sku.storage_nic_gbits_per_s) == (4, 16384, 160.0)
        assert skus.SOURCES[sku.fact_source("storage_nic_gbits_per_s")].url.startswith("https://learn.microsoft.com/")

    @pytest.mark.parametrize("name, gib", [("Standard_NC40ads_H100_v5", 3576), ("Standard_NC80adis_H100_v5", 7152)])
    def test_nc_h100_temp_disks(self, name, gib):
        assert skus.get(name).temp_disk_gib == gib

    def test_nc96ads_front_end_bandwidth(self):
        assert skus.get("Standard_NC96ads_A100_v4").storage_nic_gbits_per_s == 80.0

    @pytest.mark.parametrize("name, fact, kept, other", [
        ("Standard_ND128isr_GB300_v6", "ib_gbits_per_s_per_hca", 400, 800),
        ("Standard_ND128isr_NDR_GB200_v6", "memory_gib", 864, 900),
        ("Standard_ND128isr_NDR_GB200_v6", "gpu_memory_gib", 186, 192),
    ])
    def test_conflicts_between_microsofts_sources_are_recorded_with_both(self, name, fact, kept, other):
        sku = skus.get(name)
        conflict = next(c for c in sku.conflicts if c.fact == fact)
        assert (conflict.value, conflict.other, getattr(sku, fact)) == (kept, other, kept)
        assert conflict.source != conflict.other_source and conflict.why
        assert all(skus.SOURCES[s].as_of for s in (conflict.source, conflict.other_source))

    def test_a_conflict_that_does_not_hold_the_catalogs_value_fails_at_load(self, tmp_path):
        text = skus.CATALOG_FILE.read_text().replace("fact = \"memory_gib\"\nvalue = 864", "fact = \"memory_gib\"\nvalue = 900", 1)
        (tmp_path / "skus.toml").write_text(text)
        with pytest.raises(skus.CatalogError, match="holds memory_gib = 864, but the conflict says it keeps 900"):
            skus._load(tmp_path / "skus.toml")

    @pytest.mark.parametrize("name, infiniband, gpus", [
        ("Standard_ND128isrG5_GB300_v6", True, 4), ("Standard_ND96isrf_H200_v5", True, 8),
        ("Standard_ND96is_H200_v5", False, 8), ("Standard_ND96is_MI300X_v5", False, 8),
    ])
    def test_the_missing_sizes_are_in_the_catalog(self, name, infiniband, gpus):
        sku = skus.get(name)
        assert (sku.infiniband, sku.gpus) == (infiniband, gpus)
        assert name in availability.OFFERINGS

    def test_the_h200_variants_carry_azures_pass_marks(self):
        assert skus.get("Standard_ND96isrf_H200_v5").health.nccl_allreduce_busbw_gbytes_per_s_min == 432.0
        assert skus.get("Standard_ND96isrf_H200_v5").health.ib_write_gbits_per_s_per_hca_min == 360.0
        assert skus.get("Standard_ND96is_H200_v5").health.ib_write_gbits_per_s_per_hca_min is None


class TestAvailability:
    @pytest.mark.parametrize("name", ["Standard_NC48ads_A100_v4", "Standard_NC40ads_H100_v5", "Standard_NC80adis_H100_v5"])
    def test_a_list_from_a_price_snapshot_is_partial_and_refuses_no_region(self, name):
        """A public azureml-examples issue shows an NC40ads_H100_v5 cluster in West Europe."""
        assert not availability.OFFERINGS[name].complete
        for region in ("westeurope", "eastus2", "swedencentral"):
            assert availability.problem(name, region, TODAY) is None

    def test_a_complete_list_still_refuses(self):
        assert availability.problem("Standard_ND96isr_H200_v5", "brazilsouth", TODAY) is not None

    def test_low_priority_is_recorded_per_size_with_its_source(self):
        assert availability.OFFERINGS["Standard_ND96isr_H100_v5"].low_priority is True
        gb200 = availability.OFFERINGS["Standard_ND128isr_NDR_GB200_v6"]
        assert gb200.low_priority is False and availability.SOURCES[gb200.low_priority_source].as_of
        assert availability.low_priority_problem("Standard_ND128isr_NDR_GB200_v6") is not None
        assert availability.low_priority_problem("Standard_NC24ads_A100_v4") is None  # unknown passes

    def test_partial_and_low_priority_survive_a_render(self, tmp_path):
        offerings, sources = availability.load()
        path = tmp_path / "availability.toml"
        path.write_text(availability.render(offerings, sources, "# header"))
        again, _ = availability.load(path)
        assert again == offerings


class TestRefusalTextIsTrue:
    COMMAND = re.compile(r"python -m amlhpc\.core\.catalog (\w+)((?: --[a-z-]+)*)")

    def texts(self) -> list[str]:
        out = [s.title for s in skus.SOURCES.values()] + [s.title for s in availability.SOURCES.values()]
        out += [s.notes for s in skus.CATALOG.values()] + [s.azureml.elsewhere for s in skus.CATALOG.values()]
        return out

    def test_every_catalog_command_the_texts_recommend_exists(self):
        app = typer_app()
        found = 0
        for text in self.texts():
            for command, flags in self.COMMAND.findall(text):
                found += 1
                result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
                assert result.exit_code == 0, f"{command!r} named in {text[:80]!r} does not exist"
                for flag in flags.split():
                    assert flag in result.output, f"{command} {flag} named in {text[:80]!r} does not exist"
        assert found >= 3

    def test_the_azure_ml_refusal_names_no_missing_option(self):
        problem = skus.get("Standard_ND128isr_GB300_v6").azureml_problem
        assert "--aml-sizes" not in problem and "refresh --subscription" in problem


def typer_app():
    return refresh.app


class TestEveryFactHasASourceAndADate:
    def test_every_fact_of_every_file_resolves_to_a_dated_source(self):
        listed = facts.catalog_facts()
        assert {f.file for f in listed} == {"skus.toml", "availability.toml", "nccl.toml"}
        for fact in listed:
            assert fact.source and fact.as_of and fact.title and fact.url, fact
        sizes = {f.subject for f in listed if f.file == "skus.toml"}
        assert set(skus.CATALOG) <= sizes
        keys = {(f.subject, f.key) for f in listed}
        for name, sku in skus.CATALOG.items():
            for key in skus.FACT_KEYS:
                if getattr(sku, key) is not None:
                    assert (name, key) in keys

    def test_a_fact_source_override_names_a_known_key(self, tmp_path):
        text = skus.CATALOG_FILE.read_text().replace("[sku.fact_sources]\nstorage_nic_gbits_per_s",
                                                     "[sku.fact_sources]\nstorage_nics", 1)
        (tmp_path / "skus.toml").write_text(text)
        with pytest.raises(skus.CatalogError, match="'storage_nics' is not one of the size's figures"):
            skus._load(tmp_path / "skus.toml")

    def test_the_command_lists_them(self):
        result = CliRunner().invoke(refresh.app, ["facts", "--size", "Standard_ND96isr_H200_v5"])
        assert result.exit_code == 0
        assert "price = '84.8 USD/h in eastus2 (2026-08-20)'  <- h200-price-snapshot (2026-08-20)" in result.output
        assert "NCCL_MIN_NCHANNELS = '32'" in result.output
        as_json = CliRunner().invoke(refresh.app, ["facts", "--size", "Standard_ND96isr_H200_v5", "--json"])
        assert {row["source"] for row in json.loads(as_json.output)} <= set(skus.SOURCES) | set(availability.SOURCES) | set(nccl.SOURCES)

    def test_an_unknown_size_is_refused(self):
        result = CliRunner().invoke(refresh.app, ["facts", "--size", "Standard_ND96isr_H300_v5"])
        assert result.exit_code != 0 and "unknown VM size" in result.output


def test_the_recorded_answer_is_documented():
    readme = (FIXTURES / "README.md").read_text()
    assert "retail-linux-prices.json" in readme and Path(FIXTURES / "retail-linux-prices.json").is_file()
