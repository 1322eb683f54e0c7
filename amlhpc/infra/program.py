"""The Pulumi program: validated stack config in, components and the outputs document out.

`build(cfg)` is called by the Pulumi engine (amlhpc/infra/__main__.py) and by the offline plan
(amlhpc/infra/plan), so both see exactly the same resources. Environment stacks own the long-lived
resources; experiment stacks (exp-*) add clusters to an environment's workspace through the
environment's published outputs (amlhpc/infra/published.py: they decide isolation and which
cluster names are taken) and are torn down after `expiresAt`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import pulumi
from pulumi_azure_native import authorization

from amlhpc.infra import outputs, published
from amlhpc.infra.components.access import Access, AccessArgs, grants_for
from amlhpc.infra.components.budget import Budget, BudgetArgs
from amlhpc.infra.components.controller import (
    ControllerCluster,
    ControllerClusterArgs,
    controller_identity_name,
)
from amlhpc.infra.components.dataset_storage import (
    DATASTORE_CONTAINERS,
    DatasetStorage,
    DatasetStorageArgs,
)
from amlhpc.infra.components.datastores import Datastores, DatastoresArgs
from amlhpc.infra.components.diagnostics import Diagnostics, DiagnosticsArgs, platform_targets
from amlhpc.infra.components.environments import TrainingEnvironments, TrainingEnvironmentsArgs
from amlhpc.infra.components.gpu_cluster import GpuCluster, GpuClusterArgs
from amlhpc.infra.components.locks import cannot_delete_lock
from amlhpc.infra.components.managed_network import PrivateEndpointRule, managed_network_settings
from amlhpc.infra.components.ml_registry import MlRegistry, MlRegistryArgs
from amlhpc.infra.components.network import Network, NetworkArgs
from amlhpc.infra.components.private_endpoints import (
    EndpointTarget,
    PrivateEndpoints,
    PrivateEndpointsArgs,
)
from amlhpc.infra.components.resource_group import ResourceGroup, ResourceGroupArgs
from amlhpc.infra.components.role_storage import RoleStorage, RoleStorageArgs
from amlhpc.infra.components.way_in import JumpBoxSpec, WayIn, WayInArgs
from amlhpc.infra.components.workspace import CustomerManagedKeySettings, Workspace, WorkspaceArgs
from amlhpc.infra.config import ClusterConfig, StackConfig
from amlhpc.infra.policy.rules import TAG_ALLOW_UNLISTED_REGION, TAG_ALLOW_UNLOCKED


def build(cfg: StackConfig, now: datetime | None = None,
          environment: published.EnvironmentOutputs | None = None) -> dict[str, Any]:
    """Declare the stack's resources; return the outputs document (values may be Outputs).
    An experiment reads `environment`, its environment's published outputs (default: the file
    AMLHPC_ENVIRONMENT_OUTPUTS names)."""
    if cfg.is_experiment:
        return _experiment(cfg, now, environment or published.from_environ(cfg.environment))
    return _environment(cfg, now)


def opt_in_tags(cluster: ClusterConfig) -> dict[str, str]:
    """Opt-ins from the stack file, made visible on the cluster for policy and reviewers."""
    tags = {}
    if cluster.allow_idle_nodes:
        tags["allowIdleNodes"] = "true"
    if cluster.allow_tcp_multi_node:
        tags["allowTcpMultiNode"] = "true"
    if cluster.allow_unlisted_region:
        tags[TAG_ALLOW_UNLISTED_REGION] = "true"
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
    managed_network: pulumi.Input[bool] = False
    """The workspace has an Azure ML managed network (clusters take no subnet there)."""


def _clusters(cfg: StackConfig, where: ClusterPlacement, tags: dict[str, str]) -> list[GpuCluster]:
    clusters = []
    for c in cfg.clusters:
        ssh = c.ssh
        clusters.append(GpuCluster(
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
                managed_network=where.managed_network,
                tags={**tags, **opt_in_tags(c)},
            ),
            opts=pulumi.ResourceOptions(depends_on=list(where.depends_on)),
        ))
    return clusters


def _budget(cfg: StackConfig, scope: pulumi.Input[str], now: datetime | None,
            resource_ids: list[pulumi.Input[str]] | None = None) -> None:
    if cfg.budget is None:
        return
    Budget("budget", BudgetArgs(
        budget_name=cfg.names.budget, scope=scope, monthly_amount_usd=cfg.budget.monthly_amount_usd,
        alert_emails=list(cfg.budget.alert_emails), thresholds_percent=list(cfg.budget.thresholds_percent),
        resource_ids=resource_ids, start=now,
    ))


def stack_facts(cfg: StackConfig) -> frozenset[str]:
    """The permission model's `when` values that hold for the stack (amlhpc/core/catalog/permissions.toml)."""
    facts = set()
    if cfg.workspace_storage_auth == "identity":
        facts.add("identity-storage")
    if cfg.network.isolation != "public":
        facts.add("closed-network")
    if cfg.encryption.customer_managed_key:
        facts.add("customer-managed-key")
    if cfg.lock_dataset_storage:
        facts.add("dataset-lock")
    return frozenset(facts)


@dataclass(frozen=True)
class RoleAccounts:
    """The stack's accounts beside the dataset account: its own checkpoint accounts (striping
    order) and its coordination account, each absent when the stack declares none."""

    checkpoints: tuple[RoleStorage, ...] = ()
    coordination: RoleStorage | None = None

    def all(self) -> list[tuple[str, RoleStorage]]:
        """(short key, account) of every role account, for endpoints and diagnostics."""
        named = [(f"checkpoints{i}", a) for i, a in enumerate(self.checkpoints, start=1)]
        return named + ([("coordination", self.coordination)] if self.coordination else [])


def role_accounts(cfg: StackConfig, resource_group_name: pulumi.Input[str], location: pulumi.Input[str],
                  private: pulumi.Input[bool], tags: dict[str, str]) -> RoleAccounts:
    """The checkpoint accounts (aml-hpc:checkpointAccounts) and the coordination account
    (aml-hpc:storage.coordinationAccount) a stack declares, kept on destroy (teardown never
    deletes checkpoints); an environment's are also protected with its data."""
    environment = not cfg.is_experiment
    ckpt = cfg.checkpoint_accounts
    checkpoints = tuple(RoleStorage(f"checkpoints{i}", RoleStorageArgs(
        resource_group_name=resource_group_name, account_name=name, location=location, role="checkpoints",
        allow_shared_key_access=cfg.storage.allow_shared_key_access, private=private,  # type: ignore[arg-type]
        soft_delete_days=ckpt.soft_delete_days if ckpt else 0, retain=True,
        protect=environment and cfg.protect_data, tags=tags,
    )) for i, name in enumerate(cfg.names.checkpoint_storage, start=1))
    coordination = None
    if environment and cfg.storage.coordination_account:
        coordination = RoleStorage("coordination", RoleStorageArgs(
            resource_group_name=resource_group_name, account_name=cfg.names.coordination_storage, location=location,
            role="coordination", allow_shared_key_access=cfg.storage.allow_shared_key_access,
            private=private,  # type: ignore[arg-type]
            soft_delete_days=cfg.storage.soft_delete_days, retain=True, protect=cfg.protect_data, tags=tags))
    return RoleAccounts(checkpoints, coordination)


def grant_scopes(ws: Workspace, data: DatasetStorage, roles: RoleAccounts | None = None) -> dict[str, Any]:
    """The resource ids of the model's symbolic scopes an environment stack grants at.
    container:checkpoints and container:supervision name the dataset account's container first
    (a stack deployed before keeps its runs' checkpoints and records there) and then the role
    accounts' own."""
    roles = roles or RoleAccounts()
    scopes: dict[str, Any] = {
        "workspace": ws.workspace_id,
        "workspace-storage": ws.workspace_storage_id,
        "dataset-account": data.account_id,
        "registry": ws.registry_id,
        **{f"container:{name}": container_id for name, container_id in data.container_ids.items()},
    }
    for account in (*roles.checkpoints, *([roles.coordination] if roles.coordination else [])):
        for name, container_id in account.container_ids.items():
            first = scopes[f"container:{name}"]
            scopes[f"container:{name}"] = [*(first if isinstance(first, list) else [first]), container_id]
    return scopes


def _data_access(cfg: StackConfig, ws: Workspace, data: DatasetStorage, roles: RoleAccounts,
                 subscription_id: pulumi.Input[str]) -> Access:
    """The rights of the GPU clusters' identity, the workspace's identity, the submitters and
    the dataset uploaders (amlhpc/core/catalog/permissions.toml says what each is for)."""
    facts, scopes, locked = stack_facts(cfg), grant_scopes(ws, data, roles), cfg.lock_dataset_storage
    grants = grants_for("compute", scopes, ws.identity_principal_id, facts, locked=locked)
    grants += grants_for("workspace", scopes, ws.principal_id, facts, locked=locked)
    for i, who in enumerate(cfg.submitters):
        grants += grants_for("submitter", scopes, who.principal_id, facts, principal_type=who.principal_type,
                             index=i, locked=locked)
    for i, who in enumerate(cfg.storage.data_contributors):
        grants += grants_for("data-contributor", scopes, who.principal_id, facts, principal_type=who.principal_type,
                             index=i, locked=locked)
    return Access("access", AccessArgs(subscription_id, grants))


def _private_endpoints(cfg: StackConfig, group: ResourceGroup, net: Network, ws: Workspace,
                       data: DatasetStorage, roles: RoleAccounts, registry: MlRegistry | None,
                       tags: dict[str, str]) -> PrivateEndpoints:
    # A private registry is reachable only through endpoints to it, its ACR and its storage.
    extra = [EndpointTarget(f"mlregistry{t.suffix}", t.resource_id, t.group_id)
             for t in (registry.private_link_targets() if registry else [])]
    # The role accounts have no public network access either: the nodes reach them here.
    extra += [EndpointTarget(f"{key}-blob", account.account_id, "blob") for key, account in roles.all()]
    return PrivateEndpoints("endpoints", PrivateEndpointsArgs(
        resource_group_name=group.name,
        location=cfg.location,
        subnet_id=net.endpoint_subnet_id,
        dns_zone_ids=dict(net.dns_zone_ids),
        name_prefix=f"{cfg.name_prefix}-{cfg.stack}",
        targets=[
            EndpointTarget("datasets-blob", data.account_id, "blob", protect=cfg.lock_dataset_storage),
            EndpointTarget("ws-blob", ws.workspace_storage_id, "blob"),
            EndpointTarget("ws-file", ws.workspace_storage_id, "file"),
            EndpointTarget("kv", ws.key_vault_id, "vault"),
            EndpointTarget("acr", ws.registry_id, "registry"),
            EndpointTarget("workspace", ws.workspace_id, "amlworkspace"),
            *extra,
        ],
        tags=tags,
    ))


def _environment(cfg: StackConfig, now: datetime | None) -> dict[str, Any]:
    client = authorization.get_client_config_output()
    tags = cfg.tags()
    names = cfg.names
    isolation = cfg.network.isolation
    private = isolation == "private"
    closed = isolation != "public"  # no public network access: our VNet and its private endpoints

    group = ResourceGroup("core", ResourceGroupArgs(names.resource_group, cfg.location, tags))
    net = None
    if closed:
        assert cfg.endpoint_subnet and cfg.network.address_space
        net = Network("net", NetworkArgs(group.name, cfg.location, names.virtual_network, cfg.network.address_space,
                                         cfg.compute_subnet, cfg.endpoint_subnet, tags))

    data = _dataset_storage(cfg, group, closed, tags)
    roles = role_accounts(cfg, group.name, cfg.location, closed, tags)
    # The ML registry exists before the workspace: a managed network's outbound rules name it.
    ml_registry = None
    if cfg.ml_registry.enabled:
        ml_registry = MlRegistry("registry", MlRegistryArgs(
            group.name, names.ml_registry, cfg.location, list(cfg.ml_registry.regions), private=closed,
            protect=cfg.protect_data, tags=tags))
    ws = Workspace("ml", WorkspaceArgs(group.name, cfg.location, names, client.tenant_id, closed, tags,
                                       storage_auth=cfg.workspace_storage_auth, protect=cfg.protect_data,
                                       storage_soft_delete_days=cfg.storage.soft_delete_days,
                                       registry_sku=cfg.container_registry_sku,
                                       **_workspace_hardening(cfg, client.subscription_id, data, roles, ml_registry)))
    stores = Datastores("datastores", DatastoresArgs(group.name, ws.workspace_name, data.account_name,
                                                       list(DATASTORE_CONTAINERS)))
    cluster_deps: list[pulumi.Resource] = [_data_access(cfg, ws, data, roles, client.subscription_id)]
    if net is not None:
        # Nodes without public IPs reach the workspace only through its private endpoint.
        endpoints = _private_endpoints(cfg, group, net, ws, data, roles, ml_registry, tags)
        cluster_deps.append(endpoints)
        # Studio reaches private storage through the workspace's identity: Reader on the endpoints.
        Access("endpoint-access", AccessArgs(client.subscription_id, grants_for(
            "workspace", {f"endpoint:{key}": endpoint_id for key, endpoint_id in endpoints.endpoint_ids.items()},
            ws.principal_id, stack_facts(cfg), endpoints=True)))

    _clusters(cfg, ClusterPlacement(group.name, ws.workspace_name, cfg.location, ws.identity_id,
                                    net.compute_subnet_id if net and private else None, not closed,
                                    tuple(cluster_deps), managed_network=isolation == "managed"), tags)

    # The managed runs' controller sits where the GPU clusters do (no subnet in a managed network).
    controller = _controller(cfg, group, ws, data, roles, client.subscription_id,
                             net.compute_subnet_id if net and private else None, not closed, tags, cluster_deps)

    # Azure ML environments for our images, registered by image reference (never rebuilt).
    environments = TrainingEnvironments("environments", TrainingEnvironmentsArgs(
        resource_group_name=group.name, workspace_name=ws.workspace_name,
        login_server=ws.registry_login_server, tags=tags,
    ))
    _budget(cfg, group.id, now)
    _hardening(cfg, group, net, ws, data, roles, tags, client.subscription_id)

    return _environment_outputs(cfg, tags, client.subscription_id, group, ws, stores, data, roles, environments,
                                ml_registry, net.compute_subnet_id if net and private else None, controller)


def _dataset_storage(cfg: StackConfig, group: ResourceGroup, closed: bool, tags: dict[str, str]) -> DatasetStorage:
    return DatasetStorage("data", DatasetStorageArgs(
        resource_group_name=group.name,
        account_name=cfg.names.dataset_storage,
        location=cfg.location,
        tier=cfg.storage.tier,
        allow_shared_key_access=cfg.storage.allow_shared_key_access,
        private=closed,
        soft_delete_days=cfg.storage.soft_delete_days,
        protect=cfg.protect_data,
        tags={**tags, **data_opt_out_tags(cfg)},
    ))


def _environment_outputs(cfg: StackConfig, tags: dict[str, str], subscription_id: Any, group: ResourceGroup,
                         ws: Workspace, stores: Datastores, data: DatasetStorage, roles: RoleAccounts,
                         environments: TrainingEnvironments, ml_registry: MlRegistry | None,
                         compute_subnet_id: Any, controller: dict[str, Any] | None) -> dict[str, Any]:
    """The environment's stack outputs (amlhpc/core/outputs.py's StackOutputs, checked on export)."""
    return {
        **_own_entries(cfg, tags),
        "subscriptionId": subscription_id,
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
            "mlRegistry": ml_registry.registry_name if ml_registry else None,
        },
        "identity": {"clientId": ws.identity_client_id, "principalId": ws.identity_principal_id, "id": ws.identity_id},
        "network": {"isolation": cfg.network.isolation, "subnetId": compute_subnet_id},
        "controller": controller,
        "checkpointReaders": _checkpoint_readers(cfg, controller),
        **_account_entries(data.account_name, roles),
    }


def _checkpoint_readers(cfg: StackConfig, controller: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Who reads checkpoints besides the GPU identity, for experiments' own checkpoint accounts."""
    readers: list[dict[str, Any]] = []
    if controller is not None:
        readers.append({"principal": "controller", "principalId": controller["identity"]["principalId"],
                        "principalType": "ServicePrincipal", "index": None})
    readers += [{"principal": "submitter", "principalId": who.principal_id, "principalType": who.principal_type,
                 "index": i} for i, who in enumerate(cfg.submitters)]
    return readers


def _account_entries(dataset_account: pulumi.Input[str], roles: RoleAccounts) -> dict[str, Any]:
    """checkpointAccounts (striping order) and coordinationAccount: the role accounts, the dataset account without them."""
    return {
        "checkpointAccounts": [a.account_name for a in roles.checkpoints] or [dataset_account],
        "coordinationAccount": roles.coordination.account_name if roles.coordination else dataset_account,
    }


def _controller(cfg: StackConfig, group: ResourceGroup, ws: Workspace, data: DatasetStorage, roles: RoleAccounts,
                subscription_id: pulumi.Input[str], subnet_id: pulumi.Input[str] | None, node_public_ip: bool,
                tags: dict[str, str], depends_on: list[pulumi.Resource]) -> dict[str, Any] | None:
    """The managed runs' controller cluster and identity; its outputs entry (None when disabled)."""
    ctl = cfg.controller
    if not ctl.enabled:
        return None
    cluster = ControllerCluster("controller", ControllerClusterArgs(
        resource_group_name=group.name, workspace_name=ws.workspace_name, location=cfg.location,
        subscription_id=subscription_id, cluster_name=ctl.name, sku=ctl.sku,
        identity_name=controller_identity_name(cfg.name_prefix, cfg.stack), grant_scopes=grant_scopes(ws, data, roles),
        grant_facts=stack_facts(cfg), max_nodes=ctl.max_nodes, idle_minutes=ctl.idle_minutes, subnet_id=subnet_id,
        node_public_ip=node_public_ip, compute_depends_on=list(depends_on), data_locked=cfg.lock_dataset_storage,
        tags=tags))
    return {"cluster": ctl.name, "sku": ctl.sku, "usdPerHour": ctl.price, "priceSource": ctl.price_source(cfg.source),
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


def _experiment(cfg: StackConfig, now: datetime | None, env: published.EnvironmentOutputs) -> dict[str, Any]:
    tags = cfg.tags()
    passthrough: dict[str, Any] = {key: env.require_output(key).apply(partial(outputs.inherited, key))
                                   for key in PASSTHROUGH}
    # the environment's; null before it had one
    passthrough["controller"] = env.get_output("controller").apply(partial(outputs.inherited, "controller"))
    network = passthrough["network"]
    env.require_output("clusters").apply(lambda taken: _refuse_taken_cluster_names(cfg, taken))

    clusters = _clusters(cfg, ClusterPlacement(
        resource_group_name=passthrough["resourceGroup"], workspace_name=passthrough["workspace"],
        location=passthrough["location"], identity_id=passthrough["identity"].apply(lambda i: i["id"]),
        subnet_id=network.apply(lambda n: n.get("subnetId")),
        node_public_ip=network.apply(lambda n: n["isolation"] == "public"),
        managed_network=network.apply(lambda n: n["isolation"] == "managed"),
    ), tags)

    scope = pulumi.Output.all(passthrough["subscriptionId"], passthrough["resourceGroup"]).apply(
        lambda a: f"/subscriptions/{a[0]}/resourceGroups/{a[1]}")
    # Compute tags never reach cost records: the budget counts the clusters' own cost.
    _budget(cfg, scope, now, resource_ids=[c.cluster_id for c in clusters])
    return {**passthrough, **_own_entries(cfg, tags), **_experiment_accounts(cfg, env, passthrough, network, tags)}


def _experiment_accounts(cfg: StackConfig, env: published.EnvironmentOutputs, passthrough: dict[str, Any],
                         network: pulumi.Output[Any], tags: dict[str, str]) -> dict[str, Any]:
    """An experiment's checkpoint accounts of its own (aml-hpc:checkpointAccounts), in the
    environment's resource group, granted to the environment's compute and controller
    identities as the permission model grants their container:checkpoints; else the
    environment's accounts (a stack deployed before accounts by role: its dataset account)."""
    dataset_account = passthrough["storage"].apply(lambda s: s["account"])
    inherited_checkpoints = pulumi.Output.all(env.get_output("checkpointAccounts"), dataset_account).apply(
        lambda a: a[0] or [a[1]])
    coordination = pulumi.Output.all(env.get_output("coordinationAccount"), dataset_account).apply(
        lambda a: a[0] or a[1])
    if not cfg.names.checkpoint_storage:
        return {"checkpointAccounts": inherited_checkpoints, "coordinationAccount": coordination}
    network.apply(lambda n: _refuse_closed_checkpoint_accounts(cfg, n["isolation"]))
    roles = role_accounts(cfg, passthrough["resourceGroup"], passthrough["location"], False, tags)
    scopes: dict[str, Any] = {"container:checkpoints": [c for a in roles.checkpoints for c in a.container_ids.values()]}
    grants = grants_for("compute", scopes, passthrough["identity"].apply(lambda i: i["principalId"]), only_given=True)
    Access("checkpoint-access", AccessArgs(passthrough["subscriptionId"], grants))
    # The readers are the environment's (a list only its outputs hold): their grants follow them.
    env.get_output("checkpointReaders").apply(
        lambda readers: _checkpoint_reader_access(passthrough["subscriptionId"], scopes, readers or []))
    return {"checkpointAccounts": [a.account_name for a in roles.checkpoints], "coordinationAccount": coordination}


def _checkpoint_reader_access(subscription_id: Any, scopes: dict[str, Any], readers: list[dict[str, Any]]) -> None:
    """The reads the permission model gives the environment's controller and submitters on
    checkpoints, on an experiment's own checkpoint accounts (a managed run's controller reads its
    nodes' records there; `jobs status` the pointer)."""
    grants = []
    for reader in readers:
        index = reader.get("index")  # a StackReference hands numbers over as floats: 0.0
        grants += grants_for(reader["principal"], scopes, reader["principalId"],
                             principal_type=reader.get("principalType") or "ServicePrincipal",
                             index=int(index) if index is not None else None, only_given=True)
    if grants:
        Access("checkpoint-readers", AccessArgs(subscription_id, grants))


def _refuse_closed_checkpoint_accounts(cfg: StackConfig, isolation: str) -> None:
    """An experiment declares no private endpoints: under a closed network its own accounts
    would be unreachable from the nodes, so they are the environment's to declare."""
    if isolation != "public":
        raise pulumi.RunError(f"{cfg.source}: aml-hpc:checkpointAccounts: environment {cfg.environment!r} is "
                              f"{isolation}, and an experiment's own accounts would have no private endpoint; remove "
                              f"the key here and set aml-hpc:checkpointAccounts in Pulumi.{cfg.environment}.yaml")


def _refuse_taken_cluster_names(cfg: StackConfig, taken: dict[str, Any]) -> None:
    """An experiment's clusters join the environment's workspace: their names must be free."""
    taken_lower = {name.lower() for name in taken}
    clash = sorted(c.name for c in cfg.clusters if c.name.lower() in taken_lower)
    if clash:
        raise pulumi.RunError(f"{cfg.source}: cluster name(s) {', '.join(clash)} already exist in environment "
                              f"{cfg.environment!r}'s workspace (taken: {', '.join(sorted(taken))}); rename them")


# --------------------------------------------------------------------------------------
# Hardening: managed network, customer-managed key, HBI, diagnostics, locks, a way in

def data_opt_out_tags(cfg: StackConfig) -> dict[str, str]:
    """Protected data without its delete lock is a choice the account itself records."""
    return {TAG_ALLOW_UNLOCKED: "true"} if cfg.protect_data and not cfg.lock_dataset_storage else {}


def _workspace_hardening(cfg: StackConfig, subscription_id: pulumi.Input[str], data: DatasetStorage,
                         roles: RoleAccounts, ml_registry: MlRegistry | None) -> dict[str, Any]:
    """The WorkspaceArgs the hardening options decide."""
    extra: dict[str, Any] = {"hbi_workspace": cfg.hbi_workspace}
    if cfg.diagnostics:
        extra["log_retention_days"] = cfg.diagnostics.retention_days
    if cfg.encryption.customer_managed_key:
        assert cfg.encryption.cosmos_db_principal_id
        extra["customer_managed_key"] = CustomerManagedKeySettings(
            subscription_id, cfg.encryption.cosmos_db_principal_id, cfg.encryption.key_size)
    managed = cfg.managed_network
    if managed is not None:
        # Our resources the nodes reach through the managed VNet: in approved-only mode a
        # private endpoint is the only way to storage; the workspace's own storage, vault and
        # registry get theirs from Azure.
        endpoints = [PrivateEndpointRule("datasets-blob", data.account_id, "blob")]
        endpoints += [PrivateEndpointRule(f"{key}-blob", account.account_id, "blob") for key, account in roles.all()]
        if ml_registry is not None:
            # The registry, its ACR and each region's storage: the nodes pull assets from all three.
            endpoints += [PrivateEndpointRule(f"ml-registry{t.suffix}", t.resource_id, t.group_id)
                          for t in ml_registry.private_link_targets()]
        extra["managed_network"] = managed_network_settings(
            managed.outbound, fqdn_rules=managed.fqdn_rules, firewall_sku=managed.firewall_sku, endpoints=endpoints)
    return extra


def _hardening(cfg: StackConfig, group: ResourceGroup, net: Network | None, ws: Workspace,
               data: DatasetStorage, roles: RoleAccounts, tags: dict[str, str],
               subscription_id: pulumi.Input[str]) -> None:
    """Diagnostic settings, the dataset account's delete lock and the way in, as configured."""
    if cfg.diagnostics:
        Diagnostics("diagnostics", DiagnosticsArgs(ws.log_analytics_id, platform_targets(
            workspace_id=ws.workspace_id, vault_id=ws.key_vault_id,
            storage_account_ids={"datasets": data.account_id, "workspace-storage": ws.workspace_storage_id,
                                 **{key: account.account_id for key, account in roles.all()}},
            storage_reads=cfg.diagnostics.storage_reads,
            locked_accounts=frozenset({"datasets"}) if cfg.lock_dataset_storage else frozenset())))
    if cfg.lock_dataset_storage:
        cannot_delete_lock("data-lock", scope=data.account_id, opts=pulumi.ResourceOptions(parent=data),
                           notes=f"Datasets and checkpoints of aml-hpc stack {cfg.stack}; lift only to delete "
                                 "them on purpose (docs/isolation.md).")
    way_in = cfg.way_in
    if way_in is not None and net is not None and cfg.network.way_in is not None:
        box = cfg.network.way_in.jump_box
        seat = WayIn("way-in", WayInArgs(
            resource_group_name=group.name, location=cfg.location, vnet_name=cfg.names.virtual_network,
            name_prefix=f"{cfg.name_prefix}-{cfg.stack}", bastion_subnet=way_in.bastion, bastion_sku=way_in.bastion_sku,
            jump_box_subnet=way_in.jump_box,
            jump_box=JumpBoxSpec(box.size, box.admin_user, (box.public_key or "").strip()) if box else None,
            ci_runner_subnet=way_in.ci_runners, tags=tags,
        ), opts=pulumi.ResourceOptions(depends_on=[net]))
        # Who signs in to the jump box with Entra ID (jumpBox.logins).
        logins = seat.login_grants([(p.principal_id, p.principal_type) for p in (box.logins if box else [])])
        if logins:
            Access("way-in-access", AccessArgs(subscription_id, logins))
