"""Private endpoints for the stack's PaaS resources, each registered in its private DNS zones.

Separate from `Network` because the endpoints need the resources, and the resources
(the workspace, the clusters) need the network first.

Deleting an endpoint removes its connection on the target resource, which an Azure delete
lock on the target refuses (ScopeLocked on `<target>/privateEndpointConnectionProxies/...`):
an endpoint to a locked resource is `protect`ed, and `make down` leaves it (with the subnet
and VNet it sits in).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import network

from amlhpc.infra import quirks
from amlhpc.infra.components import ComponentError


@dataclass
class EndpointTarget:
    key: str
    """Short name used in resource names, e.g. "datasets-blob"."""
    resource_id: pulumi.Input[str]
    group_id: str
    """Private Link sub-resource: blob, file, vault, registry or amlworkspace."""
    protect: bool = False
    """The target is under an Azure delete lock: the endpoint cannot be deleted while it stands."""


@dataclass
class PrivateEndpointsArgs:
    resource_group_name: pulumi.Input[str]
    location: str
    subnet_id: pulumi.Input[str]
    dns_zone_ids: dict[str, pulumi.Input[str]]
    """Zone name -> zone id, from Network.dns_zone_ids."""
    targets: list[EndpointTarget]
    name_prefix: str
    tags: dict[str, str] = field(default_factory=dict)


class PrivateEndpoints(pulumi.ComponentResource):
    """One private endpoint and DNS zone group per target."""

    endpoint_ids: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: PrivateEndpointsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:network:PrivateEndpoints", name, None, opts)
        self.endpoint_ids = {}
        for target in args.targets:
            zones = quirks.PRIVATE_DNS_ZONES.get(target.group_id)
            if zones is None:
                raise ComponentError(self, f"no private DNS zone known for sub-resource {target.group_id!r}")
            missing = [z for z in zones if z not in args.dns_zone_ids]
            if missing:
                raise ComponentError(self, f"the network has no private DNS zone {missing[0]}")
            endpoint_name = f"pe-{args.name_prefix}-{target.key}"
            endpoint = network.PrivateEndpoint(
                f"{name}-{target.key}",
                private_endpoint_name=endpoint_name,
                resource_group_name=args.resource_group_name,
                location=args.location,
                subnet=network.SubnetArgs(id=args.subnet_id),
                private_link_service_connections=[
                    network.PrivateLinkServiceConnectionArgs(
                        name=endpoint_name,
                        private_link_service_id=target.resource_id,
                        group_ids=[target.group_id],
                    )
                ],
                tags=args.tags,
                opts=pulumi.ResourceOptions(parent=self, protect=True if target.protect else None),
            )
            network.PrivateDnsZoneGroup(
                f"{name}-{target.key}-dns",
                private_dns_zone_group_name="default",
                private_endpoint_name=endpoint.name,
                resource_group_name=args.resource_group_name,
                private_dns_zone_configs=[
                    network.PrivateDnsZoneConfigArgs(name=zone.replace(".", "-"), private_dns_zone_id=args.dns_zone_ids[zone])
                    for zone in zones
                ],
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.endpoint_ids[target.key] = endpoint.id
        self.register_outputs({"endpointIds": dict(self.endpoint_ids)})
