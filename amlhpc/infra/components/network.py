"""Our own virtual network for private isolation: a compute subnet behind an NSG with a
NAT gateway for outbound traffic (nodes have no public IP), an endpoint subnet, and the
private DNS zones the private endpoints register in, linked to the VNet.

Under managed isolation the nodes live in Azure ML's managed VNet, so ours has no compute
subnet (nor its NSG and NAT gateway): only the endpoints people and CI reach the stack by.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import network, privatedns

from amlhpc.infra import quirks


@dataclass
class NetworkArgs:
    resource_group_name: pulumi.Input[str]
    location: str
    vnet_name: str
    address_space: str
    """VNet CIDR. Changing it replaces the VNet, its subnets and every cluster in them."""
    compute_subnet: str | None
    """CIDR for the cluster nodes (inside address_space); None under managed isolation.
    Changing it replaces the clusters."""
    endpoint_subnet: str
    """CIDR for private endpoints (inside address_space)."""
    tags: dict[str, str] = field(default_factory=dict)


class Network(pulumi.ComponentResource):
    """VNet, subnets, NSG, NAT gateway and private DNS zones."""

    vnet_id: pulumi.Output[str]
    compute_subnet_id: pulumi.Output[str] | None
    endpoint_subnet_id: pulumi.Output[str]
    dns_zone_ids: dict[str, pulumi.Output[str]]
    """Private DNS zone name -> zone id."""

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:network:Network", name, None, opts)
        vnet = self._vnet(name, args)
        endpoints = self._endpoint_subnet(name, args, vnet)
        compute = self._compute_subnet(name, args, vnet, endpoints) if args.compute_subnet is not None else None
        self.dns_zone_ids = self._private_dns_zones(name, args, vnet)

        self.vnet_id = vnet.id
        self.compute_subnet_id = compute.id if compute else None
        self.endpoint_subnet_id = endpoints.id
        self.register_outputs({
            "vnetId": self.vnet_id,
            "computeSubnetId": self.compute_subnet_id,
            "endpointSubnetId": self.endpoint_subnet_id,
        })

    def _vnet(self, name: str, args: NetworkArgs) -> network.VirtualNetwork:
        return network.VirtualNetwork(
            f"{name}-vnet",
            virtual_network_name=args.vnet_name,
            resource_group_name=args.resource_group_name,
            location=args.location,
            address_space=network.AddressSpaceArgs(address_prefixes=[args.address_space]),
            tags=args.tags,
            # Subnets are their own resources below; don't let the VNet fight over them.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["subnets"]),
        )

    def _compute_subnet(self, name: str, args: NetworkArgs, vnet: network.VirtualNetwork,
                        endpoints: network.Subnet) -> network.Subnet:
        """The nodes' subnet: inbound from the internet denied, outbound through a NAT gateway."""
        assert args.compute_subnet is not None
        return network.Subnet(
            f"{name}-compute-subnet",
            subnet_name="compute",
            virtual_network_name=vnet.name,
            resource_group_name=args.resource_group_name,
            address_prefix=args.compute_subnet,
            network_security_group=network.NetworkSecurityGroupArgs(id=self._compute_nsg(name, args).id),
            nat_gateway=network.SubResourceArgs(id=self._nat_gateway(name, args).id),
            default_outbound_access=False,
            # Azure serialises subnet changes on one VNet. This one waits for the endpoint
            # subnet, not the other way round: an endpoint kept by `make down` (its target is
            # locked) then keeps only its own subnet, not the NAT gateway billed by the hour.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[endpoints]),
        )

    def _compute_nsg(self, name: str, args: NetworkArgs) -> network.NetworkSecurityGroup:
        return network.NetworkSecurityGroup(
            f"{name}-compute-nsg",
            network_security_group_name=f"{args.vnet_name}-compute-nsg",
            resource_group_name=args.resource_group_name,
            location=args.location,
            security_rules=[
                # Nodes have no public IP; nothing from the internet may reach them. Traffic
                # inside the VNet (MPI, NCCL sockets, BeeOND) stays allowed by the defaults.
                network.SecurityRuleArgs(
                    name="deny-internet-inbound",
                    priority=4000,
                    direction="Inbound",
                    access="Deny",
                    protocol="*",
                    source_address_prefix="Internet",
                    source_port_range="*",
                    destination_address_prefix="*",
                    destination_port_range="*",
                ),
            ],
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _nat_gateway(self, name: str, args: NetworkArgs) -> network.NatGateway:
        """Outbound for nodes without public IPs: a NAT gateway on a static public IP."""
        child = pulumi.ResourceOptions(parent=self)
        egress_ip = network.PublicIPAddress(
            f"{name}-nat-ip",
            public_ip_address_name=f"{args.vnet_name}-nat-ip",
            resource_group_name=args.resource_group_name,
            location=args.location,
            sku=network.PublicIPAddressSkuArgs(name="Standard"),
            public_ip_allocation_method="Static",
            tags=args.tags,
            opts=child,
        )
        return network.NatGateway(
            f"{name}-nat",
            nat_gateway_name=f"{args.vnet_name}-nat",
            resource_group_name=args.resource_group_name,
            location=args.location,
            sku=network.NatGatewaySkuArgs(name="Standard"),
            public_ip_addresses=[network.SubResourceArgs(id=egress_ip.id)],
            tags=args.tags,
            opts=child,
        )

    def _endpoint_subnet(self, name: str, args: NetworkArgs, vnet: network.VirtualNetwork) -> network.Subnet:
        return network.Subnet(
            f"{name}-endpoint-subnet",
            subnet_name="endpoints",
            virtual_network_name=vnet.name,
            resource_group_name=args.resource_group_name,
            address_prefix=args.endpoint_subnet,
            private_endpoint_network_policies="Disabled",
            default_outbound_access=False,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _private_dns_zones(self, name: str, args: NetworkArgs, vnet: network.VirtualNetwork) -> dict[str, pulumi.Output[str]]:
        """Every private DNS zone our endpoints register in, each linked to the VNet: name -> id."""
        child = pulumi.ResourceOptions(parent=self)
        zone_ids = {}
        for zone_name in sorted({zone for zones in quirks.PRIVATE_DNS_ZONES.values() for zone in zones}):
            short = zone_name.removeprefix("privatelink.").split(".")[0]
            zone = privatedns.PrivateZone(
                f"{name}-dns-{short}",
                private_zone_name=zone_name,
                resource_group_name=args.resource_group_name,
                location="global",
                tags=args.tags,
                opts=child,
            )
            privatedns.VirtualNetworkLink(
                f"{name}-dns-{short}-link",
                virtual_network_link_name=f"{args.vnet_name}-link",
                private_zone_name=zone.name,
                resource_group_name=args.resource_group_name,
                location="global",
                registration_enabled=False,
                virtual_network=privatedns.SubResourceArgs(id=vnet.id),
                tags=args.tags,
                opts=child,
            )
            zone_ids[zone_name] = zone.id
        return zone_ids
