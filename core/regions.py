"""Azure public-cloud region names accepted as `azure-native:location`.

Pure data. A region Azure adds later is one line here; until then the config check
refuses it with near matches, which catches the far more common typo.
"""

from __future__ import annotations

import difflib

REGIONS: frozenset[str] = frozenset(
    """
    australiacentral australiaeast australiasoutheast austriaeast belgiumcentral brazilsouth
    canadacentral canadaeast centralindia centralus chilecentral denmarkeast eastasia eastus
    eastus2 francecentral germanywestcentral indonesiacentral israelcentral italynorth
    japaneast japanwest koreacentral koreasouth malaysiawest mexicocentral newzealandnorth
    northcentralus northeurope norwayeast polandcentral qatarcentral southafricanorth
    southcentralus southeastasia southindia spaincentral swedencentral switzerlandnorth
    uaenorth uksouth ukwest westcentralus westeurope westindia westus westus2 westus3
    """.split()
)


def suggest(name: str) -> list[str]:
    """Near matches for a mistyped region ("East US" -> eastus)."""
    squashed = name.replace(" ", "").lower()
    if squashed in REGIONS:
        return [squashed]
    return difflib.get_close_matches(squashed, sorted(REGIONS), n=2, cutoff=0.6)
