"""Role assignments: least privilege for the cluster identity, and data upload rights for
the people or groups the stack names.

The cluster identity reads datasets (Storage Blob Data Reader on the `datasets`
container), writes checkpoints (Storage Blob Data Contributor on `checkpoints`) and
pulls images (AcrPull on the registry). Assignments can take minutes to propagate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import authorization

from infra import quirks
from infra.components import ComponentError


@dataclass
class Grant:
    key: str
    """Short name for the resource name, e.g. "datasets-read"."""
    role_guid: str
    scope: pulumi.Input[str]
    principal_id: pulumi.Input[str]
    principal_type: str = "ServicePrincipal"
    """ServicePrincipal for managed identities (avoids the replication-delay failure), User or Group."""


@dataclass
class AccessArgs:
    subscription_id: pulumi.Input[str]
    grants: list[Grant] = field(default_factory=list)


class Access(pulumi.ComponentResource):
    """A set of role assignments."""

    def __init__(self, name: str, args: AccessArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:security:Access", name, None, opts)
        keys = [g.key for g in args.grants]
        if len(keys) != len(set(keys)):
            raise ComponentError(self, f"duplicate grant keys in {keys}")
        for grant in args.grants:
            authorization.RoleAssignment(
                f"{name}-{grant.key}",
                principal_id=grant.principal_id,
                principal_type=grant.principal_type,
                role_definition_id=pulumi.Output.from_input(args.subscription_id).apply(
                    lambda sub, guid=grant.role_guid: quirks.role_definition_id(sub, guid)
                ),
                scope=grant.scope,
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.register_outputs({})


def cluster_identity_grants(principal_id, datasets_scope, checkpoints_scope, registry_scope) -> list[Grant]:
    """The cluster identity's three roles."""
    return [
        Grant("datasets-read", quirks.ROLE_STORAGE_BLOB_DATA_READER, datasets_scope, principal_id),
        Grant("checkpoints-write", quirks.ROLE_STORAGE_BLOB_DATA_CONTRIBUTOR, checkpoints_scope, principal_id),
        Grant("acr-pull", quirks.ROLE_ACR_PULL, registry_scope, principal_id),
    ]
