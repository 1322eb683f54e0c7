"""Storage accounts by role beside the dataset account: checkpoints (write-heavy) and
coordination (small, hot).

One account per role keeps each role's traffic within its own account's targets (Microsoft
Learn, "Scalability and performance targets for standard storage accounts", read 2026-11-28:
20,000 requests/s, ingress and egress per account by region): checkpoint bytes can fill a
checkpoint account's ingress without a single supervision record waiting behind them.

- Checkpoints: blob soft delete off (or one day at most): the uploader prunes old versions
  itself, and a soft-deleted 405B version would be billed as data for the whole retention
  (Microsoft Learn, "Soft delete for blobs": soft-deleted data is billed at the active
  tier's rate). A lifecycle rule deletes previous blob versions and snapshots a day after
  they were made (Microsoft Learn, "Lifecycle management overview", actions on versions and
  snapshots), so an overwrite never keeps a second copy of a checkpoint for long.
- Coordination: the `supervision` container of the managed runs' records; the same secure
  account settings, soft delete as the stack sets it (records are small).

Every stack retains them on `destroy`, like the dataset account (environments also protect them
with the data outside dev): an experiment's teardown never deletes a run's checkpoints; its own
checkpoint accounts stay, tagged with the experiment, until someone deletes them on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pulumi
from pulumi_azure_native import storage

from amlhpc.infra.components.storage_account import blob_service, secure_storage_account

Role = Literal["checkpoints", "coordination"]
ROLE_CONTAINERS: dict[str, tuple[str, ...]] = {"checkpoints": ("checkpoints",), "coordination": ("supervision",)}
"""The containers an account of each role holds (the permission model's container:<name> scopes)."""
CHECKPOINT_SOFT_DELETE_MAX_DAYS = 1
OLD_VERSIONS_DAYS = 1
"""Previous versions and snapshots of a checkpoint blob are deleted this many days after they were made."""
COMPONENT_TYPE = "aml-hpc:data:RoleStorage"


@dataclass
class RoleStorageArgs:
    resource_group_name: pulumi.Input[str]
    account_name: str
    location: pulumi.Input[str]
    role: Role
    allow_shared_key_access: bool = False
    private: bool = False
    soft_delete_days: int = 0
    """Blob and container soft delete, days; 0 is off. Checkpoint accounts: at most one day."""
    retain: bool = True
    """Kept by `pulumi destroy` and by an experiment's teardown: checkpoints outlive the stack."""
    protect: bool = False
    tags: dict[str, str] = field(default_factory=dict)


class RoleStorage(pulumi.ComponentResource):
    """A storage account for one role, with its containers (and, for checkpoints, its lifecycle rule)."""

    account_name: pulumi.Output[str]
    account_id: pulumi.Output[str]
    blob_endpoint: pulumi.Output[str]
    container_ids: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: RoleStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(COMPONENT_TYPE, name, None, opts)
        if args.role == "checkpoints" and args.soft_delete_days > CHECKPOINT_SOFT_DELETE_MAX_DAYS:
            raise ValueError(f"checkpoint account {args.account_name}: soft delete {args.soft_delete_days} days; "
                             f"at most {CHECKPOINT_SOFT_DELETE_MAX_DAYS} (pruned versions would be billed as data)")
        keep = pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain or None, protect=args.protect or None)
        account = secure_storage_account(
            f"{name}-account", account_name=args.account_name, resource_group_name=args.resource_group_name,
            location=args.location,
            allow_shared_key_access=args.allow_shared_key_access, private=args.private,
            tags={**args.tags, "role": args.role}, opts=keep)
        service = blob_service(f"{name}-blob-service", account=account, resource_group_name=args.resource_group_name,
                               soft_delete_days=args.soft_delete_days,
                               opts=pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain or None))
        if args.role == "checkpoints":
            old_versions_rule(f"{name}-lifecycle", account, args.resource_group_name,
                              pulumi.ResourceOptions(parent=self, depends_on=[service],
                                                     retain_on_delete=args.retain or None))
        self.container_ids = {}
        for container_name in ROLE_CONTAINERS[args.role]:
            container = storage.BlobContainer(
                f"{name}-{container_name}", account_name=account.name, resource_group_name=args.resource_group_name,
                container_name=container_name, public_access="None",
                opts=pulumi.ResourceOptions.merge(keep, pulumi.ResourceOptions(depends_on=[service])))
            self.container_ids[container_name] = container.id
        self.account_name = account.name
        self.account_id = account.id
        self.blob_endpoint = account.primary_endpoints.apply(lambda e: e.blob)
        self.register_outputs({"accountName": self.account_name, "accountId": self.account_id,
                               "blobEndpoint": self.blob_endpoint})


def old_versions_rule(resource_name: str, account: storage.StorageAccount, resource_group_name: pulumi.Input[str],
                      opts: pulumi.ResourceOptions) -> storage.ManagementPolicy:
    """The account's lifecycle policy: previous versions and snapshots of block blobs deleted
    OLD_VERSIONS_DAYS after they were made (the policy is one per account, named `default`)."""
    after = storage.DateAfterCreationArgs(days_after_creation_greater_than=OLD_VERSIONS_DAYS)
    return storage.ManagementPolicy(
        resource_name, account_name=account.name, resource_group_name=resource_group_name,
        management_policy_name="default",
        policy=storage.ManagementPolicySchemaArgs(rules=[storage.ManagementPolicyRuleArgs(
            name="checkpoint-old-versions", enabled=True, type="Lifecycle",
            definition=storage.ManagementPolicyDefinitionArgs(
                filters=storage.ManagementPolicyFilterArgs(blob_types=["blockBlob"]),
                actions=storage.ManagementPolicyActionArgs(
                    version=storage.ManagementPolicyVersionArgs(delete=after),
                    snapshot=storage.ManagementPolicySnapShotArgs(delete=after))))]),
        opts=opts)
