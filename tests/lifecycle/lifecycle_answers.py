"""What Azure answers to a GET, type by type, beyond echoing the request: the server-side
part of the lifecycle emulator's responses, built from the example responses of
Azure/azure-rest-api-specs recorded in tests/reference/azure-rest-api-specs (SOURCES.md).

Answers are in azure-native's SDK shape (the `properties` container flattened where the
Pulumi resource flattens it), since the emulated provider hands them to the engine as
outputs and, on import, turns them into inputs (azure-native `ResponseToSdkInputs`,
lifecycle_engine.response_to_inputs). Each rule names the example field it stands for
(`EXAMPLE_FIELDS`: the test holds every one to the recorded file):

- Server-assigned identities: a user-assigned identity's principalId, clientId and
  tenantId, and a system-assigned identity's principalId and tenantId, are new random
  GUIDs each time the resource is created (Entra issues a new service principal per
  identity); Azure returns the map of user-assigned identities with each one's ids.
- Read-only properties (provisioningState, creationTime, a workspace's discoveryUrl and
  serviceProvisionedResourceGroup, a registry's managed resource group...).
- Server defaults the request left out: a workspace reports hbiWorkspace false; a storage
  account reports isHnsEnabled false for a new non-HNS account (pulumi-azure-native issue
  #2003: accounts created since the property exists report it).
- Ids in Azure's casing: a workspace returns its Application Insights id with the
  provider namespace `microsoft.insights` (the workspace example); Azure ML returns
  referenced ids as it stores them, not as sent.
- System-added items: a managed network reports the rules Azure adds itself (category
  Required, status Active or Inactive, like the example's), which the request never holds.
- What every answer carries (ARM's resource envelope, as in every example): `id`, `name`
  and `type` (the resource type of the id), the location in Azure's normalised form
  (lower case, no spaces: "East US" is answered "eastus") and, for a type whose model has one,
  provisioningState "Succeeded" where that model puts it (flattened at the top, or inside
  `properties`).
- Secrets are never echoed: a VM's osProfile.adminPassword is sent and not returned
  (`WRITE_ONLY`, held to the password example).
- Server-filled fields of the Key, the Key Vault and the VM, each what the create example's
  answer adds to its request (`SERVER_FILLED`): a Key's attributes (enabled true, created,
  updated, recoveryLevel), keyOps, keySize 2048, keyUri and keyUriWithVersion, and the vault's
  location; a Vault's vaultUri, provisioningState and tags; a VM's vmId, osProfile.secrets,
  storageProfile.osDisk.osType and storageProfile.dataDisks.
- An identity turned on by an update gets its principal then (on_update), as on a create;
  turned off, it loses it.

Read-back (`writable`) keeps what azure-native's ResponseToSdkInputs keeps: the properties of
the type's PUT body, walked with the Azure SDK model the conformance suite reads
(tests/conformance/conformance_rows.py), read-only ones left out at every depth, plus the
resource path's parameters.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amlhpc.infra.plan.mocks import id_inputs
from tests.conformance import conformance_reference as conformance
from tests.conformance.conformance_rows import ROWS

REFERENCE = Path(__file__).resolve().parent.parent / "reference" / "azure-rest-api-specs"

UAI = "azure-native:managedidentity:UserAssignedIdentity"
WORKSPACE = "azure-native:machinelearningservices:Workspace"
ML_REGISTRY = "azure-native:machinelearningservices:Registry"
ACCOUNT = "azure-native:storage:StorageAccount"
ROLE = "azure-native:authorization:RoleAssignment"
KEY = "azure-native:keyvault:Key"
VAULT = "azure-native:keyvault:Vault"
VM = "azure-native:compute:VirtualMachine"

EXAMPLE_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    UAI: ("msi/IdentityGet.json", ("properties.principalId", "properties.clientId", "properties.tenantId")),
    WORKSPACE: ("machinelearningservices/Workspace_get.json", (
        "identity.principalId", "identity.tenantId", "identity.userAssignedIdentities",
        "properties.hbiWorkspace", "properties.discoveryUrl", "properties.serviceProvisionedResourceGroup",
        "properties.applicationInsights", "properties.managedNetwork.outboundRules",
        "properties.managedNetwork.networkId", "properties.managedNetwork.status")),
    ML_REGISTRY: ("machinelearningservices/Registries_get.json", (
        "identity.principalId", "properties.managedResourceGroup.resourceId", "properties.discoveryUrl",
        "properties.regionDetails")),
    ACCOUNT: ("storage/StorageAccountGetProperties.json", (
        "properties.isHnsEnabled", "properties.creationTime", "properties.provisioningState",
        "properties.primaryEndpoints")),
    ROLE: ("authorization/RoleAssignments_ListForScope.json", ("value",)),
    KEY: ("keyvault/createKey.json", (
        "location", "properties.attributes.enabled", "properties.attributes.created", "properties.attributes.updated",
        "properties.attributes.recoveryLevel", "properties.keyOps", "properties.keySize", "properties.keyUri",
        "properties.keyUriWithVersion")),
    VAULT: ("keyvault/getVault.json", ("properties.vaultUri", "properties.provisioningState", "tags")),
    VM: ("compute/VirtualMachine_Create_WithSshAuthentication.json", (
        "properties.vmId", "properties.osProfile.secrets", "properties.storageProfile.osDisk.osType",
        "properties.storageProfile.dataDisks", "properties.provisioningState")),
}
"""type -> (recorded example, the wire paths of it the answers below reproduce)."""

READ_ONLY: dict[str, frozenset[str]] = {
    UAI: frozenset({"principalId", "clientId", "tenantId"}),
    WORKSPACE: frozenset({"discoveryUrl", "serviceProvisionedResourceGroup", "provisioningState", "workspaceId",
                          "mlFlowTrackingUri", "privateEndpointConnections", "notebookInfo"}),
    ML_REGISTRY: frozenset({"managedResourceGroup", "discoveryUrl", "mlFlowRegistryUri",
                            "registryPrivateEndpointConnections"}),
    ACCOUNT: frozenset({"creationTime", "provisioningState", "primaryEndpoints", "primaryLocation",
                        "statusOfPrimary"}),
}
"""Top-level SDK properties Azure sets and a request may not (readOnly in the specification):
azure-native leaves them out of inputs on import. Nested read-only fields are listed in
NESTED_READ_ONLY."""

SERVER_FILLED: dict[str, tuple[str, ...]] = {
    KEY: ("location", "properties.attributes.enabled", "properties.attributes.created", "properties.attributes.updated",
          "properties.attributes.recoveryLevel", "properties.keyOps", "properties.keySize", "properties.keyUri",
          "properties.keyUriWithVersion"),
    VAULT: ("properties.vaultUri", "tags"),
    VM: ("vmId", "osProfile.secrets", "storageProfile.osDisk.osType", "storageProfile.dataDisks"),
}
"""The SDK-shape paths a GET answers that the request did not send, per type: what the create
example's answer adds to its request (tests hold each to the example)."""

WRITE_ONLY: dict[str, tuple[tuple[str, str], ...]] = {
    VM: (("osProfile.adminPassword", "compute/VirtualMachine_Create_WithPasswordAuthentication.json"),),
}
"""SDK-shape paths sent and never answered (secrets), with the example that shows it: the request
holds the path, the answer does not."""

NESTED_READ_ONLY: dict[str, tuple[str, ...]] = {
    "identity": ("principalId", "tenantId"),
    "managedNetwork": ("networkId", "status"),
}


def example(type_token: str) -> dict[str, Any]:
    """The recorded example response body of a type."""
    path, _ = EXAMPLE_FIELDS[type_token]
    document = json.loads((REFERENCE / path).read_text())
    return document["responses"]["200"]["body"]


def wire_path(body: dict[str, Any], dotted: str) -> Any:
    value: Any = body
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(dotted)
        value = value[part]
    return value


def new_guid() -> str:
    return str(uuid.uuid4())


def on_create(type_token: str, body: dict[str, Any], tenant: str) -> dict[str, Any]:
    """What Azure assigns once, when the resource is created (kept across updates)."""
    server: dict[str, Any] = {}
    if type_token == UAI:
        server.update(principalId=new_guid(), clientId=new_guid(), tenantId=tenant)
    identity = body.get("identity")
    if isinstance(identity, dict) and "SystemAssigned" in str(identity.get("type", "")):
        server["identity"] = {"principalId": new_guid(), "tenantId": tenant}
    if type_token == WORKSPACE:
        server["workspaceId"] = new_guid()
    if type_token == ML_REGISTRY:
        server["registryGuid"] = new_guid()
    if type_token == KEY:
        server["keyVersion"] = uuid.uuid4().hex
        server["created"] = 1795424400  # 2026-11-23T09:00:00Z, the emulator's clock
    if type_token == VM:
        server["vmId"] = new_guid()
    return server


def on_update(type_token: str, body: dict[str, Any], server: dict[str, Any], tenant: str) -> dict[str, Any]:
    """What Azure assigns on an update: a system-assigned identity turned on now gets its
    principal (Entra creates the service principal then); turned off, it is gone. Everything
    else assigned at creation stays."""
    out = copy.deepcopy(server)
    identity = body.get("identity")
    system = isinstance(identity, dict) and "SystemAssigned" in str(identity.get("type", ""))
    if system and "identity" not in out:
        out["identity"] = {"principalId": new_guid(), "tenantId": tenant}
    elif not system:
        out.pop("identity", None)
    return out


def arm_type(arm_id: str) -> str:
    """The resource type of an ARM id, as the `type` of its answer: the namespace of the last
    provider segment and each type name after it (Microsoft.KeyVault/vaults/keys)."""
    parts = arm_id.strip("/").split("/")
    lowered = [p.lower() for p in parts]
    if "providers" not in lowered:
        return "Microsoft.Resources/resourceGroups" if "resourcegroups" in lowered else "Microsoft.Resources/subscriptions"
    at = len(lowered) - 1 - lowered[::-1].index("providers")
    rest = parts[at + 1:]
    return "/".join([rest[0], *rest[1::2]])


def normalized_location(value: Any) -> Any:
    """Azure's form of a location: "East US" -> "eastus"."""
    return value.replace(" ", "").lower() if isinstance(value, str) else value


def _model(type_token: str) -> type | None:
    row = ROWS.get(type_token)
    return conformance.resolve(row.model) if row else None


def _provisioning_state(type_token: str, out: dict[str, Any]) -> None:
    """provisioningState "Succeeded" where the type's model has it: flattened at the top, or
    inside a `properties` object."""
    model = _model(type_token)
    if model is None:
        return
    fields = conformance.model_spec(model).fields
    if "provisioningstate" in fields:
        out["provisioningState"] = "Succeeded"
        return
    container = fields.get("properties")
    if container is not None and container.kind == "model" and isinstance(out.get("properties", {}), dict):
        inner = container.target
        if "provisioningstate" in conformance.model_spec(inner).fields or any(
                "provisioningstate" in conformance.model_spec(sub).fields
                for sub in conformance.model_spec(inner).subtypes.values()):
            out.setdefault("properties", {})["provisioningState"] = "Succeeded"


def _pop(value: dict[str, Any], dotted: str) -> None:
    *head, last = dotted.split(".")
    for part in head:
        value = value.get(part) if isinstance(value, dict) else None
        if not isinstance(value, dict):
            return
    value.pop(last, None)


def _key_answer(out: dict[str, Any], arm_id: str, server: dict[str, Any],
                lookup: Callable[[str], dict[str, Any] | None]) -> None:
    """A Key as createKey.json answers a request of {kty: RSA}: attributes, keyOps, keySize,
    the key's URIs, and the vault's location."""
    vault_id, _, name = arm_id.partition("/keys/")
    vault = lookup(vault_id) or {}
    vault_name = vault_id.rsplit("/", 1)[-1]
    props = out.setdefault("properties", {})
    attributes = props.setdefault("attributes", {})
    attributes.setdefault("enabled", True)
    attributes["created"] = attributes["updated"] = server.get("created", 0)
    protected = (vault.get("properties") or {}).get("enablePurgeProtection")
    attributes["recoveryLevel"] = "Recoverable" if protected else "Recoverable+Purgeable"
    if str(props.get("kty", "")).startswith("RSA"):
        props.setdefault("keyOps", ["encrypt", "decrypt", "sign", "verify", "wrapKey", "unwrapKey"])
        props.setdefault("keySize", 2048)
    uri = f"https://{vault_name}.vault.azure.net:443/keys/{name}"
    props["keyUri"] = uri
    props["keyUriWithVersion"] = f"{uri}/{server.get('keyVersion', '')}"
    if vault.get("location"):
        out["location"] = vault["location"]


def _vm_answer(out: dict[str, Any], server: dict[str, Any]) -> None:
    """A VM as VirtualMachine_Create_WithSshAuthentication.json answers its request."""
    out["vmId"] = server.get("vmId")
    profile = out.get("osProfile")
    if isinstance(profile, dict):
        profile.setdefault("secrets", [])
    storage = out.setdefault("storageProfile", {})
    if isinstance(storage, dict):
        linux = isinstance(profile, dict) and "linuxConfiguration" in profile
        if isinstance(storage.get("osDisk"), dict):
            storage["osDisk"].setdefault("osType", "Linux" if linux else "Windows")
        storage.setdefault("dataDisks", [])


def azure_casing(arm_id: str, pattern: str) -> str:
    """`arm_id` with the fixed segments (`providers`, namespaces, types) cased as in
    `pattern`, an id of the same type as Azure writes it in the example."""
    mine, theirs = arm_id.split("/"), pattern.split("/")
    if len(mine) != len(theirs):
        return arm_id
    fixed = {"subscriptions", "resourcegroups", "providers"}
    out = []
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        is_fixed = a.lower() in fixed or (i > 0 and mine[i - 1].lower() == "providers") or (
            i % 2 == 1 and i > 6 and a.lower() == b.lower())
        out.append(b if is_fixed and a.lower() == b.lower() else a)
    return "/".join(out)


def system_outbound_rules(body: dict[str, Any]) -> dict[str, Any]:
    """The rules Azure adds to a managed network itself: private endpoints to the workspace's
    own storage (blob, file), Key Vault and registry, and the service tags its computes
    need (Microsoft Learn, "Managed virtual network isolation", required outbound rules),
    shaped like the example's Required rule."""
    rules: dict[str, Any] = {}
    for target, subresources in ((body.get("storageAccount"), ("blob", "file")), (body.get("keyVault"), ("vault",)),
                                 (body.get("containerRegistry"), ("registry",))):
        for sub in subresources:
            if target:
                name = f"__SYS_PE_{str(target).rsplit('/', 1)[-1]}_{sub}"
                rules[name] = {"type": "PrivateEndpoint", "category": "Required", "status": "Active",
                               "destination": {"serviceResourceId": target, "subresourceTarget": sub,
                                               "sparkEnabled": False}}
    for tag in ("AzureActiveDirectory", "AzureMachineLearning", "BatchNodeManagement", "AzureResourceManager"):
        rules[f"__SYS_ST_{tag}"] = {"type": "ServiceTag", "category": "Required", "status": "Active",
                                    "destination": {"serviceTag": tag, "protocol": "TCP", "portRanges": "443"}}
    return rules


def answer(type_token: str, arm_id: str, body: dict[str, Any], server: dict[str, Any],
           lookup: Callable[[str], dict[str, Any] | None]) -> dict[str, Any]:
    """The GET response (SDK shape) of a resource whose last request was `body`. `lookup`
    answers for other resources (a workspace reports its user-assigned identities' ids)."""
    out = copy.deepcopy(body)
    for key, value in server.items():
        if key == "identity":
            out["identity"] = {**out.get("identity", {}), **value}
        elif key not in ("registryGuid", "keyVersion", "created", "vmId"):
            out[key] = value
    identity = out.get("identity")
    if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
        identity["userAssignedIdentities"] = {
            uid: {k: (lookup(uid) or {}).get(k) for k in ("principalId", "clientId")}
            for uid in identity["userAssignedIdentities"]}
    name = arm_id.rsplit("/", 1)[-1]
    for path, _ in WRITE_ONLY.get(type_token, ()):
        _pop(out, path)
    if type_token == KEY:
        _key_answer(out, arm_id, server, lookup)
    if type_token == VAULT:
        out.setdefault("tags", {})
        out.setdefault("properties", {})["vaultUri"] = f"https://{name}.vault.azure.net"
    if type_token == VM:
        _vm_answer(out, server)
    out["id"] = arm_id
    out.setdefault("name", name)
    out.setdefault("type", arm_type(arm_id))
    if "location" in out:
        out["location"] = normalized_location(out["location"])
    _provisioning_state(type_token, out)
    if type_token == WORKSPACE:
        out.setdefault("hbiWorkspace", False)
        out["discoveryUrl"] = f"https://{out.get('location', 'region')}.api.azureml.ms/discovery"
        out["serviceProvisionedResourceGroup"] = f"{name}_{server.get('workspaceId', '').replace('-', '')[:16]}"
        if out.get("applicationInsights"):
            pattern = wire_path(example(WORKSPACE), "properties.applicationInsights")
            out["applicationInsights"] = azure_casing(str(out["applicationInsights"]), pattern)
        network = out.get("managedNetwork")
        if isinstance(network, dict):
            network["outboundRules"] = {**system_outbound_rules(out), **(network.get("outboundRules") or {})}
            network["networkId"] = server.get("workspaceId")
            network["status"] = {"sparkReady": False, "status": "Active"}
    if type_token == ML_REGISTRY:
        managed = f"azureml-rg-{name}_{server.get('registryGuid', '')}"
        subscription = arm_id.split("/")[2]
        out["managedResourceGroup"] = {"resourceId": f"/subscriptions/{subscription}/resourceGroups/{managed}"}
        out["discoveryUrl"] = f"https://{out.get('location', 'region')}.api.azureml.ms/registrymanagement/v1.0/registries/{name}/discovery"
        out["regionDetails"] = registry_region_details(out, subscription, managed)
    if type_token == ACCOUNT:
        out.setdefault("isHnsEnabled", False)
        out["provisioningState"] = "Succeeded"
        out["creationTime"] = "2026-11-23T09:00:00.0000000Z"
        out["primaryEndpoints"] = {s: f"https://{name}.{s}.core.windows.net/" for s in ("blob", "dfs", "file", "queue")}
    return out


def registry_region_details(registry: dict[str, Any], subscription: str, managed_group: str) -> list[dict[str, Any]]:
    """Each region with the ids of what Azure ML created for it in the registry's managed
    resource group (the example's armResourceId): a storage account per region and a single
    container registry, geo-replicated to every region, reported in each ("Manage Azure
    Machine Learning registries": "Azure blob storage accounts in each supported region ...
    a single Azure Container Registry with replication enabled to each supported region")."""
    out = []
    prefix = f"/subscriptions/{subscription}/resourceGroups/{managed_group}/providers"
    token = re.sub(r"[^a-z0-9]", "", str(registry.get("registryName") or "reg").lower())[:10]
    for i, region in enumerate(registry.get("regionDetails") or []):
        details = copy.deepcopy(region)
        for acr in details.get("acrDetails") or []:
            created = acr.setdefault("systemCreatedAcrAccount", {})
            created["acrAccountName"] = f"{token}acr"
            created["armResourceId"] = {"resourceId": f"{prefix}/Microsoft.ContainerRegistry/registries/{token}acr"}
        for account in details.get("storageAccountDetails") or []:
            created = account.setdefault("systemCreatedStorageAccount", {})
            created["storageAccountName"] = f"{token}st{i}"
            created["armResourceId"] = {"resourceId": f"{prefix}/Microsoft.Storage/storageAccounts/{token}st{i}"}
        out.append(details)
    return out


def _project(value: dict[str, Any], model: type, keep: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The part of `value` that is the writable properties of `model`, at every depth
    (azure-native's ResponseToSdkInputs walks the PUT body's schema the same way)."""
    spec = conformance.model_spec(model)
    if spec.discriminator and spec.subtypes:
        spec = conformance._resolve_polymorphic(spec, value, "", [])  # noqa: SLF001 - the suite's own reader
    out: dict[str, Any] = {}
    for key, inner in value.items():
        if key in keep:
            out[key] = copy.deepcopy(inner)
            continue
        found = spec.fields.get(conformance.norm(key))
        if found is None or found.readonly:
            continue
        nested = found.kind == "model" or found.item_kind == "model"
        if nested and found.kind == "model" and isinstance(inner, dict):
            out[key] = _project(inner, found.target)
        elif nested and found.kind == "list" and isinstance(inner, list):
            out[key] = [_project(i, found.target) if isinstance(i, dict) else copy.deepcopy(i) for i in inner]
        elif nested and found.kind == "dict" and isinstance(inner, dict):
            out[key] = {k: _project(v, found.target) if isinstance(v, dict) else copy.deepcopy(v) for k, v in inner.items()}
        else:
            out[key] = copy.deepcopy(inner)
    return out


def writable(type_token: str, response: dict[str, Any]) -> dict[str, Any]:
    """The response without what Azure sets and a request may not (read-only properties),
    as azure-native's ResponseToSdkInputs keeps only the PUT body's properties."""
    out = {k: copy.deepcopy(v) for k, v in response.items() if k not in READ_ONLY.get(type_token, ()) and k != "id"}
    model = _model(type_token)
    if model is not None:
        out = _project(out, model, frozenset(id_inputs(type_token)) | frozenset(ROWS[type_token].fixed_inputs))
    for key, nested in NESTED_READ_ONLY.items():
        if isinstance(out.get(key), dict):
            out[key] = {k: v for k, v in out[key].items() if k not in nested}
    identity = out.get("identity")
    if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), dict):
        # azure-native's input is the list of ids (a string set); the answer is a map.
        identity["userAssignedIdentities"] = sorted(identity["userAssignedIdentities"])
    if type_token == ML_REGISTRY:
        for region in out.get("regionDetails") or []:
            for acr in region.get("acrDetails") or []:
                for key in ("acrAccountName", "armResourceId"):
                    (acr.get("systemCreatedAcrAccount") or {}).pop(key, None)
            for account in region.get("storageAccountDetails") or []:
                for key in ("storageAccountName", "armResourceId"):
                    (account.get("systemCreatedStorageAccount") or {}).pop(key, None)
    return out
