"""Pulumi's mock runtime, recording what the program declares.

`RecordingMonitor` keeps every RegisterResource request - type, name, parent, inputs and
the options the engine would see (protect, retainOnDelete, replaceOnChanges,
ignoreChanges, deleteBeforeReplace, dependencies) plus which inputs are secrets, whose
values are never kept. Inputs are stored canonically (keys sorted) so the same program
gives the same plan byte for byte. `PlanMocks` answers like Azure would in shape (ARM
ids, endpoints, identity ids) but with synthetic values: the plan is the desired state,
not Azure's answer.

Pulumi surfaces used: `pulumi.runtime.mocks.Mocks` / `MockMonitor` (the monitor
`set_mocks(monitor=...)` takes), the RegisterResource/ReadResource request fields of
Pulumi's resource protocol, and `pulumi.runtime.rpc`'s `deserialize_properties` and
`is_rpc_secret`. tests/test_plan_sdk.py holds them to the pinned SDK.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime import mocks, rpc

FAKE_SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"
FAKE_TENANT = "00000000-0000-0000-0000-0000000000aa"
SECRET_PLACEHOLDER = "[secret]"
"""What a secret input's value is recorded as: the plan shows that it is set, never what."""


@dataclass
class RecordedResource:
    urn: str
    type: str
    name: str
    parent: str | None
    custom: bool
    inputs: dict[str, Any]
    protect: bool
    retain_on_delete: bool
    delete_before_replace: bool
    replace_on_changes: list[str]
    depends_on: list[str]
    secret_inputs: list[str] = field(default_factory=list)
    ignore_changes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "urn": self.urn,
            "type": self.type,
            "name": self.name,
            "parent": self.parent,
            "custom": self.custom,
            "inputs": self.inputs,
            "options": {
                "protect": self.protect,
                "retainOnDelete": self.retain_on_delete,
                "deleteBeforeReplace": self.delete_before_replace,
                "replaceOnChanges": sorted(self.replace_on_changes),
                "ignoreChanges": sorted(self.ignore_changes),
                "dependsOn": sorted(self.depends_on),
            },
            "secretInputs": list(self.secret_inputs),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RecordedResource:
        """The inverse of `to_json` (a saved `plan --json` document's resource)."""
        options = doc.get("options") or {}
        return cls(
            urn=doc["urn"], type=doc["type"], name=doc["name"], parent=doc.get("parent"),
            custom=bool(doc.get("custom")), inputs=doc.get("inputs") or {},
            protect=bool(options.get("protect")), retain_on_delete=bool(options.get("retainOnDelete")),
            delete_before_replace=bool(options.get("deleteBeforeReplace")),
            replace_on_changes=list(options.get("replaceOnChanges") or []),
            depends_on=list(options.get("dependsOn") or []),
            secret_inputs=list(doc.get("secretInputs") or []),
            ignore_changes=list(options.get("ignoreChanges") or []),
        )


def _plain(value: Any) -> Any:
    """JSON-safe, key-sorted copy of deserialized inputs (resource references by class)."""
    if isinstance(value, dict):
        return {k: _plain(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, pulumi.Resource):
        return f"<resource {type(value).__name__}>"
    if isinstance(value, float) and value.is_integer():
        return int(value)  # the wire has only doubles; Azure's counts and days are integers
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class RecordingMonitor(mocks.MockMonitor):
    def __init__(self, mocks_impl: mocks.Mocks):
        super().__init__(mocks_impl)
        self.recorded: list[RecordedResource] = []

    def RegisterResource(self, request):  # noqa: N802 - gRPC method name
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            return response
        inputs, secret = _inputs_and_secrets(request.object)
        self.recorded.append(RecordedResource(
            urn=response.urn,
            type=request.type,
            name=request.name,
            parent=request.parent or None,
            custom=bool(request.custom),
            inputs=inputs,
            protect=bool(request.protect),
            retain_on_delete=bool(request.retainOnDelete),
            delete_before_replace=bool(request.deleteBeforeReplace),
            replace_on_changes=sorted(request.replaceOnChanges),
            depends_on=sorted(set(request.dependencies)),
            secret_inputs=secret,
            ignore_changes=sorted(request.ignoreChanges),
        ))
        return response

    def ReadResource(self, request):  # noqa: N802 - gRPC method name
        """Reads of existing resources (`Resource.get`): recorded with custom=False inputs."""
        response = super().ReadResource(request)
        self.recorded.append(RecordedResource(
            urn=response.urn, type=request.type, name=request.name, parent=request.parent or None,
            custom=False, inputs=_inputs_and_secrets(request.properties)[0],
            protect=False, retain_on_delete=False, delete_before_replace=False,
            replace_on_changes=[], depends_on=sorted(set(request.dependencies)),
        ))
        return response


def _inputs_and_secrets(struct) -> tuple[dict[str, Any], list[str]]:
    """Deserialized inputs with secret values replaced, and the names of the secret ones.

    The SDK marks a top-level input secret when any value inside it is (rpc's
    deserialization lifts secretness to the top), so one check per input suffices."""
    raw = dict(rpc.deserialize_properties(struct)) if struct else {}
    secret = sorted(k for k, v in raw.items() if rpc.is_rpc_secret(v))
    return _plain({k: SECRET_PLACEHOLDER if k in secret else v for k, v in raw.items()}), secret


# type token -> (ARM provider path, name input, parent name inputs...) for synthetic ids
_ARM: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "azure-native:storage:StorageAccount": ("Microsoft.Storage/storageAccounts/{name}", "accountName", ()),
    "azure-native:storage:BlobServiceProperties": ("Microsoft.Storage/storageAccounts/{accountName}/blobServices/default", "blobServicesName", ("accountName",)),
    "azure-native:storage:BlobContainer": ("Microsoft.Storage/storageAccounts/{accountName}/blobServices/default/containers/{name}", "containerName", ("accountName",)),
    "azure-native:keyvault:Vault": ("Microsoft.KeyVault/vaults/{name}", "vaultName", ()),
    "azure-native:keyvault:Key": ("Microsoft.KeyVault/vaults/{vaultName}/keys/{name}", "keyName", ("vaultName",)),
    "azure-native:network:BastionHost": ("Microsoft.Network/bastionHosts/{name}", "bastionHostName", ()),
    "azure-native:network:NetworkInterface": ("Microsoft.Network/networkInterfaces/{name}", "networkInterfaceName", ()),
    "azure-native:compute:VirtualMachine": ("Microsoft.Compute/virtualMachines/{name}", "vmName", ()),
    "azure-native:compute:VirtualMachineExtension": ("Microsoft.Compute/virtualMachines/{vmName}/extensions/{name}", "vmExtensionName", ("vmName",)),
    "azure-native:operationalinsights:Workspace": ("Microsoft.OperationalInsights/workspaces/{name}", "workspaceName", ()),
    "azure-native:applicationinsights:Component": ("Microsoft.Insights/components/{name}", "resourceName", ()),
    "azure-native:containerregistry:Registry": ("Microsoft.ContainerRegistry/registries/{name}", "registryName", ()),
    "azure-native:managedidentity:UserAssignedIdentity": ("Microsoft.ManagedIdentity/userAssignedIdentities/{name}", "resourceName", ()),
    "azure-native:managedidentity:FederatedIdentityCredential": ("Microsoft.ManagedIdentity/userAssignedIdentities/{resourceName}/federatedIdentityCredentials/{name}", "federatedIdentityCredentialResourceName", ("resourceName",)),
    "azure-native:machinelearningservices:Workspace": ("Microsoft.MachineLearningServices/workspaces/{name}", "workspaceName", ()),
    "azure-native:machinelearningservices:Compute": ("Microsoft.MachineLearningServices/workspaces/{workspaceName}/computes/{name}", "computeName", ("workspaceName",)),
    "azure-native:machinelearningservices:Datastore": ("Microsoft.MachineLearningServices/workspaces/{workspaceName}/datastores/{name}", "name", ("workspaceName",)),
    "azure-native:machinelearningservices:EnvironmentContainer": ("Microsoft.MachineLearningServices/workspaces/{workspaceName}/environments/{name}", "name", ("workspaceName",)),
    "azure-native:machinelearningservices:EnvironmentVersion": ("Microsoft.MachineLearningServices/workspaces/{workspaceName}/environments/{name}/versions/{version}", "name", ("workspaceName", "version")),
    "azure-native:machinelearningservices:Registry": ("Microsoft.MachineLearningServices/registries/{name}", "registryName", ()),
    "azure-native:network:VirtualNetwork": ("Microsoft.Network/virtualNetworks/{name}", "virtualNetworkName", ()),
    "azure-native:network:Subnet": ("Microsoft.Network/virtualNetworks/{virtualNetworkName}/subnets/{name}", "subnetName", ("virtualNetworkName",)),
    "azure-native:network:NetworkSecurityGroup": ("Microsoft.Network/networkSecurityGroups/{name}", "networkSecurityGroupName", ()),
    "azure-native:network:PublicIPAddress": ("Microsoft.Network/publicIPAddresses/{name}", "publicIpAddressName", ()),
    "azure-native:network:NatGateway": ("Microsoft.Network/natGateways/{name}", "natGatewayName", ()),
    "azure-native:network:PrivateEndpoint": ("Microsoft.Network/privateEndpoints/{name}", "privateEndpointName", ()),
    "azure-native:network:PrivateDnsZoneGroup": ("Microsoft.Network/privateEndpoints/{privateEndpointName}/privateDnsZoneGroups/{name}", "privateDnsZoneGroupName", ("privateEndpointName",)),
    "azure-native:privatedns:PrivateZone": ("Microsoft.Network/privateDnsZones/{name}", "privateZoneName", ()),
    "azure-native:privatedns:VirtualNetworkLink": ("Microsoft.Network/privateDnsZones/{privateZoneName}/virtualNetworkLinks/{name}", "virtualNetworkLinkName", ("privateZoneName",)),
}


def id_inputs(type_token: str) -> tuple[str, ...]:
    """The inputs that make up a resource's Azure id (its URL path parameters): azure-native
    replaces the resource when one of them changes (pulumi-azure-native,
    provider/pkg/provider/diff.go: "All the parameters that are part of the resource path
    cause a replacement")."""
    if type_token == "azure-native:resources:ResourceGroup":
        return ("resourceGroupName",)
    if type_token == "azure-native:authorization:RoleAssignment":
        return ("scope", "roleAssignmentName")
    if type_token == "azure-native:consumption:Budget":
        return ("scope", "budgetName")
    if type_token == "azure-native:authorization:RoleDefinition":
        return ("scope", "roleDefinitionId")
    arm = _ARM.get(type_token)
    if arm is None:
        return ("resourceGroupName",) if type_token.startswith("azure-native:") else ()
    return ("resourceGroupName", *arm[2], arm[1])


def qualified_name(type_token: str, inputs: dict[str, Any], logical: str) -> str:
    """The physical name with the names of its Azure parents (`account/container`,
    `zone/link`, `workspace/cluster`, `workspace/environment:version`), so children of
    different parents never look alike."""
    name = physical_name(type_token, inputs, logical)
    arm = _ARM.get(type_token)
    if arm is None:
        return name
    parents = [str(inputs[p]) for p in arm[2] if p != "version" and inputs.get(p)]
    version = f":{inputs['version']}" if "version" in arm[2] and inputs.get("version") else ""
    return "/".join([*parents, name]) + version


def _stable_uuid(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "/".join(parts)))


def planned_principal(type_token: str, name: str, system_assigned: bool) -> str:
    """The stand-in principal id the offline plan gives an identity (`name` its physical
    name): a user-assigned identity's own, or a resource's system-assigned one. Azure's
    are random; amlhpc.infra.adopt maps these back to the identity to read the real one."""
    return _stable_uuid("principal", type_token, name) if system_assigned else _stable_uuid("principal", name)


def physical_name(type_token: str, inputs: dict[str, Any], logical: str) -> str:
    """The Azure name a resource gets (its name input), or the logical name."""
    if type_token == "azure-native:resources:ResourceGroup":
        return inputs.get("resourceGroupName") or logical
    if type_token == "azure-native:consumption:Budget":
        return inputs.get("budgetName") or logical
    arm = _ARM.get(type_token)
    if arm and inputs.get(arm[1]):
        return str(inputs[arm[1]])
    return logical


class PlanMocks(mocks.Mocks):
    """Synthetic, Azure-shaped answers for the program's resources and invokes."""

    def __init__(self, subscription_id: str = FAKE_SUBSCRIPTION):
        self.subscription_id = subscription_id

    def call(self, args: mocks.MockCallArgs):
        if args.token == "azure-native:authorization:getClientConfig":
            return {"subscriptionId": self.subscription_id, "tenantId": FAKE_TENANT,
                    "clientId": _stable_uuid("client"), "objectId": _stable_uuid("object")}, []
        return {}, []

    def new_resource(self, args: mocks.MockResourceArgs):
        inputs = dict(args.inputs)
        if not args.custom:
            return f"{args.name}-id", inputs
        return self._arm_id(args.typ, inputs, args.name), {**inputs, **self._computed(args.typ, inputs, args.name)}

    def _arm_id(self, type_token: str, inputs: dict[str, Any], logical: str) -> str:
        name = physical_name(type_token, inputs, logical)
        if type_token == "azure-native:resources:ResourceGroup":
            return f"/subscriptions/{self.subscription_id}/resourceGroups/{name}"
        if type_token == "azure-native:authorization:RoleAssignment":
            guid = inputs.get("roleAssignmentName") or _stable_uuid(logical)
            return f"{inputs.get('scope')}/providers/Microsoft.Authorization/roleAssignments/{guid}"
        if type_token == "azure-native:consumption:Budget":
            return f"{inputs.get('scope')}/providers/Microsoft.Consumption/budgets/{name}"
        if type_token == "azure-native:authorization:RoleDefinition":
            return f"{inputs.get('scope')}/providers/Microsoft.Authorization/roleDefinitions/{inputs.get('roleDefinitionId')}"
        # Extension resources live under the resource they watch or lock.
        if type_token == "azure-native:monitor:DiagnosticSetting":
            return f"{inputs.get('resourceUri')}/providers/Microsoft.Insights/diagnosticSettings/{inputs.get('name') or logical}"
        if type_token == "azure-native:authorization:ManagementLockByScope":
            return f"{inputs.get('scope')}/providers/Microsoft.Authorization/locks/{inputs.get('lockName') or logical}"
        arm = _ARM.get(type_token)
        group = inputs.get("resourceGroupName", "unknown-group")
        prefix = f"/subscriptions/{self.subscription_id}/resourceGroups/{group}/providers/"
        if arm is None:
            return prefix + f"{type_token.split(':')[1]}/{logical}"
        fields = {key: inputs.get(key, "x") for key in arm[2]}
        return prefix + arm[0].format(name=name, **fields)

    def _computed(self, type_token: str, inputs: dict[str, Any], logical: str) -> dict[str, Any]:
        name = physical_name(type_token, inputs, logical)
        out: dict[str, Any] = {"name": name}
        identity = inputs.get("identity")
        if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
            # Azure answers a list of identity ids with a map keyed by id.
            out["identity"] = {**identity, "userAssignedIdentities": {
                uid: {"clientId": _stable_uuid("client", uid), "principalId": _stable_uuid("principal", uid)}
                for uid in identity["userAssignedIdentities"]}}
        if isinstance(identity, dict) and "SystemAssigned" in str(identity.get("type", "")):
            # Azure fills in the system-assigned identity's principal (role grants use it).
            out["identity"] = {**out.get("identity", identity), "principalId": planned_principal(type_token, name, True),
                               "tenantId": FAKE_TENANT}
        if type_token == "azure-native:storage:StorageAccount":
            out["primaryEndpoints"] = {"blob": f"https://{name}.blob.core.windows.net/",
                                       "file": f"https://{name}.file.core.windows.net/"}
        elif type_token == "azure-native:containerregistry:Registry":
            out["loginServer"] = f"{name.lower()}.azurecr.io"
        elif type_token == "azure-native:managedidentity:UserAssignedIdentity":
            out["clientId"] = _stable_uuid("client", name)
            out["principalId"] = planned_principal(type_token, name, False)
            out["tenantId"] = FAKE_TENANT
        elif type_token == "azure-native:keyvault:Key":
            # Azure answers with the key's URL and its first version's URL.
            key_uri = f"https://{inputs.get('vaultName', 'vault')}.vault.azure.net/keys/{name}"
            out["keyUri"] = key_uri
            out["keyUriWithVersion"] = f"{key_uri}/{uuid.uuid5(uuid.NAMESPACE_URL, key_uri).hex}"
        elif type_token == "azure-native:machinelearningservices:Workspace":
            out["discoveryUrl"] = f"https://{inputs.get('location', 'region')}.api.azureml.ms/discovery"
        elif type_token == "azure-native:machinelearningservices:Registry":
            out["regionDetails"] = self._registry_region_details(inputs, name)
        return out

    def _registry_region_details(self, inputs: dict[str, Any], name: str) -> list[dict[str, Any]]:
        """Each region with the ids of what Azure ML creates for it in the registry's managed
        resource group: a storage account per region, one container registry for all
        (geo-replicated). Synthetic names; Azure's are its own."""
        group = f"azureml-rg-{name}_{_stable_uuid('registry', name)}"
        prefix = f"/subscriptions/{self.subscription_id}/resourceGroups/{group}/providers"
        token = "".join(c for c in name.lower() if c.isalnum())[:12]
        out = []
        for i, region in enumerate(inputs.get("regionDetails") or []):
            details = {**region}
            details["acrDetails"] = [{**acr, "systemCreatedAcrAccount": {
                **(acr.get("systemCreatedAcrAccount") or {}), "acrAccountName": f"{token}acr",
                "armResourceId": {"resourceId": f"{prefix}/Microsoft.ContainerRegistry/registries/{token}acr"}}}
                for acr in region.get("acrDetails") or []]
            details["storageAccountDetails"] = [{**account, "systemCreatedStorageAccount": {
                **(account.get("systemCreatedStorageAccount") or {}), "storageAccountName": f"{token}st{i}",
                "armResourceId": {"resourceId": f"{prefix}/Microsoft.Storage/storageAccounts/{token}st{i}"}}}
                for account in region.get("storageAccountDetails") or []]
            out.append(details)
        return out
