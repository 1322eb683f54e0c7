"""The platform's secure storage account settings, in one place.

Used by the dataset storage and by the workspace's own account: HTTPS only, TLS 1.2, no
anonymous blob access, Entra ID first (shared keys off unless opted in), and in private
isolation no public network access at all. `blob_service` keeps what is deleted or
overwritten recoverable: soft delete for blobs and containers, and optionally versioning.
"""

from __future__ import annotations

import pulumi
from pulumi_azure_native import storage


def secure_storage_account(resource_name: str, *, account_name: str, resource_group_name: pulumi.Input[str],
                           location: pulumi.Input[str], premium: bool = False, allow_shared_key_access: bool = False,
                           private: bool = False, tags: dict[str, str] | None = None,
                           opts: pulumi.ResourceOptions | None = None) -> storage.StorageAccount:
    """premium: BlockBlobStorage on Premium_LRS; otherwise StorageV2 Standard_LRS, hot tier."""
    return storage.StorageAccount(
        resource_name,
        account_name=account_name,
        resource_group_name=resource_group_name,
        location=location,
        kind="BlockBlobStorage" if premium else "StorageV2",
        sku=storage.SkuArgs(name="Premium_LRS" if premium else "Standard_LRS"),
        access_tier=None if premium else "Hot",
        # Azure reports isHnsEnabled (false) for every new account and azure-native marks it
        # forceNew: left unset, the account adopted after `make down` reads back with it and
        # the next `up` would replace it (pulumi-azure-native issue #2003). Stated, it matches.
        is_hns_enabled=False,
        enable_https_traffic_only=True,
        minimum_tls_version="TLS1_2",
        allow_blob_public_access=False,
        allow_shared_key_access=allow_shared_key_access,
        default_to_o_auth_authentication=not allow_shared_key_access,
        public_network_access="Disabled" if private else "Enabled",
        network_rule_set=storage.NetworkRuleSetArgs(default_action="Deny" if private else "Allow", bypass="AzureServices"),
        tags=tags or {},
        opts=opts,
    )


def blob_service(resource_name: str, *, account: storage.StorageAccount, resource_group_name: pulumi.Input[str],
                 soft_delete_days: int, versioning: bool = False,
                 opts: pulumi.ResourceOptions | None = None) -> storage.BlobServiceProperties:
    """The account's blob service: soft delete of blobs and containers for `soft_delete_days`
    (an overwritten blob is kept as a soft-deleted snapshot as well; 0 turns soft delete off),
    and blob versioning.

    A singleton: azure-native "deletes" it by writing Azure's defaults back, which would switch
    soft delete off on an account `destroy` keeps. Callers retain it with its account (never
    protect it: Pulumi would then refuse to destroy the rest of the stack)."""
    policy = (storage.DeleteRetentionPolicyArgs(enabled=True, days=soft_delete_days) if soft_delete_days > 0
              else storage.DeleteRetentionPolicyArgs(enabled=False))
    return storage.BlobServiceProperties(
        resource_name,
        account_name=account.name,
        resource_group_name=resource_group_name,
        blob_services_name="default",
        delete_retention_policy=policy,
        container_delete_retention_policy=policy,
        is_versioning_enabled=True if versioning else None,
        opts=opts,
    )
