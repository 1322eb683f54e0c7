"""The Pulumi program: validated stack config in, components and the outputs document out.

`build(cfg)` is called by the Pulumi engine (infra/__main__.py) and by the offline plan
(infra/plan), so both see exactly the same resources. Environment stacks own the long-lived
resources; experiment stacks (exp-*) add clusters to an environment's workspace through a
StackReference and are torn down after `expiresAt`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pulumi
from pulumi_azure_native import authorization

from infra import outputs
from infra.components.access import Access, AccessArgs, Grant, cluster_identity_grants
from infra.components.budget import Budget, BudgetArgs
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


def build(cfg: StackConfig, environment_cfg: StackConfig | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Declare the stack's resources; return the outputs document (values may be Outputs).

    environment_cfg: for experiment stacks, the validated config of the environment they
    join (isolation decides node public IPs; its clusters' names are taken).
    """
    if cfg.is_experiment:
        if environment_cfg is None:
            raise ValueError("an experiment stack needs its environment's config")
        return _experiment(cfg, environment_cfg, now)
    return _environment(cfg, now)


def opt_in_tags(cluster: ClusterConfig) -> dict[str, str]:
    """Opt-ins from the stack file, made visible on the cluster for policy and reviewers."""
    tags = {}
    if cluster.allow_idle_nodes:
        tags["allowIdleNodes"] = "true"
    if cluster.allow_tcp_multi_node:
        tags["allowTcpMultiNode"] = "true"
    return tags


def _cluster(cfg_cluster: ClusterConfig, *, resource_group_name, workspace_name, location, identity_id,
             subnet_id, private: bool, tags: dict[str, str], depends_on: list[pulumi.Resource]) -> GpuCluster:
    ssh = cfg_cluster.ssh
    return GpuCluster(
        f"cluster-{cfg_cluster.name}",
        GpuClusterArgs(
            resource_group_name=resource_group_name,
            workspace_name=workspace_name,
            location=location,
            cluster_name=cfg_cluster.name,
            sku=cfg_cluster.sku,
            min_nodes=cfg_cluster.min_nodes,
            max_nodes=cfg_cluster.max_nodes,
            idle_minutes=cfg_cluster.idle_minutes,
            priority=cfg_cluster.priority,
            identity_id=identity_id,
            ssh_public_key=(ssh.public_key.strip() if ssh and ssh.on and ssh.public_key else None),
            ssh_admin_user=ssh.admin_user if ssh else "azureuser",
            subnet_id=subnet_id if private else None,
            node_public_ip=not private,
            tags={**tags, **opt_in_tags(cfg_cluster)},
        ),
        opts=pulumi.ResourceOptions(depends_on=depends_on),
    )


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

    grants = cluster_identity_grants(
        ws.identity_principal_id, data.container_ids["datasets"], data.container_ids["checkpoints"], ws.registry_id
    )
    grants += [
        Grant(f"datasets-write-{i}", ROLE_STORAGE_BLOB_DATA_CONTRIBUTOR, data.container_ids["datasets"],
              p.principal_id, p.principal_type)
        for i, p in enumerate(cfg.storage.data_contributors)
    ]
    access = Access("access", AccessArgs(client.subscription_id, grants))

    cluster_deps: list[pulumi.Resource] = [access]
    if net is not None:
        endpoints = PrivateEndpoints("endpoints", PrivateEndpointsArgs(
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
        # Nodes without public IPs reach the workspace only through its private endpoint.
        cluster_deps.append(endpoints)

    for c in cfg.clusters:
        _cluster(c, resource_group_name=group.name, workspace_name=ws.workspace_name, location=cfg.location,
                 identity_id=ws.identity_id, subnet_id=net.compute_subnet_id if net else None, private=private,
                 tags=tags, depends_on=cluster_deps)

    ml_registry_name: Any = None
    if cfg.ml_registry.enabled:
        ml_registry_name = MlRegistry("registry", MlRegistryArgs(
            group.name, names.ml_registry, cfg.location, list(cfg.ml_registry.regions), private, tags)).registry_name

    # Azure ML environments for our images, registered by image reference (never rebuilt).
    environments = TrainingEnvironments("environments", TrainingEnvironmentsArgs(
        resource_group_name=group.name, workspace_name=ws.workspace_name,
        login_server=ws.registry_login_server, tags=tags,
    ))

    if cfg.budget is not None:
        Budget("budget", BudgetArgs(
            budget_name=names.budget, scope=group.id, monthly_amount_usd=cfg.budget.monthly_amount_usd,
            alert_emails=list(cfg.budget.alert_emails), thresholds_percent=list(cfg.budget.thresholds_percent),
            start=now,
        ))

    return {
        "stack": cfg.stack,
        "kind": cfg.kind,
        "environment": cfg.environment,
        "subscriptionId": client.subscription_id,
        "resourceGroup": group.name,
        "location": cfg.location,
        "workspace": ws.workspace_name,
        "workspaceId": ws.workspace_id,
        "clusters": outputs.clusters_entry(cfg),
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
        "budget": outputs.budget_entry(cfg),
        "expiresAt": None,
        "tags": tags,
    }




def _experiment(cfg: StackConfig, env_cfg: StackConfig, now: datetime | None) -> dict[str, Any]:
    env = pulumi.StackReference("environment", stack_name=cfg.environment_stack)
    tags = cfg.tags()
    private = env_cfg.network.isolation == "private"
    subscription = env.require_output("subscriptionId")
    group_name = env.require_output("resourceGroup")
    identity = env.require_output("identity")
    network = env.require_output("network")

    for c in cfg.clusters:
        _cluster(c, resource_group_name=group_name, workspace_name=env.require_output("workspace"),
                 location=env.require_output("location"), identity_id=identity.apply(lambda i: i["id"]),
                 subnet_id=network.apply(lambda n: n.get("subnetId")), private=private, tags=tags, depends_on=[])

    if cfg.budget is not None:
        scope = pulumi.Output.all(subscription, group_name).apply(lambda a: f"/subscriptions/{a[0]}/resourceGroups/{a[1]}")
        Budget("budget", BudgetArgs(
            budget_name=cfg.names.budget, scope=scope, monthly_amount_usd=cfg.budget.monthly_amount_usd,
            alert_emails=list(cfg.budget.alert_emails), thresholds_percent=list(cfg.budget.thresholds_percent),
            stack_tag=cfg.stack, start=now,
        ))

    passthrough = ("subscriptionId", "resourceGroup", "location", "workspace", "workspaceId", "datastores",
                   "storage", "registry", "identity", "network")
    document: dict[str, Any] = {key: env.require_output(key) for key in passthrough}
    document.update({
        "stack": cfg.stack,
        "kind": cfg.kind,
        "environment": cfg.environment,
        "clusters": outputs.clusters_entry(cfg),
        "budget": outputs.budget_entry(cfg),
        "expiresAt": outputs.expires_entry(cfg),
        "tags": tags,
    })
    return document
