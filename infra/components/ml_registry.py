"""An Azure ML registry for sharing environments (and models) across workspaces."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import machinelearningservices as ml


@dataclass
class MlRegistryArgs:
    resource_group_name: pulumi.Input[str]
    registry_name: str
    """Physical name (infra.naming). Changing it replaces the registry."""
    location: str
    replica_regions: list[str] = field(default_factory=list)
    """Extra regions the registry's storage and ACR replicate to (the location is always one)."""
    private: bool = False
    """Public network access off; the program adds a private endpoint (amlregistry). The
    registry's system-created storage and ACR keep their public endpoints: private
    endpoints to them need their ids, which exist only after the registry does."""
    protect: bool = False
    tags: dict[str, str] = field(default_factory=dict)


class MlRegistry(pulumi.ComponentResource):
    """Registry with system-created storage and Premium ACR in each region."""

    registry_name: pulumi.Output[str]
    registry_id: pulumi.Output[str]

    def __init__(self, name: str, args: MlRegistryArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:ml:MlRegistry", name, None, opts)
        regions = [args.location] + [r for r in args.replica_regions if r != args.location]
        registry = ml.Registry(
            f"{name}-registry",
            registry_name=args.registry_name,
            resource_group_name=args.resource_group_name,
            location=args.location,
            identity=ml.ManagedServiceIdentityArgs(type="SystemAssigned"),
            public_network_access="Disabled" if args.private else "Enabled",
            region_details=[
                ml.RegistryRegionArmDetailsArgs(
                    location=region,
                    acr_details=[ml.AcrDetailsArgs(
                        system_created_acr_account=ml.SystemCreatedAcrAccountArgs(acr_account_sku="Premium"))],
                    storage_account_details=[ml.StorageAccountDetailsArgs(
                        system_created_storage_account=ml.SystemCreatedStorageAccountArgs(
                            storage_account_type="Standard_LRS",
                            storage_account_hns_enabled=False,
                            allow_blob_public_access=False,
                        ))],
                )
                for region in regions
            ],
            tags=args.tags,
            # Assets shared across workspaces, and a name unique across Azure: kept by
            # destroy and adopted by the next up, like the workspace.
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True, protect=args.protect),
        )
        self.registry_name = registry.name
        self.registry_id = registry.id
        self.register_outputs({"registryName": self.registry_name, "registryId": self.registry_id})
