"""The platform team's rules, as pure functions over the neutral view (amlhpc/infra/policy/model.py).

Each rule has one enforcement level: `mandatory` blocks a deployment (and fails
`python -m amlhpc.infra plan --policy`), `advisory` is printed and lets it through. Where the
stack file can opt in to something a rule forbids (idle nodes, multi-node over TCP), the
opt-in is visible on the resource as a tag, and a separate advisory rule reports what the
opt-in costs - so an opt-in never silences a rule, it downgrades it.

Some rules cannot be broken through a valid stack file, because the config validation
(amlhpc/infra/config/) or the components already refuse it (password login, TLS, purge
protection). They stay: they guard the program itself against a regression, and they
guard stacks deployed from another branch of it.

Facts come from the SKU catalog (amlhpc/core/catalog/skus.toml); nothing here imports Pulumi.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime

from amlhpc.core import availability, invocation, skus
from amlhpc.infra import quirks
from amlhpc.infra.policy import baseline
from amlhpc.infra.policy.model import (
    Finding,
    Level,
    Limits,
    NotVisible,
    ResourceView,
    StackView,
    get_path,
    is_sequence,
)

# Type tokens the rules look at (pulumi-azure-native 3.x).
COMPUTE = "azure-native:machinelearningservices:Compute"
STORAGE_ACCOUNT = "azure-native:storage:StorageAccount"
BLOB_CONTAINER = "azure-native:storage:BlobContainer"
KEY_VAULT = "azure-native:keyvault:Vault"
CONTAINER_REGISTRY = "azure-native:containerregistry:Registry"
BUDGET = "azure-native:consumption:Budget"
RESOURCE_GROUP = "azure-native:resources:ResourceGroup"
WORKSPACE = "azure-native:machinelearningservices:Workspace"
DIAGNOSTIC_SETTING = "azure-native:monitor:DiagnosticSetting"
LOCK_BY_SCOPE = "azure-native:authorization:ManagementLockByScope"
LOCK_AT_RESOURCE = "azure-native:authorization:ManagementLockAtResourceLevel"
VIRTUAL_MACHINE = "azure-native:compute:VirtualMachine"
NETWORK_INTERFACE = "azure-native:network:NetworkInterface"
KEY_VAULT_KEY = "azure-native:keyvault:Key"
ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"
PRIVATE_ENDPOINT = "azure-native:network:PrivateEndpoint"

# The component that owns datasets and checkpoints (amlhpc/infra/components/dataset_storage.py).
# Its type is part of every child's URN, so both adapters can tell dataset storage apart
# from the workspace's own storage account.
DATASET_COMPONENT = "aml-hpc:data:DatasetStorage"

# Opt-ins the stack file can express (aml-hpc:clusters[i].allowIdleNodes /
# .allowTcpMultiNode) and the program carries onto the cluster as tags, so the resource
# itself says it was a deliberate choice.
TAG_ALLOW_IDLE_NODES = "allowIdleNodes"
TAG_ALLOW_TCP_MULTI_NODE = "allowTcpMultiNode"
# A size amlhpc/core/catalog/availability.toml does not list in the cluster's region, by choice
# (aml-hpc:clusters[i].allowUnlistedRegion: the region lists are a snapshot).
TAG_ALLOW_UNLISTED_REGION = "allowUnlistedRegion"
# On protected dataset storage whose stack turned its delete lock off (aml-hpc:locks.datasetStorage).
TAG_ALLOW_UNLOCKED = "allowUnlocked"

REQUIRED_TAGS = ("owner", "environment")
EXPERIMENT_TAG = "expiresAt"

# Azure resource types (among those this program declares) that accept ARM tags. Rules
# also check any other resource that has a `tags` input. tests/test_policy_rules.py checks
# this list against the installed pulumi-azure-native.
TAGGABLE = frozenset({
    RESOURCE_GROUP,
    STORAGE_ACCOUNT,
    KEY_VAULT,
    CONTAINER_REGISTRY,
    COMPUTE,
    "azure-native:machinelearningservices:Workspace",
    "azure-native:machinelearningservices:Registry",
    "azure-native:managedidentity:UserAssignedIdentity",
    "azure-native:operationalinsights:Workspace",
    "azure-native:applicationinsights:Component",
    "azure-native:network:VirtualNetwork",
    "azure-native:network:NetworkSecurityGroup",
    "azure-native:network:PublicIPAddress",
    "azure-native:network:NatGateway",
    "azure-native:network:PrivateEndpoint",
    "azure-native:privatedns:PrivateZone",
    "azure-native:privatedns:VirtualNetworkLink",
    "azure-native:network:BastionHost",
    NETWORK_INTERFACE,
    VIRTUAL_MACHINE,
    "azure-native:compute:VirtualMachineExtension",
    KEY_VAULT_KEY,
})

# What an experiment stack may own. Everything long-lived (data, workspace, registry,
# network) belongs to the environment, so destroying an expired experiment never loses data.
EXPERIMENT_ALLOWED = frozenset({COMPUTE, BUDGET})
ROLE_STORAGE_COMPONENT = "aml-hpc:data:RoleStorage"
"""Checkpoint and coordination accounts (amlhpc/infra/components/role_storage.py). An experiment may own
checkpoint accounts of its own when teardown keeps them (retainOnDelete), with the grants on them."""
BLOB_SERVICE = "azure-native:storage:BlobServiceProperties"
CHECKPOINT_SOFT_DELETE_MAX_DAYS = 1

ResourceCheck = Callable[[ResourceView, StackView, Limits], Iterable[Finding]]
StackCheck = Callable[[Sequence[ResourceView], StackView, Limits], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    name: str
    level: Level
    description: str
    check_resource: ResourceCheck | None = None
    check_stack: StackCheck | None = None


# --------------------------------------------------------------------------------------
# Helpers


def _aml(r: ResourceView):
    """The AmlCompute properties of a Compute resource, or None for other compute types."""
    if r.type != COMPUTE or get_path(r.inputs, "properties", "computeType") != "AmlCompute":
        return None
    return get_path(r.inputs, "properties", "properties") or {}


def _cluster_name(r: ResourceView) -> str:
    return str(r.inputs.get("computeName") or r.name)


def _opted_in(r: ResourceView, tag: str) -> bool:
    tags = r.tags or {}
    return str(tags.get(tag, "")).lower() == "true"


_SIZE_FEATURES = re.compile(r"^Standard_[A-Z]+\d+([a-z]*)(?:_|$)")


@dataclass(frozen=True)
class _SizeFacts:
    gpu: bool
    infiniband: bool
    known: bool
    """False when inferred from the size name (not in the catalog)."""


def _size_facts(vm_size: str) -> _SizeFacts:
    try:
        sku = skus.get(vm_size)
    except skus.UnknownSkuError:
        # Azure's naming: N-series sizes carry GPUs; an "r" among the feature letters
        # after the vCPU count means RDMA (InfiniBand), e.g. ND96asr_v4, NC24rs_v3.
        match = _SIZE_FEATURES.match(vm_size)
        features = match.group(1) if match else ""
        return _SizeFacts(vm_size.startswith("Standard_N"), "r" in features, False)
    return _SizeFacts(sku.gpus > 0, sku.infiniband, True)


def _number(value) -> float | None:
    try:
        return float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def duration_minutes(text: str) -> float | None:
    """ISO 8601 duration (PT20M, PT120S, PT1H30M, P1D) in minutes, or None if not one."""
    match = _DURATION.match(text or "")
    if not match or text in ("P", "PT") or text.endswith("T"):
        return None
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return days * 1440 + hours * 60 + minutes + seconds / 60


def _gpu_cluster(r: ResourceView):
    """(AmlCompute properties, size facts) for GPU clusters; None otherwise."""
    props = _aml(r)
    if props is None:
        return None
    facts = _size_facts(str(props.get("vmSize") or ""))
    return (props, facts) if facts.gpu else None


# --------------------------------------------------------------------------------------
# GPU clusters


def _scale_to_zero(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    found = _gpu_cluster(r)
    if not found:
        return
    props, _ = found
    min_nodes = _number(get_path(props, "scaleSettings", "minNodeCount")) or 0
    if min_nodes > 0 and not _opted_in(r, TAG_ALLOW_IDLE_NODES):
        yield Finding(
            f"GPU cluster {_cluster_name(r)!r} keeps {min_nodes:g} node(s) running while idle (minNodes {min_nodes:g})",
            f"in Pulumi.{_short(stack)}.yaml set minNodes: 0 on cluster {_cluster_name(r)!r}, or opt in with "
            f"allowIdleNodes: true (the cluster then carries the tag {TAG_ALLOW_IDLE_NODES}=true)",
        )


def _idle_nodes_opted_in(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    found = _gpu_cluster(r)
    if not found:
        return
    props, _ = found
    min_nodes = _number(get_path(props, "scaleSettings", "minNodeCount")) or 0
    if min_nodes > 0 and _opted_in(r, TAG_ALLOW_IDLE_NODES):
        size = str(props.get("vmSize") or "")
        cost = ""
        try:
            price = skus.get(size).price
        except skus.UnknownSkuError:
            price = None
        if price:
            cost = f", about ${min_nodes * price.usd_per_hour * 24:,.0f}/day at the {price.region} on-demand reference price"
        yield Finding(
            f"GPU cluster {_cluster_name(r)!r} keeps {min_nodes:g} node(s) while idle by choice ({TAG_ALLOW_IDLE_NODES}){cost}",
            "set minNodes: 0 when nobody needs warm nodes (e.g. outside a sprint of interactive work)",
        )


def _idle_scale_down(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    found = _gpu_cluster(r)
    if not found:
        return
    props, _ = found
    raw = get_path(props, "scaleSettings", "nodeIdleTimeBeforeScaleDown")
    name = _cluster_name(r)
    fix = (f"set idleMinutes (at most {limits.max_idle_minutes}) on cluster {name!r} in Pulumi.{_short(stack)}.yaml")
    if raw is None:
        yield Finding(f"GPU cluster {name!r} does not say when idle nodes are released (nodeIdleTimeBeforeScaleDown unset)", fix)
        return
    minutes = duration_minutes(str(raw))
    if minutes is None:
        yield Finding(f"GPU cluster {name!r} has nodeIdleTimeBeforeScaleDown {raw!r}, not an ISO 8601 duration", fix)
    elif minutes > limits.max_idle_minutes:
        yield Finding(
            f"GPU cluster {name!r} keeps idle nodes for {minutes:g} minutes ({raw}); the limit is {limits.max_idle_minutes}",
            fix,
        )


def _multi_node_infiniband(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    found = _gpu_cluster(r)
    if not found:
        return
    props, facts = found
    max_nodes = _number(get_path(props, "scaleSettings", "maxNodeCount")) or 1
    if max_nodes > 1 and not facts.infiniband and not _opted_in(r, TAG_ALLOW_TCP_MULTI_NODE):
        ib_sizes = ", ".join(s for s in skus.names() if skus.get(s).infiniband)
        inferred = "" if facts.known else " (inferred from the size name; it is not in amlhpc/core/catalog/skus.toml)"
        yield Finding(
            f"GPU cluster {_cluster_name(r)!r} scales to {max_nodes:g} nodes of {props.get('vmSize')}, which has no "
            f"InfiniBand{inferred}: multi-node training would run over TCP",
            f"use an InfiniBand size ({ib_sizes}), set maxNodes: 1, or opt in with allowTcpMultiNode: true "
            f"(the cluster then carries the tag {TAG_ALLOW_TCP_MULTI_NODE}=true)",
        )


def _tcp_multi_node_opted_in(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    found = _gpu_cluster(r)
    if not found:
        return
    props, facts = found
    max_nodes = _number(get_path(props, "scaleSettings", "maxNodeCount")) or 1
    if max_nodes > 1 and not facts.infiniband and _opted_in(r, TAG_ALLOW_TCP_MULTI_NODE):
        yield Finding(
            f"GPU cluster {_cluster_name(r)!r} runs up to {max_nodes:g} nodes of {props.get('vmSize')} over TCP by choice "
            f"({TAG_ALLOW_TCP_MULTI_NODE}); all-reduce will scale poorly beyond one node",
            "keep multi-node jobs on an InfiniBand cluster; use this one for single-node work",
        )


def _today() -> date:
    """Retirement dates are judged on the day the rules run, as the stack file check does."""
    return datetime.now(UTC).date()


def _region_problem(r: ResourceView, limits: Limits) -> tuple[str, str, tuple[str, str] | None] | None:
    """(size, region, the catalog's problem or None) of a GPU cluster with a known location."""
    found = _gpu_cluster(r)
    region = r.inputs.get("location")
    if not found or not region:
        return None
    size = str(found[0].get("vmSize") or "")
    return size, str(region), availability.problem(size, str(region), _today())


def _size_in_region(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    found = _region_problem(r, limits)
    if not found:
        return
    size, _, problem = found
    if problem is None:
        return
    message, fix = problem
    if _opted_in(r, TAG_ALLOW_UNLISTED_REGION) and not availability.retired(size, _today()):
        return
    yield Finding(f"GPU cluster {_cluster_name(r)!r}: {message}", fix)


def _unlisted_region_opted_in(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    found = _region_problem(r, limits)
    if not found or not _opted_in(r, TAG_ALLOW_UNLISTED_REGION):
        return
    size, region, problem = found
    if availability.retired(size, _today()):
        return  # cluster-size-in-region refuses it: no opt-in covers a retired size
    if problem is None:
        yield Finding(f"GPU cluster {_cluster_name(r)!r} opts in to an unlisted region ({TAG_ALLOW_UNLISTED_REGION}), "
                      f"but amlhpc/core/catalog/availability.toml now lists {size} in {region}",
                      f"remove allowUnlistedRegion from cluster {_cluster_name(r)!r} in Pulumi.{_short(stack)}.yaml")
        return
    yield Finding(f"GPU cluster {_cluster_name(r)!r} uses {size} in {region}, which amlhpc/core/catalog/availability.toml "
                  f"does not list, by choice ({TAG_ALLOW_UNLISTED_REGION}): the deployment fails if Azure does not "
                  "offer it there",
                  f"confirm with `az vm list-skus -l {region} --size {size} -o table`, then refresh the catalog: "
                  f"{availability.REFRESH_COMMAND}")


def _public_ssh(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    props = _aml(r)
    if props is None:
        return
    credentials = props.get("userAccountCredentials") or {}
    ssh_on = bool(get_path(credentials, "adminUserSshPublicKey") or get_path(credentials, "adminUserPassword"))
    if not ssh_on or props.get("enableNodePublicIp") is False:
        return
    port = props.get("remoteLoginPortPublicAccess") or "NotSpecified"
    # NotSpecified opens the port on every public node unless the cluster is in a VNet
    # (Azure's RemoteLoginPortPublicAccess semantics).
    if port == "Enabled" or (port == "NotSpecified" and not props.get("subnet")):
        yield Finding(
            f"cluster {_cluster_name(r)!r} opens SSH (port 22) on public node IPs to the internet",
            "remove the cluster's ssh block (debug through the job's services instead), or move the environment to "
            "aml-hpc:network.isolation: private so nodes have no public IP",
        )


def _password_login(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    props = _aml(r)
    if props is None:
        return
    # Never echo the value: it is a secret.
    if get_path(props, "userAccountCredentials", "adminUserPassword") not in (None, ""):
        yield Finding(
            f"cluster {_cluster_name(r)!r} allows password login on its nodes",
            "remove adminUserPassword; give an SSH public key (aml-hpc:clusters[i].ssh.publicKey) if you need SSH at all",
        )


# --------------------------------------------------------------------------------------
# Storage


def _storage_secure(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type == BLOB_CONTAINER:
        access = r.inputs.get("publicAccess")
        if access not in (None, "None"):
            yield Finding(
                f"container {r.inputs.get('containerName') or r.name!r} allows anonymous read access (publicAccess {access})",
                "set publicAccess: None; grant readers Storage Blob Data Reader instead",
            )
        return
    if r.type != STORAGE_ACCOUNT:
        return
    account = r.inputs.get("accountName") or r.name
    if r.inputs.get("enableHttpsTrafficOnly") is not True:
        yield Finding(f"storage account {account!r} does not require HTTPS (enableHttpsTrafficOnly is not true)",
                      "set enableHttpsTrafficOnly: true on the account")
    tls = r.inputs.get("minimumTlsVersion")
    if tls not in ("TLS1_2", "TLS1_3"):
        shown = tls if tls is not None else "unset, which Azure reads as TLS1_0"
        yield Finding(f"storage account {account!r} accepts TLS below 1.2 (minimumTlsVersion {shown})",
                      "set minimumTlsVersion: TLS1_2")
    if r.inputs.get("allowBlobPublicAccess") is not False:
        yield Finding(f"storage account {account!r} does not forbid anonymous blob access (allowBlobPublicAccess is not false)",
                      "set allowBlobPublicAccess: false on the account")


def _is_dataset_resource(r: ResourceView) -> bool:
    return r.type in (STORAGE_ACCOUNT, BLOB_CONTAINER) and r.within(DATASET_COMPONENT)


def _dataset_retained(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if not _is_dataset_resource(r) or r.protect:
        return
    if r.retain_on_delete is None:
        raise NotVisible(f"retainOnDelete is not sent to policy packs; `{invocation.command('infra', 'plan --stack S --policy')}` checks it")
    if not r.retain_on_delete:
        yield Finding(
            f"dataset storage {r.name!r} would be deleted by `pulumi destroy` or a replacement",
            "declare it with retain_on_delete=True (and protect=True outside dev): "
            "amlhpc/infra/components/dataset_storage.py",
        )


def _dataset_group_retained(resources: Sequence[ResourceView], stack: StackView, limits: Limits) -> Iterable[Finding]:
    # Deleting a resource group deletes everything in it, retained resources included: a
    # retained dataset account survives `pulumi destroy` only if its group does too.
    # Protected dataset resources block destroy on their own, so only the retained-only
    # case needs the group kept.
    exposed = [r for r in resources if _is_dataset_resource(r) and not r.protect]
    if not exposed:
        return
    for group in (r for r in resources if r.type == RESOURCE_GROUP):
        if group.protect:
            continue
        if group.retain_on_delete is None:
            raise NotVisible(f"retainOnDelete is not sent to policy packs; `{invocation.command('infra', 'plan --stack S --policy')}` checks it")
        if not group.retain_on_delete:
            names = ", ".join(sorted(r.name for r in exposed))
            yield Finding(
                f"resource group {group.inputs.get('resourceGroupName') or group.name!r} holds dataset storage "
                f"({names}) that is only retained, and deleting the group on `pulumi destroy` deletes it anyway",
                "declare the resource group with retain_on_delete=True (amlhpc/infra/components/resource_group.py), "
                "or protect the dataset storage (aml-hpc:protectData: true)",
                urn=group.urn, name=group.name,
            )


# --------------------------------------------------------------------------------------
# Secrets and images


def _checkpoint_soft_delete(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type != BLOB_SERVICE or not r.within(ROLE_STORAGE_COMPONENT) or not r.name.startswith("checkpoints"):
        return
    policy = r.inputs.get("deleteRetentionPolicy") or {}
    days = _number(policy.get("days")) or 0
    if policy.get("enabled") is True and days > CHECKPOINT_SOFT_DELETE_MAX_DAYS:
        yield Finding(f"checkpoint account blob service {r.name!r} keeps deleted blobs {days:g} days: every pruned "
                      "checkpoint version is billed as data for that long",
                      f"aml-hpc:checkpointAccounts.softDeleteDays: 0 (or {CHECKPOINT_SOFT_DELETE_MAX_DAYS})")


def _key_vault_purge_protection(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type != KEY_VAULT:
        return
    vault = r.inputs.get("vaultName") or r.name
    props = r.inputs.get("properties") or {}
    if props.get("enablePurgeProtection") is not True:
        yield Finding(f"key vault {vault!r} can be purged: deleted secrets and keys would be gone at once",
                      "set properties.enablePurgeProtection: true (it cannot be turned off again)")
    if props.get("enableSoftDelete") is False:
        yield Finding(f"key vault {vault!r} disables soft delete, which purge protection needs",
                      "remove enableSoftDelete: false")


def _registry_admin_off(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type != CONTAINER_REGISTRY:
        return
    if r.inputs.get("adminUserEnabled") is True:
        yield Finding(
            f"container registry {r.inputs.get('registryName') or r.name!r} enables the shared admin user (a password login)",
            "set adminUserEnabled: false; clusters pull with their managed identity (AcrPull), people with `az acr login`",
        )


# --------------------------------------------------------------------------------------
# Money and ownership


def _stack_budget(resources: Sequence[ResourceView], stack: StackView, limits: Limits) -> Iterable[Finding]:
    budgets = [r for r in resources if r.type == BUDGET]
    fix = (f"add to Pulumi.{_short(stack)}.yaml: aml-hpc:budget: {{monthlyAmountUsd: <amount>, "
           "alertEmails: [<you@example.com>]}")
    if not budgets:
        yield Finding(f"stack {stack.name!r} declares no consumption budget: nobody is told when spend runs away", fix)
        return
    for budget in budgets:
        amount = _number(budget.inputs.get("amount"))
        if not amount or amount <= 0:
            yield Finding(f"budget {budget.name!r} has no positive amount", fix, urn=budget.urn, name=budget.name)
        notifications = budget.inputs.get("notifications") or {}
        alerting = [
            n for n in (notifications.values() if hasattr(notifications, "values") else [])
            if n.get("enabled") is not False
            and any(is_sequence(n.get(k)) and len(n.get(k)) > 0 for k in ("contactEmails", "contactGroups", "contactRoles"))
        ]
        if not alerting:
            yield Finding(f"budget {budget.name!r} alerts nobody (no enabled notification with a contact)",
                          "give the budget alertEmails", urn=budget.urn, name=budget.name)


def _required_tags(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type not in TAGGABLE and "tags" not in r.inputs:
        return
    tags = r.tags or {}
    required = REQUIRED_TAGS + ((EXPERIMENT_TAG,) if stack.kind == "experiment" else ())
    missing = [t for t in required if not str(tags.get(t) or "").strip()]
    if missing:
        yield Finding(
            f"{r.type.rsplit(':', 1)[-1]} {r.name!r} lacks required tag(s) {', '.join(missing)}",
            "tag it with the stack's tags (StackConfig.tags(): owner and environment from the stack file, "
            "expiresAt on experiment stacks)",
        )
    if stack.kind == "experiment" and EXPERIMENT_TAG not in missing:
        value = str(tags.get(EXPERIMENT_TAG))
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            yield Finding(f"{r.name!r} has tag expiresAt {value!r}, not an ISO 8601 date-time; teardown cannot read it",
                          "use e.g. 2026-12-31T00:00:00Z (aml-hpc:expiresAt in the stack file)")


def _experiment_clusters_only(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if stack.kind != "experiment" or not r.type.startswith("azure-native:") or r.type in EXPERIMENT_ALLOWED:
        return
    if r.within(ROLE_STORAGE_COMPONENT) and r.retain_on_delete is not False:
        return  # the experiment's own checkpoint accounts, kept by teardown (None: an adapter that cannot tell)
    if r.type == ROLE_ASSIGNMENT and r.name.startswith(("checkpoint-access-", "checkpoint-readers-")):
        return  # the grants on them; an assignment holds no data
    yield Finding(
        f"experiment stack {stack.name!r} owns {r.type}: teardown destroys experiment stacks, so it would be lost",
        "declare long-lived resources (data, workspace, registry, network) in the environment stack; "
        "experiments add clusters (and a budget) only",
    )


# --------------------------------------------------------------------------------------
# Hardening: delete locks, managed networks, diagnostics, keys, the way in


def _locked_scopes(resources: Sequence[ResourceView]) -> list[str]:
    """Resource ids (lower case) that carry a CanNotDelete or ReadOnly lock in this stack."""
    scopes = []
    for r in resources:
        if r.type not in (LOCK_BY_SCOPE, LOCK_AT_RESOURCE) or r.inputs.get("level") not in ("CanNotDelete", "ReadOnly"):
            continue
        if r.type == LOCK_BY_SCOPE:
            scopes.append(str(r.inputs.get("scope") or "").lower())
        else:  # at resource level: provider namespace, type and name instead of an id
            scopes.append(f"/providers/{r.inputs.get('resourceProviderNamespace')}/{r.inputs.get('resourceType')}/"
                          f"{r.inputs.get('resourceName')}".lower())
    return scopes


def _protected_dataset_accounts(resources: Sequence[ResourceView]) -> list[ResourceView]:
    return [r for r in resources if r.type == STORAGE_ACCOUNT and r.within(DATASET_COMPONENT) and r.protect]


def _dataset_locked(resources: Sequence[ResourceView], stack: StackView, limits: Limits) -> Iterable[Finding]:
    # `protect` guards against Pulumi only; an Azure lock guards against the portal, the CLI
    # and a deleted resource group as well.
    scopes = _locked_scopes(resources)
    for r in _protected_dataset_accounts(resources):
        account = str(r.inputs.get("accountName") or r.name)
        suffix = f"/microsoft.storage/storageaccounts/{account.lower()}"
        if _opted_in(r, TAG_ALLOW_UNLOCKED) or any(s.endswith(suffix) for s in scopes):
            continue
        yield Finding(
            f"protected dataset storage {account!r} has no delete lock: Pulumi refuses to delete it, "
            "anyone with Azure rights outside Pulumi can",
            f"lock it (aml-hpc:locks.datasetStorage: true in Pulumi.{_short(stack)}.yaml, the default outside dev), "
            f"or opt out with locks.datasetStorage: false (the account then carries {TAG_ALLOW_UNLOCKED}=true)",
            urn=r.urn, name=r.name,
        )


def _dataset_storage_kept(resources: Sequence[ResourceView], stack: StackView, limits: Limits) -> Iterable[Finding]:
    # Outside dev the datasets must survive a mistaken `pulumi destroy` and a delete outside
    # Pulumi: protectData: false with the lock off left neither, and passed every rule.
    if baseline.environment_of(stack) == baseline.DEV:
        return
    scopes = _locked_scopes(resources)
    for r in resources:
        if r.type != STORAGE_ACCOUNT or not r.within(DATASET_COMPONENT) or r.protect:
            continue
        account = str(r.inputs.get("accountName") or r.name)
        if any(s.endswith(f"/microsoft.storage/storageaccounts/{account.lower()}") for s in scopes):
            continue
        yield Finding(
            f"dataset storage {account!r} is neither protected nor locked outside dev: `pulumi destroy`, the portal "
            "or the CLI deletes every dataset in it",
            f"remove aml-hpc:protectData: false from Pulumi.{_short(stack)}.yaml (or keep aml-hpc:locks.datasetStorage on)",
            urn=r.urn, name=r.name,
        )


def _dataset_unlocked_opted_in(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type == STORAGE_ACCOUNT and r.within(DATASET_COMPONENT) and r.protect and _opted_in(r, TAG_ALLOW_UNLOCKED):
        yield Finding(
            f"dataset storage {r.inputs.get('accountName') or r.name!r} is protected in Pulumi but not locked in Azure "
            f"by choice ({TAG_ALLOW_UNLOCKED})",
            "lock it once the deploying identity may create locks (Owner or User Access Administrator)",
        )


_MANAGED_MODES = ("AllowInternetOutbound", "AllowOnlyApprovedOutbound")


def _locked_targets(r: ResourceView) -> list[str]:
    """The resource ids whose delete lock also stops deleting `r`: the scope of a role
    assignment, the resource a diagnostic setting watches (both extension resources), the
    targets of a private endpoint (deleting it removes their endpoint connection)."""
    if r.type == ROLE_ASSIGNMENT:
        found = [r.inputs.get("scope")]
    elif r.type == DIAGNOSTIC_SETTING:
        found = [r.inputs.get("resourceUri")]
    elif r.type == PRIVATE_ENDPOINT:
        found = [c.get("privateLinkServiceId") for c in r.inputs.get("privateLinkServiceConnections") or []]
    else:
        return []
    return [str(t).lower() for t in found if t]


def _locked_scope_protected(resources: Sequence[ResourceView], stack: StackView, limits: Limits) -> Iterable[Finding]:
    # Azure refuses deleting anything under a lock (ScopeLocked). Unprotected, such a resource
    # makes `make down` fail halfway and hides from Pulumi that removing it needs the lock lifted.
    scopes = [s for s in _locked_scopes(resources) if s.startswith("/subscriptions/")]
    for r in resources:
        if r.protect or r.type in (LOCK_BY_SCOPE, LOCK_AT_RESOURCE):
            continue
        for target in _locked_targets(r):
            held = next((s for s in scopes if target == s or target.startswith(s + "/")), None)
            if held:
                yield Finding(
                    f"{r.type.rsplit(':', 1)[-1]} {r.name!r} sits under the delete lock on {held.rsplit('/', 1)[-1]!r}: "
                    "Azure refuses to delete it (ScopeLocked), so tearing the stack down (`down`) would fail on it",
                    "declare it with protect=True while the lock stands (amlhpc/infra/components/access.py, diagnostics.py, "
                    "private_endpoints.py take protect)",
                    urn=r.urn, name=r.name,
                )
                break


def _managed_mode(resources: Sequence[ResourceView]) -> str | None:
    for r in resources:
        if r.type == WORKSPACE:
            mode = get_path(r.inputs, "managedNetwork", "isolationMode")
            if mode in _MANAGED_MODES:
                return str(mode)
    return None


def _managed_network_clusters(resources: Sequence[ResourceView], stack: StackView, limits: Limits) -> Iterable[Finding]:
    # Azure places a managed workspace's clusters in its managed VNet: a subnet of our own is
    # refused at deployment, and a public node IP would bypass the outbound rules.
    if _managed_mode(resources) is None:
        return
    for r in resources:
        props = _aml(r)
        if props is None:
            continue
        if props.get("subnet"):
            yield Finding(f"cluster {_cluster_name(r)!r} names a subnet, but its workspace uses a managed network",
                          "drop the subnet: clusters in a managed network take none", urn=r.urn, name=r.name)
        if props.get("enableNodePublicIp") is not False:
            yield Finding(f"cluster {_cluster_name(r)!r} in a managed network does not turn node public IPs off",
                          "set enableNodePublicIp: false (amlhpc/infra/program.py does for managed isolation)",
                          urn=r.urn, name=r.name)


def _managed_network_outbound(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type != WORKSPACE:
        return
    network = r.inputs.get("managedNetwork") or {}
    mode = network.get("isolationMode")
    name = r.inputs.get("workspaceName") or r.name
    if mode == "AllowInternetOutbound":
        if baseline.environment_of(stack) == baseline.DEV:  # outside dev, no-internet-outbound refuses it
            yield Finding(f"workspace {name!r}: jobs may send data to any host on the internet (AllowInternetOutbound)",
                          "use outbound: AllowOnlyApprovedOutbound with FQDN rules for the hosts jobs need; Azure "
                          "allows that switch once, and never back")
        return
    rules = network.get("outboundRules") or {}
    fqdn = [rule.get("destination") for rule in (rules.values() if hasattr(rules, "values") else [])
            if rule.get("type") == "FQDN"]
    if mode == "AllowOnlyApprovedOutbound" and fqdn:
        sku = str(network.get("firewallSku") or "Standard")
        hourly = quirks.AZURE_FIREWALL_USD_PER_HOUR.get(sku)
        cost = (f"about ${hourly:.3g}/hour (${hourly * 730:,.0f}/month) plus "
                f"${quirks.AZURE_FIREWALL_USD_PER_GB[sku]}/GB at the list price") if hourly else "billed hourly"
        yield Finding(f"workspace {name!r}: {len(fqdn)} FQDN rule(s) ({', '.join(map(str, fqdn))}) make Azure run a "
                      f"{sku} Azure Firewall in the managed VNet, {cost}",
                      "keep the list to what jobs need (aml-hpc:network.fqdnRules); [] removes the firewall")


def _diagnostics_complete(resources: Sequence[ResourceView], stack: StackView, limits: Limits) -> Iterable[Finding]:
    # A stack that sends diagnostics sends them for the workspace, its vault and every storage
    # account's blob service: a gap is the one place nobody looks.
    settings = [str(r.inputs.get("resourceUri") or "").lower() for r in resources if r.type == DIAGNOSTIC_SETTING]
    if not settings:
        return
    wanted = []
    for r in resources:
        if r.type == WORKSPACE:
            wanted.append((r, f"/workspaces/{r.inputs.get('workspaceName') or ''}", "workspace"))
        elif r.type == KEY_VAULT:
            wanted.append((r, f"/vaults/{r.inputs.get('vaultName') or ''}", "key vault"))
        elif r.type == STORAGE_ACCOUNT:
            wanted.append((r, f"/storageaccounts/{r.inputs.get('accountName') or ''}/blobservices/default",
                           "storage account (blob service)"))
    for r, suffix, what in wanted:
        if not any(s.endswith(suffix.lower()) for s in settings):
            yield Finding(f"{what} {r.name!r} sends no diagnostics while the rest of the stack does",
                          "add it to amlhpc/infra/components/diagnostics.py platform_targets", urn=r.urn, name=r.name)


def _key_size(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type != KEY_VAULT_KEY:
        return
    props = r.inputs.get("properties") or {}
    size = _number(props.get("keySize"))
    if str(props.get("kty", "")).startswith("RSA") and size is not None and size < 3072:
        yield Finding(f"key {r.inputs.get('keyName') or r.name!r} is RSA {size:g} bits; Microsoft recommends 3072 or "
                      "more for Azure ML customer-managed keys", "set aml-hpc:encryption.keySize: 3072 (or 4096)")


def _vm_ssh_key_only(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type != VIRTUAL_MACHINE:
        return
    profile = r.inputs.get("osProfile") or {}
    name = r.inputs.get("vmName") or r.name
    if profile.get("adminPassword") not in (None, ""):  # never echo the value
        yield Finding(f"VM {name!r} sets an admin password", "remove it; give an SSH public key")
    if get_path(profile, "linuxConfiguration", "disablePasswordAuthentication") is not True:
        yield Finding(f"VM {name!r} allows password login", "set osProfile.linuxConfiguration.disablePasswordAuthentication: true")


def _no_public_ip_nic(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type != NETWORK_INTERFACE:
        return
    configs = r.inputs.get("ipConfigurations") or []
    if any(c.get("publicIPAddress") for c in (configs if is_sequence(configs) else [])):
        yield Finding(f"network interface {r.inputs.get('networkInterfaceName') or r.name!r} has a public IP",
                      "reach VMs through Azure Bastion (aml-hpc:network.wayIn.bastion), never a public IP of their own")


def _short(stack: StackView) -> str:
    return stack.name.rsplit("/", 1)[-1]


RULES: tuple[Rule, ...] = (
    Rule("gpu-scale-to-zero", "mandatory", "GPU clusters scale to zero nodes when idle (minNodes 0 unless opted in).",
         check_resource=_scale_to_zero),
    Rule("gpu-idle-nodes-opted-in", "advisory", "GPU clusters that keep idle nodes by choice, and what that costs.",
         check_resource=_idle_nodes_opted_in),
    Rule("gpu-idle-scale-down", "mandatory", "GPU clusters release idle nodes within the configured idle time.",
         check_resource=_idle_scale_down),
    Rule("cluster-size-in-region", "mandatory",
         "GPU clusters use a size offered in their region (amlhpc/core/catalog/availability.toml), unless opted in; "
         "never a retired size.", check_resource=_size_in_region),
    Rule("cluster-region-unlisted-opted-in", "advisory",
         "GPU clusters in a region the catalog does not list for their size, by choice.",
         check_resource=_unlisted_region_opted_in),
    Rule("no-public-ssh", "mandatory", "No SSH open to the internet on cluster nodes.", check_resource=_public_ssh),
    Rule("no-password-login", "mandatory", "No password login on cluster nodes.", check_resource=_password_login),
    Rule("multi-node-infiniband", "mandatory", "Clusters that scale beyond one node use an InfiniBand size.",
         check_resource=_multi_node_infiniband),
    Rule("tcp-multi-node-opted-in", "advisory", "Multi-node clusters without InfiniBand by choice.",
         check_resource=_tcp_multi_node_opted_in),
    Rule("storage-secure", "mandatory", "Storage is HTTPS-only, TLS 1.2+, with no anonymous blob access.",
         check_resource=_storage_secure),
    Rule("checkpoint-soft-delete", "mandatory",
         "Checkpoint accounts keep deleted blobs a day at most (pruned versions would be billed as data).",
         check_resource=_checkpoint_soft_delete),
    Rule("dataset-storage-retained", "mandatory", "Dataset storage survives `pulumi destroy` (retained or protected).",
         check_resource=_dataset_retained),
    Rule("dataset-resource-group-retained", "mandatory",
         "The resource group of retained-only dataset storage is retained too (deleting a group deletes its contents).",
         check_stack=_dataset_group_retained),
    Rule("key-vault-purge-protection", "mandatory", "Key Vaults have purge protection.",
         check_resource=_key_vault_purge_protection),
    Rule("registry-admin-user-off", "mandatory", "Container registries have the admin user off.",
         check_resource=_registry_admin_off),
    Rule("stack-budget", "mandatory", "Every stack has a consumption budget that alerts someone.",
         check_stack=_stack_budget),
    Rule("required-tags", "mandatory", "Resources carry owner and environment tags (and expiresAt on experiments).",
         check_resource=_required_tags),
    Rule("experiment-clusters-only", "mandatory",
         "Experiment stacks own clusters and budgets only, so teardown never destroys data.",
         check_resource=_experiment_clusters_only),
    Rule("dataset-storage-locked", "mandatory",
         "Protected dataset storage also carries an Azure CanNotDelete lock (deletion outside Pulumi).",
         check_stack=_dataset_locked),
    Rule("dataset-storage-kept", "mandatory",
         "Outside dev, the dataset storage is protected in Pulumi or locked in Azure, or both.",
         check_stack=_dataset_storage_kept),
    Rule("dataset-storage-unlocked-opted-in", "advisory", "Protected dataset storage left unlocked by choice.",
         check_resource=_dataset_unlocked_opted_in),
    Rule("locked-scope-protected", "mandatory",
         "Role assignments, diagnostic settings and private endpoints under a delete lock are protected (Azure refuses "
         "to delete them).",
         check_stack=_locked_scope_protected),
    Rule("managed-network-clusters", "mandatory",
         "Clusters of a managed-network workspace take no subnet and no node public IP.",
         check_stack=_managed_network_clusters),
    Rule("managed-network-outbound", "advisory",
         "What a managed network lets out: internet outbound, or FQDN rules and their firewall's cost.",
         check_resource=_managed_network_outbound),
    Rule("diagnostics-complete", "mandatory",
         "A stack with diagnostic settings covers the workspace, its Key Vault and every blob service.",
         check_stack=_diagnostics_complete),
    Rule("key-size", "mandatory", "RSA keys for customer-managed encryption have 3072 bits or more.",
         check_resource=_key_size),
    Rule("vm-ssh-key-only", "mandatory", "VMs (the jump box) allow SSH keys only.", check_resource=_vm_ssh_key_only),
    Rule("no-public-ip-on-nics", "mandatory", "Network interfaces have no public IP (reach VMs through Bastion).",
         check_resource=_no_public_ip_nic),
    # The security baseline (amlhpc/infra/policy/baseline.py): outside dev, and for roles everywhere.
    Rule("environment-tag-is-the-stacks", "mandatory",
         "A resource's environment tag names the stack's environment (an environment stack's name, an experiment's "
         "aml-hpc:environment).", check_resource=baseline.environment_tag_is_the_stacks),
    Rule("no-public-network-access", "mandatory",
         "Outside dev, storage, Key Vaults, registries, workspaces and ML registries take no connections from the "
         "internet.", check_resource=baseline.public_network_access),
    Rule("no-shared-key-storage", "mandatory", "Outside dev, no storage account accepts its account key.",
         check_resource=baseline.no_shared_key),
    Rule("no-internet-outbound", "mandatory", "Outside dev, a managed network never allows all internet outbound.",
         check_resource=baseline.no_internet_outbound),
    Rule("egress-controlled", "mandatory",
         "Outside dev, jobs' egress is controlled under every isolation mode: a managed network that allows only "
         "approved outbound (private isolation's NAT gateway lets everything out).",
         check_stack=baseline.egress_controlled),
    Rule("outbound-fqdn-allow-listed", "mandatory",
         "Outside dev, a managed network's FQDN rules name exact hosts of amlhpc/infra/policy/outbound.toml, no wildcard.",
         check_resource=baseline.outbound_allow_listed),
    Rule("no-public-ips", "mandatory",
         "Outside dev, public IPs only on Bastion and NAT gateways, none on cluster nodes.",
         check_stack=baseline.no_public_ips),
    Rule("no-privileged-roles", "mandatory",
         "No Owner, no User Access Administrator, no Role Based Access Control Administrator without the condition "
         "that constrains the roles it assigns.", check_resource=baseline.no_privileged_roles),
    Rule("role-in-permission-model", "mandatory",
         "Every role assignment gives a role amlhpc/core/catalog/permissions.toml names.", check_resource=baseline.role_in_model),
)

RULES_BY_NAME = {rule.name: rule for rule in RULES}
