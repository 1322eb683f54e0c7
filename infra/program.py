"""The Pulumi program: validated stack config in, components and the outputs document out.

`build(cfg)` is called by the Pulumi engine (infra/__main__.py) and by the offline plan
(infra/plan), so both see exactly the same resources. Environment stacks own the long-lived
resources; experiment stacks (exp-*) add clusters to an environment's workspace through a
StackReference (the environment's deployed outputs decide isolation and which cluster
names are taken) and are torn down after `expiresAt`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pulumi
from pulumi_azure_native import authorization

from infra import outputs
from infra.components.access import Access, AccessArgs, Grant, cluster_identity_grants
from infra.components.budget import Budget, BudgetArgs
from infra.components.controller import (
    ControllerCluster,
    ControllerClusterArgs,
    controller_identity_name,
)
from infra.components.dataset_storage import CONTAINERS, DatasetStorage, DatasetStorageArgs
from infra.components.datastores import Datastores, DatastoresArgs
from infra.components.environments import TrainingEnvironments, TrainingEnvironmentsArgs
from infra.components.gpu_cluster import GpuCluster, GpuClusterArgs
from infra.components.ml_registry import MlRegistry, MlRegistryArgs
from infra.components.network import Network, NetworkArgs
from infra.components.private_endpoints import (
    EndpointTarget,
    PrivateEndpoints,
    PrivateEndpointsArgs,
)
from infra.components.resource_group import ResourceGroup, ResourceGroupArgs
from infra.components.workspace import Workspace, WorkspaceArgs
from infra.config import ClusterConfig, StackConfig
from infra.quirks import ROLE_STORAGE_BLOB_DATA_CONTRIBUTOR


def build(cfg: StackConfig, now: datetime | None = None) -> dict[str, Any]:
    """Declare the stack's resources; return the outputs document (values may be Outputs)."""
    if cfg.is_experiment:
        return _experiment(cfg, now)
    return _environment(cfg, now)


def opt_in_tags(cluster: ClusterConfig) -> dict[str, str]:
    """Opt-ins from the stack file, made visible on the cluster for policy and reviewers."""
    tags = {}
    if cluster.allow_idle_nodes:
        tags["allowIdleNodes"] = "true"
    if cluster.allow_tcp_multi_node:
        tags["allowTcpMultiNode"] = "true"
    return tags


@dataclass(frozen=True)
class ClusterPlacement:
    """Where a stack's clusters go: a workspace, its identity and network (plain or Outputs)."""

    resource_group_name: pulumi.Input[str]
    workspace_name: pulumi.Input[str]
    location: pulumi.Input[str]
    identity_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str] | None
    """The compute subnet under private isolation, else None."""
    node_public_ip: pulumi.Input[bool]
    depends_on: tuple[pulumi.Resource, ...] = ()


def _clusters(cfg: StackConfig, where: ClusterPlacement, tags: dict[str, str]) -> None:
    for c in cfg.clusters:
        ssh = c.ssh
        GpuCluster(
            f"cluster-{c.name}",
            GpuClusterArgs(
                resource_group_name=where.resource_group_name,
                workspace_name=where.workspace_name,
                location=where.location,
                cluster_name=c.name,
                sku=c.sku,
                min_nodes=c.min_nodes,
                max_nodes=c.max_nodes,
                idle_minutes=c.idle_minutes,
                priority=c.priority,
                identity_id=where.identity_id,
                ssh_public_key=(ssh.public_key.strip() if ssh and ssh.on and ssh.public_key else None),
                ssh_admin_user=ssh.admin_user if ssh else "azureuser",
                subnet_id=where.subnet_id,
                node_public_ip=where.node_public_ip,
                tags={**tags, **opt_in_tags(c)},
            ),
            opts=pulumi.ResourceOptions(depends_on=list(where.depends_on)),
        )


def _budget(cfg: StackConfig, scope: pulumi.Input[str], now: datetime | None, stack_tag: str | None = None) -> None:
    if cfg.budget is None:
        return
    Budget("budget", BudgetArgs(
        budget_name=cfg.names.budget, scope=scope, monthly_amount_usd=cfg.budget.monthly_amount_usd,
        alert_emails=list(cfg.budget.alert_emails), thresholds_percent=list(cfg.budget.thresholds_percent),
        stack_tag=stack_tag, start=now,
    ))


def _data_access(cfg: StackConfig, ws: Workspace, data: DatasetStorage, subscription_id: pulumi.Input[str]) -> Access:
    """The compute identity's data and image rights, plus the stack's dataset uploaders."""
    grants = cluster_identity_grants(
        ws.identity_principal_id, data.container_ids["datasets"], data.container_ids["checkpoints"], ws.registry_id
    )
    grants += [
        Grant(f"datasets-write-{i}", ROLE_STORAGE_BLOB_DATA_CONTRIBUTOR, data.container_ids["datasets"],
              p.principal_id, p.principal_type)
        for i, p in enumerate(cfg.storage.data_contributors)
    ]
    return Access("access", AccessArgs(subscription_id, grants))


def _private_endpoints(cfg: StackConfig, group: ResourceGroup, net: Network, ws: Workspace,
                       data: DatasetStorage, tags: dict[str, str]) -> PrivateEndpoints:
    return PrivateEndpoints("endpoints", PrivateEndpointsArgs(
        resource_group_name=group.name,
        location=cfg.location,
        subnet_id=net.endpoint_subnet_id,
        dns_zone_ids=dict(net.dns_zone_ids),
        name_prefix=f"{cfg.name_prefix}-{cfg.stack}",
        targets=[
            EndpointTarget("datasets-blob", data.account_id, "blob"),
            EndpointTarget("ws-blob", ws.workspace_storage_id, "blob"),
            EndpointTarget("ws-file", ws.workspace_storage_id, "file"),
            EndpointTarget("kv", ws.key_vault_id, "vault"),
            EndpointTarget("acr", ws.registry_id, "registry"),
            EndpointTarget("workspace", ws.workspace_id, "amlworkspace"),
        ],
        tags=tags,
    ))


def _environment(cfg: StackConfig, now: datetime | None) -> dict[str, Any]:
    client = authorization.get_client_config_output()
    tags = cfg.tags()
    names = cfg.names
    private = cfg.network.isolation == "private"

    group = ResourceGroup("core", ResourceGroupArgs(names.resource_group, cfg.location, tags))
    net = None
    if private:
        assert cfg.compute_subnet and cfg.endpoint_subnet and cfg.network.address_space
        net = Network("net", NetworkArgs(group.name, cfg.location, names.virtual_network, cfg.network.address_space,
                                         cfg.compute_subnet, cfg.endpoint_subnet, tags))

    ws = Workspace("ml", WorkspaceArgs(group.name, cfg.location, names, client.tenant_id, private, tags))
    data = DatasetStorage("data", DatasetStorageArgs(
        resource_group_name=group.name,
        account_name=names.dataset_storage,
        location=cfg.location,
        tier=cfg.storage.tier,
        allow_shared_key_access=cfg.storage.allow_shared_key_access,
        private=private,
        soft_delete_days=cfg.storage.soft_delete_days,
        protect=cfg.protect_data,
        tags=tags,
    ))
    stores = Datastores("datastores", DatastoresArgs(group.name, ws.workspace_name, data.account_name, list(CONTAINERS)))
    cluster_deps: list[pulumi.Resource] = [_data_access(cfg, ws, data, client.subscription_id)]
    if net is not None:
        # Nodes without public IPs reach the workspace only through its private endpoint.
        cluster_deps.append(_private_endpoints(cfg, group, net, ws, data, tags))

    _clusters(cfg, ClusterPlacement(group.name, ws.workspace_name, cfg.location, ws.identity_id,
                                    net.compute_subnet_id if net else None, not private, tuple(cluster_deps)), tags)

    controller = _controller(cfg, group, ws, data, client.subscription_id, net.compute_subnet_id if net else None,
                             not private, tags, cluster_deps)

    ml_registry_name: Any = None
    if cfg.ml_registry.enabled:
        ml_registry_name = MlRegistry("registry", MlRegistryArgs(
            group.name, names.ml_registry, cfg.location, list(cfg.ml_registry.regions), private, tags)).registry_name

    # Azure ML environments for our images, registered by image reference (never rebuilt).
    environments = TrainingEnvironments("environments", TrainingEnvironmentsArgs(
        resource_group_name=group.name, workspace_name=ws.workspace_name,
        login_server=ws.registry_login_server, tags=tags,
    ))
    _budget(cfg, group.id, now)

    return {
        **_own_entries(cfg, tags),
        "subscriptionId": client.subscription_id,
        "resourceGroup": group.name,
        "location": cfg.location,
        "workspace": ws.workspace_name,
        "workspaceId": ws.workspace_id,
        "datastores": stores.names,
        "storage": {
            "account": data.account_name,
            "blobEndpoint": data.blob_endpoint,
            "containers": dict(data.container_names),
            "tier": cfg.storage.tier,
            "egressGbps": cfg.storage.egress_gbps,
            "ingressGbps": cfg.storage.ingress_gbps,
        },
        "registry": {
            "loginServer": ws.registry_login_server,
            "environments": environments.environments,
            "environmentIds": environments.environment_ids,
            "mlRegistry": ml_registry_name,
        },
        "identity": {"clientId": ws.identity_client_id, "principalId": ws.identity_principal_id, "id": ws.identity_id},
        "network": {"isolation": cfg.network.isolation, "subnetId": net.compute_subnet_id if net else None},
        "controller": controller,
    }


def _controller(cfg: StackConfig, group: ResourceGroup, ws: Workspace, data: DatasetStorage,
                subscription_id: pulumi.Input[str], subnet_id: pulumi.Input[str] | None, node_public_ip: bool,
                tags: dict[str, str], depends_on: list[pulumi.Resource]) -> dict[str, Any] | None:
    """The managed runs' controller cluster and identity; its outputs entry (None when disabled)."""
    ctl = cfg.controller
    if not ctl.enabled:
        return None
    cluster = ControllerCluster("controller", ControllerClusterArgs(
        resource_group_name=group.name, workspace_name=ws.workspace_name, location=cfg.location,
        subscription_id=subscription_id, cluster_name=ctl.name, sku=ctl.sku,
        identity_name=controller_identity_name(cfg.name_prefix, cfg.stack), workspace_scope=ws.workspace_id,
        checkpoints_scope=data.container_ids["checkpoints"], registry_scope=ws.registry_id, max_nodes=ctl.max_nodes,
        idle_minutes=ctl.idle_minutes, subnet_id=subnet_id, node_public_ip=node_public_ip, tags=tags),
        opts=pulumi.ResourceOptions(depends_on=depends_on))
    source = (f"{cfg.source}: aml-hpc:controller.usdPerHour" if ctl.usd_per_hour
              else f"Azure Retail Prices API, {ctl.sku} Linux pay-as-you-go, eastus, 2024-06")
    return {"cluster": ctl.name, "sku": ctl.sku, "usdPerHour": ctl.price, "priceSource": source,
            "identity": {"clientId": cluster.identity_client_id, "principalId": cluster.identity_principal_id,
                         "id": cluster.identity_id}}


def _own_entries(cfg: StackConfig, tags: dict[str, str]) -> dict[str, Any]:
    """The entries every stack exports from its own config (environment or experiment)."""
    return {
        "stack": cfg.stack,
        "kind": cfg.kind,
        "environment": cfg.environment,
        "clusters": outputs.clusters_entry(cfg),
        "budget": outputs.budget_entry(cfg),
        "prices": outputs.prices_entry(cfg),
        "expiresAt": outputs.expires_entry(cfg),
        "tags": tags,
    }


PASSTHROUGH = ("subscriptionId", "resourceGroup", "location", "workspace", "workspaceId", "datastores",
               "storage", "registry", "identity", "network")
"""Entries an experiment stack re-exports from its environment's deployed outputs."""


def _experiment(cfg: StackConfig, now: datetime | None) -> dict[str, Any]:
    env = pulumi.StackReference("environment", stack_name=cfg.environment_stack)
    tags = cfg.tags()
    passthrough: dict[str, Any] = {key: env.require_output(key) for key in PASSTHROUGH}
    passthrough["controller"] = env.get_output("controller")  # the environment's; null before it had one
    network = passthrough["network"]
    env.require_output("clusters").apply(lambda taken: _refuse_taken_cluster_names(cfg, taken))

    private = network.apply(lambda n: n["isolation"] == "private")
    _clusters(cfg, ClusterPlacement(
        resource_group_name=passthrough["resourceGroup"], workspace_name=passthrough["workspace"],
        location=passthrough["location"], identity_id=passthrough["identity"].apply(lambda i: i["id"]),
        subnet_id=network.apply(lambda n: n.get("subnetId")), node_public_ip=private.apply(lambda p: not p),
    ), tags)

    scope = pulumi.Output.all(passthrough["subscriptionId"], passthrough["resourceGroup"]).apply(
        lambda a: f"/subscriptions/{a[0]}/resourceGroups/{a[1]}")
    _budget(cfg, scope, now, stack_tag=cfg.stack)
    return {**passthrough, **_own_entries(cfg, tags)}


def _refuse_taken_cluster_names(cfg: StackConfig, taken: dict[str, Any]) -> None:
    """An experiment's clusters join the environment's workspace: their names must be free."""
    taken_lower = {name.lower() for name in taken}
    clash = sorted(c.name for c in cfg.clusters if c.name.lower() in taken_lower)
    if clash:
        raise pulumi.RunError(f"{cfg.source}: cluster name(s) {', '.join(clash)} already exist in environment "
                              f"{cfg.environment!r}'s workspace (taken: {', '.join(sorted(taken))}); rename them")
