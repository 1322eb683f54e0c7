"""The security baseline: checks amlhpc/infra/policy/rules.py registers as mandatory rules.

Outside dev (the stack's environment: an environment stack's name, an experiment's
`aml-hpc:environment`; never a tag, which the stack file writes): no public network access on
data or control-plane resources, no shared keys on storage, no internet outbound from a
managed network and only allow-listed exact hosts in its FQDN rules, no public IP but
Bastion's and a NAT gateway's (outbound only). Everywhere: no Owner, no User Access
Administrator, no Role Based Access Control Administrator without a condition that
constrains the roles it assigns, and no role the permission model (amlhpc/core/catalog/
permissions.toml) does not name. dev is public by design (docs/isolation.md), so the
network rules leave it alone; nothing justifies an unconstrained role anywhere.

Pure functions over the neutral view (amlhpc/infra/policy/model.py); no Pulumi import.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from amlhpc.core.permissions import MODEL, Right
from amlhpc.infra.policy.model import (
    Finding,
    Limits,
    ResourceView,
    StackView,
    get_path,
    is_sequence,
)
from amlhpc.infra.policy.outbound import OUTBOUND_FILE, allowed_hosts

STORAGE_ACCOUNT = "azure-native:storage:StorageAccount"
KEY_VAULT = "azure-native:keyvault:Vault"
CONTAINER_REGISTRY = "azure-native:containerregistry:Registry"
WORKSPACE = "azure-native:machinelearningservices:Workspace"
ML_REGISTRY = "azure-native:machinelearningservices:Registry"
COMPUTE = "azure-native:machinelearningservices:Compute"
ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"
PUBLIC_IP = "azure-native:network:PublicIPAddress"
BASTION = "azure-native:network:BastionHost"
NAT_GATEWAY = "azure-native:network:NatGateway"

DEV = "dev"


UNKNOWN = "(unknown)"


def environment_of(stack: StackView) -> str:
    """The environment a stack's resources belong to, decided by the stack, never by a tag: an
    environment stack is its own name (one line `aml-hpc:environment: dev` in Pulumi.prod.yaml
    must not switch the baseline off), an experiment is its `aml-hpc:environment` as the adapter
    read it; UNKNOWN (outside dev: the baseline applies) when the adapter could not tell."""
    if stack.kind == "environment":
        return stack.short_name
    return stack.environment or UNKNOWN


def _outside_dev(r: ResourceView, stack: StackView) -> bool:
    return environment_of(stack) != DEV


def environment_tag_is_the_stacks(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    """A resource's `environment` tag says what the stack decides: a tag that claims another
    environment (dev on a prod resource) is how a stack file once switched the baseline off."""
    tagged = str((r.tags or {}).get("environment") or "").strip()
    decided = environment_of(stack)
    if tagged and decided != UNKNOWN and tagged != decided:
        yield Finding(f"{r.type.rsplit(':', 1)[-1]} {r.name!r} is tagged environment {tagged!r} in stack {stack.name!r}, "
                      f"which belongs to environment {decided!r}",
                      f"remove aml-hpc:environment from Pulumi.{_short(stack)}.yaml (an environment stack's environment "
                      "is its name; an experiment's is the environment it deploys into)")


def _short(stack: StackView) -> str:
    return stack.name.rsplit("/", 1)[-1]


# --------------------------------------------------------------------------------------
# Network


def _public_access(r: ResourceView) -> object:
    if r.type == KEY_VAULT:
        return get_path(r.inputs, "properties", "publicNetworkAccess")
    return r.inputs.get("publicNetworkAccess")


def public_network_access(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type not in (STORAGE_ACCOUNT, KEY_VAULT, CONTAINER_REGISTRY, WORKSPACE, ML_REGISTRY) or not _outside_dev(r, stack):
        return
    value = _public_access(r)
    if value != "Disabled":
        shown = value if value is not None else "unset, which Azure reads as Enabled"
        yield Finding(f"{r.type.rsplit(':', 1)[-1]} {r.name!r} in environment {environment_of(stack)!r} takes "
                      f"connections from the internet (publicNetworkAccess {shown})",
                      f"set aml-hpc:network.isolation: managed (or private) in Pulumi.{_short(stack)}.yaml: people and "
                      "CI then reach it through private endpoints (docs/isolation.md)")


def no_internet_outbound(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type != WORKSPACE or not _outside_dev(r, stack):
        return
    if get_path(r.inputs, "managedNetwork", "isolationMode") == "AllowInternetOutbound":
        yield Finding(f"workspace {r.inputs.get('workspaceName') or r.name!r}: jobs may send data to any host on the "
                      "internet (managed network AllowInternetOutbound)",
                      f"set aml-hpc:network.outbound: AllowOnlyApprovedOutbound in Pulumi.{_short(stack)}.yaml with the "
                      "hosts jobs need in fqdnRules (Azure allows that switch once, and never back)")


def egress_controlled(resources: Sequence[ResourceView], stack: StackView, limits: Limits) -> Iterable[Finding]:
    """Outside dev, what jobs send out is controlled under every isolation mode: only a managed
    network with AllowOnlyApprovedOutbound does that here. Under `private` isolation the nodes
    sit in our subnet and leave through the NAT gateway to any host on the internet (no
    firewall on that path is declared), so it is refused like `public`."""
    if stack.kind != "environment" or environment_of(stack) == DEV:
        return
    workspaces = [r for r in resources if r.type == WORKSPACE]
    if not workspaces:
        return
    for r in workspaces:
        mode = get_path(r.inputs, "managedNetwork", "isolationMode")
        if mode != "AllowOnlyApprovedOutbound":
            shown = mode or "no managed network"
            yield Finding(f"workspace {r.inputs.get('workspaceName') or r.name!r} in environment {environment_of(stack)!r}: "
                          f"jobs reach any host on the internet ({shown}; a private network's NAT gateway lets "
                          "everything out)",
                          f"set aml-hpc:network.isolation: managed with outbound: AllowOnlyApprovedOutbound in "
                          f"Pulumi.{_short(stack)}.yaml (docs/isolation.md)", urn=r.urn, name=r.name)


def outbound_allow_listed(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type != WORKSPACE or not _outside_dev(r, stack):
        return
    rules = get_path(r.inputs, "managedNetwork", "outboundRules") or {}
    allowed = allowed_hosts()
    for key, rule in sorted((rules.items() if hasattr(rules, "items") else []), key=lambda kv: str(kv[0])):
        if rule.get("type") != "FQDN":
            continue
        host = str(rule.get("destination") or "").lower()
        if "*" in host:
            yield Finding(f"workspace {r.inputs.get('workspaceName') or r.name!r}: outbound rule {key!r} allows the "
                          f"wildcard {host!r}: jobs could send data to any host anyone creates under it",
                          "list exact hosts in aml-hpc:network.fqdnRules")
        elif host not in allowed:
            yield Finding(f"workspace {r.inputs.get('workspaceName') or r.name!r}: outbound rule {key!r} allows "
                          f"{host!r}, which {OUTBOUND_FILE.parent.name}/{OUTBOUND_FILE.name} does not allow-list",
                          f"remove it from aml-hpc:network.fqdnRules, or propose it with why in "
                          f"amlhpc/infra/policy/{OUTBOUND_FILE.name} for the platform team's review (allowed now: "
                          f"{', '.join(sorted(allowed))})")


def no_public_ips(resources: Sequence[ResourceView], stack: StackView, limits: Limits) -> Iterable[Finding]:
    """Public IPs only on Bastion (the way in) and NAT gateways (outbound only: nothing can
    connect to them); no node public IPs on clusters."""
    attached: set[str] = set()
    for r in resources:
        if r.type == BASTION:
            configs = r.inputs.get("ipConfigurations") or []
            attached |= {str(get_path(c, "publicIPAddress", "id") or "").lower()
                         for c in (configs if is_sequence(configs) else [])}
        elif r.type == NAT_GATEWAY:
            ips = r.inputs.get("publicIpAddresses") or []
            attached |= {str(get_path(ip, "id") or "").lower() for ip in (ips if is_sequence(ips) else [])}
    for r in resources:
        if not _outside_dev(r, stack):
            continue
        if r.type == PUBLIC_IP:
            name = str(r.inputs.get("publicIpAddressName") or r.name)
            if not any(ref.endswith(f"/publicipaddresses/{name.lower()}") for ref in attached):
                yield Finding(f"public IP {name!r} belongs to neither Azure Bastion nor a NAT gateway: something "
                              "outside the VNet could reach what it is attached to",
                              "reach VMs through Bastion (aml-hpc:network.wayIn.bastion); send outbound traffic "
                              "through the NAT gateway", urn=r.urn, name=r.name)
        elif r.type == COMPUTE and get_path(r.inputs, "properties", "computeType") == "AmlCompute":
            if get_path(r.inputs, "properties", "properties", "enableNodePublicIp") is not False:
                yield Finding(f"cluster {r.inputs.get('computeName') or r.name!r} gives its nodes public IPs",
                              f"set aml-hpc:network.isolation: managed (or private) in Pulumi.{_short(stack)}.yaml",
                              urn=r.urn, name=r.name)


# --------------------------------------------------------------------------------------
# Storage


def no_shared_key(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type != STORAGE_ACCOUNT or not _outside_dev(r, stack):
        return
    if r.inputs.get("allowSharedKeyAccess") is not False:
        yield Finding(f"storage account {r.inputs.get('accountName') or r.name!r} accepts its account key (shared key "
                      "access is not off): one leaked key reads and writes everything in it, past every role",
                      "aml-hpc:workspaceStorageAuth: identity for the workspace's storage, "
                      "aml-hpc:storage.allowSharedKeyAccess: false for the dataset storage")


# --------------------------------------------------------------------------------------
# Roles


def _role_guid(r: ResourceView) -> tuple[str, str]:
    """(role GUID, subscription) of a role assignment's roleDefinitionId."""
    parts = str(r.inputs.get("roleDefinitionId") or "").split("/")
    subscription = parts[2] if len(parts) > 2 and parts[1].lower() == "subscriptions" else ""
    return parts[-1].lower(), subscription


def no_privileged_roles(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    if r.type != ROLE_ASSIGNMENT:
        return
    guid, subscription = _role_guid(r)
    role = MODEL.role_by_guid(guid)
    if role is None or not role.privileged:
        return
    condition = str(r.inputs.get("condition") or "")
    # Exactly the model's text: a condition that merely contains its clauses (or lists one
    # more role, Owner say) would pass a substring test and let its holder assign that role.
    if role.key == "rbac-administrator" and condition == MODEL.constrain_roles_condition(subscription):
        return
    why = ("with no condition" if not condition else
           "with a condition that is not the model's constrain-roles condition (it may allow other roles)")
    yield Finding(f"role assignment {r.name!r} gives {role.name} {why}: its holder can give anyone any role, "
                  "Owner included", "grant the narrow roles amlhpc/core/catalog/permissions.toml lists; Role Based Access "
                  "Control Administrator only with the constrain-roles condition (amlhpc.core.permissions), word for word")


_SCOPE_SHAPES = {
    "subscription": r"^/subscriptions/[^/]+$", "resource-group": r"/resourcegroups/[^/]+$",
    "workspace": r"/providers/microsoft\.machinelearningservices/workspaces/[^/]+$",
    "workspace-storage": r"/providers/microsoft\.storage/storageaccounts/[^/]+$",
    "dataset-account": r"/providers/microsoft\.storage/storageaccounts/[^/]+$",
    "registry": r"/providers/microsoft\.containerregistry/registries/[^/]+$", "cmk-key": r"/keys/[^/]+$",
    "jump-box": r"/virtualmachines/[^/]+$", "jump-box-nic": r"/networkinterfaces/[^/]+$",
    "bastion": r"/bastionhosts/[^/]+$",
    # state-<env> and state-<env>-experiments: neither shape takes the other's container.
    "state-container": r"/containers/state-(?![^/]*-experiments$)[^/]+$",
    "experiments-state-container": r"/containers/state-[^/]+-experiments$",
}
"""What the resource id at each symbolic scope of the model looks like (lower case)."""

_SERVICE_PRINCIPALS = ("workload", "azure", "ci")
"""Model principal kinds that are managed identities or applications: always ServicePrincipal."""


def _scope_fits(symbolic: str, scope: str) -> bool:
    if symbolic.startswith("container:"):
        return scope.endswith(f"/blobservices/default/containers/{symbolic.split(':', 1)[1]}")
    if symbolic.startswith("endpoint:"):
        return "/privateendpoints/" in scope and scope.endswith(symbolic.split(":", 1)[1])
    return re.search(_SCOPE_SHAPES[symbolic], scope) is not None


def _named_rights(name: str) -> list[Right]:
    """The model rights an assignment's resource name claims: it ends in the right's key."""
    found = []
    for right in MODEL.rights:
        key = re.escape(right.key).replace(re.escape("{i}"), r"\d+")
        if re.search(rf"(^|-){key}$", name):
            found.append(right)
    return found


def _mismatch(right: Right, r: ResourceView, guid: str, subscription: str) -> str | None:
    """Why the assignment is not the right's (principal type, role, scope, condition), or None."""
    if right.role.guid_in(subscription).lower() != guid:
        return f"role {guid}, not {right.role.name}"
    kind = MODEL.principals[right.principal].kind
    if kind in _SERVICE_PRINCIPALS and r.inputs.get("principalType") not in (None, "ServicePrincipal"):
        return f"principal type {r.inputs.get('principalType')}, not a {right.principal} identity (ServicePrincipal)"
    scope = r.inputs.get("scope")
    if isinstance(scope, str) and scope.startswith("/") and not _scope_fits(right.scope, scope.lower().rstrip("/")):
        return f"scope {scope}, not the model's {right.scope}"
    expected = MODEL.condition_text(right.condition, subscription)
    if (r.inputs.get("condition") or None) != expected:
        return ("no condition" if not r.inputs.get("condition") else "another condition") + \
            (f", not the model's {right.condition}" if right.condition else ", and the model gives it none")
    return None


def role_in_model(r: ResourceView, stack: StackView, limits: Limits) -> Iterable[Finding]:
    """Every assignment is one right of the model: the right its name ends in (its key), with
    that right's role, principal type, scope and condition - not merely a role some right names
    (Contributor on the GPU identity would pass that)."""
    if r.type != ROLE_ASSIGNMENT:
        return
    guid, subscription = _role_guid(r)
    role = MODEL.role_by_guid(guid, subscription)
    fix = ("add the right (principal, role, scope, why) to amlhpc/core/catalog/permissions.toml and derive the "
           "assignment from it (amlhpc/infra/components/access.py grants_for)")
    if role is None or not any(right.role.key == role.key for right in MODEL.rights):
        yield Finding(f"role assignment {r.name!r} gives role {guid}, which no right of the permission model names", fix)
        return
    if role.privileged:
        return  # no-privileged-roles decides these
    claimed = _named_rights(r.name)
    if not claimed:
        yield Finding(f"role assignment {r.name!r} ({role.name}) is no right of the permission model: its name ends in "
                      "no right's key", fix)
        return
    problems = [f"{right.principal}/{right.key}: {why}" for right in claimed
                if (why := _mismatch(right, r, guid, subscription)) is not None]
    if len(problems) == len(claimed):
        yield Finding(f"role assignment {r.name!r} is not the right of the permission model it is named after "
                      f"({'; '.join(problems)})", fix)
