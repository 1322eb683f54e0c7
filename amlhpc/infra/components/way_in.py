"""A way into a private or managed stack: Azure Bastion and a jump box, and a CI runner subnet.

The workspace, its storage and registry take no public traffic in those stacks, so people
and CI need a seat inside our VNet to reach the private endpoints (docs/isolation.md):

- **Azure Bastion** (public IP on Bastion only) and a **jump box**: a small Linux VM with no
  public IP and no password, reached with `az network bastion ssh` (Standard SKU: native
  client tunnels) or from the portal (Basic). People sign in with their Entra ID: the
  AADSSHLoginForLinux extension and the VM's system-assigned identity, which Entra ID login
  needs (Microsoft Learn, "Sign in to a Linux virtual machine in Azure by using Microsoft
  Entra ID and OpenSSH"); who may is a role assignment on the VM (`login_grants`), so
  joining and leaving the team is Entra ID's business, not a key on the box. The admin
  account's SSH key is a break-glass credential. `jobs submit`, `make images` and `pulumi`
  run from it with the user's own `az login`.
- a **CI runner subnet** for self-hosted runners (VMs or scale sets registered with the CI
  outside Pulumi), behind the same NSG.

The jump box and runners reach the internet (Entra ID sign-in, package indexes) through
their own NAT gateway: our subnets have no default outbound access. Azure serialises
subnet changes on a VNet, so each subnet waits for the one before it.

Input names: pulumi-azure-native network (BastionHost, Subnet, NatGateway,
NetworkSecurityGroup, NetworkInterface) and compute (VirtualMachine, VirtualMachineExtension).
Bastion needs a subnet named AzureBastionSubnet of /26 or larger and a Standard, static
public IP (Microsoft Learn, "About Azure Bastion configuration settings").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pulumi
from pulumi_azure_native import compute, network

from amlhpc.infra.components import ComponentError, inherited_depends_on
from amlhpc.infra.components.access import Grant, grants_for

BASTION_SUBNET_NAME = "AzureBastionSubnet"  # the only name Azure accepts for Bastion's subnet
JUMP_BOX_IMAGE = compute.ImageReferenceArgs(publisher="Canonical", offer="ubuntu-24_04-lts", sku="server",
                                            version="latest")
# Entra ID sign-in to a Linux VM: the extension Microsoft documents for it (`az vm extension
# set --publisher Microsoft.Azure.ActiveDirectory --name AADSSHLoginForLinux`).
ENTRA_LOGIN_EXTENSION = ("Microsoft.Azure.ActiveDirectory", "AADSSHLoginForLinux", "1.0")


@dataclass
class JumpBoxSpec:
    size: str
    admin_user: str
    public_key: str
    """OpenSSH public key (validated in amlhpc.infra.config); passwords are never set."""


@dataclass
class WayInArgs:
    resource_group_name: pulumi.Input[str]
    location: str
    vnet_name: str
    """Our VNet (amlhpc/infra/components/network.py), created before this component."""
    name_prefix: str
    """e.g. amlhpc-prod: resource names derive from it."""
    bastion_subnet: str | None = None
    bastion_sku: Literal["Basic", "Standard"] = "Standard"
    jump_box_subnet: str | None = None
    jump_box: JumpBoxSpec | None = None
    ci_runner_subnet: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


class WayIn(pulumi.ComponentResource):
    """Bastion, jump box and CI runner subnet, each only when its subnet is given."""

    ci_runner_subnet_id: pulumi.Output[str] | None
    jump_box_id: pulumi.Output[str] | None
    jump_box_nic_id: pulumi.Output[str] | None
    bastion_id: pulumi.Output[str] | None

    def __init__(self, name: str, args: WayInArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:network:WayIn", name, None, opts)
        if args.bastion_subnet and not (args.jump_box and args.jump_box_subnet):
            raise ComponentError(self, "Bastion needs a jump box to connect to")
        self._name, self._args = name, args
        self._child = pulumi.ResourceOptions(parent=self)
        # Children do not inherit a component's depends_on: the first subnet waits for the network.
        self._previous = inherited_depends_on(opts)
        self._nsg = self._nat = None
        if args.jump_box_subnet or args.ci_runner_subnet:
            self._nsg, self._nat = self._inner_guard_and_egress()

        self.ci_runner_subnet_id = self.jump_box_id = self.jump_box_nic_id = self.bastion_id = None
        if args.bastion_subnet:
            self.bastion_id = self._bastion(args.bastion_subnet)
        if args.jump_box and args.jump_box_subnet:
            self._jump_box(args.jump_box, self._inner_subnet("jump-box", "jump-box", args.jump_box_subnet))
        if args.ci_runner_subnet:
            self.ci_runner_subnet_id = self._inner_subnet("ci-runners", "ci-runners", args.ci_runner_subnet).id
        self.register_outputs({"ciRunnerSubnetId": self.ci_runner_subnet_id})

    def _subnet(self, key: str, subnet_name: str, cidr: str, **props) -> network.Subnet:
        """A subnet of our VNet, after the one before it (Azure serialises subnet changes)."""
        args = self._args
        created = network.Subnet(
            f"{self._name}-{key}-subnet",
            subnet_name=subnet_name,
            virtual_network_name=args.vnet_name,
            resource_group_name=args.resource_group_name,
            address_prefix=cidr,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self._previous)),
            **props,
        )
        self._previous[:] = [created]
        return created

    def _inner_subnet(self, key: str, subnet_name: str, cidr: str) -> network.Subnet:
        """A subnet for the jump box or runners: behind the NSG, out through the NAT gateway only."""
        assert self._nsg is not None and self._nat is not None
        return self._subnet(key, subnet_name, cidr,
                            network_security_group=network.NetworkSecurityGroupArgs(id=self._nsg.id),
                            nat_gateway=network.SubResourceArgs(id=self._nat.id), default_outbound_access=False)

    def _inner_guard_and_egress(self) -> tuple[network.NetworkSecurityGroup, network.NatGateway]:
        """The inner subnets' NSG (no inbound from the internet; SSH from Bastion) and NAT gateway."""
        name, args, prefix = self._name, self._args, self._args.name_prefix
        rules = [
            network.SecurityRuleArgs(
                name="deny-internet-inbound", priority=4000, direction="Inbound", access="Deny", protocol="*",
                source_address_prefix="Internet", source_port_range="*", destination_address_prefix="*",
                destination_port_range="*",
            ),
        ]
        if args.bastion_subnet and args.jump_box_subnet:
            rules.insert(0, network.SecurityRuleArgs(
                name="ssh-from-bastion", priority=1000, direction="Inbound", access="Allow", protocol="Tcp",
                source_address_prefix=args.bastion_subnet, source_port_range="*",
                destination_address_prefix=args.jump_box_subnet, destination_port_range="22",
            ))
        nsg = network.NetworkSecurityGroup(
            f"{name}-nsg", network_security_group_name=f"nsg-{prefix}-way-in",
            resource_group_name=args.resource_group_name, location=args.location, security_rules=rules,
            tags=args.tags, opts=self._child,
        )
        egress_ip = network.PublicIPAddress(
            f"{name}-nat-ip", public_ip_address_name=f"pip-{prefix}-way-in-nat",
            resource_group_name=args.resource_group_name, location=args.location,
            sku=network.PublicIPAddressSkuArgs(name="Standard"), public_ip_allocation_method="Static",
            tags=args.tags, opts=self._child,
        )
        nat = network.NatGateway(
            f"{name}-nat", nat_gateway_name=f"nat-{prefix}-way-in",
            resource_group_name=args.resource_group_name, location=args.location,
            sku=network.NatGatewaySkuArgs(name="Standard"),
            public_ip_addresses=[network.SubResourceArgs(id=egress_ip.id)], tags=args.tags, opts=self._child,
        )
        return nsg, nat

    def login_grants(self, principals: list[tuple[str, str]]) -> list[Grant]:
        """What each (principal id, principal type) that signs in to the jump box with Entra ID
        needs: Virtual Machine User Login on the VM (its read actions cover the VM), Reader on
        its network interface and on the Bastion (Microsoft Learn, Azure Bastion: "Reader role
        on the NIC with private IP of the virtual machine", "Reader role on the Azure Bastion
        resource"). Scoped to these resources, not the resource group: a login to the jump box
        is no login to any other VM."""
        if self.jump_box_id is None or self.jump_box_nic_id is None:
            return []
        scopes: dict[str, pulumi.Input[str]] = {"jump-box": self.jump_box_id, "jump-box-nic": self.jump_box_nic_id}
        facts = []
        if self.bastion_id is not None:
            scopes["bastion"] = self.bastion_id
            facts.append("bastion")
        grants = []
        for i, (principal, kind) in enumerate(principals):
            grants += grants_for("jump-box-user", scopes, principal, facts, principal_type=kind, index=i)
        return grants

    def _bastion(self, cidr: str) -> pulumi.Output[str]:
        name, args, prefix = self._name, self._args, self._args.name_prefix
        bastion_subnet = self._subnet("bastion", BASTION_SUBNET_NAME, cidr)
        bastion_ip = network.PublicIPAddress(
            f"{name}-bastion-ip", public_ip_address_name=f"pip-{prefix}-bastion",
            resource_group_name=args.resource_group_name, location=args.location,
            sku=network.PublicIPAddressSkuArgs(name="Standard"), public_ip_allocation_method="Static",
            tags=args.tags, opts=self._child,
        )
        bastion = network.BastionHost(
            f"{name}-bastion", bastion_host_name=f"bas-{prefix}",
            resource_group_name=args.resource_group_name, location=args.location,
            sku=network.SkuArgs(name=args.bastion_sku),
            ip_configurations=[network.BastionHostIPConfigurationArgs(
                name="bastion", subnet=network.SubResourceArgs(id=bastion_subnet.id),
                public_ip_address=network.SubResourceArgs(id=bastion_ip.id),
            )],
            # Native-client tunnels (az network bastion ssh|tunnel) exist on Standard only.
            enable_tunneling=args.bastion_sku == "Standard" or None,
            enable_shareable_link=False,
            tags=args.tags, opts=self._child,
        )
        return bastion.id

    def _jump_box(self, box: JumpBoxSpec, box_subnet: network.Subnet) -> None:
        name, args, prefix = self._name, self._args, self._args.name_prefix
        nic = network.NetworkInterface(
            f"{name}-jump-box-nic", network_interface_name=f"nic-{prefix}-jump-box",
            resource_group_name=args.resource_group_name, location=args.location,
            ip_configurations=[network.NetworkInterfaceIPConfigurationArgs(
                name="primary", subnet=network.SubnetArgs(id=box_subnet.id), private_ip_allocation_method="Dynamic",
            )],
            tags=args.tags, opts=self._child,
        )
        vm = compute.VirtualMachine(
            f"{name}-jump-box", vm_name=f"vm-{prefix}-jump-box"[:64],
            resource_group_name=args.resource_group_name, location=args.location,
            # Entra ID sign-in needs the VM's system-assigned identity.
            identity=compute.VirtualMachineIdentityArgs(type="SystemAssigned"),
            hardware_profile=compute.HardwareProfileArgs(vm_size=box.size),
            os_profile=compute.OSProfileArgs(
                computer_name="jump-box", admin_username=box.admin_user,
                linux_configuration=compute.LinuxConfigurationArgs(
                    disable_password_authentication=True,
                    ssh=compute.SshConfigurationArgs(public_keys=[compute.SshPublicKeyArgs(
                        path=f"/home/{box.admin_user}/.ssh/authorized_keys", key_data=box.public_key)]),
                ),
            ),
            storage_profile=compute.StorageProfileArgs(
                image_reference=JUMP_BOX_IMAGE,
                os_disk=compute.OSDiskArgs(create_option="FromImage", delete_option="Delete",
                                           managed_disk=compute.ManagedDiskParametersArgs(
                                               storage_account_type="StandardSSD_LRS")),
            ),
            network_profile=compute.NetworkProfileArgs(network_interfaces=[
                compute.NetworkInterfaceReferenceArgs(id=nic.id, primary=True)]),
            security_profile=compute.SecurityProfileArgs(
                security_type="TrustedLaunch",
                uefi_settings=compute.UefiSettingsArgs(secure_boot_enabled=True, v_tpm_enabled=True)),
            diagnostics_profile=compute.DiagnosticsProfileArgs(
                boot_diagnostics=compute.BootDiagnosticsArgs(enabled=True)),  # managed storage
            tags=args.tags,
            # A new key replaces the VM (Azure cannot change osProfile in place).
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["osProfile"], delete_before_replace=True),
        )
        publisher, extension, version = ENTRA_LOGIN_EXTENSION
        compute.VirtualMachineExtension(
            f"{name}-jump-box-entra-login", vm_extension_name=extension, vm_name=vm.name,
            resource_group_name=args.resource_group_name, location=args.location,
            publisher=publisher, type=extension, type_handler_version=version, auto_upgrade_minor_version=True,
            tags=args.tags, opts=self._child,
        )
        self.jump_box_id, self.jump_box_nic_id = vm.id, nic.id
