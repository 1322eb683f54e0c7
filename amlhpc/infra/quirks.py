"""Azure facts and workarounds the components depend on, each with its reason.

One place for what is Azure's behaviour rather than our design, so a change upstream is a
one-line change here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

# AmlCompute accepts updates to these fields and silently ignores them: the only way to
# change them is a new cluster. Azure ML's update model for an existing cluster
# (ClusterUpdateParameters, API 2025-12-01 as azure-ai-ml ships it) carries scaleSettings
# and nothing else. Paths are the Compute resource's input properties.
CLUSTER_REPLACE_ON_CHANGES: tuple[str, ...] = (
    "properties.properties.vmSize",
    "properties.properties.vmPriority",
    "properties.properties.subnet",
    "properties.properties.enableNodePublicIp",
    "properties.properties.osType",
    # SSH is set up when the nodes are provisioned: the admin user and key, and whether
    # the SSH port is open, only take effect on a new cluster.
    "properties.properties.userAccountCredentials",
    "properties.properties.remoteLoginPortPublicAccess",
    # The identity the nodes run as (data access, image pulls) is fixed at creation too.
    "identity",
)

# Role definitions (built-in GUIDs, custom roles) are data in amlhpc/core/catalog/permissions.toml.

# Workspace storage access (systemDatastoresAuthMode). Microsoft Learn, "Disable shared key
# access for your workspace's storage account (preview)" (checked 2026-11-23): identity
# mode is a preview "we don't recommend for production workloads"; with it, the users of
# the workspace need Storage Blob Data Contributor and Storage File Data Privileged
# Contributor on the account, and a compute identity that reads or writes job data needs
# Storage Blob Data Contributor. Identity is the default everywhere: an account key is a
# secret that opens every job's snapshots and outputs, and the platform's baseline refuses
# shared keys on any storage outside dev (policy no-shared-key-storage). A stack may still
# choose accessKey (aml-hpc:workspaceStorageAuth); outside dev the policy then refuses it.
SYSTEM_DATASTORES_AUTH_MODE = {"identity": "Identity", "accessKey": "AccessKey"}
"""Sent as the specification's enum spells them (SystemDatastoresAuthMode, API 2025-12-01): Azure
answers in that casing, and any other reads back as a change after an import."""


def default_workspace_storage_auth(environment: str) -> str:
    """identity in every environment (the reasons above); the argument stays for callers."""
    return "identity"


# Under private isolation, what keeps a public endpoint and why (the plan is checked
# against this table: a resource with a public switch left on must be listed here).
PUBLIC_BY_DESIGN: dict[str, str] = {
    "azure-native:operationalinsights:Workspace": (
        "public ingestion and query: a private Log Analytics workspace needs an Azure Monitor "
        "Private Link Scope (AMPLS), which this plan does not create"),
    "azure-native:applicationinsights:Component": (
        "ingests into the Log Analytics workspace over its public endpoint (same AMPLS reason)"),
}


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
    # Microsoft Learn, "Azure Private Endpoint DNS zone values": registries use amlregistry.
    "amlregistry": ("privatelink.api.azureml.ms",),
}

# Private endpoints on a container registry need the Premium SKU; public registries default to
# Standard (cheaper; its 3,000 reads/min serve a few dozen nodes starting at once, the plan checks
# the stack's clusters against it and aml-hpc:containerRegistry.sku raises it).
ACR_SKU: dict[str, Literal["Basic", "Standard", "Premium"]] = {"public": "Standard", "private": "Premium"}
"""Microsoft Learn, "Azure Container Registry service tiers" (read 2026-11): changing the tier
is an update in place; private endpoints need Premium."""

# A deleted workspace stays soft-deleted for 14 days and blocks its name: experiment
# stacks therefore never own a workspace (docs/deploying.md).
WORKSPACE_SOFT_DELETE_DAYS = 14

# Key Vault soft delete cannot be turned off; purge protection makes it mandatory for the
# retention period, so a deleted vault's name is also blocked for that long.
KEY_VAULT_SOFT_DELETE_DAYS = 90


def budget_start_date(now: datetime) -> str:
    """Consumption budgets must start on the first of a month (in UTC), not in the past at
    creation.

    The start date is computed at first deployment; the Budget resource ignores later
    changes to `timePeriod` so the monthly value drift does not update the budget. A naive
    `now` is taken as UTC.
    """
    moment = now.astimezone(UTC) if now.tzinfo else now
    return f"{moment.year:04d}-{moment.month:02d}-01T00:00:00Z"


# azure-mgmt-consumption, Budget.notifications: "Budget can have up to five notifications."
BUDGET_MAX_NOTIFICATIONS = 5


BUDGET_IGNORE_CHANGES = ["timePeriod"]


def idle_duration(minutes: int) -> str:
    """AmlCompute wants the scale-down idle time as an ISO 8601 duration."""
    return f"PT{minutes}M"


# Azure Firewall, which an Azure ML managed network deploys for its FQDN outbound rules:
# deployment price per hour in USD (plus data processed per GB), as listed on Azure's
# pricing page (https://azure.microsoft.com/pricing/details/azure-firewall/, 2025, East US).
# Policy and docs quote them so the cost of an FQDN rule is visible before it is billed.
AZURE_FIREWALL_USD_PER_HOUR = {"Standard": 1.25, "Basic": 0.395}
AZURE_FIREWALL_USD_PER_GB = {"Standard": 0.016, "Basic": 0.065}


# Azure RBAC propagation: a role assignment can take minutes to take effect (Microsoft Learn,
# "Troubleshoot Azure RBAC": changes can take up to 10 minutes), and Azure checks some
# grants at the moment a resource is created: Azure ML checks the workspace identity's
# access to a customer-managed key (Key Vault answers 403 ForbiddenByRbac, its RBAC denial:
# Microsoft Learn, "Azure Key Vault REST API error codes"), and storage refuses a data
# request the grant does not cover yet with AuthorizationPermissionMismatch (Azure Storage
# error codes). Such a failure on the first `up` after the grant was made is retried by
# scripts/pulumi-stack.sh after a wait (amlhpc.infra.adopt.rbac_propagation_failure decides).
RBAC_PROPAGATION_ERRORS = ("ForbiddenByRbac", "AuthorizationPermissionMismatch")
RBAC_PROPAGATION_WAIT_SECONDS = 60
RBAC_PROPAGATION_ATTEMPTS = 6
"""Up to 5 waits of a minute after the first attempt: within Microsoft's 10 minutes with the ups' own time."""
