"""The hardening options: customer-managed key, diagnostics, locks, regions a size is offered in."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from amlhpc.core.errors import ProblemCollector
from amlhpc.infra.config.clusters import _check_cluster_regions, _check_managed_ssh
from amlhpc.infra.config.models import EXPERIMENT_PREFIX, GUID_FORMAT, NAMESPACE, _RawConfig
from amlhpc.infra.config.network import _check_managed_network, _check_way_in
from amlhpc.infra.config.problems import fix_command


def _check_hardening(found: ProblemCollector, stack: str, raw: _RawConfig, location: str,
                     compute_subnet: str | None, endpoint_subnet: str | None,
                     now: datetime | None) -> dict[str, Any]:
    """Validate the hardening options; return the StackConfig fields they resolve to."""
    _check_cluster_regions(found, raw, location, (now or datetime.now(UTC)).date())
    _check_managed_ssh(found, raw)
    _check_encryption(found, stack, raw)
    environment = raw.environment if stack.startswith(EXPERIMENT_PREFIX) else stack  # an environment stack is its name
    protect = raw.protect_data if raw.protect_data is not None else (environment or stack) != "dev"
    lock = raw.locks.dataset_storage if raw.locks.dataset_storage is not None else protect
    return {
        "encryption": raw.encryption,
        "diagnostics": raw.diagnostics if raw.diagnostics and raw.diagnostics.enabled else None,
        "hbi_workspace": raw.hbi_workspace,
        "lock_dataset_storage": lock,
        "managed_network": _check_managed_network(found, stack, raw),
        "way_in": _check_way_in(found, stack, raw, compute_subnet, endpoint_subnet),
    }


def _check_encryption(found: ProblemCollector, stack: str, raw: _RawConfig) -> None:
    enc = raw.encryption
    path = f"{NAMESPACE}encryption.cosmosDbPrincipalId"
    lookup = "az ad sp show --id a232010e-820c-4083-83bb-3ace5fc29d0b --query id -o tsv"
    if not enc.customer_managed_key:
        if enc.cosmos_db_principal_id is not None:
            found.add(path, "is only used with customerManagedKey: true", "remove it")
        return
    if not enc.cosmos_db_principal_id:
        found.add(path, "a customer-managed key needs the object id of the 'Azure Cosmos DB' service principal, "
                  "which encrypts the workspace's metadata with it", f"find it with `{lookup}`, then "
                  f"{fix_command(stack, path, '<object id>')}")
    elif not GUID_FORMAT.match(enc.cosmos_db_principal_id):
        found.add(path, f"{enc.cosmos_db_principal_id!r} is not an Entra object id (a GUID)", f"find it with `{lookup}`")
