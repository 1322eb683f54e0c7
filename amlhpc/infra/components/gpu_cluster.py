"""One AmlCompute GPU cluster: scales to zero, releases idle nodes, SSH by key only.

Fields Azure cannot change in place (vmSize, vmPriority, subnet, enableNodePublicIp,
osType) replace the cluster, deleting the old one first so the name is free
(amlhpc.infra.quirks.CLUSTER_REPLACE_ON_CHANGES).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pulumi
from pulumi_azure_native import machinelearningservices as ml

from amlhpc.core import skus
from amlhpc.infra import quirks
from amlhpc.infra.components import ComponentError, inherited_depends_on


@dataclass
class GpuClusterArgs:
    resource_group_name: pulumi.Input[str]
    workspace_name: pulumi.Input[str]
    location: pulumi.Input[str]
    cluster_name: str
    """3-24 characters with a letter after the last hyphen (amlhpc.infra.naming, validated in amlhpc.infra.config). Changing it replaces the cluster."""
    sku: str
    """Azure VM size from amlhpc.core.skus. Changing it replaces the cluster."""
    max_nodes: int
    identity_id: pulumi.Input[str]
    """User-assigned identity the nodes run as (data access, image pulls)."""
    min_nodes: int = 0
    """Nodes kept while idle; above 0 only with the config's explicit opt-in."""
    idle_minutes: int = 10
    """Idle time before a node is released."""
    priority: Literal["Dedicated", "LowPriority"] = "Dedicated"
    """Changing it replaces the cluster."""
    ssh_public_key: str | None = None
    """OpenSSH public key; None disables SSH. Passwords are never set."""
    ssh_admin_user: str = "azureuser"
    subnet_id: pulumi.Input[str] | None = None
    """Our own VNet's compute subnet (private isolation only). Changing it replaces the cluster."""
    node_public_ip: pulumi.Input[bool] = True
    """False under private isolation (an Output for experiments, which read it from the
    environment's outputs). Changing it replaces the cluster."""
    tags: dict[str, str] = field(default_factory=dict)
    managed_network: pulumi.Input[bool] = False
    """True when the workspace has an Azure ML managed network: the nodes take no subnet and
    no public IP there (Azure places them in the managed VNet)."""


class GpuCluster(pulumi.ComponentResource):
    """An AmlCompute cluster of one GPU VM size."""

    cluster_name: pulumi.Output[str]
    cluster_id: pulumi.Output[str]

    def __init__(self, name: str, args: GpuClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:compute:GpuCluster", name, None, opts)
        sku = skus.get(args.sku)
        if args.min_nodes > args.max_nodes:
            raise ComponentError(self, f"minNodes {args.min_nodes} exceeds maxNodes {args.max_nodes}")
        if args.node_public_ip is False and args.subnet_id is None and args.managed_network is False:
            # Without a public IP the nodes need our VNet (or a managed VNet) to reach Azure ML.
            raise ComponentError(self, "a cluster without node public IPs needs a subnet")

        ssh_on = bool(args.ssh_public_key)
        credentials = (
            ml.UserAccountCredentialsArgs(
                admin_user_name=args.ssh_admin_user,
                admin_user_ssh_public_key=args.ssh_public_key,
            )
            if ssh_on
            else None
        )
        compute = ml.Compute(
            f"{name}-compute",
            compute_name=args.cluster_name,
            resource_group_name=args.resource_group_name,
            workspace_name=args.workspace_name,
            location=args.location,
            identity=ml.ManagedServiceIdentityArgs(
                type="UserAssigned", user_assigned_identities=[args.identity_id]
            ),
            properties=ml.AmlComputeArgs(
                compute_type="AmlCompute",
                disable_local_auth=True,
                description=f"{sku.gpus}x {sku.gpu_model}"
                + (f", InfiniBand {sku.ib_generation}" if sku.infiniband else ", no InfiniBand"),
                properties=ml.AmlComputePropertiesArgs(
                    vm_size=sku.name,
                    vm_priority=args.priority,
                    os_type="Linux",
                    scale_settings=ml.ScaleSettingsArgs(
                        min_node_count=args.min_nodes,
                        max_node_count=args.max_nodes,
                        node_idle_time_before_scale_down=quirks.idle_duration(args.idle_minutes),
                    ),
                    enable_node_public_ip=args.node_public_ip,
                    remote_login_port_public_access=pulumi.Output.from_input(args.node_public_ip).apply(
                        lambda public: "Enabled" if ssh_on and public else "Disabled"),
                    user_account_credentials=credentials,
                    subnet=subnet_reference(args.subnet_id),
                ),
            ),
            tags=args.tags,
            opts=pulumi.ResourceOptions(
                parent=self,
                # Children do not inherit a component's depends_on: pass it on, so nodes
                # start only after their role assignments and endpoints exist.
                depends_on=inherited_depends_on(opts),
                replace_on_changes=list(quirks.CLUSTER_REPLACE_ON_CHANGES),
                delete_before_replace=True,
            ),
        )
        self.cluster_name = compute.name
        self.cluster_id = compute.id
        self.register_outputs({"clusterName": self.cluster_name, "clusterId": self.cluster_id})


def subnet_reference(subnet_id: pulumi.Input[str] | None) -> pulumi.Input[ml.ResourceIdArgs] | None:
    """An AmlCompute cluster's subnet, or none (also when the id resolves empty: an experiment
    learns it from its environment's outputs). The controller cluster uses it too."""
    if subnet_id is None:
        return None
    if isinstance(subnet_id, str):
        return ml.ResourceIdArgs(id=subnet_id)
    # Annotated so mypy infers from_input's type variable from the target (str), not the argument.
    resolved: pulumi.Output[str] = pulumi.Output.from_input(subnet_id)
    return resolved.apply(lambda s: ml.ResourceIdArgs(id=s) if s else None)
