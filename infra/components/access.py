"""Role assignments: least privilege for the cluster identity, and data upload rights for
the people or groups the stack names.

The cluster identity reads datasets (Storage Blob Data Reader on the `datasets`
container), writes checkpoints (Storage Blob Data Contributor on `checkpoints`) and
pulls images (AcrPull on the registry). Assignments can take minutes to propagate.

Every assignment this program makes is named by `role_assignment_name`: a GUID derived
from its scope, principal and role, the three things Azure allows only one assignment for
(a second one fails with RoleAssignmentExists). Microsoft recommends the same for
templates ("Create Azure RBAC resources by using Bicep": "a GUID that uses the scope,
principal ID, and role ID together"). Without it azure-native names each assignment with
a random GUID, so an assignment kept by `down` (retainOnDelete) could never be found again
by its id, and the next `up` would try to create a second one.

A grant whose scope sits under an Azure delete lock (the dataset account outside dev) is
`protect`ed: Azure refuses to delete it (ScopeLocked), so Pulumi must not plan to, and
`make down` (destroy --exclude-protected) leaves it in place with the data it opens
(docs/isolation.md, "The delete lock on the dataset account, and teardown").
"""

from __future__ import annotations

import uuid
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
    protect: bool = False
    """The scope is under an Azure delete lock: Azure refuses to delete the assignment, so
    Pulumi protects it (revoking it means lifting the lock first: docs/isolation.md)."""


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
            role_assignment(
                f"{name}-{grant.key}",
                scope=grant.scope,
                principal_id=grant.principal_id,
                principal_type=grant.principal_type,
                role_definition_id=pulumi.Output.from_input(args.subscription_id).apply(
                    lambda sub, guid=grant.role_guid: quirks.role_definition_id(sub, guid)
                ),
                opts=pulumi.ResourceOptions(parent=self, protect=True if grant.protect else None),
            )
        self.register_outputs({})


def cluster_identity_grants(principal_id, datasets_scope, checkpoints_scope, registry_scope,
                            data_locked: bool = False) -> list[Grant]:
    """The cluster identity's three roles; `data_locked`: the two data containers are under
    a delete lock."""
    return [
        Grant("datasets-read", quirks.ROLE_STORAGE_BLOB_DATA_READER, datasets_scope, principal_id, protect=data_locked),
        Grant("checkpoints-write", quirks.ROLE_STORAGE_BLOB_DATA_CONTRIBUTOR, checkpoints_scope, principal_id,
              protect=data_locked),
        Grant("acr-pull", quirks.ROLE_ACR_PULL, registry_scope, principal_id),
    ]


ROLE_ASSIGNMENT_NAMESPACE = uuid.UUID("5f1c7e2a-9d3b-4c8e-a6f0-2b7d9e4c1a35")
"""Ours, fixed for good: changing it renames (and so replaces) every assignment."""


def role_assignment_name(scope: str, principal_id: str, role_definition_id: str) -> str:
    """The deterministic name of the assignment of a role to a principal at a scope (ARM ids
    compared without case, as Azure does)."""
    key = "|".join(str(part).lower() for part in (scope, principal_id, role_definition_id))
    return str(uuid.uuid5(ROLE_ASSIGNMENT_NAMESPACE, key))


def role_assignment(resource_name: str, *, scope: pulumi.Input[str], principal_id: pulumi.Input[str],
                    principal_type: str, role_definition_id: pulumi.Input[str],
                    opts: pulumi.ResourceOptions | None = None) -> authorization.RoleAssignment:
    """A role assignment under its deterministic name (every assignment of this program)."""
    name = pulumi.Output.all(scope, principal_id, role_definition_id).apply(lambda a: role_assignment_name(*a))
    return authorization.RoleAssignment(
        resource_name,
        role_assignment_name=name,
        principal_id=principal_id,
        principal_type=principal_type,
        role_definition_id=role_definition_id,
        scope=scope,
        opts=opts,
    )
