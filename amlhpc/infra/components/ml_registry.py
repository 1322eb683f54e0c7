"""An Azure ML registry for sharing environments (and models) across workspaces.

Azure ML creates the registry's storage itself: a blob storage account in each of its
regions and a single Premium container registry, geo-replicated to each region, in a
managed resource group `azureml-rg-<registry>_<guid>` of the subscription (Microsoft Learn,
"Manage Azure Machine Learning registries", ms.date 2024-10-10). Their ids exist only once
the registry does: Azure reports them in `regionDetails[].storageAccountDetails[]` and
`acrDetails[]` (`systemCreated*.armResourceId`), which this component exposes.

A private registry (public network access off; Azure ML applies the setting to its storage
and ACR, which the API offers no network switch for) is reached only through private
endpoints: to the registry (`amlregistry`), to each region's storage (`blob`) and to the ACR
(`registry`), in the subnet of the workspace's endpoint, as Microsoft's registry isolation
guidance asks ("Network isolation with Azure Machine Learning registries", ms.date
2025-04-04: "Create a private endpoint to the registry, storage, and ACR in the same subnet
as the private endpoint of the AML workspace"). `private_link_targets()` lists them, for the
endpoints in our VNet and for a managed network's outbound rules alike.

What a private registry refuses: creating an environment asset in it directly, when its ACR
has public access disabled (same page); the workaround Microsoft gives, and what this
project does, is to register environments in the workspace (by image reference,
amlhpc/infra/components/environments.py) and share them into the registry
(`az ml environment share`, docs/isolation.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_azure_native import machinelearningservices as ml


@dataclass
class MlRegistryArgs:
    resource_group_name: pulumi.Input[str]
    registry_name: str
    """Physical name (amlhpc.infra.naming). Changing it replaces the registry."""
    location: str
    replica_regions: list[str] = field(default_factory=list)
    """Extra regions the registry's storage and ACR replicate to (the location is always one)."""
    private: bool = False
    """Public network access off: reachable only through the private endpoints of
    `private_link_targets()`, which the program adds."""
    protect: bool = False
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PrivateLinkTarget:
    """One thing of the registry a private endpoint connects to."""

    suffix: str
    """Appended to the caller's key: "" for the registry, "-acr", "-blob-<region>"."""
    resource_id: pulumi.Input[str]
    group_id: str
    """Private Link sub-resource: amlregistry, registry or blob."""


def _regions(args: MlRegistryArgs) -> list[str]:
    return [args.location] + [r for r in args.replica_regions if r != args.location]


class MlRegistry(pulumi.ComponentResource):
    """Registry with system-created storage in each region and one geo-replicated Premium ACR."""

    registry_name: pulumi.Output[str]
    registry_id: pulumi.Output[str]
    storage_account_ids: dict[str, pulumi.Output[str]]
    """Region -> the id of the storage account Azure ML created there."""
    container_registry_id: pulumi.Output[str]
    """The id of the container registry Azure ML created (one for all regions)."""

    def __init__(self, name: str, args: MlRegistryArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:ml:MlRegistry", name, None, opts)
        regions = _regions(args)
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
        where = args.registry_name
        self.storage_account_ids = {
            region: registry.region_details.apply(lambda d, r=region: system_created_id(d, r, "storage", where))
            for region in regions}
        self.container_registry_id = registry.region_details.apply(
            lambda d: system_created_id(d, args.location, "acr", where))
        self.register_outputs({"registryName": self.registry_name, "registryId": self.registry_id})

    def private_link_targets(self) -> list[PrivateLinkTarget]:
        """The registry, its container registry and each region's storage account."""
        return [
            PrivateLinkTarget("", self.registry_id, "amlregistry"),
            PrivateLinkTarget("-acr", self.container_registry_id, "registry"),
            *[PrivateLinkTarget(f"-blob-{region}", account, "blob") for region, account in self.storage_account_ids.items()],
        ]


def _field(value: Any, snake: str, camel: str) -> Any:
    """A property of an azure-native output object (or of the plain dict a test hands in)."""
    if value is None:
        return None
    found = getattr(value, snake, None)
    if found is None and isinstance(value, dict):
        found = value.get(camel, value.get(snake))
    return found


def _same_region(a: Any, b: str) -> bool:
    return str(a or "").replace(" ", "").lower() == b.replace(" ", "").lower()


def system_created_id(region_details: Any, region: str, kind: str, registry: str) -> str:
    """The id Azure reports for the storage account (kind "storage") or container registry
    ("acr") it created for `region`; a clear error when the answer has none."""
    details_key, account_key = (("storage_account_details", "storageAccountDetails"),
                                ("system_created_storage_account", "systemCreatedStorageAccount")) \
        if kind == "storage" else (("acr_details", "acrDetails"), ("system_created_acr_account", "systemCreatedAcrAccount"))
    for details in region_details or []:
        if not _same_region(_field(details, "location", "location"), region):
            continue
        for entry in _field(details, *details_key) or []:
            arm = _field(_field(entry, *account_key), "arm_resource_id", "armResourceId")
            resource_id = _field(arm, "resource_id", "resourceId")
            if resource_id:
                return str(resource_id)
    what = "storage account" if kind == "storage" else "container registry"
    raise pulumi.RunError(f"Azure reported no system-created {what} for region {region} of ML registry {registry} "
                          "(regionDetails): its private endpoint has no target; check the registry with "
                          f"`az ml registry show -n {registry}`")
