"""One row per azure-native resource type the plans declare: which Azure SDK model holds
its ARM body, which request builder checks its names, and what the model cannot check
(listed with the reason, never skipped silently). A new resource type or option is
covered by adding a row here; test_conformance refuses a plan type without one.

API versions: `provider` is what the installed azure-native module targets (its
docstring, read by amlhpc.infra.adopt.provider_api_version); the SDK's is what its request
builder sends. Where they differ, `note` says why that model is the nearest reference.
Packages are pinned in pyproject.toml's dev group.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conformance.conformance_reference import Finding

ML = "azure.ai.ml._restclient.arm_ml_service"
ML_BUILDERS = f"{ML}.operations._operations"
NET = "azure.mgmt.network"
NET_BUILDERS = f"{NET}.operations._operations"

ML_NOTE = ("azure-mgmt-machinelearningservices on PyPI stops at 1.0.1 (API 2020-08-01, no registries, "
           "datastores v2 or environment versions); azure-ai-ml ships Microsoft's generated ARM models for "
           "2025-12-01, the provider's own version (TypeSpec style: no length, pattern or range rules)")


@dataclass(frozen=True)
class Row:
    type: str
    model: str
    """Dotted path of the ARM body model the inputs must fit."""
    builder: str
    """Dotted path of the SDK request builder for the create call (checks the names)."""
    package: str
    """The distribution the model comes from (its pinned version is reported)."""
    note: str = ""
    """Why this model is the reference when its API version differs from the provider's."""
    path_defaults: dict[str, str] = field(default_factory=dict)
    """Builder parameters azure-native fills itself (autonamed, fixed)."""
    fixed_inputs: dict[str, str] = field(default_factory=dict)
    """Path inputs whose value the API fixes (not a builder parameter): input -> value."""
    not_covered: dict[str, str] = field(default_factory=dict)
    """Input paths ([*] for list items) the model cannot check, and why."""
    rules: tuple[Callable[[dict[str, Any]], list[Finding]], ...] = ()
    """Documented limits the model does not encode."""


def _budget_notifications(inputs: dict[str, Any]) -> list[Finding]:
    """azure-mgmt-consumption, Budget.notifications: "Budget can have up to five notifications"."""
    count = len(inputs.get("notifications") or {})
    return [Finding("notifications", f"{count} notifications; a budget takes at most 5")] if count > 5 else []


ML_NAMES = json.loads((Path(__file__).parent / "reference" / "ml-name-parameters.json").read_text())
"""Reference copies of the name rules the TypeSpec builders do not carry (source, date inside)."""


def _ml_name(key: str) -> Callable[[dict[str, Any]], list[Finding]]:
    pattern, source = ML_NAMES[key]["pattern"], ML_NAMES[key]["source"]

    def rule(inputs: dict[str, Any]) -> list[Finding]:
        value = inputs.get(key)
        if value is not None and not re.match(pattern, str(value)):
            return [Finding(key, f"{value!r} does not match {pattern} ({source})")]
        return []

    rule.__doc__ = f"{key}: {pattern} ({source})"
    return rule


_REGISTRY_NAME = _ml_name("registryName")
_WORKSPACE_NAME = _ml_name("workspaceName")

ROWS: dict[str, Row] = {row.type: row for row in [
    Row("azure-native:resources:ResourceGroup",
        "azure.mgmt.resource.resources.v2024_07_01.models.ResourceGroup",
        "azure.mgmt.resource.resources.v2024_07_01.operations._operations.build_resource_groups_create_or_update_request",
        "azure-mgmt-resource",
        note="no azure-mgmt-resource release ships 2024-03-01; 2024-07-01 is the nearest (ResourceGroup is unchanged)"),
    Row("azure-native:storage:StorageAccount",
        "azure.mgmt.storage.models.StorageAccountCreateParameters",
        "azure.mgmt.storage.operations._storage_accounts_operations.build_create_request",
        "azure-mgmt-storage"),
    Row("azure-native:storage:BlobServiceProperties",
        "azure.mgmt.storage.models.BlobServiceProperties",
        "azure.mgmt.storage.operations._blob_services_operations.build_set_service_properties_request",
        "azure-mgmt-storage",
        fixed_inputs={"blobServicesName": "default"}),
    Row("azure-native:storage:ManagementPolicy",
        "azure.mgmt.storage.models.ManagementPolicy",
        "azure.mgmt.storage.operations._management_policies_operations.build_create_or_update_request",
        "azure-mgmt-storage",
        fixed_inputs={"managementPolicyName": "default"}),
    Row("azure-native:storage:BlobContainer",
        "azure.mgmt.storage.models.BlobContainer",
        "azure.mgmt.storage.operations._blob_containers_operations.build_create_request",
        "azure-mgmt-storage"),
    Row("azure-native:keyvault:Vault",
        "azure.mgmt.keyvault.v2024_11_01.models.VaultCreateOrUpdateParameters",
        "azure.mgmt.keyvault.v2024_11_01.operations._vaults_operations.build_create_or_update_request",
        "azure-mgmt-keyvault"),
    Row("azure-native:operationalinsights:Workspace",
        "azure.mgmt.loganalytics.models.Workspace",
        "azure.mgmt.loganalytics.operations._workspaces_operations.build_create_or_update_request",
        "azure-mgmt-loganalytics",
        note="the msrest releases ship 2021-06-01 or 2025-07-01 only; 2025-07-01 is nearer to 2023-09-01 "
             "and a superset of the properties the plan sets (sku, retentionInDays)"),
    Row("azure-native:applicationinsights:Component",
        "azure.mgmt.applicationinsights.v2020_02_02.models.ApplicationInsightsComponent",
        "azure.mgmt.applicationinsights.v2020_02_02.operations._components_operations.build_create_or_update_request",
        "azure-mgmt-applicationinsights"),
    Row("azure-native:containerregistry:Registry",
        "azure.mgmt.containerregistry.v2023_01_01_preview.models.Registry",
        "azure.mgmt.containerregistry.v2023_01_01_preview.operations._registries_operations.build_create_request",
        "azure-mgmt-containerregistry"),
    Row("azure-native:managedidentity:UserAssignedIdentity",
        "azure.mgmt.msi.v2023_01_31.models.Identity",
        "azure.mgmt.msi.v2023_01_31.operations._user_assigned_identities_operations.build_create_or_update_request",
        "azure-mgmt-msi"),
    Row("azure-native:authorization:RoleAssignment",
        "azure.mgmt.authorization.v2022_04_01.models.RoleAssignmentCreateParameters",
        "azure.mgmt.authorization.v2022_04_01.operations._role_assignments_operations.build_create_request",
        "azure-mgmt-authorization",
        # azure-native names each assignment with a new GUID when none is given.
        path_defaults={"role_assignment_name": "00000000-0000-0000-0000-0000000000ab"}),
    Row("azure-native:consumption:Budget",
        "azure.mgmt.consumption.models.Budget",
        "azure.mgmt.consumption.operations._operations.build_budgets_create_or_update_request",
        "azure-mgmt-consumption",
        rules=(_budget_notifications,),
        not_covered={"filter.dimensions": "BudgetComparisonExpression.name is free text in the model; "
                                          "ResourceId is one of Cost Management's budget filter dimensions"}),
    Row("azure-native:network:VirtualNetwork", f"{NET}.models.VirtualNetwork",
        f"{NET_BUILDERS}.build_virtual_networks_create_or_update_request", "azure-mgmt-network",
        note="no msrest release ships 2024-05-01; 2024-07-01 (29.0.0) is the nearest newer, a superset"),
    Row("azure-native:network:Subnet", f"{NET}.models.Subnet",
        f"{NET_BUILDERS}.build_subnets_create_or_update_request", "azure-mgmt-network",
        note="as for VirtualNetwork"),
    Row("azure-native:network:NetworkSecurityGroup", f"{NET}.models.NetworkSecurityGroup",
        f"{NET_BUILDERS}.build_network_security_groups_create_or_update_request", "azure-mgmt-network",
        note="as for VirtualNetwork"),
    Row("azure-native:network:PublicIPAddress", f"{NET}.models.PublicIPAddress",
        f"{NET_BUILDERS}.build_public_ip_addresses_create_or_update_request", "azure-mgmt-network",
        note="as for VirtualNetwork"),
    Row("azure-native:network:NatGateway", f"{NET}.models.NatGateway",
        f"{NET_BUILDERS}.build_nat_gateways_create_or_update_request", "azure-mgmt-network",
        note="as for VirtualNetwork"),
    Row("azure-native:network:PrivateEndpoint", f"{NET}.models.PrivateEndpoint",
        f"{NET_BUILDERS}.build_private_endpoints_create_or_update_request", "azure-mgmt-network",
        note="as for VirtualNetwork"),
    Row("azure-native:network:PrivateDnsZoneGroup", f"{NET}.models.PrivateDnsZoneGroup",
        f"{NET_BUILDERS}.build_private_dns_zone_groups_create_or_update_request", "azure-mgmt-network",
        note="as for VirtualNetwork"),
    Row("azure-native:privatedns:PrivateZone", "azure.mgmt.privatedns.models.PrivateZone",
        "azure.mgmt.privatedns.operations._private_zones_operations.build_create_or_update_request",
        "azure-mgmt-privatedns"),
    Row("azure-native:privatedns:VirtualNetworkLink", "azure.mgmt.privatedns.models.VirtualNetworkLink",
        "azure.mgmt.privatedns.operations._virtual_network_links_operations.build_create_or_update_request",
        "azure-mgmt-privatedns"),
    Row("azure-native:network:BastionHost", f"{NET}.models.BastionHost",
        f"{NET_BUILDERS}.build_bastion_hosts_create_or_update_request", "azure-mgmt-network",
        note="as for VirtualNetwork"),
    Row("azure-native:network:NetworkInterface", f"{NET}.models.NetworkInterface",
        f"{NET_BUILDERS}.build_network_interfaces_create_or_update_request", "azure-mgmt-network",
        note="as for VirtualNetwork"),
    Row("azure-native:compute:VirtualMachine", "azure.mgmt.compute.models.VirtualMachine",
        "azure.mgmt.compute.operations._operations.build_virtual_machines_create_or_update_request",
        "azure-mgmt-compute",
        note="azure-mgmt-compute ships one API version per release; the newest's VirtualMachine is a "
             "superset of the properties the jump box sets",
        not_covered={"hardwareProfile.vmSize": "VirtualMachineSizeTypes stops at 2017's sizes and its "
                                               "docstring points to the List Sizes API for the real list"}),
    Row("azure-native:compute:VirtualMachineExtension", "azure.mgmt.compute.models.VirtualMachineExtension",
        "azure.mgmt.compute.operations._operations.build_virtual_machine_extensions_create_or_update_request",
        "azure-mgmt-compute",
        note="as for VirtualMachine: the newest API's VirtualMachineExtension is a superset of what the jump box's "
             "Entra ID sign-in extension sets"),
    Row("azure-native:keyvault:Key", "azure.mgmt.keyvault.v2024_11_01.models.KeyCreateParameters",
        "azure.mgmt.keyvault.v2024_11_01.operations._keys_operations.build_create_if_not_exist_request",
        "azure-mgmt-keyvault"),
    Row("azure-native:monitor:DiagnosticSetting",
        "azure.mgmt.monitor.v2021_05_01_preview.models.DiagnosticSettingsResource",
        "azure.mgmt.monitor.v2021_05_01_preview.operations._diagnostic_settings_operations.build_create_or_update_request",
        "azure-mgmt-monitor"),
    Row("azure-native:authorization:ManagementLockByScope", "azure.mgmt.resource.locks.models.ManagementLockObject",
        "azure.mgmt.resource.locks.operations._operations.build_management_locks_create_or_update_by_scope_request",
        "azure-mgmt-resource-locks"),
    Row("azure-native:machinelearningservices:Workspace", f"{ML}.models.Workspace",
        f"{ML_BUILDERS}.build_workspaces_create_or_update_request", "azure-ai-ml", note=ML_NOTE,
        rules=(_WORKSPACE_NAME,)),
    Row("azure-native:machinelearningservices:Compute", f"{ML}.models.ComputeResource",
        f"{ML_BUILDERS}.build_compute_create_or_update_request", "azure-ai-ml", note=ML_NOTE,
        not_covered={"computeName": "the specification has no name rule for computes; Microsoft Learn's "
                                    "(3-24 characters, a letter after the last hyphen) is amlhpc.infra.naming's, "
                                    "tested in test_review_defects"}),
    Row("azure-native:machinelearningservices:Datastore", f"{ML}.models.Datastore",
        f"{ML_BUILDERS}.build_datastores_create_or_update_request", "azure-ai-ml", note=ML_NOTE),
    Row("azure-native:machinelearningservices:EnvironmentContainer", f"{ML}.models.EnvironmentContainer",
        f"{ML_BUILDERS}.build_environment_containers_create_or_update_request", "azure-ai-ml", note=ML_NOTE),
    Row("azure-native:machinelearningservices:EnvironmentVersion", f"{ML}.models.EnvironmentVersion",
        f"{ML_BUILDERS}.build_environment_versions_create_or_update_request", "azure-ai-ml", note=ML_NOTE),
    Row("azure-native:machinelearningservices:Registry", f"{ML}.models.Registry",
        f"{ML_BUILDERS}.build_registries_create_or_update_request", "azure-ai-ml", note=ML_NOTE,
        rules=(_REGISTRY_NAME,)),
]}
