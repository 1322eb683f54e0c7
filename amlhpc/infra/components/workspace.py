"""The Azure ML workspace and what it depends on: Key Vault (RBAC, purge protection),
Application Insights on Log Analytics, a container registry (admin user off), the
workspace's own storage account, and the user-assigned identity the GPU clusters run as.

Lives only in environment stacks. The workspace and its dependencies are kept by
`pulumi destroy` (retainOnDelete) and adopted again by the next `up`
(scripts/pulumi-stack.sh, amlhpc/infra/adopt.py): a deleted workspace blocks its name for 14 days
(amlhpc.infra.quirks.WORKSPACE_SOFT_DELETE_DAYS) and a purge-protected Key Vault its name for its
retention, so deleting and recreating them would fail; keeping them also keeps run
history, models and images.

Under private isolation the workspace, Key Vault, registry and storage turn public network
access off. Log Analytics and Application Insights keep public ingestion and query: making
them private needs an Azure Monitor Private Link Scope, which this plan does not create
(amlhpc.infra.quirks.PUBLIC_BY_DESIGN).

Hardening options, all set when the workspace is created (Azure refuses changing the key
setting and the HBI flag later, and a managed network cannot be turned off again):
a managed network (amlhpc/infra/components/managed_network.py), a customer-managed key
(amlhpc/infra/components/encryption.py) and the high-business-impact flag (`hbiWorkspace`: less
diagnostic data to Microsoft, encrypted and wiped node scratch disks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pulumi
from pulumi_azure_native import (
    applicationinsights,
    containerregistry,
    keyvault,
    managedidentity,
    operationalinsights,
    storage,
)
from pulumi_azure_native import (
    machinelearningservices as ml,
)

from amlhpc.infra import quirks
from amlhpc.infra.components.encryption import CustomerManagedKey, CustomerManagedKeyArgs
from amlhpc.infra.components.storage_account import blob_service, secure_storage_account
from amlhpc.infra.naming import StackNames


@dataclass
class WorkspaceArgs:
    resource_group_name: pulumi.Input[str]
    location: str
    names: StackNames
    """Physical names for the workspace, vault, registry, storage, logs and identity."""
    tenant_id: pulumi.Input[str]
    """Entra tenant for the Key Vault (from the deploying credential)."""
    private: bool = False
    """Private isolation: public network access off on the workspace, Key Vault, registry and
    storage (Log Analytics and Application Insights stay public, see the module docstring)."""
    tags: dict[str, str] = field(default_factory=dict)
    log_retention_days: int = 30
    storage_auth: Literal["identity", "accessKey"] = "identity"
    """How Azure ML reaches its own storage account: `identity` (shared keys off; a preview
    Microsoft does not recommend for production; users and compute need data-plane roles,
    amlhpc.infra.program grants them) or `accessKey` (the account key, kept in the Key Vault)."""
    protect: bool = False
    """Pulumi `protect` on the workspace and its dependencies (outside dev)."""
    managed_network: ml.ManagedNetworkSettingsArgs | None = None
    """Managed isolation: the managed VNet and its outbound rules. Azure provisions it when the
    workspace is created (provisionNetworkNow), so the first cluster does not wait for it."""
    customer_managed_key: CustomerManagedKeySettings | None = None
    hbi_workspace: bool = False
    registry_sku: str | None = None
    """The container registry's tier (aml-hpc:containerRegistry.sku); None: the isolation's default."""
    storage_soft_delete_days: int = 14
    """Soft delete (blobs and containers) on the workspace storage, which also keeps every
    blob version: job snapshots, outputs and logs overwritten or deleted stay recoverable."""


@dataclass
class CustomerManagedKeySettings:
    """What the stack says about the key; the vault is the workspace's own."""

    subscription_id: pulumi.Input[str]
    cosmos_db_principal_id: str
    key_size: int = 3072


class Workspace(pulumi.ComponentResource):
    """An Azure ML workspace with secure dependencies and a compute identity."""

    workspace_name: pulumi.Output[str]
    workspace_id: pulumi.Output[str]
    key_vault_id: pulumi.Output[str]
    registry_id: pulumi.Output[str]
    registry_login_server: pulumi.Output[str]
    workspace_storage_id: pulumi.Output[str]
    principal_id: pulumi.Output[str]
    """The workspace's system-assigned identity (studio previews of identity-based datastores)."""
    identity_id: pulumi.Output[str]
    identity_client_id: pulumi.Output[str]
    identity_principal_id: pulumi.Output[str]
    log_analytics_id: pulumi.Output[str]

    def __init__(self, name: str, args: WorkspaceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:ml:Workspace", name, None, opts)
        # Names Azure reserves after deletion, and data: kept by destroy, adopted by the next up.
        kept = pulumi.ResourceOptions(parent=self, retain_on_delete=True, protect=args.protect)

        identity = self._compute_identity(name, args)
        vault = self._key_vault(name, args, kept)
        logs = self._log_analytics(name, args, kept)
        insights = self._app_insights(name, args, logs, kept)
        registry = self._container_registry(name, args, kept)
        ws_storage = self._workspace_storage(name, args, kept)
        cmk = self._customer_managed_key(name, args, vault, kept)
        workspace = self._ml_workspace(name, args, _Dependencies(vault, insights, registry, ws_storage, cmk), kept)

        self.workspace_name = workspace.name
        self.workspace_id = workspace.id
        self.key_vault_id = vault.id
        self.registry_id = registry.id
        self.registry_login_server = registry.login_server
        self.workspace_storage_id = ws_storage.id
        self.principal_id = workspace.identity.apply(lambda i: i.principal_id if i else None)
        self.identity_id = identity.id
        self.identity_client_id = identity.client_id
        self.identity_principal_id = identity.principal_id
        self.log_analytics_id = logs.id
        self.register_outputs({
            "workspaceName": self.workspace_name,
            "workspaceId": self.workspace_id,
            "registryLoginServer": self.registry_login_server,
            "identityClientId": self.identity_client_id,
        })

    def _compute_identity(self, name: str, args: WorkspaceArgs) -> managedidentity.UserAssignedIdentity:
        """The user-assigned identity the GPU clusters run as."""
        return managedidentity.UserAssignedIdentity(
            f"{name}-compute-identity",
            resource_name_=args.names.identity,
            resource_group_name=args.resource_group_name,
            location=args.location,
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _key_vault(self, name: str, args: WorkspaceArgs, kept: pulumi.ResourceOptions) -> keyvault.Vault:
        """RBAC authorization, soft delete with purge protection; closed under private isolation."""
        return keyvault.Vault(
            f"{name}-kv",
            vault_name=args.names.key_vault,
            resource_group_name=args.resource_group_name,
            location=args.location,
            properties=keyvault.VaultPropertiesArgs(
                tenant_id=args.tenant_id,
                sku=keyvault.SkuArgs(family="A", name="standard"),
                enable_rbac_authorization=True,
                enable_purge_protection=True,
                enable_soft_delete=True,
                soft_delete_retention_in_days=quirks.KEY_VAULT_SOFT_DELETE_DAYS,
                public_network_access=_public_access(args),
                network_acls=keyvault.NetworkRuleSetArgs(
                    default_action="Deny" if args.private else "Allow", bypass="AzureServices"
                ),
            ),
            tags=args.tags,
            opts=kept,
        )

    def _log_analytics(self, name: str, args: WorkspaceArgs, kept: pulumi.ResourceOptions) -> operationalinsights.Workspace:
        return operationalinsights.Workspace(
            f"{name}-logs",
            workspace_name=args.names.log_analytics,
            resource_group_name=args.resource_group_name,
            location=args.location,
            sku=operationalinsights.WorkspaceSkuArgs(name="PerGB2018"),
            retention_in_days=args.log_retention_days,
            tags=args.tags,
            opts=kept,
        )

    def _app_insights(self, name: str, args: WorkspaceArgs, logs: operationalinsights.Workspace,
                      kept: pulumi.ResourceOptions) -> applicationinsights.Component:
        """Workspace-based Application Insights, on the Log Analytics workspace."""
        return applicationinsights.Component(
            f"{name}-insights",
            resource_name_=args.names.app_insights,
            resource_group_name=args.resource_group_name,
            location=args.location,
            kind="web",
            application_type="web",
            ingestion_mode="LogAnalytics",
            workspace_resource_id=logs.id,
            tags=args.tags,
            opts=kept,
        )

    def _container_registry(self, name: str, args: WorkspaceArgs, kept: pulumi.ResourceOptions) -> containerregistry.Registry:
        """Admin user and anonymous pull off; the tier the stack declares (Premium under private isolation)."""
        return containerregistry.Registry(
            f"{name}-acr",
            registry_name=args.names.container_registry,
            resource_group_name=args.resource_group_name,
            location=args.location,
            sku=containerregistry.SkuArgs(name=args.registry_sku or quirks.ACR_SKU["private" if args.private else "public"]),
            admin_user_enabled=False,
            anonymous_pull_enabled=False,
            public_network_access=_public_access(args),
            tags=args.tags,
            opts=kept,
        )

    def _workspace_storage(self, name: str, args: WorkspaceArgs, kept: pulumi.ResourceOptions) -> storage.StorageAccount:
        # Identity mode: no keys at all. Access-key mode: Azure ML keeps the account key in
        # the Key Vault and its system datastores use it, so shared keys must stay on.
        account = secure_storage_account(
            f"{name}-storage",
            account_name=args.names.workspace_storage,
            resource_group_name=args.resource_group_name,
            location=args.location,
            allow_shared_key_access=args.storage_auth == "accessKey",
            private=args.private,
            tags=args.tags,
            opts=kept,
        )
        blob_service(f"{name}-storage-blob-service", account=account, resource_group_name=args.resource_group_name,
                     soft_delete_days=args.storage_soft_delete_days, versioning=True,
                     opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True))
        return account

    def _customer_managed_key(self, name: str, args: WorkspaceArgs, vault: keyvault.Vault,
                              kept: pulumi.ResourceOptions) -> CustomerManagedKey | None:
        key = args.customer_managed_key
        if key is None:
            return None
        return CustomerManagedKey(f"{name}-cmk", CustomerManagedKeyArgs(
            resource_group_name=args.resource_group_name, location=args.location, vault_name=vault.name,
            vault_id=vault.id, subscription_id=key.subscription_id, identity_name=f"{args.names.identity}-cmk",
            cosmos_db_principal_id=key.cosmos_db_principal_id, key_size=key.key_size, tags=args.tags,
        ), opts=kept)  # a kept workspace needs its key after `down`

    def _ml_workspace(self, name: str, args: WorkspaceArgs, deps: _Dependencies,
                      kept: pulumi.ResourceOptions) -> ml.Workspace:
        """The workspace itself, with the hardening options it can only take at creation."""
        cmk = deps.cmk
        return ml.Workspace(
            f"{name}-mlw",
            workspace_name=args.names.workspace,
            resource_group_name=args.resource_group_name,
            location=args.location,
            kind="Default",
            sku=ml.SkuArgs(name="Basic", tier="Basic"),
            identity=cmk.workspace_identity() if cmk else ml.ManagedServiceIdentityArgs(type="SystemAssigned"),
            encryption=cmk.encryption() if cmk else None,
            hbi_workspace=args.hbi_workspace or None,
            managed_network=args.managed_network,
            provision_network_now=True if args.managed_network else None,
            key_vault=deps.vault.id,
            application_insights=deps.insights.id,
            container_registry=deps.registry.id,
            storage_account=deps.storage.id,
            public_network_access=_public_access(args),
            v1_legacy_mode=False,
            system_datastores_auth_mode=quirks.SYSTEM_DATASTORES_AUTH_MODE[args.storage_auth],
            friendly_name=args.names.workspace,
            tags=args.tags,
            # The key's role assignments must exist before Azure ML first uses the key; it checks
            # them at creation, and one not yet in effect (RBAC propagation) makes the up fail
            # with ForbiddenByRbac, which scripts/pulumi-stack.sh retries after a wait.
            opts=pulumi.ResourceOptions.merge(kept, pulumi.ResourceOptions(depends_on=cmk.grants if cmk else None)),
        )


@dataclass(frozen=True)
class _Dependencies:
    """What the workspace resource points at."""

    vault: keyvault.Vault
    insights: applicationinsights.Component
    registry: containerregistry.Registry
    storage: storage.StorageAccount
    cmk: CustomerManagedKey | None


def _public_access(args: WorkspaceArgs) -> str:
    """Public network access on the workspace, vault, registry and storage."""
    return "Disabled" if args.private else "Enabled"
