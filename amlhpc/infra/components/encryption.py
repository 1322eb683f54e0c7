"""A customer-managed key (CMK) for the Azure ML workspace, kept in the workspace's Key Vault.

Azure ML encrypts the workspace's metadata with the key in resources it creates in a
Microsoft-managed resource group of our subscription (Cosmos DB, AI Search, storage: billed
to us). What Azure requires, and what this component declares for it (Microsoft Learn,
"Customer-managed keys for Azure Machine Learning", 2024-05; "Use customer-managed keys",
2025-02):

- the key in a Key Vault of the same subscription with soft delete and purge protection
  (the workspace's vault has both); RSA, at least 3072 bits recommended;
- get/wrap/unwrap rights on the key for the identity the workspace names for the key (a
  user-assigned identity here, so the rights exist before the workspace does) and for the
  "Azure Cosmos DB" service principal, which encrypts the metadata store. The vault uses
  Azure RBAC, so the rights are the permission model's `cmk` and `cosmos-db` rights
  (amlhpc/core/catalog/permissions.toml): "Key Vault Crypto Service Encryption User" on the key.

The key is set when the workspace is created: Azure refuses turning CMK on or off later
and only accepts another key of the same vault.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import keyvault, managedidentity
from pulumi_azure_native import machinelearningservices as ml

from amlhpc.infra.components.access import grants_for, role_assignment, role_definition_id


@dataclass
class CustomerManagedKeyArgs:
    resource_group_name: pulumi.Input[str]
    location: str
    vault_name: pulumi.Input[str]
    vault_id: pulumi.Input[str]
    subscription_id: pulumi.Input[str]
    identity_name: str
    """The user-assigned identity the workspace fetches the key with."""
    cosmos_db_principal_id: str
    """Object id of the 'Azure Cosmos DB' service principal in the tenant (validated config)."""
    key_name: str = "cmk-workspace"
    key_size: int = 3072
    tags: dict[str, str] = field(default_factory=dict)


class CustomerManagedKey(pulumi.ComponentResource):
    """An RSA key, the identity that uses it, and the role assignments both users need."""

    identity_id: pulumi.Output[str]
    key_identifier: pulumi.Output[str]
    """The versioned key URL (https://<vault>.vault.azure.net/keys/<name>/<version>) Azure ML wants."""
    grants: list[pulumi.Resource]
    """Role assignments the workspace must wait for."""

    def __init__(self, name: str, args: CustomerManagedKeyArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:security:CustomerManagedKey", name, None, opts)
        # Kept with the workspace it encrypts: a workspace retained by `down` needs its key, its
        # identity and their grants when the next `up` adopts it.
        keep = bool(opts and opts.retain_on_delete) or None
        child = pulumi.ResourceOptions(parent=self, retain_on_delete=keep)
        self._vault_id = args.vault_id
        identity = managedidentity.UserAssignedIdentity(
            f"{name}-identity",
            resource_name_=args.identity_name,
            resource_group_name=args.resource_group_name,
            location=args.location,
            tags=args.tags,
            opts=child,
        )
        key = keyvault.Key(
            f"{name}-key",
            key_name=args.key_name,
            vault_name=args.vault_name,
            resource_group_name=args.resource_group_name,
            properties=keyvault.KeyPropertiesArgs(
                kty="RSA",
                key_size=args.key_size,
                attributes=keyvault.KeyAttributesArgs(enabled=True),
            ),
            tags=args.tags,
            # Without the key the workspace's metadata cannot be read: never replace it silently.
            opts=pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=keep),
        )
        # Plain assignments, not an Access component: they keep the names (and so the ids) they
        # had before the permission model, and are retained with the workspace.
        grants = (grants_for("cmk", {"cmk-key": key.id}, identity.principal_id, {"customer-managed-key"})
                  + grants_for("cosmos-db", {"cmk-key": key.id}, args.cosmos_db_principal_id, {"customer-managed-key"}))
        self.grants = [
            role_assignment(
                f"{name}-{grant.key}",
                principal_id=grant.principal_id,
                principal_type=grant.principal_type,
                role_definition_id=role_definition_id(args.subscription_id, grant.role),
                scope=grant.scope,
                opts=child,
            )
            for grant in grants
        ]
        self.identity_id = identity.id
        self.key_identifier = key.key_uri_with_version
        self.register_outputs({"identityId": self.identity_id, "keyIdentifier": self.key_identifier})

    def workspace_identity(self) -> ml.ManagedServiceIdentityArgs:
        """The workspace keeps its system identity (for its own resources) and adds the key's."""
        return ml.ManagedServiceIdentityArgs(type="SystemAssigned,UserAssigned",
                                             user_assigned_identities=[self.identity_id])

    def encryption(self) -> ml.EncryptionPropertyArgs:
        return ml.EncryptionPropertyArgs(
            status="Enabled",
            key_vault_properties=ml.KeyVaultPropertiesArgs(key_vault_arm_id=self._vault_id,
                                                           key_identifier=self.key_identifier),
            identity=ml.IdentityForCmkArgs(user_assigned_identity=self.identity_id),
        )
