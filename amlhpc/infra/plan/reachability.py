"""Who can reach what, from where: derived from the resources a plan declares, never written
by hand.

Three places a request can come from:
- **the internet** (a laptop, a GitHub-hosted runner): only what keeps public network access;
- **our VNet** (the jump box behind Bastion, a network handed off by VPN or ExpressRoute, the
  CI runners' subnet): a private endpoint there to the target, else its public endpoint
  (our subnets go out through a NAT gateway);
- **the nodes**: in a public stack the public endpoints; on our VNet the same private
  endpoints; in a managed network the workspace's outbound rules - a private endpoint rule of
  ours to the target, or one Azure adds itself for the workspace's own storage, Key Vault and
  registry (Microsoft Learn, "Workspace managed virtual network isolation", list of required
  rules: with approved-only outbound always, with internet outbound when the resource has
  public access off), and nothing else under approved-only outbound.

Targets: the workspace, studio (a browser talks to the workspace and to its storage, blob and
file: "Use Azure Machine Learning studio in an Azure virtual network"), the workspace's
storage, Key Vault and container registry, the dataset storage, and the ML registry with its
storage in each region and its container registry (whose public access follows the
registry's: the API has no switch of their own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amlhpc.infra.plan.mocks import FAKE_SUBSCRIPTION, PlanMocks, RecordedResource, physical_name

WORKSPACE = "azure-native:machinelearningservices:Workspace"
ML_REGISTRY = "azure-native:machinelearningservices:Registry"
ACCOUNT = "azure-native:storage:StorageAccount"
VAULT = "azure-native:keyvault:Vault"
ACR = "azure-native:containerregistry:Registry"
ENDPOINT = "azure-native:network:PrivateEndpoint"
BASTION = "azure-native:network:BastionHost"
VM = "azure-native:compute:VirtualMachine"
SUBNET = "azure-native:network:Subnet"
ROLE = "azure-native:authorization:RoleAssignment"

ORIGINS = ("internet", "our VNet", "nodes")


@dataclass(frozen=True)
class Path:
    """How one origin reaches one target, or why it cannot."""

    reachable: bool
    how: str

    def to_json(self) -> dict[str, Any]:
        return {"reachable": self.reachable, "how": self.how}


@dataclass(frozen=True)
class Reach:
    target: str
    name: str
    paths: dict[str, Path]
    """origin (ORIGINS) -> path; an origin that does not apply is absent."""

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "name": self.name, "from": {o: p.to_json() for o, p in self.paths.items()}}


@dataclass(frozen=True)
class Reachability:
    ways_in: list[str]
    """The seats the stack declares for people and CI, in words."""
    reaches: list[Reach] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"waysIn": list(self.ways_in), "targets": [r.to_json() for r in self.reaches]}


@dataclass(frozen=True)
class _Thing:
    """A target resource: its id, name and whether it keeps public network access."""

    target: str
    resource_id: str
    name: str
    public: bool
    public_note: str = ""
    azure_managed_rule: bool = False
    """Azure adds a managed private endpoint to it (the workspace's own resources)."""


def reachability(plan: Any) -> Reachability:
    """The reachability of an environment plan's targets (an experiment's: none of its own)."""
    workspaces = plan.of_type(WORKSPACE)
    if not workspaces:
        return Reachability(["none of its own: an experiment uses its environment's (see its plan)"])
    ids = PlanMocks(str(plan.outputs.get("subscriptionId") or FAKE_SUBSCRIPTION))
    workspace = workspaces[0]
    things = _targets(plan, ids, workspace)
    endpoints = _endpoints(plan)
    network = plan.config.network.isolation
    managed = workspace.inputs.get("managedNetwork") or {}
    out = []
    for thing in things:
        paths = {"internet": _from_internet(thing)}
        if network != "public":
            paths["our VNet"] = _from_vnet(thing, endpoints, "public endpoint, out through the NAT gateway")
        paths["nodes"] = _from_nodes(thing, network, managed, endpoints)
        out.append(Reach(thing.target, thing.name, paths))
    out.insert(1, _studio(out[0], next(r for r in out if r.target == "workspace storage"), endpoints, things))
    return Reachability(_ways_in(plan), out)


def _id(ids: PlanMocks, r: RecordedResource) -> str:
    return ids._arm_id(r.type, r.inputs, r.name).lower()  # noqa: SLF001 - the plan's own id scheme


def _by_id(plan: Any, ids: PlanMocks, type_token: str, resource_id: Any) -> RecordedResource | None:
    wanted = str(resource_id or "").lower()
    return next((r for r in plan.of_type(type_token) if _id(ids, r) == wanted), None)


def _public(r: RecordedResource | None) -> bool:
    if r is None:
        return False
    access = r.inputs.get("publicNetworkAccess") or (r.inputs.get("properties") or {}).get("publicNetworkAccess")
    return access != "Disabled"


def _targets(plan: Any, ids: PlanMocks, workspace: RecordedResource) -> list[_Thing]:
    w = workspace.inputs
    out = [_Thing("workspace", _id(ids, workspace), physical_name(workspace.type, w, workspace.name), _public(workspace))]
    for target, type_token, key in (("workspace storage", ACCOUNT, "storageAccount"), ("key vault", VAULT, "keyVault"),
                                    ("container registry", ACR, "containerRegistry")):
        r = _by_id(plan, ids, type_token, w.get(key))
        if r is not None:
            out.append(_Thing(target, _id(ids, r), physical_name(r.type, r.inputs, r.name), _public(r),
                              azure_managed_rule=True))
    account = str((plan.outputs.get("storage") or {}).get("account") or "")
    data = next((r for r in plan.of_type(ACCOUNT) if r.inputs.get("accountName") == account), None)
    if data is not None:
        out.append(_Thing("dataset storage", _id(ids, data), account, _public(data)))
    for registry in plan.of_type(ML_REGISTRY):
        public = _public(registry)
        name = physical_name(registry.type, registry.inputs, registry.name)
        out.append(_Thing("ML registry", _id(ids, registry), name, public))
        note = f"follows the registry's publicNetworkAccess: {registry.inputs.get('publicNetworkAccess')}"
        details = ids._computed(registry.type, registry.inputs, registry.name).get("regionDetails") or []  # noqa: SLF001
        acrs = {}
        for region in details:
            for account_details in region.get("storageAccountDetails") or []:
                created = account_details["systemCreatedStorageAccount"]
                out.append(_Thing(f"ML registry storage ({region['location']})",
                                  created["armResourceId"]["resourceId"].lower(), created["storageAccountName"],
                                  public, note))
            for acr in region.get("acrDetails") or []:
                created = acr["systemCreatedAcrAccount"]
                acrs[created["armResourceId"]["resourceId"].lower()] = created["acrAccountName"]
        out += [_Thing("ML registry ACR", i, n, public, note) for i, n in acrs.items()]
    return out


def _endpoints(plan: Any) -> dict[str, list[tuple[str, str]]]:
    """Target id -> [(sub-resource, endpoint name)] of the private endpoints in our VNet."""
    out: dict[str, list[tuple[str, str]]] = {}
    for e in plan.of_type(ENDPOINT):
        for connection in e.inputs.get("privateLinkServiceConnections") or []:
            target = str(connection.get("privateLinkServiceId") or "").lower()
            for group in connection.get("groupIds") or []:
                out.setdefault(target, []).append((group, str(e.inputs.get("privateEndpointName"))))
    return out


def _from_internet(thing: _Thing) -> Path:
    if thing.public:
        return Path(True, "public endpoint, Entra ID sign-in")
    return Path(False, f"no: public network access off{f' ({thing.public_note})' if thing.public_note else ''}")


def _from_vnet(thing: _Thing, endpoints: dict[str, list[tuple[str, str]]], public_how: str) -> Path:
    found = endpoints.get(thing.resource_id)
    if found:
        return Path(True, "private endpoint " + ", ".join(f"{name} ({group})" for group, name in sorted(found)))
    if thing.public:
        return Path(True, public_how)
    return Path(False, "no: no private endpoint here and public network access off")


def _from_nodes(thing: _Thing, network: str, managed: dict[str, Any],
                endpoints: dict[str, list[tuple[str, str]]]) -> Path:
    if network == "public":
        return _from_internet(thing)
    if network == "private":
        return _from_vnet(thing, endpoints, "public endpoint, out through the NAT gateway")
    mode = managed.get("isolationMode")
    rules = [(name, rule) for name, rule in (managed.get("outboundRules") or {}).items()
             if rule.get("type") == "PrivateEndpoint"
             and str((rule.get("destination") or {}).get("serviceResourceId") or "").lower() == thing.resource_id]
    if rules:
        return Path(True, "managed private endpoint, rule " + ", ".join(
            f"{name} ({rule['destination'].get('subresourceTarget')})" for name, rule in sorted(rules)))
    if thing.target == "workspace" or (thing.azure_managed_rule and (mode == "AllowOnlyApprovedOutbound"
                                                                     or not thing.public)):
        return Path(True, "managed private endpoint Azure adds (a required rule)")
    if mode == "AllowInternetOutbound" and thing.public:
        return Path(True, "public endpoint (internet outbound)")
    return Path(False, "no: no outbound rule to it (approved outbound only)" if mode == "AllowOnlyApprovedOutbound"
                else "no: no outbound rule to it and public network access off")


def _studio(workspace: Reach, storage: Reach, endpoints: dict[str, list[tuple[str, str]]],
            things: list[_Thing]) -> Reach:
    """A browser on studio calls the workspace and reads and writes its storage (blob, file)."""
    paths: dict[str, Path] = {}
    store = next(t for t in things if t.target == "workspace storage")
    for origin in ("internet", "our VNet"):
        if origin not in workspace.paths:
            continue
        both = workspace.paths[origin].reachable and storage.paths[origin].reachable
        if origin == "our VNet" and both:
            groups = {g for g, _ in endpoints.get(store.resource_id, [])}
            missing = {"blob", "file"} - groups
            if missing and not store.public:
                both = False
        how = "yes: the workspace and its storage" if both else "no: needs both the workspace and its storage"
        paths[origin] = Path(both, how)
    return Reach("studio", "ml.azure.com in a browser", paths)


def _ways_in(plan: Any) -> list[str]:
    """The declared seats, in words: Bastion, the jump box and who signs in, the CI runners'
    subnet, a hand-off (config: the gateway is outside this program)."""
    out = []
    names = {r.type: physical_name(r.type, r.inputs, r.name) for r in plan.resources if r.custom}
    if BASTION in names:
        out.append(f"Azure Bastion {names[BASTION]} (the only public IP; SSH to the jump box subnet only)")
    if VM in names:
        logins = {r.inputs.get("principalId") for r in plan.of_type(ROLE) if r.name.startswith("way-in-access-")}
        out.append(f"jump box {names[VM]} (no public IP; Entra ID sign-in for {len(logins)} principal(s) in "
                   "jumpBox.logins, and the admin's break-glass key)")
    for subnet in plan.of_type(SUBNET):
        if subnet.inputs.get("subnetName") == "ci-runners":
            out.append(f"CI runners subnet {subnet.inputs.get('addressPrefix')} (self-hosted runners, registered "
                       "outside Pulumi)")
    way_in = plan.config.network.way_in
    if way_in is not None and way_in.hand_off is not None:
        out.append(f"{way_in.hand_off.via} hand-off from {', '.join(way_in.hand_off.address_prefixes)} (managed outside "
                   "this program; needs DNS forwarding for the privatelink zones)")
    if plan.config.network.isolation == "public":
        out.append("none needed: public network access, Entra ID sign-in from anywhere")
    return out or ["NONE: nobody can reach this stack's private endpoints"]
