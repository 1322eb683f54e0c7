"""What to stage: the inputs of AMLHPC_STAGE_JSON (docs/contracts.md section 4), parsed and checked.

Each entry: {"name", "container", "account_url", "prefix", "mode", "egress_gbps", "inflate", "version"};
`version` names the dataset version to stage (an integer, or "latest", the default: the
newest committed version when the job stages; amlhpc.jobs.runtime.staging.dataversion);
`mode` is `local`, `shared` or `replica` (see amlhpc/jobs/runtime/staging/stager.py); `inflate` says which
blobs are gzip to inflate: `encoded` (the default: those whose Content-Encoding is gzip, as
`jobs data upload` writes them) or `gz-names` (also every blob whose name ends in `.gz`,
for another tool's data the user knows to be gzip; such blobs are staged without `.gz`). `specs_from_json` reports every
wrong entry and key at once, as `StageConfigError` (a RuntimeInputError: exit 2 at entry
points); an account URL is shown without its query, so a SAS never reaches a message.

Also here: the per-node Blob rate from AMLHPC_SKU_JSON and the warning when the nodes
together would pull more than the storage account's egress.

Standard library only (plus blobio for the safe endpoint): ships into the training image.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.base.errors import RuntimeInputError, RuntimeProblem
from amlhpc.jobs.runtime.blob import blobio

log = logging.getLogger("amlhpc.staging")

Mode = Literal["local", "shared", "replica"]
MODES: tuple[str, ...] = ("local", "shared", "replica")
INFLATE: tuple[str, ...] = ("encoded", "gz-names")


class StageConfigError(RuntimeInputError):
    """Bad staging input: names the variable/key, the bad value and the fix (exit 2)."""


@dataclass(frozen=True)
class StageSpec:
    """One input to stage (an entry of AMLHPC_STAGE_JSON)."""

    name: str
    """Input name; AMLHPC_DATA_DIR_<NAME> and the directory under the scratch."""
    container: str
    account_url: str | None = None
    """https://<account>.blob.core.windows.net/; None when a connection string is used (Azurite)."""
    prefix: str = ""
    """Blob "directory" to stage; files keep their path below it."""
    mode: Mode = "local"
    egress_gbps: float | None = None
    """The account's egress limit, Gb/s (stack output storage.egressGbps)."""
    inflate: str = "encoded"
    """Which blobs are inflated: `encoded` (Content-Encoding gzip) or `gz-names` (also names ending in .gz)."""
    version: int | None = None
    """The dataset version to stage; None: the latest committed one (dataversion)."""

    @property
    def normalized_prefix(self) -> str:
        """`prefix` as a directory: 'cosmo' matches 'cosmo/...', never 'cosmo2/...'."""
        p = self.prefix.strip("/")
        return f"{p}/" if p else ""


_SPEC_KEYS = {"name", "account_url", "container", "prefix", "mode", "egress_gbps", "inflate", "version"}


def specs_from_json(text: str, source: str = contract.STAGE_JSON) -> list[StageSpec]:
    """Parse a JSON list of inputs; StageConfigError names every entry and key that is wrong."""
    shape = 'a JSON list of {"name", "container", "account_url", "prefix", "mode", "egress_gbps"} objects'
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StageConfigError.single(source, "", f"is not valid JSON ({exc.msg} at character {exc.pos})",
                                      f"it must be {shape}") from None
    if isinstance(document, dict):
        document = [document]
    if not isinstance(document, list):
        raise StageConfigError.single(source, "", f"is a JSON {type(document).__name__}", f"it must be {shape}")
    problems: list[RuntimeProblem] = []
    specs: list[StageSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(document):
        before = len(problems)

        def bad(key: str, message: str, hint: str = "") -> None:
            problems.append(RuntimeProblem(source, f"[{i}]{'.' + key if key else ''}", message, hint))  # noqa: B023

        if not isinstance(entry, dict):
            bad("", f"is a {type(entry).__name__}, not an object", f"each entry must be one of {shape}")
            continue
        for key in sorted(set(entry) - _SPEC_KEYS):
            near = difflib.get_close_matches(key, sorted(_SPEC_KEYS), n=1)
            bad(key, "unknown key", (f"did you mean {near[0]!r}? " if near else "") + f"allowed: {', '.join(sorted(_SPEC_KEYS))}")
        name = entry.get("name")
        if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_" for c in name):
            bad("name", f"{name!r} is not a valid input name",
                "use letters, digits, '-' or '_' (it becomes AMLHPC_DATA_DIR_<NAME> and a directory)")
        elif name.upper().replace("-", "_") in seen:
            bad("name", f"{name!r} is used twice (names are compared upper-case, '-' as '_')", "give each input its own name")
        else:
            seen.add(name.upper().replace("-", "_"))
        container = entry.get("container")
        if not isinstance(container, str) or not container:
            bad("container", "is required", "the stack output storage.containers.datasets, e.g. \"datasets\"")
        mode = entry.get("mode", "local")
        if mode not in MODES:
            bad("mode", f"{mode!r} is not a staging mode", f"use one of {', '.join(MODES)}")
        prefix = entry.get("prefix", "") or ""
        if not isinstance(prefix, str) or ".." in PurePosixPath(str(prefix)).parts:
            bad("prefix", f"{prefix!r} is not a blob path", "give the dataset's prefix as uploaded, without '..'")
        elif not prefix.strip("/"):
            bad("prefix", f"{prefix!r} is empty: that would stage the whole container",
                "give the dataset's prefix, as passed to `python -m amlhpc.jobs data upload --prefix`")
        account_url = entry.get("account_url")
        if account_url is not None and (not isinstance(account_url, str) or not account_url.startswith(("https://", "http://"))):
            bad("account_url", f"{blobio.safe_endpoint(str(account_url))!r} is not an https:// URL",
                "the stack output storage.blobEndpoint, e.g. https://<account>.blob.core.windows.net/")
        egress = entry.get("egress_gbps")
        if egress is not None and (not isinstance(egress, (int, float)) or isinstance(egress, bool) or egress <= 0):
            bad("egress_gbps", f"{egress!r} is not a positive number", "the stack output storage.egressGbps, in Gb/s")
        inflate = entry.get("inflate", "encoded")
        if inflate not in INFLATE:
            bad("inflate", f"{inflate!r} is not an inflate rule",
                "use 'encoded' (blobs with Content-Encoding: gzip, the default) or 'gz-names' (also names ending in .gz)")
        version = entry.get("version", "latest")
        if version == "latest" or version is None:
            version = None
        elif isinstance(version, str) and version.isdigit():
            version = int(version)
        if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
            bad("version", f"{version!r} is not a dataset version",
                "a version number `jobs data upload` printed (e.g. 3), or \"latest\" for the newest committed one")
        # name and container are strings whenever this entry added no problem (the checks above).
        if len(problems) == before and isinstance(name, str) and isinstance(container, str):
            specs.append(StageSpec(name=name, container=container, account_url=account_url, prefix=prefix,
                                   mode=mode, egress_gbps=float(egress) if egress is not None else None,
                                   inflate=inflate, version=version))
    if problems:
        raise StageConfigError(problems, "invalid staging inputs")
    return specs


def specs_from_env(env: Mapping[str, str] | None = None) -> list[StageSpec]:
    """The inputs in AMLHPC_STAGE_JSON (none when it is unset or empty)."""
    env = os.environ if env is None else env
    text = env.get(contract.STAGE_JSON, "").strip()
    return specs_from_json(text) if text else []


def node_gbits_from_env(env: Mapping[str, str] | None = None) -> float | None:
    """`storage_nic_gbits_per_s` from AMLHPC_SKU_JSON (the SKU catalog's per-node Blob rate)."""
    env = os.environ if env is None else env
    text = env.get(contract.SKU_JSON, "").strip()
    if not text:
        return None
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        log.warning("%s is not valid JSON; the egress check is skipped", contract.SKU_JSON)
        return None
    for candidate in (document, document.get("sku") if isinstance(document, dict) else None):
        if isinstance(candidate, dict) and isinstance(candidate.get("storage_nic_gbits_per_s"), (int, float)):
            return float(candidate["storage_nic_gbits_per_s"])
    return None


def egress_warning(spec: StageSpec, node_count: int, node_gbits_per_s: float | None, cap_mbps: float | None) -> str | None:
    """A warning when the nodes together can pull more than the account serves."""
    if spec.egress_gbps is None or node_gbits_per_s is None:
        return None
    per_node = node_gbits_per_s if not cap_mbps else min(node_gbits_per_s, cap_mbps / 1000)
    demand = node_count * per_node
    if demand <= spec.egress_gbps:
        return None
    accounts = math.ceil(demand / spec.egress_gbps)
    return (f"input {spec.name!r}: {node_count} nodes x {per_node:g} Gb/s = {demand:g} Gb/s exceeds the storage account's "
            f"egress of {spec.egress_gbps:g} Gb/s, so the account will throttle (503 ServerBusy) and each node gets "
            f"~{spec.egress_gbps / node_count:.1f} Gb/s; shard the dataset over {accounts} storage accounts (or cap "
            f"staging with --cap-mbps {spec.egress_gbps * 1000 / node_count:.0f}) to stay under it")
