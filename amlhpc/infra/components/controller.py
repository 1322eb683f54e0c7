"""The controller cluster of managed runs: a small CPU AmlCompute cluster that scales to
zero, the user-assigned identity its controller jobs run as, and that identity's rights.

A managed run (`python -m amlhpc.jobs submit --managed`, docs/managed-jobs.md) is supervised by
a controller job on this cluster: it submits the training job, watches it, and resubmits
it after a preemption, node failure or hang. It runs in Azure so the user's laptop can go
away. One node per supervised run, `maxNodes` runs at once; nodes are released after
`idleMinutes`, so the cluster costs nothing between runs.

The identity's rights are the permission model's `controller` rights
(amlhpc/core/catalog/permissions.toml, each with the call that needs it): a custom role on the
workspace with just the job, run-history, compute-read and asset-read actions the controller
calls (amlhpc/jobs/managed/azureml.py); write on the `supervision` container where the run's record
lives, out of the jobs' reach; read on `checkpoints` (the nodes' end records and the
checkpoint pointer); AcrPull for its image; and, when the workspace storage takes no keys,
the data role Azure ML's job I/O needs on it. Every job on this cluster runs as the
identity, and anyone who may submit can target it, so these rights are kept within a
submitter's (tests/test_permissions.py).

Nodes are Dedicated (a preempted controller would stop supervising), run no SSH, and
follow the stack's network isolation (the compute subnet, no public IP when private).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import machinelearningservices as ml
from pulumi_azure_native import managedidentity

from amlhpc.infra import quirks
from amlhpc.infra.components.access import Access, AccessArgs, grants_for
from amlhpc.infra.components.gpu_cluster import subnet_reference


def controller_identity_name(prefix: str, stack: str) -> str:
    return f"id-{prefix}-{stack}-controller"


@dataclass
class ControllerClusterArgs:
    resource_group_name: pulumi.Input[str]
    workspace_name: pulumi.Input[str]
    location: pulumi.Input[str]
    subscription_id: pulumi.Input[str]
    cluster_name: str
    sku: str
    """A CPU size, e.g. Standard_D2s_v3. Changing it replaces the cluster."""
    identity_name: str
    grant_scopes: Mapping[str, pulumi.Input[str]]
    """Resource ids of the permission model's scopes (workspace, registry, the containers, the
    workspace storage) the identity's rights name."""
    grant_facts: frozenset[str] = frozenset()
    """The model's `when` values that hold for the stack (identity-storage...)."""
    max_nodes: int = 4
    idle_minutes: int = 5
    subnet_id: pulumi.Input[str] | None = None
    node_public_ip: pulumi.Input[bool] = True
    compute_depends_on: list[pulumi.Resource] = field(default_factory=list)
    """What the nodes need first (the GPU clusters' grants, the workspace's private endpoint).
    Given to the compute only: on the component it would keep them all alive with the
    component, which outlives `down` when its checkpoints grant is protected."""
    data_locked: bool = False
    """The dataset account (holding the containers) carries a delete lock: the grants inside
    it are protected (amlhpc/infra/components/access.py says why)."""
    tags: dict[str, str] = field(default_factory=dict)


class ControllerCluster(pulumi.ComponentResource):
    cluster_name: pulumi.Output[str]
    identity_id: pulumi.Output[str]
    identity_client_id: pulumi.Output[str]
    identity_principal_id: pulumi.Output[str]

    def __init__(self, name: str, args: ControllerClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:compute:ControllerCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        identity = managedidentity.UserAssignedIdentity(
            f"{name}-identity", resource_name_=args.identity_name, resource_group_name=args.resource_group_name,
            location=args.location, tags=args.tags, opts=child)
        access = Access(f"{name}-access", AccessArgs(args.subscription_id, grants_for(
            "controller", args.grant_scopes, identity.principal_id, args.grant_facts, locked=args.data_locked)),
            opts=child)
        compute = ml.Compute(
            f"{name}-compute",
            compute_name=args.cluster_name,
            resource_group_name=args.resource_group_name,
            workspace_name=args.workspace_name,
            location=args.location,
            identity=ml.ManagedServiceIdentityArgs(type="UserAssigned", user_assigned_identities=[identity.id]),
            properties=ml.AmlComputeArgs(
                compute_type="AmlCompute",
                disable_local_auth=True,
                description="controllers of managed runs (CPU, scales to zero)",
                properties=ml.AmlComputePropertiesArgs(
                    vm_size=args.sku,
                    vm_priority="Dedicated",
                    os_type="Linux",
                    scale_settings=ml.ScaleSettingsArgs(
                        min_node_count=0, max_node_count=args.max_nodes,
                        node_idle_time_before_scale_down=quirks.idle_duration(args.idle_minutes)),
                    enable_node_public_ip=args.node_public_ip,
                    remote_login_port_public_access="Disabled",
                    subnet=subnet_reference(args.subnet_id),
                ),
            ),
            tags=args.tags,
            # Nodes start after their roles and, under private isolation, the workspace's endpoint.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[access, *args.compute_depends_on],
                                        replace_on_changes=list(quirks.CLUSTER_REPLACE_ON_CHANGES),
                                        delete_before_replace=True),
        )
        self.cluster_name = compute.name
        self.identity_id = identity.id
        self.identity_client_id = identity.client_id
        self.identity_principal_id = identity.principal_id
        self.register_outputs({"clusterName": self.cluster_name, "identityClientId": self.identity_client_id})
