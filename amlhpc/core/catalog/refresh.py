"""Refresh the catalog's prices and size facts from Azure, and say what changed.

    python -m amlhpc.core.catalog refresh [--subscription ID] [--region R ...] [--size NAME ...] [--check]
    python -m amlhpc.core.catalog facts [--size NAME] [--json]      (amlhpc/core/catalog/facts.py)

Read through azure-core's pipeline (its retry policy handles throttling; the ARM calls carry
the bearer-token policy of `azure.mgmt.core.ARMPipelineClient`):

- prices: the Azure Retail Prices API, unauthenticated (learn.microsoft.com/rest/api/
  cost-management/retail-prices/azure-retail-prices): `GET https://prices.azure.com/api/
  retail/prices?api-version=2023-01-01-preview&$filter=serviceName eq 'Virtual Machines' and
  armSkuName eq '<size>' and priceType eq 'Consumption'`, following `NextPageLink`. The
  Linux pay-as-you-go meter is the one whose productName does not say Windows (nor "Win", as
  some series write it) and whose skuName does not say Spot or Low Priority, per "1 Hour", in
  USD. A size is priced in the catalog's region for it, else in a region given with --region,
  else in eastus; a size Azure prices only elsewhere is reported with the regions that have a
  price and left for the person to pick one (--region), never priced in an arbitrary region.
  A price equal to the catalog's (figure and region) is confirmed, not a difference.
- size facts and regions: Resource SKUs, per subscription (Azure/azure-rest-api-specs
  specification/compute/resource-manager/Microsoft.Compute/Skus/stable/2021-07-01/skus.json):
  `GET /subscriptions/{id}/providers/Microsoft.Compute/skus?api-version=2021-07-01`, following
  `nextLink`; capabilities vCPUs, MemoryGB, GPUs, MaxResourceVolumeMB (the temp disk, MiB),
  CpuArchitectureType, the `family` (the quota family) and the `locations`.
- Azure ML support, per region: `GET /subscriptions/{id}/providers/Microsoft.MachineLearning
  Services/locations/{region}/vmSizes?api-version=2024-10-01` (specification/machinelearning
  services/.../stable/2024-10-01/examples/VirtualMachineSize/list.json): `supportedComputeTypes`
  lists "AmlCompute" for a size clusters can use there.

What it writes, and what it only reports:
- writes amlhpc/core/catalog/skus.toml's [sku.price] (usd_per_hour, region, as_of, source =
  "azure-retail"), and vcpus, memory_gib, gpus, temp_disk_gib, quota_family, host_arch (each
  changed figure with a comment naming the Resource SKUs source), and the regions of
  amlhpc/core/catalog/availability.toml (amlhpc.core.availability.refresh);
- reports and never writes Azure ML support (the catalog's azureml table carries a reason and
  where else to run a size, which a person writes), and touches nothing else: sources, NUMA
  maps, pass marks, peak rates, InfiniBand and NVMe facts are curated by hand.

Every change is printed before it is written; `--check` prints them and exits 1 when there
are any, writing nothing. A rewritten skus.toml is loaded by amlhpc.core.skus before it replaces the
file, so a refresh cannot leave a catalog that does not load.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import typer

from amlhpc.core import availability, skus
from amlhpc.core.catalog import facts as catalog_facts
from amlhpc.core.cli_help import VersionOption, new_app
from amlhpc.core.errors import Problem, UserError, exit_on_bad_input

RETAIL_ENDPOINT = "https://prices.azure.com"
RETAIL_PATH = "/api/retail/prices"
RETAIL_API_VERSION = "2023-01-01-preview"
ARM_ENDPOINT = "https://management.azure.com"
COMPUTE_SKUS_API_VERSION = "2021-07-01"
AML_API_VERSION = "2024-10-01"
RETAIL_SOURCE = "azure-retail"
SKUS_SOURCE = "azure-resource-skus-api"
SOURCE_ENTRIES = {
    RETAIL_SOURCE: ("Azure Retail Prices API, Linux pay-as-you-go", "https://prices.azure.com/api/retail/prices"),
    SKUS_SOURCE: ("Azure Resource SKUs API (Microsoft.Compute/skus, api-version 2021-07-01), read by python -m amlhpc.core.catalog refresh",
                  "https://learn.microsoft.com/rest/api/compute/resource-skus/list"),
}
PREFERRED_REGION = "eastus"
WRITTEN_FACTS = ("vcpus", "memory_gib", "gpus", "temp_disk_gib", "quota_family", "host_arch")
_ARCH = {"x64": "x86_64", "arm64": "aarch64"}


# --------------------------------------------------------------------------------------
# Reading Azure


def retail_client(transport: Any = None):
    from azure.core import PipelineClient
    from azure.core.pipeline.policies import HeadersPolicy, RetryPolicy, UserAgentPolicy

    return PipelineClient(RETAIL_ENDPOINT, policies=[HeadersPolicy(), UserAgentPolicy("aml-hpc-catalog"), RetryPolicy()],
                          transport=transport)


def arm_client(credential: Any, transport: Any = None):
    from azure.core.pipeline.policies import BearerTokenCredentialPolicy
    from azure.mgmt.core import ARMPipelineClient

    return ARMPipelineClient(base_url=ARM_ENDPOINT, policies=None, transport=transport, per_call_policies=[
        BearerTokenCredentialPolicy(credential, f"{ARM_ENDPOINT}/.default")])


def _pages(client: Any, first_url: str, params: Mapping[str, str] | None, items_key: str, next_key: str) -> list[dict]:
    """Every item of a paged GET, following the next-page link (absolute URLs)."""
    items: list[dict] = []
    url, query = first_url, dict(params or {})
    seen: set[str] = set()
    while url:
        request = client.get(url, params=query) if query else client.get(url)
        response = client.send_request(request)
        if response.status_code != 200:
            raise UserError([Problem(url.split("?")[0], "", f"Azure answered {response.status_code}: {response.text()[:300]}",
                                     "check `az login`, the subscription id and your network; retry later if throttled")],
                            "cannot read the catalog's sources")
        body = response.json()
        items.extend(body.get(items_key) or [])
        url, query = body.get(next_key) or "", {}
        if url in seen:
            break  # a service that repeats its last page must not loop forever
        seen.add(url)
    return items


def retail_prices(client: Any, size: str) -> list[dict]:
    """The Retail Prices API's items for one VM size (every region, consumption meters)."""
    flt = f"serviceName eq 'Virtual Machines' and armSkuName eq '{size}' and priceType eq 'Consumption'"
    return _pages(client, f"{RETAIL_ENDPOINT}{RETAIL_PATH}", {"api-version": RETAIL_API_VERSION, "$filter": flt},
                  "Items", "NextPageLink")


def linux_on_demand(items: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Region -> USD per hour of the Linux pay-as-you-go meter."""
    found: dict[str, float] = {}
    for item in items:
        text = f"{item.get('productName', '')} {item.get('skuName', '')} {item.get('meterName', '')}"
        if (item.get("type") != "Consumption" or item.get("currencyCode", "USD") != "USD"
                or item.get("unitOfMeasure") != "1 Hour" or re.search(r"Windows|\bWin\b|Spot|Low Priority", text)):
            continue
        price = float(item.get("retailPrice", 0) or 0)
        region = str(item.get("armRegionName", ""))
        if price > 0 and region:
            found[region] = price
    return found


def resource_skus(client: Any, subscription: str) -> list[dict]:
    url = f"{ARM_ENDPOINT}/subscriptions/{subscription}/providers/Microsoft.Compute/skus"
    return _pages(client, url, {"api-version": COMPUTE_SKUS_API_VERSION}, "value", "nextLink")


def aml_vm_sizes(client: Any, subscription: str, region: str) -> list[dict]:
    url = f"{ARM_ENDPOINT}/subscriptions/{subscription}/providers/Microsoft.MachineLearningServices/locations/{region}/vmSizes"
    return _pages(client, url, {"api-version": AML_API_VERSION}, "value", "nextLink")


def facts_from_resource_sku(item: Mapping[str, Any]) -> dict[str, Any]:
    """The catalog keys a Resource SKU entry says something about."""
    caps = {c.get("name"): c.get("value") for c in item.get("capabilities") or []}
    facts: dict[str, Any] = {}

    def number(name: str) -> float | None:
        try:
            return float(caps[name])
        except (KeyError, TypeError, ValueError):
            return None

    for key, cap in (("vcpus", "vCPUs"), ("gpus", "GPUs")):
        if (count := number(cap)) is not None:
            facts[key] = int(count)
    if (memory := number("MemoryGB")) is not None:
        facts["memory_gib"] = round(memory)
    if disk_mb := number("MaxResourceVolumeMB"):
        facts["temp_disk_gib"] = round(disk_mb / 1024)
    if item.get("family"):
        facts["quota_family"] = item["family"]
    arch = _ARCH.get(str(caps.get("CpuArchitectureType", "")).lower())
    if arch:
        facts["host_arch"] = arch
    return facts


# --------------------------------------------------------------------------------------
# Comparing


@dataclass
class Change:
    size: str
    what: str
    old: Any
    new: Any
    written: bool = True
    note: str = ""

    def line(self) -> str:
        text = f"  {self.what}: {self.old!r} -> {self.new!r}" if self.written else f"  {self.what}: {self.note}"
        return text + (f" ({self.note})" if self.written and self.note else "")


@dataclass
class Findings:
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    prices: dict[str, tuple[float, str]] = field(default_factory=dict)
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    capture: list[dict] = field(default_factory=list)
    confirmed: list[str] = field(default_factory=list)
    """Sizes whose catalog price Azure's answer confirms (same figure, same region)."""

    def written(self) -> list[Change]:
        return [c for c in self.changes if c.written]


def choose_region(size: skus.Sku, priced: Mapping[str, float], regions: list[str]) -> str | None:
    """The catalog's price region if Azure prices the size there, else the first of the
    asked regions that has a price, else eastus; None when Azure prices it only in other
    regions (which one a price should stand for is the person's choice: --region)."""
    for region in ([size.price.region] if size.price else []) + regions + [PREFERRED_REGION]:
        if region in priced:
            return region
    return None


def compare(catalog: Mapping[str, skus.Sku], prices: Mapping[str, dict[str, float]], capture: list[dict],
            aml: Mapping[str, list[dict]], regions: list[str], today: date) -> Findings:
    """What Azure says against what the catalog holds, size by size."""
    found = Findings(capture=capture)
    by_name = {item.get("name"): item for item in capture if item.get("resourceType") == "virtualMachines"}
    for name, sku in catalog.items():
        priced = prices.get(name)
        if priced is not None:
            region = choose_region(sku, priced, regions)
            keeps = (f"{sku.price.usd_per_hour} ({sku.price.region}, {sku.price.as_of})" if sku.price else "none")
            if region is None and priced:
                found.notes.append(f"{name}: Azure prices it only in {', '.join(sorted(priced))}, not in "
                                   f"{sku.price.region if sku.price else PREFERRED_REGION}; the catalog keeps {keeps} "
                                   f"(refresh --size {name} --region <one of them> prices it there)")
            elif region is None:
                found.notes.append(f"{name}: the Retail Prices API lists no Linux pay-as-you-go price; the catalog keeps {keeps}")
            else:
                new = priced[region]
                old = sku.price.usd_per_hour if sku.price else None
                if sku.price is not None and (old, sku.price.region) == (new, region):
                    found.confirmed.append(name)
                elif sku.price is None or (old, sku.price.region) != (new, region):
                    where = f"{sku.price.region}, {sku.price.source} {sku.price.as_of}" if sku.price else "no price"
                    found.changes.append(Change(name, "price usd_per_hour", old, new,
                                                note=f"was {where}; now {region}, {RETAIL_SOURCE} {today.isoformat()}"))
                    found.prices[name] = (new, region)
        item = by_name.get(name)
        if capture and item is None:
            found.notes.append(f"{name}: Resource SKUs does not list it for this subscription (not offered to it, or retired)")
        if item is not None:
            for key, value in facts_from_resource_sku(item).items():
                old = getattr(sku, key)
                same = str(old).lower() == str(value).lower() if key == "quota_family" else old == value
                if not same:
                    found.changes.append(Change(name, key, old, value, note=SKUS_SOURCE))
                    found.facts.setdefault(name, {})[key] = value
        for region, sizes in aml.items():
            listed = {s.get("name"): s for s in sizes}
            entry = listed.get(name)
            amlcompute = bool(entry and "AmlCompute" in (entry.get("supportedComputeTypes") or []))
            if amlcompute != sku.azureml.amlcompute:
                says = "offers it to AmlCompute" if amlcompute else ("lists it without AmlCompute" if entry else "does not list it")
                found.changes.append(Change(name, f"azureml.amlcompute ({region})", sku.azureml.amlcompute, amlcompute,
                                            written=False, note=f"Azure ML {says} in {region}, the catalog says "
                                            f"{sku.azureml.amlcompute}: review [sku.azureml] by hand (its reason and "
                                            "where else to run the size are written by a person)"))
    return found


# --------------------------------------------------------------------------------------
# Writing skus.toml (line edits: the file's comments and layout stay)


def _blocks(lines: list[str]) -> dict[str, tuple[int, int]]:
    """Size name -> (first line, end line) of its [[sku]] block."""
    starts = [i for i, line in enumerate(lines) if line.strip() == "[[sku]]"]
    blocks: dict[str, tuple[int, int]] = {}
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else next(
            (i for i in range(start + 1, len(lines)) if re.match(r"\[(?!\[?sku[.\]])", lines[i])), len(lines))
        while end - 1 > start and (lines[end - 1].startswith("#") or not lines[end - 1].strip()):
            end -= 1  # comments before the next table belong to it
        for line in lines[start:end]:
            match = re.match(r'name = "([^"]+)"', line)
            if match:
                blocks[match.group(1)] = (start, end)
                break
    return blocks


def _first_table(lines: list[str], start: int, end: int) -> int:
    return next((i for i in range(start + 1, end) if lines[i].startswith("[")), end)


def _set_fact(lines: list[str], start: int, end: int, key: str, value: Any, today: date) -> None:
    text = f'"{value}"' if isinstance(value, str) else str(value)
    new = f"{key} = {text}".ljust(37) + f"# {SKUS_SOURCE} {today.isoformat()}"
    top = _first_table(lines, start, end)
    for i in range(start, top):
        if re.match(rf"{key} = ", lines[i]):
            lines[i] = new
            return
    after = next((i for i in range(start, top) if lines[i].startswith("memory_gib = ")), top - 1)
    lines.insert(after + 1, new)


def _set_price(lines: list[str], start: int, end: int, usd: float, region: str, today: date) -> None:
    table = [
        "[sku.price]",
        f"usd_per_hour = {usd:g}",
        f'region = "{region}"',
        f'as_of = "{today.isoformat()}"',
        f'source = "{RETAIL_SOURCE}"'.ljust(37) + "# Linux pay-as-you-go",
    ]
    at = next((i for i in range(start, end) if lines[i].strip() == "[sku.price]"), None)
    if at is not None:
        stop = next((i for i in range(at + 1, end) if lines[i].startswith("[") or lines[i].startswith("#")), end)
        lines[at:stop] = table
        return
    # A size without a price: the table goes before its first NUMA domain (or its end),
    # above the comment that introduces that domain.
    numa = next((i for i in range(start, end) if lines[i].strip() == "[[sku.numa]]"), end)
    while numa - 1 > start and lines[numa - 1].startswith("#"):
        numa -= 1
    lines[numa:numa] = table


def _set_source_date(lines: list[str], source: str, today: date) -> None:
    """The source's date becomes today's; a source the file lacks is added at its end."""
    at = next((i for i, line in enumerate(lines) if line.strip() == f"[sources.{source}]"), None)
    if at is None:
        title, url = SOURCE_ENTRIES[source]
        while lines and not lines[-1].strip():
            lines.pop()
        lines += ["", f"[sources.{source}]", f'title = "{title}"', f'url = "{url}"', f'as_of = "{today.isoformat()}"']
        return
    for i in range(at + 1, len(lines)):
        if lines[i].startswith("["):
            return
        if lines[i].startswith("as_of = "):
            lines[i] = f'as_of = "{today.isoformat()}"'
            return


def rewrite_skus(text: str, findings: Findings, today: date) -> str:
    lines = text.splitlines()
    for name, values in findings.facts.items():
        for key in WRITTEN_FACTS:
            if key in values:
                start, end = _blocks(lines)[name]
                _set_fact(lines, start, end, key, values[key], today)
    for name, (usd, region) in findings.prices.items():
        start, end = _blocks(lines)[name]
        _set_price(lines, start, end, usd, region, today)
    if findings.prices:
        _set_source_date(lines, RETAIL_SOURCE, today)
    if findings.facts:
        _set_source_date(lines, SKUS_SOURCE, today)
    return "\n".join(lines) + "\n"


def write_catalog(findings: Findings, today: date, skus_file: Path, availability_file: Path) -> list[str]:
    """Apply the written changes; returns the files changed. skus.toml is checked by loading it;
    availability.toml is rewritten only when a size's regions changed."""
    changed = []
    if findings.prices or findings.facts:
        old = skus_file.read_text()
        new = rewrite_skus(old, findings, today)
        trial = skus_file.with_suffix(".toml.new")
        trial.write_text(new)
        try:
            skus._load(trial)
        except (skus.CatalogError, tomllib.TOMLDecodeError) as exc:
            trial.unlink()
            raise UserError([Problem(str(skus_file), "", f"the refreshed catalog would not load: {exc}",
                                     "nothing was written; report the change Azure made")], "refresh stopped") from None
        trial.replace(skus_file)
        changed.append(str(skus_file))
    if any(c.what == "regions" for c in findings.changes):
        availability.refresh(findings.capture, today, availability_file)
        changed.append(str(availability_file))
    return changed


def region_changes(capture: list[dict], availability_file: Path) -> list[Change]:
    """What a refresh from the capture changes in availability.toml, per size."""
    offerings, _ = availability.load(availability_file)
    fresh = availability.regions_from_list_skus(capture, skus.CATALOG)
    changes = []
    for name, regions in fresh.items():
        old = offerings.get(name)
        if old is not None and old.retired is not None:
            continue
        before = set(old.regions) if old else set()
        added, dropped = sorted(set(regions) - before), sorted(before - set(regions))
        if added or dropped:
            note = ", ".join(filter(None, [f"+{' +'.join(added)}" if added else "", f"-{' -'.join(dropped)}" if dropped else ""]))
            changes.append(Change(name, "regions", len(before), len(regions), note=note))
    return changes


# --------------------------------------------------------------------------------------
# The command


def refresh(*, sizes: list[str], regions: list[str], subscription: str | None, retail: Any, arm: Any,
            today: date, skus_file: Path = skus.CATALOG_FILE, availability_file: Path = availability.AVAILABILITY_FILE,
            check: bool = False, echo: Callable[[str], None] = print) -> Findings:
    """Read Azure, print what differs, and (unless `check`) write it."""
    catalog = skus._load(skus_file)[0]
    unknown = [s for s in sizes if s not in catalog]
    if unknown:
        raise UserError([Problem("--size", "", f"{s!r} is not in the catalog", f"one of: {', '.join(catalog)}") for s in unknown],
                        "bad arguments")
    chosen = {name: catalog[name] for name in (sizes or catalog)}
    prices = {name: linux_on_demand(retail_prices(retail, name)) for name in chosen}
    capture: list[dict] = []
    aml: dict[str, list[dict]] = {}
    if subscription:
        capture = [i for i in resource_skus(arm, subscription) if i.get("name") in chosen]
        for region in regions or [PREFERRED_REGION]:
            aml[region] = aml_vm_sizes(arm, subscription, region)
    findings = compare(chosen, prices, capture, aml, regions, today)
    if capture:
        findings.changes += region_changes(capture, availability_file)
    for name in chosen:
        mine = [c for c in findings.changes if c.size == name]
        if mine:
            echo(name)
            for change in mine:
                echo(change.line())
    for note in findings.notes:
        echo(f"note: {note}")
    if findings.confirmed:
        echo(f"confirmed: the catalog's price of {len(findings.confirmed)} size(s) is Azure's: {', '.join(findings.confirmed)}")
    if not subscription:
        echo("note: prices only; size facts, regions and Azure ML support need --subscription (Resource SKUs and "
             "Azure ML's size list are per subscription)")
    unchanged = [n for n in chosen if not any(c.size == n for c in findings.changes)]
    echo(f"{len(chosen) - len(unchanged)} size(s) differ from Azure, {len(unchanged)} unchanged")
    if check or not findings.written():
        return findings
    for path in write_catalog(findings, today, skus_file, availability_file):
        echo(f"wrote {path}")
    return findings


app = new_app("The catalog's prices and size facts, refreshed from Azure (amlhpc/core/catalog/refresh.py).")


@app.callback()
def _root(version: VersionOption = False) -> None:
    """Keeps `refresh` a subcommand."""


@app.command("refresh")
def refresh_command(
    subscription: Annotated[str | None, typer.Option(
        "--subscription", help="Subscription for Resource SKUs and Azure ML's size list (default: AZURE_SUBSCRIPTION_ID); "
                               "without one, prices only.")] = None,
    region: Annotated[list[str] | None, typer.Option(
        "--region", help="Region to price a size in when the catalog has no price region, and to ask Azure ML about "
                         "(repeatable; default eastus).")] = None,
    size: Annotated[list[str] | None, typer.Option("--size", help="Only this catalog size (repeatable).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Print what differs and exit 1 if anything does; write nothing.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Print every difference between Azure and the catalog, then write prices, size facts and regions.

    Reads the Retail Prices API, and with a subscription Resource SKUs and Azure ML's VM sizes.
    """
    with exit_on_bad_input(debug):
        subscription = subscription or os.environ.get("AZURE_SUBSCRIPTION_ID") or None
        arm = None
        if subscription:
            from azure.identity import DefaultAzureCredential

            arm = arm_client(DefaultAzureCredential())
        findings = refresh(sizes=list(size or []), regions=list(region or []), subscription=subscription,
                           retail=retail_client(), arm=arm, today=date.today(), check=check, echo=typer.echo)
    if check and findings.changes:
        raise typer.Exit(1)


@app.command("facts")
def facts_command(
    size: Annotated[str | None, typer.Option("--size", help="Only this catalog size.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of one line per fact.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """List every fact of the catalog (skus, availability, NCCL settings) with its source and date."""
    with exit_on_bad_input(debug):
        if size is not None:
            try:
                size = skus.get(size).name
            except skus.UnknownSkuError as exc:
                raise UserError([Problem("--size", "", str(exc), f"one of: {', '.join(skus.names())}")],
                                "bad arguments") from None
        typer.echo(catalog_facts.render(catalog_facts.catalog_facts(size), as_json))
