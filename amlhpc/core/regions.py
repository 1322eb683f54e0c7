"""Azure regions for `azure-native:location`: which names are valid, and which the catalog knows.

`check` says whether a name has the shape Azure Resource Manager accepts as a location: a
region's programmatic name (lowercase letters and digits, e.g. eastus2, swedencentral). A
display name ("East US") is refused with the programmatic name. `unlisted` says whether it is
on Azure's list: a stack's location that is not (`swedencentrl`) is refused as a typo with the
near match, unless the stack opts in for a region opened after the list was read
(`aml-hpc:allowUnlistedRegion`, amlhpc/infra/config/parse.py).

KNOWN: Azure's public-cloud physical regions, from Microsoft Learn "Azure regions list"
(https://learn.microsoft.com/azure/reliability/regions-list) and `az account
list-locations --query "[?metadata.regionType=='Physical'].name"`, read 2026-11; used for
"did you mean" suggestions and to say whether the catalog has heard of a region.
"""

from __future__ import annotations

import difflib
import re

KNOWN: frozenset[str] = frozenset(
    """
    australiacentral australiacentral2 australiaeast australiasoutheast austriaeast belgiumcentral
    brazilsouth brazilsoutheast canadacentral canadaeast centralindia centralus chilecentral
    denmarkeast eastasia eastus eastus2 francecentral francesouth germanynorth germanywestcentral
    indonesiacentral israelcentral italynorth japaneast japanwest jioindiacentral jioindiawest
    koreacentral koreasouth malaysiawest mexicocentral newzealandnorth northcentralus northeurope
    norwayeast norwaywest polandcentral qatarcentral southafricanorth southafricawest
    southcentralus southeastasia southindia spaincentral swedencentral switzerlandnorth
    switzerlandwest uaecentral uaenorth uksouth ukwest westcentralus westeurope westindia westus
    westus2 westus3
    """.split()
)

LIST_READ = "2026-11"
"""When KNOWN was read from Microsoft Learn and `az account list-locations`."""
_PROGRAMMATIC = re.compile(r"^[a-z][a-z0-9]{2,39}$")


def suggest(name: str) -> list[str]:
    """Near matches for a mistyped or display-form region ("East US" -> eastus)."""
    squashed = name.replace(" ", "").lower()
    if squashed in KNOWN:
        return [squashed]
    return difflib.get_close_matches(squashed, sorted(KNOWN), n=2, cutoff=0.6)


def unlisted(name: str) -> str | None:
    """None when `name` is on Azure's list (KNOWN), else why it is refused unless the stack opts
    in (a typo, or a region newer than the list)."""
    if name in KNOWN:
        return None
    return f"{name!r} is not one of Azure's public regions (the list in amlhpc/core/regions.py, read {LIST_READ})"


def check(name: str) -> str | None:
    """None when Azure would take `name` as a location, else what is wrong with it."""
    if _PROGRAMMATIC.match(name):
        return None
    near = suggest(name)
    squashed = name.replace(" ", "").lower()
    hint = f"did you mean {' or '.join(near)}?" if near else (
        f"the programmatic form would be {squashed!r}" if _PROGRAMMATIC.match(squashed) else "")
    return f"{name!r} is not an Azure region's programmatic name{': ' + hint if hint else ''}"
