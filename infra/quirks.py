"""Azure facts and workarounds the components depend on, each with its reason.

One place for what is Azure's behaviour rather than our design, so a change upstream is a
one-line change here.
"""

from __future__ import annotations

from datetime import datetime

# AmlCompute accepts updates to these fields and silently ignores them: the only way to
# change them is a new cluster. Paths are the Compute resource's input properties.
# (Azure ML issue trackers, e.g. Azure/azure-sdk-for-python and azureml-examples.)
CLUSTER_REPLACE_ON_CHANGES: tuple[str, ...] = (
    "properties.properties.vmSize",
    "properties.properties.vmPriority",
    "properties.properties.subnet",
    "properties.properties.enableNodePublicIp",
    "properties.properties.osType",
)

# Built-in role definition GUIDs (stable across tenants).
ROLE_STORAGE_BLOB_DATA_READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
ROLE_STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
ROLE_ACR_PULL = "7f951dda-4ed3-4680-a7ca-43fe172d538d"
ROLE_AZUREML_DATA_SCIENTIST = "f6c7c914-8db3-469d-8ca1-694a8f32e121"
"""'AzureML Data Scientist': every action inside a workspace (jobs, reading computes and
their nodes) except creating or deleting compute and changing the workspace itself (Azure
built-in roles, AI + machine learning)."""


def role_definition_id(subscription_id: str, role_guid: str) -> str:
    return f"/subscriptions/{subscription_id}/providers/Microsoft.Authorization/roleDefinitions/{role_guid}"


# Private Link: sub-resource (groupId) -> private DNS zone, per Azure's private endpoint
# DNS documentation. The workspace needs two zones for its one endpoint.
PRIVATE_DNS_ZONES: dict[str, tuple[str, ...]] = {
    "blob": ("privatelink.blob.core.windows.net",),
    "file": ("privatelink.file.core.windows.net",),
    "vault": ("privatelink.vaultcore.azure.net",),
    "registry": ("privatelink.azurecr.io",),
    "amlworkspace": ("privatelink.api.azureml.ms", "privatelink.notebooks.azure.net"),
}

# Private endpoints on a container registry need the Premium SKU; public registries are
# fine on Standard (cheaper, same pull throughput for a handful of images).
ACR_SKU = {"public": "Standard", "private": "Premium"}

# A deleted workspace stays soft-deleted for 14 days and blocks its name: experiment
# stacks therefore never own a workspace (docs/deploying.md).
WORKSPACE_SOFT_DELETE_DAYS = 14

# Key Vault soft delete cannot be turned off; purge protection makes it mandatory for the
# retention period, so a deleted vault's name is also blocked for that long.
KEY_VAULT_SOFT_DELETE_DAYS = 90


def budget_start_date(now: datetime) -> str:
    """Consumption budgets must start on the first of a month, not in the past at creation.

    The start date is computed at first deployment; the Budget resource ignores later
    changes to `timePeriod` so the monthly value drift does not update the budget.
    """
    return f"{now.year:04d}-{now.month:02d}-01T00:00:00Z"


BUDGET_IGNORE_CHANGES = ["timePeriod"]


def idle_duration(minutes: int) -> str:
    """AmlCompute wants the scale-down idle time as an ISO 8601 duration."""
    return f"PT{minutes}M"
