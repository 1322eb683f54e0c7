"""Role assignments, each derived from a right of the permission model
(amlhpc/core/catalog/permissions.toml): who gets which role at which scope, and why, is data there;
this module turns a principal's rights into Azure role assignments.

`grants_for(principal, scopes, principal_id, facts)` lists the `granted_by = "program"` rights
of a principal that apply to the stack (`facts`: the `when` values that hold), each at the
resource id its symbolic scope resolves to; `Access` declares them. Assignments can take
minutes to propagate.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import authorization

from amlhpc.core.permissions import CONDITION_VERSION, MODEL
from amlhpc.infra import quirks
from amlhpc.infra.components import ComponentError

DATASET_SCOPES = frozenset({"dataset-account", "container:datasets", "container:checkpoints", "container:supervision"})
"""The model's scopes inside the dataset account: under its delete lock when the stack has one."""


@dataclass
class Grant:
    key: str
    """Short name for the resource name, e.g. "datasets-read" (the model right's key)."""
    role: str
    """The permission model's role key, e.g. "storage-blob-data-reader"."""
    scope: pulumi.Input[str]
    principal_id: pulumi.Input[str]
    principal_type: str = "ServicePrincipal"
    """ServicePrincipal for managed identities (avoids the replication-delay failure), User or Group."""
    protect: bool = False
    """The scope is under an Azure delete lock: Azure refuses to delete the assignment, so
    Pulumi protects it (revoking it means lifting the lock first: docs/isolation.md)."""
    condition: str | None = None
    """The model's ABAC condition for the right (`job-writes-only`...), None for none."""


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
        unknown = sorted({g.role for g in args.grants} - set(MODEL.roles))
        if unknown:
            raise ComponentError(self, f"role(s) {', '.join(unknown)} are not in amlhpc/core/catalog/permissions.toml")
        self.assignments = []
        for grant in args.grants:
            self.assignments.append(role_assignment(
                f"{name}-{grant.key}",
                scope=grant.scope,
                principal_id=grant.principal_id,
                principal_type=grant.principal_type,
                role_definition_id=role_definition_id(args.subscription_id, grant.role),
                condition=_condition(args.subscription_id, grant.condition),
                opts=pulumi.ResourceOptions(parent=self, protect=True if grant.protect else None),
            ))
        self.register_outputs({})


def _condition(subscription_id: pulumi.Input[str], name: str | None) -> pulumi.Output[str] | None:
    """The model's condition text for a grant, in the subscription (None: unconditioned)."""
    if name is None:
        return None
    return pulumi.Output.from_input(subscription_id).apply(lambda sub: MODEL.condition_text(name, sub) or "")


def role_definition_id(subscription_id: pulumi.Input[str], role: str) -> pulumi.Output[str]:
    """The ARM id of a model role in the subscription (custom roles: their derived GUID)."""
    return pulumi.Output.from_input(subscription_id).apply(
        lambda sub: quirks.role_definition_id(sub, MODEL.role(role).guid_in(sub)))


def grants_for(principal: str, scopes: Mapping[str, pulumi.Input[str] | list[pulumi.Input[str]]],
               principal_id: pulumi.Input[str], facts: Iterable[str] = (), *, principal_type: str = "ServicePrincipal",
               index: int | None = None, locked: bool = False, endpoints: bool = False,
               only_given: bool = False) -> list[Grant]:
    """The principal's program rights that apply to the stack, at the resource ids `scopes`
    gives for the model's symbolic scopes (a list: the scope in each of several accounts,
    the dataset account's first). `only_given`: skip rights at scopes `scopes` does not
    name (an experiment granting on its own accounts only), instead of refusing them. `index`: the principal's position in its stack file
    list (submitters, dataContributors); `locked`: the dataset account carries a delete lock;
    `endpoints`: the rights on private endpoints only (they exist later in the program), else
    all the others."""
    grants = []
    facts = frozenset(facts)
    for right in MODEL.rights_of(principal, "program"):
        if not right.applies(facts) or right.scope.startswith("endpoint:") != endpoints:
            continue
        if right.scope not in scopes:
            if only_given:
                continue
            raise KeyError(f"no resource id for scope {right.scope!r} of {principal}'s right {right.key!r}")
        given = scopes[right.scope]
        # A scope with several resources (container:checkpoints in every checkpoint account):
        # one assignment each; the first keeps the right's own key, so a stack that gains
        # accounts keeps its existing assignments, and the others are prefixed (`acct1-`...),
        # so every name still ends in its right's key (the policy's role-in-permission-model).
        # Only the first can sit under the dataset lock.
        for n, scope in enumerate(given if isinstance(given, list) else [given]):
            key = right.resource_key(index) if n == 0 else f"acct{n}-{right.resource_key(index)}"
            grants.append(Grant(key, right.role.key, scope, principal_id, principal_type,
                                protect=locked and n == 0 and right.scope in DATASET_SCOPES, condition=right.condition))
    return grants


ROLE_ASSIGNMENT_NAMESPACE = uuid.UUID("5f1c7e2a-9d3b-4c8e-a6f0-2b7d9e4c1a35")
"""Ours, fixed for good: changing it renames (and so replaces) every assignment."""


def role_assignment_name(scope: str, principal_id: str, role_definition_id: str) -> str:
    """The deterministic name of the assignment of a role to a principal at a scope (ARM ids
    compared without case, as Azure does)."""
    key = "|".join(str(part).lower() for part in (scope, principal_id, role_definition_id))
    return str(uuid.uuid5(ROLE_ASSIGNMENT_NAMESPACE, key))


def role_assignment(resource_name: str, *, scope: pulumi.Input[str], principal_id: pulumi.Input[str],
                    principal_type: str, role_definition_id: pulumi.Input[str],
                    condition: pulumi.Input[str] | None = None,
                    opts: pulumi.ResourceOptions | None = None) -> authorization.RoleAssignment:
    """A role assignment under its deterministic name (every assignment of this program and
    of the access program); `condition`: an ABAC condition (version 2.0)."""
    name = pulumi.Output.all(scope, principal_id, role_definition_id).apply(lambda a: role_assignment_name(*a))
    return authorization.RoleAssignment(
        resource_name,
        role_assignment_name=name,
        principal_id=principal_id,
        principal_type=principal_type,
        role_definition_id=role_definition_id,
        scope=scope,
        condition=condition,
        condition_version=CONDITION_VERSION if condition is not None else None,
        opts=opts,
    )
