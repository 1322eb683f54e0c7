"""`python -m amlhpc.core.catalog refresh` on recorded responses (tests/fixtures/catalog-refresh,
built after the documented REST shapes): azure-core's real pipeline over a fake transport,
as tests/aml_fakes.py does for Azure ML. The catalog files are copies in tmp_path."""

from __future__ import annotations

import io
import json
import shutil
import tomllib
from datetime import date
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest._requests_basic import RestRequestsTransportResponse
from typer.testing import CliRunner

from amlhpc.core import availability, skus
from amlhpc.core.catalog import refresh
from amlhpc.core.errors import UserError
from tests.aml_fakes import SUBSCRIPTION, FakeCredential

FIXTURES = Path(__file__).parent / "fixtures" / "catalog-refresh"
TODAY = date(2026, 11, 23)
H200, A100, GB300 = "Standard_ND96isr_H200_v5", "Standard_ND96asr_v4", "Standard_ND128isr_GB300_v6"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


class RecordedAzure(HttpTransport):
    """Answers the three APIs from the fixtures; records every request."""

    def __init__(self):
        self.requests: list[str] = []

    def __enter__(self):
        return self

    def __exit__(self, *args):
        pass

    def open(self):
        pass

    def close(self):
        pass

    def answer(self, url: str) -> dict:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        if parts.netloc == "prices.azure.com":
            assert query["api-version"] == ["2023-01-01-preview"]
            flt = query["$filter"][0]
            assert "serviceName eq 'Virtual Machines'" in flt and "priceType eq 'Consumption'" in flt
            if f"armSkuName eq '{H200}'" in flt:
                return fixture("retail-Standard_ND96isr_H200_v5-page2.json" if "$skip" in query else
                               "retail-Standard_ND96isr_H200_v5-page1.json")
            if f"armSkuName eq '{A100}'" in flt:
                return fixture("retail-Standard_ND96asr_v4.json")
            return fixture("retail-empty.json")
        assert parts.netloc == "management.azure.com"
        if parts.path.endswith("/providers/Microsoft.Compute/skus"):
            assert query["api-version"] == ["2021-07-01"]
            return fixture("resource-skus-page2.json" if "$skiptoken" in query else "resource-skus-page1.json")
        if parts.path.endswith("/locations/eastus/vmSizes"):
            assert query["api-version"] == ["2024-10-01"]
            return fixture("aml-vmsizes-eastus.json")
        raise AssertionError(f"no recorded answer for {url}")

    def send(self, request, **kwargs):
        self.requests.append(request.url)
        if "management.azure.com" in request.url:
            assert request.headers["Authorization"] == "Bearer fake-token"
        raw = requests.Response()
        raw.status_code, raw.raw, raw.url = 200, io.BytesIO(), request.url
        raw._content = json.dumps(self.answer(request.url)).encode()
        raw.headers["Content-Type"] = "application/json"
        response = RestRequestsTransportResponse(request=request, internal_response=raw)
        response._content = raw._content
        return response


@pytest.fixture
def catalog(tmp_path):
    skus_file, availability_file = tmp_path / "skus.toml", tmp_path / "availability.toml"
    shutil.copy(skus.CATALOG_FILE, skus_file)
    shutil.copy(availability.AVAILABILITY_FILE, availability_file)
    return skus_file, availability_file


_retail = refresh.retail_client


def run(catalog, *, subscription=None, sizes=(H200, A100, GB300), check=False, regions=()):
    transport = RecordedAzure()
    lines: list[str] = []
    findings = refresh.refresh(sizes=list(sizes), regions=list(regions), subscription=subscription,
                               retail=refresh.retail_client(transport),
                               arm=refresh.arm_client(FakeCredential(), transport), today=TODAY,
                               skus_file=catalog[0], availability_file=catalog[1], check=check, echo=lines.append)
    return findings, "\n".join(lines), transport


class TestPrices:
    def test_a_size_without_a_price_gets_azures_linux_on_demand_price(self, catalog):
        """ND H200 v5 without a price in the catalog: the refresh reads both pages, skips the
        Windows, Spot and Low Priority meters, prices it in eastus and says so."""
        text = catalog[0].read_text()
        start = text.index("[sku.price]\nusd_per_hour = 84.8")
        catalog[0].write_text(text[:start] + text[text.index("# azhpc-images-topology", start):])
        findings, printed, transport = run(catalog)
        retail = [u for u in transport.requests if "prices.azure.com" in u and H200 in u]
        assert len(retail) == 2  # NextPageLink followed
        assert "price usd_per_hour: None -> 95.5 (was no price; now eastus, azure-retail 2026-11-23)" in printed
        price = skus._load(catalog[0])[0][H200].price
        assert (price.usd_per_hour, price.region, price.as_of, price.source) == (95.5, "eastus", "2026-11-23", "azure-retail")
        assert f"wrote {catalog[0]}" in printed

    def test_windows_spot_and_low_priority_meters_are_not_prices(self):
        items = fixture("retail-Standard_ND96isr_H200_v5-page1.json")["Items"]
        assert refresh.linux_on_demand(items) == {"eastus": 95.5, "westus3": 97.0}

    def test_an_unchanged_price_is_left_alone_and_an_unpriced_size_keeps_its_figure(self, catalog):
        findings, printed, _ = run(catalog, sizes=(A100, GB300))
        assert not findings.changes
        assert "GB300_v6: the Retail Prices API lists no Linux pay-as-you-go price; the catalog keeps none" in printed
        assert "0 size(s) differ from Azure, 2 unchanged" in printed
        assert catalog[0].read_text() == skus.CATALOG_FILE.read_text()

    def test_check_prints_and_writes_nothing(self, catalog):
        findings, printed, _ = run(catalog, check=True)
        assert findings.changes and "wrote" not in printed
        assert catalog[0].read_text() == skus.CATALOG_FILE.read_text()


class TestFactsAndRegions:
    def test_size_facts_regions_and_azure_ml_support(self, catalog):
        findings, printed, transport = run(catalog, subscription=SUBSCRIPTION)
        assert any("skiptoken=page2" in u for u in transport.requests)  # nextLink followed
        new = skus._load(catalog[0])[0]
        # GB300: Resource SKUs gives its temp disk (absent before), inserted with its source.
        assert new[GB300].temp_disk_gib == 600 and "temp_disk_gib: None -> 600 (azure-resource-skus-api)" in printed
        assert "temp_disk_gib = 600                  # azure-resource-skus-api 2026-11-23" in catalog[0].read_text()
        # A quota family that differs only in case is the same family.
        assert not any(c.what == "quota_family" for c in findings.changes)
        # Regions: what Resource SKUs lists replaces the snapshot.
        offered, _ = availability.load(catalog[1])
        assert sorted(offered[H200].regions) == ["eastus2", "southcentralus", "westus3"]
        assert "regions: 9 -> 3" in printed
        # Azure ML support differs for ND96asr_v4 in this recording: reported, never written.
        assert "azureml.amlcompute (eastus): Azure ML lists it without AmlCompute in eastus" in printed
        assert new[A100].azureml.amlcompute is True

    def test_hand_curated_facts_are_untouched(self, catalog):
        before = tomllib.loads(catalog[0].read_text())
        findings, _, _ = run(catalog, subscription=SUBSCRIPTION)
        after = tomllib.loads(catalog[0].read_text())
        written = {(c.size, c.what) for c in findings.written()}
        for old, new in zip(before["sku"], after["sku"], strict=True):
            for key in set(old) | set(new):
                if key == "price" or (old["name"], key) in written:
                    continue
                assert old.get(key) == new.get(key), (old["name"], key)
        assert {k: v for k, v in before["sources"].items() if k not in ("azure-retail", "azure-resource-skus-api")} == \
            {k: v for k, v in after["sources"].items() if k not in ("azure-retail", "azure-resource-skus-api")}
        assert after["sources"]["azure-retail"]["as_of"] == "2026-11-23"
        assert after["sources"]["azure-resource-skus-api"]["as_of"] == "2026-11-23"  # added with the first facts it gives

    def test_without_a_subscription_only_prices_are_read(self, catalog):
        findings, printed, transport = run(catalog)
        assert all("prices.azure.com" in u for u in transport.requests)
        assert "need --subscription" in printed

    def test_a_refresh_that_would_break_the_catalog_writes_nothing(self, catalog, monkeypatch):
        monkeypatch.setattr(refresh, "rewrite_skus", lambda text, findings, today: text.replace('host_arch = "aarch64"', 'host_arch = "sparc"', 1))
        with pytest.raises(UserError, match="would not load"):
            run(catalog)
        assert catalog[0].read_text() == skus.CATALOG_FILE.read_text()
        assert not catalog[0].with_suffix(".toml.new").exists()


class TestCommand:
    def test_unknown_size_is_refused(self, catalog):
        with pytest.raises(UserError, match="'Standard_ND96' is not in the catalog"):
            run(catalog, sizes=("Standard_ND96",))

    def test_help_and_check_exit_status(self, monkeypatch):
        """`--check` on the real catalog (nothing is written): a difference exits 1."""
        result = CliRunner().invoke(refresh.app, ["refresh", "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0 and "--check" in result.output and "<bool>" not in result.output
        before = skus.CATALOG_FILE.read_text()
        monkeypatch.setattr(refresh, "retail_client", lambda transport=None: _retail(RecordedAzure()))
        monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
        result = CliRunner().invoke(refresh.app, ["refresh", "--size", H200, "--check"])
        assert result.exit_code == 1 and "price usd_per_hour: 84.8 -> 95.5 (was eastus2" in result.output
        assert skus.CATALOG_FILE.read_text() == before
