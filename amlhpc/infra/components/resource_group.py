"""The stack's resource group, tagged so cost and teardown can find what it holds."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import resources

from amlhpc.infra.components import ComponentError


@dataclass
class ResourceGroupArgs:
    name: str
    """Physical name (amlhpc.infra.naming). Changing it replaces the group and everything in it."""
    location: str
    """Azure region. Changing it replaces the group."""
    tags: dict[str, str]
    """owner, environment, stack, cost-center and expiresAt (experiments) - see StackConfig.tags()."""
    retain_on_delete: bool = True
    """Keep the group on `pulumi destroy`. Azure deletes everything inside a deleted group,
    retained resources included, so a group holding retained data must be retained too."""


class ResourceGroup(pulumi.ComponentResource):
    """A resource group with the stack's tags."""

    name: pulumi.Output[str]
    id: pulumi.Output[str]

    def __init__(self, name: str, args: ResourceGroupArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:core:ResourceGroup", name, None, opts)
        for required in ("owner", "environment", "stack"):
            if required not in args.tags:
                raise ComponentError(self, f"resource group tags must include {required!r}")
        group = resources.ResourceGroup(
            f"{name}-rg",
            resource_group_name=args.name,
            location=args.location,
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_on_delete),
        )
        self.name = group.name
        self.id = group.id
        self.register_outputs({"name": self.name, "id": self.id})
