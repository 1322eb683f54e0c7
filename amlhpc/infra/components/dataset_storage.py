"""The dataset storage account: its own account (never the workspace's), locked down, and
retained by every `pulumi destroy` so datasets and checkpoints outlive any stack update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pulumi
from pulumi_azure_native import storage

from amlhpc.infra.components.storage_account import blob_service, secure_storage_account

CONTAINERS = ("datasets", "checkpoints", "supervision")
"""`supervision` holds managed runs' records: the controllers and the submitters write it, jobs
cannot (amlhpc/core/catalog/permissions.toml), so nothing a job writes steers a controller."""
DATASTORE_CONTAINERS = ("datasets", "checkpoints")
"""The containers jobs reach through Azure ML datastores (inputs and outputs)."""


@dataclass
class DatasetStorageArgs:
    resource_group_name: pulumi.Input[str]
    account_name: str
    """Physical name (amlhpc.infra.naming): 3-24 lowercase letters/digits, global. Changing it replaces
    the account - which `protect` refuses, so data is never dropped by a rename."""
    location: str
    tier: Literal["StandardHot", "PremiumBlockBlob"] = "StandardHot"
    """StandardHot: StorageV2 Standard_LRS, hot tier. PremiumBlockBlob: BlockBlobStorage
    Premium_LRS (lower latency, higher cost). Changing it replaces the account."""
    allow_shared_key_access: bool = False
    """Off by default: data access is by Entra ID (managed identity, az login) only."""
    private: bool = False
    """True under private isolation: public network access disabled (private endpoint only)."""
    soft_delete_days: int = 14
    """Blob and container soft delete retention, days."""
    protect: bool = True
    """Pulumi `protect`: the stack refuses to delete or replace the account. On outside dev."""
    tags: dict[str, str] = field(default_factory=dict)


class DatasetStorage(pulumi.ComponentResource):
    """Storage account + `datasets`, `checkpoints` and `supervision` containers, https/TLS 1.2
    only, no public blobs."""

    account_name: pulumi.Output[str]
    account_id: pulumi.Output[str]
    blob_endpoint: pulumi.Output[str]
    container_ids: dict[str, pulumi.Output[str]]
    container_names: dict[str, str]

    def __init__(self, name: str, args: DatasetStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:data:DatasetStorage", name, None, opts)
        premium = args.tier == "PremiumBlockBlob"
        # Data outlives the stack: retained on delete always, protected outside dev.
        keep = pulumi.ResourceOptions(parent=self, retain_on_delete=True, protect=args.protect)

        account = secure_storage_account(
            f"{name}-account",
            account_name=args.account_name,
            resource_group_name=args.resource_group_name,
            location=args.location,
            premium=premium,
            allow_shared_key_access=args.allow_shared_key_access,
            private=args.private,
            tags=args.tags,
            opts=keep,
        )
        service = blob_service(f"{name}-blob-service", account=account, resource_group_name=args.resource_group_name,
                               soft_delete_days=args.soft_delete_days,
                               opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True))
        self.container_ids = {}
        self.container_names = {}
        for container_name in CONTAINERS:
            container = storage.BlobContainer(
                f"{name}-{container_name}",
                account_name=account.name,
                resource_group_name=args.resource_group_name,
                container_name=container_name,
                public_access="None",
                opts=pulumi.ResourceOptions.merge(keep, pulumi.ResourceOptions(depends_on=[service])),
            )
            self.container_ids[container_name] = container.id
            self.container_names[container_name] = container_name

        self.account_name = account.name
        self.account_id = account.id
        self.blob_endpoint = account.primary_endpoints.apply(lambda e: e.blob)
        self.register_outputs({
            "accountName": self.account_name,
            "accountId": self.account_id,
            "blobEndpoint": self.blob_endpoint,
        })
