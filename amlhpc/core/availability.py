"""Which Azure regions offer each VM size of the catalog, and since when a size is retired.

The facts live in `amlhpc/core/catalog/availability.toml` (each size with its source and date);
this module loads them once and answers `offering(size)` and `problem(size, region)`, the
sentence amlhpc/infra/config/clusters.py shows when a stack asks for a size its region does not have. A
cluster can accept a region the data does not list (`allowUnlistedRegion: true`, for when
the snapshot lags behind Azure); a retired size is refused whatever it says.

`refresh` rewrites the data file from a capture of `az vm list-skus --all --resource-type
virtualMachines -o json` (Azure's Resource SKUs API), so the regions can be brought up to
date by anyone with an Azure login; the capture's date becomes the source's date. Pure: no
Pulumi, no Azure SDK.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from types import MappingProxyType
from typing import Any

from amlhpc.core import invocation, skus
from amlhpc.core.skus import CatalogError, Source

AVAILABILITY_FILE = Path(__file__).resolve().parent / "catalog" / "availability.toml"
LIST_SKUS_SOURCE = "az-vm-list-skus"
REFRESH_COMMAND = ("az vm list-skus --all --resource-type virtualMachines -o json > list-skus.json && "
                   + invocation.module("amlhpc.core.availability", "refresh list-skus.json"))


@dataclass(frozen=True)
class Offering:
    """Where one VM size is offered, according to one source."""

    name: str
    regions: frozenset[str]
    source: str
    """Source id in the file's [sources]."""
    retired: date | None = None
    """Offered nowhere from this date on."""
    successor: str | None = None
    """The size Microsoft advises instead of a retired one."""
    seen_in: tuple[tuple[str, str], ...] = ()
    """(region, source id) pairs: regions another public source shows the size deployed in,
    beyond what `source` lists (included in `regions`; a refresh replaces them)."""
    complete: bool = True
    """The list names every region that offers the size (a region list, a Resource SKUs capture).
    False where the source only shows some (a price snapshot of one region): a region it does not
    name is unknown, not refused."""
    low_priority: bool | None = None
    """Whether Azure sells the size as low priority (Azure ML's lowPriorityCapable, a Retail Prices
    "Low Priority" meter); None: unknown."""
    low_priority_source: str = ""
    """Source id of `low_priority`."""

    def offered_in(self, region: str, today: date) -> bool:
        if self.retired is not None and today >= self.retired:
            return False
        return region in self.regions


_KEYS = {"name", "regions", "source", "retired", "successor", "seen_in", "complete", "low_priority",
         "low_priority_source"}


def load(path: Path = AVAILABILITY_FILE) -> tuple[dict[str, Offering], dict[str, Source]]:
    """Parse the data file; a malformed entry raises CatalogError naming it."""
    document = tomllib.loads(path.read_text())
    sources = {key: Source(id=key, **value) for key, value in document.get("sources", {}).items()}
    offerings: dict[str, Offering] = {}
    for i, entry in enumerate(document.get("size", [])):
        where = f"{path.name}: size[{i}] ({entry.get('name', '?')})"
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise CatalogError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}")
        missing = sorted({"name", "regions", "source"} - set(entry))
        if missing:
            raise CatalogError(f"{where}: missing key(s) {', '.join(missing)}")
        name = entry["name"]
        if name not in skus.CATALOG:
            raise CatalogError(f"{where}: {name} is not a size of {skus.CATALOG_FILE.name}")
        if name in offerings:
            raise CatalogError(f"{where}: duplicate size {name}")
        if entry["source"] not in sources:
            raise CatalogError(f"{where}: source {entry['source']!r} is not in [sources] ({', '.join(sorted(sources))})")
        successor = entry.get("successor")
        if successor is not None and successor not in skus.CATALOG:
            raise CatalogError(f"{where}: successor {successor} is not a size of {skus.CATALOG_FILE.name}")
        seen = entry.get("seen_in", {})
        for region, source in seen.items():
            if source not in sources:
                raise CatalogError(f"{where}: seen_in.{region}: source {source!r} is not in [sources]")
            if region in entry["regions"]:
                raise CatalogError(f"{where}: seen_in.{region}: the region is already in regions")
        low_priority = entry.get("low_priority")
        low_priority_source = entry.get("low_priority_source", "")
        if (low_priority is None) != (not low_priority_source):
            raise CatalogError(f"{where}: low_priority and low_priority_source go together (the fact and where it comes from)")
        if low_priority_source and low_priority_source not in sources:
            raise CatalogError(f"{where}: low_priority_source {low_priority_source!r} is not in [sources]")
        offerings[name] = Offering(name=name, regions=frozenset(entry["regions"]) | set(seen), source=entry["source"],
                                   retired=entry.get("retired"), successor=successor,
                                   seen_in=tuple(sorted(seen.items())), complete=entry.get("complete", True),
                                   low_priority=low_priority, low_priority_source=low_priority_source)
    return offerings, sources


_offerings, _sources = load()
OFFERINGS: MappingProxyType[str, Offering] = MappingProxyType(_offerings)
SOURCES: MappingProxyType[str, Source] = MappingProxyType(_sources)


def offering(size: str) -> Offering | None:
    """The recorded offering of a catalog size (exact spelling), or None if none is recorded."""
    return OFFERINGS.get(size)


def low_priority_problem(size: str) -> tuple[str, str] | None:
    """(message, fix) when the size is recorded as not sold at low priority, else None (unknown passes)."""
    found = OFFERINGS.get(size)
    if found is None or found.low_priority is not False:
        return None
    return (f"{size} is not sold as low priority ({SOURCES[found.low_priority_source].cite()})",
            "use priority: Dedicated for this cluster, or a size Azure sells as low priority")


def retired(size: str, today: date) -> bool:
    """True when the size's recorded retirement date has come."""
    found = OFFERINGS.get(size)
    return bool(found and found.retired is not None and today >= found.retired)


OPT_IN = "allowUnlistedRegion"
"""The cluster key that accepts a region the data does not list (amlhpc/infra/config/models.py)."""


def problem(size: str, region: str, today: date) -> tuple[str, str] | None:
    """(message, fix) when `size` is not offered in `region` on `today`, else None.

    A size with no recorded offering, one recorded with no known region (no public list exists for
    it yet) or one whose list is partial (a price snapshot shows some regions, not all) passes:
    the data cannot say no.
    """
    found = OFFERINGS.get(size)
    if found is None or found.offered_in(region, today):
        return None
    if found.retired is None and (not found.regions or not found.complete):
        return None
    source = "; ".join([SOURCES[found.source].cite()]
                       + [f"{region}: {SOURCES[sid].cite()}" for region, sid in found.seen_in])
    if found.retired is not None and today >= found.retired:
        instead = f"use {found.successor} instead" if found.successor else "choose a current size"
        return (f"{size} was retired on {found.retired.isoformat()} and is offered in no region ({source})",
                f"{instead} (amlhpc/core/catalog/skus.toml lists the sizes)")
    elsewhere = ", ".join(sorted(found.regions)) or "none recorded"
    here = [s for s, o in OFFERINGS.items() if o.offered_in(region, today) and s != size]
    alternatives = f"; sizes offered in {region}: {', '.join(sorted(here))}" if here else ""
    return (f"{size} is not offered in {region}; regions that offer it: {elsewhere} ({source})",
            f"pick one of those regions for the stack or another size{alternatives}. If Azure offers it "
            f"there now (the lists are a snapshot), refresh amlhpc/core/catalog/availability.toml: {REFRESH_COMMAND}; "
            f"or, until then, set {OPT_IN}: true on this cluster (it carries the tag {OPT_IN}=true and the "
            "policy reports it)")


# --------------------------------------------------------------------------------------
# Refreshing the data from a capture of Azure's Resource SKUs API


def regions_from_list_skus(items: Iterable[Mapping[str, Any]], sizes: Iterable[str]) -> dict[str, list[str]]:
    """Size -> sorted regions, from `az vm list-skus -o json` items (ResourceSku objects).

    Only virtualMachines entries of the given sizes count; region names are lower-cased
    (the API writes some as display names). Restrictions are per subscription (quota,
    access) and do not make a region stop offering a size, so they are ignored here.
    """
    wanted = set(sizes)
    found: dict[str, set[str]] = {}
    for item in items:
        if item.get("resourceType") != "virtualMachines" or item.get("name") not in wanted:
            continue
        places = set(item.get("locations") or []) | {info.get("location") for info in item.get("locationInfo") or []}
        found.setdefault(item["name"], set()).update(p.replace(" ", "").lower() for p in places if p)
    return {name: sorted(regions) for name, regions in found.items()}


def render(offerings: Mapping[str, Offering], sources: Mapping[str, Source], header: str) -> str:
    """The data file's text for these offerings (catalog order) and sources."""
    lines = [header.rstrip("\n"), ""]
    for name in skus.CATALOG:
        found = offerings.get(name)
        if found is None:
            continue
        lines += ["[[size]]", f'name = "{name}"']
        seen = dict(found.seen_in)
        regions = sorted(found.regions - set(seen))
        if len(regions) <= 4:
            lines.append("regions = [" + ", ".join(f'"{r}"' for r in regions) + "]")
        else:
            lines.append("regions = [")
            row: list[str] = []
            for region in regions:
                if len(", ".join([*row, f'"{region}"'])) > 88:
                    lines.append("  " + ", ".join(row) + ",")
                    row = []
                row.append(f'"{region}"')
            lines += ["  " + ", ".join(row) + ",", "]"]
        if found.retired is not None:
            lines.append(f"retired = {found.retired.isoformat()}")
        if found.successor:
            lines.append(f'successor = "{found.successor}"')
        lines.append(f'source = "{found.source}"')
        if not found.complete:
            lines.append("complete = false")
        if found.low_priority is not None:
            lines += [f"low_priority = {str(found.low_priority).lower()}", f'low_priority_source = "{found.low_priority_source}"']
        if seen:
            lines.append("seen_in = { " + ", ".join(f'{region} = "{sid}"' for region, sid in sorted(seen.items())) + " }")
        lines.append("")
    for source in sorted(sources.values(), key=lambda s: s.id):
        if not any(o.source == source.id or source.id in dict(o.seen_in).values() or o.low_priority_source == source.id
                   for o in offerings.values()):
            continue
        lines += [f"[sources.{source.id}]", f"title = {_quote(source.title)}", f"url = {_quote(source.url)}",
                  f'as_of = "{source.as_of}"', ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _header(path: Path) -> str:
    """The file's leading comment block, kept across refreshes."""
    kept = []
    for line in path.read_text().splitlines():
        if not line.startswith("#") and line.strip():
            break
        kept.append(line)
    return "\n".join(kept)


def refresh(capture: Sequence[Mapping[str, Any]], captured_on: date, path: Path = AVAILABILITY_FILE) -> list[str]:
    """Rewrite the data file's regions from a list-skus capture; returns the sizes updated.

    Retired sizes keep their record; a catalog size the capture does not list keeps its old
    entry (the capture may be filtered), so the change is visible in review.
    """
    offerings, sources = load(path)
    fresh = regions_from_list_skus(capture, skus.CATALOG)
    sources[LIST_SKUS_SOURCE] = Source(LIST_SKUS_SOURCE, "Azure Resource SKUs API (az vm list-skus --all)",
                                       "https://learn.microsoft.com/rest/api/compute/resource-skus/list",
                                       captured_on.isoformat())
    for name, regions in fresh.items():
        old = offerings.get(name)
        if old is not None and old.retired is not None:
            continue
        offerings[name] = Offering(name=name, regions=frozenset(regions), source=LIST_SKUS_SOURCE,
                                   successor=old.successor if old else None,
                                   low_priority=old.low_priority if old else None,
                                   low_priority_source=old.low_priority_source if old else "")
    path.write_text(render(offerings, sources, _header(path)))
    return sorted(fresh)


def _main(argv: list[str]) -> int:
    import json

    from amlhpc.core.errors import Problem, UserError, exit_on_bad_input

    with exit_on_bad_input("--debug" in argv):
        args = [a for a in argv if a != "--debug"]
        if len(args) != 2 or args[0] != "refresh":
            raise UserError([Problem("amlhpc.core.availability", "", "usage: python -m amlhpc.core.availability refresh "
                                     "LIST_SKUS_JSON", f"capture it with: {REFRESH_COMMAND}")], "bad arguments")
        capture_path = Path(args[1])
        try:
            capture = json.loads(capture_path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError([Problem(str(capture_path), "", f"cannot read a JSON capture: {exc}",
                                     f"capture it with: {REFRESH_COMMAND}")], "bad capture") from None
        if not isinstance(capture, list):
            raise UserError([Problem(str(capture_path), "", "is not a JSON list of Resource SKUs",
                                     "capture it with `az vm list-skus ... -o json` (not -o table)")], "bad capture")
        updated = refresh(capture, date.today())
        print(f"{AVAILABILITY_FILE.name}: regions refreshed for {len(updated)} size(s): {', '.join(updated) or 'none'}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_main(sys.argv[1:]))
