"""What the offline plan shows of each resource beyond its type and name: the few properties a
reviewer checks, one formatter per resource type (`detail` registers it; a type without one
shows nothing more)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from amlhpc.core.permissions import MODEL
from amlhpc.infra.plan.mocks import RecordedResource

Formatter = Callable[[dict[str, Any]], str]
FORMATTERS: dict[str, Formatter] = {}
"""Resource type token -> its formatter (of the resource's inputs)."""


def detail(type_token: str) -> Callable[[Formatter], Formatter]:
    def register(formatter: Formatter) -> Formatter:
        FORMATTERS[type_token] = formatter
        return formatter

    return register


def details(r: RecordedResource) -> str:
    """The properties that matter for review ("" when the type and name say it all)."""
    formatter = FORMATTERS.get(r.type)
    return formatter(r.inputs) if formatter else ""


def role_name(role_definition_id: str) -> str:
    """A role assignment's role by name (the permission model's), else its GUID."""
    parts = str(role_definition_id or "").split("/")
    subscription = parts[2] if len(parts) > 2 and parts[1].lower() == "subscriptions" else ""
    role = MODEL.role_by_guid(parts[-1], subscription)
    return role.name if role else parts[-1]


def _short_scope(scope: str) -> str:
    parts = str(scope).split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else str(scope)


def _last(resource_id: Any) -> str:
    return str(resource_id or "").rstrip("/").rsplit("/", 1)[-1]


def _on(flag: Any) -> str:
    return "on" if flag else "off"


@detail("azure-native:storage:StorageAccount")
def _storage_storage_account(i: dict[str, Any]) -> str:
    bits = [i.get("kind"), (i.get("sku") or {}).get("name"), i.get("minimumTlsVersion"),
            "https only" if i.get("enableHttpsTrafficOnly") else "HTTP ALLOWED",
            "no public blobs" if i.get("allowBlobPublicAccess") is False else "PUBLIC BLOBS",
            "shared key off" if i.get("allowSharedKeyAccess") is False else "shared key on",
            f"network {i.get('publicNetworkAccess')}"]
    return ", ".join(str(b) for b in bits if b)


@detail("azure-native:machinelearningservices:Compute")
def _machinelearningservices_compute(i: dict[str, Any]) -> str:
    props = (i.get("properties") or {}).get("properties") or {}
    scale = props.get("scaleSettings") or {}
    ssh = "SSH key" if props.get("userAccountCredentials") else "SSH off"
    ip = "public IP" if props.get("enableNodePublicIp") else "no public IP"
    nodes = f"{scale.get('minNodeCount') or 0}-{scale.get('maxNodeCount') or 0}"
    return (f"{props.get('vmSize')} x{nodes} {props.get('vmPriority')}, idle "
            f"{scale.get('nodeIdleTimeBeforeScaleDown')}, {ssh}, {ip}"
            + (", in subnet" if props.get("subnet") else ""))


@detail("azure-native:keyvault:Vault")
def _keyvault_vault(i: dict[str, Any]) -> str:
    p = i.get("properties") or {}
    return (f"RBAC {_on(p.get('enableRbacAuthorization'))}, purge protection "
            f"{_on(p.get('enablePurgeProtection'))}, network {p.get('publicNetworkAccess')}")


@detail("azure-native:containerregistry:Registry")
def _containerregistry_registry(i: dict[str, Any]) -> str:
    return (f"{(i.get('sku') or {}).get('name')}, admin user "
            f"{'ON' if i.get('adminUserEnabled') else 'off'}, network {i.get('publicNetworkAccess')}")


@detail("azure-native:machinelearningservices:Workspace")
def _machinelearningservices_workspace(i: dict[str, Any]) -> str:
    return f"network {i.get('publicNetworkAccess')}, identity {(i.get('identity') or {}).get('type')}"


@detail("azure-native:machinelearningservices:Registry")
def _machinelearningservices_registry(i: dict[str, Any]) -> str:
    regions = ", ".join(str(d.get("location")) for d in i.get("regionDetails") or [])
    return f"regions {regions}, network {i.get('publicNetworkAccess')}"


@detail("azure-native:authorization:RoleAssignment")
def _authorization_role_assignment(i: dict[str, Any]) -> str:
    condition = ", with a condition" if i.get("condition") else ""
    return (f"{role_name(str(i.get('roleDefinitionId') or ''))} on {_short_scope(i.get('scope', ''))} "
            f"({i.get('principalType')}{condition})")


@detail("azure-native:consumption:Budget")
def _consumption_budget(i: dict[str, Any]) -> str:
    notes = i.get("notifications") or {}
    return f"${i.get('amount') or 0:,.0f}/month, alerts at {', '.join(sorted(notes))}"


@detail("azure-native:machinelearningservices:Datastore")
def _machinelearningservices_datastore(i: dict[str, Any]) -> str:
    p = i.get("properties") or {}
    return (f"{p.get('accountName')}/{p.get('containerName')}, credentials "
            f"{(p.get('credentials') or {}).get('credentialsType')}")


@detail("azure-native:machinelearningservices:EnvironmentVersion")
def _machinelearningservices_environment_version(i: dict[str, Any]) -> str:
    return str((i.get("properties") or {}).get("image", ""))


@detail("azure-native:storage:BlobContainer")
def _storage_blob_container(i: dict[str, Any]) -> str:
    return f"public access {i.get('publicAccess')}"


@detail("azure-native:storage:BlobServiceProperties")
def _storage_blob_service_properties(i: dict[str, Any]) -> str:
    blobs = i.get("deleteRetentionPolicy") or {}
    containers = i.get("containerDeleteRetentionPolicy") or {}
    return (f"soft delete: blobs {blobs.get('days') if blobs.get('enabled') else 'off'} days, "
            f"containers {containers.get('days') if containers.get('enabled') else 'off'} days")


@detail("azure-native:network:VirtualNetwork")
def _network_virtual_network(i: dict[str, Any]) -> str:
    return ", ".join((i.get("addressSpace") or {}).get("addressPrefixes") or [])


@detail("azure-native:network:Subnet")
def _network_subnet(i: dict[str, Any]) -> str:
    nsg = _last((i.get("networkSecurityGroup") or {}).get("id"))
    nat = _last((i.get("natGateway") or {}).get("id"))
    return ", ".join(b for b in (str(i.get("addressPrefix")), nsg and f"NSG {nsg}", nat and f"NAT {nat}") if b)


@detail("azure-native:network:NetworkSecurityGroup")
def _network_network_security_group(i: dict[str, Any]) -> str:
    rules = i.get("securityRules") or []
    return "rules: " + ", ".join(f"{x.get('name')} ({x.get('access')} {x.get('direction')})" for x in rules)


@detail("azure-native:network:PublicIPAddress")
def _network_public_ip_address(i: dict[str, Any]) -> str:
    return f"{(i.get('sku') or {}).get('name')}, {i.get('publicIPAllocationMethod')}"


@detail("azure-native:network:NatGateway")
def _network_nat_gateway(i: dict[str, Any]) -> str:
    return f"{(i.get('sku') or {}).get('name')}, {len(i.get('publicIpAddresses') or [])} public IP"


@detail("azure-native:network:PrivateEndpoint")
def _network_private_endpoint(i: dict[str, Any]) -> str:
    conns = i.get("privateLinkServiceConnections") or [{}]
    target = _last(conns[0].get("privateLinkServiceId"))
    return f"{','.join(conns[0].get('groupIds') or [])} of {target}"


@detail("azure-native:network:PrivateDnsZoneGroup")
def _network_private_dns_zone_group(i: dict[str, Any]) -> str:
    return "zones: " + ", ".join(_last(z.get("privateDnsZoneId")) for z in i.get("privateDnsZoneConfigs") or [])


@detail("azure-native:privatedns:VirtualNetworkLink")
def _privatedns_virtual_network_link(i: dict[str, Any]) -> str:
    return (f"to {_last((i.get('virtualNetwork') or {}).get('id'))}, auto-registration "
            f"{_on(i.get('registrationEnabled'))}")


@detail("azure-native:operationalinsights:Workspace")
def _operationalinsights_workspace(i: dict[str, Any]) -> str:
    return f"{(i.get('sku') or {}).get('name')}, retention {i.get('retentionInDays')} days"


@detail("azure-native:applicationinsights:Component")
def _applicationinsights_component(i: dict[str, Any]) -> str:
    return (f"{i.get('kind')}, ingestion {i.get('ingestionMode')}, public ingestion "
            f"{i.get('publicNetworkAccessForIngestion')}, query {i.get('publicNetworkAccessForQuery')}")


@detail("azure-native:resources:ResourceGroup")
def _resources_resource_group(i: dict[str, Any]) -> str:
    return str(i.get("location"))
