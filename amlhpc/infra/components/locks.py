"""Azure resource locks: a CanNotDelete lock keeps a resource alive against deletion outside Pulumi.

Pulumi's `protect` guards only Pulumi; a lock is enforced by Azure Resource Manager for
everyone (portal, CLI, a deleted resource group). What it does not do (Microsoft Learn,
"Lock your resources to protect your infrastructure"): it does not protect the data in a
storage account (blob deletes are data-plane calls), and it also blocks deleting child
and extension resources inside its scope (containers, role assignments, diagnostic
settings) and private endpoints to it. The program protects those (amlhpc/infra/program.py,
policy rule `locked-scope-protected`), so `make down` leaves them instead of failing with
ScopeLocked. Declared with `ManagementLockByScope` (azure-native authorization, REST API
2020-05-01; levels CanNotDelete or ReadOnly).

The lock is retained on delete: `pulumi destroy` of a stack leaves it on the retained
account, and turning it off in the stack file stops managing it without removing it -
lifting a data safeguard is a deliberate `az lock delete` (docs/isolation.md).
"""

from __future__ import annotations

import pulumi
from pulumi_azure_native import authorization

LOCK_NAME = "do-not-delete"


def cannot_delete_lock(resource_name: str, *, scope: pulumi.Input[str], notes: str,
                       opts: pulumi.ResourceOptions | None = None) -> authorization.ManagementLockByScope:
    """A CanNotDelete lock on `scope` (a resource id), kept when the stack lets go of it."""
    return authorization.ManagementLockByScope(
        resource_name,
        lock_name=LOCK_NAME,
        scope=scope,
        level="CanNotDelete",
        notes=notes[:512],
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(retain_on_delete=True)),
    )
