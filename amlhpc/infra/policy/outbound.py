"""The hosts a managed network may let jobs reach outside dev: amlhpc/infra/policy/outbound.toml.

Pure data and one lookup, for the policy rule `outbound-fqdn-allow-listed` and its test
against the stack config's default rules. No Pulumi import.
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

OUTBOUND_FILE = Path(__file__).resolve().parent / "outbound.toml"


@cache
def allowed_hosts(path: Path = OUTBOUND_FILE) -> dict[str, str]:
    """host (lower case) -> why it may be reached."""
    with path.open("rb") as handle:
        document = tomllib.load(handle)
    hosts = document.get("hosts", {})
    bad = [h for h, entry in hosts.items() if "*" in h or not str(entry.get("why", "")).strip() or set(entry) != {"why"}]
    if bad or set(document) - {"hosts"}:
        raise ValueError(f"{path.name}: every entry is an exact host with only a `why` (bad: {', '.join(bad) or 'top level'})")
    return {h.lower(): str(entry["why"]) for h, entry in hosts.items()}
