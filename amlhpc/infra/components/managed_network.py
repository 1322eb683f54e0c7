"""Azure ML managed network settings for a workspace: isolation mode and outbound rules.

Not a resource of its own: the settings are a property of the workspace (`managedNetwork`),
declared in one place so a rule never drifts from the workspace that holds it. Clusters in
a managed network take no subnet and no public IP; Azure adds the required rules (Azure ML,
Entra ID, Batch, ...) and private endpoints to the workspace's own storage, Key Vault and
registry itself. What this module adds, and why:

- private endpoint rules to resources the workspace does not own (the dataset account, an
  Azure ML registry): in approved-only mode that is the only way to reach storage;
- FQDN rules to the package sources jobs need (amlhpc.infra.config.DEFAULT_FQDN_RULES). Any FQDN
  rule makes Azure deploy a firewall in the managed VNet, billed to the subscription.

Input names and allowed values: pulumi-azure-native's machinelearningservices Workspace
(ManagedNetworkSettings, FqdnOutboundRule, PrivateEndpointOutboundRule; Azure REST API
2025-12-01, `Microsoft.MachineLearningServices/workspaces` in Azure/azure-rest-api-specs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import pulumi
from pulumi_azure_native import machinelearningservices as ml

OutboundMode = Literal["AllowOnlyApprovedOutbound", "AllowInternetOutbound"]


@dataclass(frozen=True)
class PrivateEndpointRule:
    """An outbound private endpoint from the managed VNet to one of our resources."""

    key: str
    """Short name for the rule, e.g. "datasets-blob"."""
    resource_id: pulumi.Input[str]
    subresource: str
    """Private Link sub-resource: blob, dfs, amlregistry, vault, ..."""


def fqdn_rule_name(host: str) -> str:
    """A rule name from a host: letters, digits and hyphens ("*.anaconda.org" -> fqdn-any-anaconda-org)."""
    name = "fqdn-" + re.sub(r"[^a-z0-9]+", "-", host.lower().replace("*.", "any.")).strip("-")
    return name[:64].rstrip("-")


def managed_network_settings(outbound: OutboundMode, *, fqdn_rules: Sequence[str] = (),
                             firewall_sku: str | None = None,
                             endpoints: Sequence[PrivateEndpointRule] = ()) -> ml.ManagedNetworkSettingsArgs:
    """The workspace's `managedNetwork`: the isolation mode and our user-defined rules."""
    rules: dict[str, pulumi.Input[ml.FqdnOutboundRuleArgs | ml.PrivateEndpointOutboundRuleArgs]] = {}
    for endpoint in endpoints:
        rules[f"pe-{endpoint.key}"] = ml.PrivateEndpointOutboundRuleArgs(
            type="PrivateEndpoint",
            category="UserDefined",
            destination=ml.PrivateEndpointDestinationArgs(
                service_resource_id=endpoint.resource_id,
                subresource_target=endpoint.subresource,
                spark_enabled=False,
            ),
        )
    if outbound == "AllowOnlyApprovedOutbound":
        for host in fqdn_rules:
            rules[fqdn_rule_name(host)] = ml.FqdnOutboundRuleArgs(type="FQDN", category="UserDefined", destination=host)
    duplicates = len(rules) != len(endpoints) + (len(fqdn_rules) if outbound == "AllowOnlyApprovedOutbound" else 0)
    if duplicates:
        raise ValueError(f"outbound rule names collide: {sorted(rules)}")
    return ml.ManagedNetworkSettingsArgs(
        isolation_mode=outbound,
        outbound_rules=rules or None,
        # Azure deploys the firewall only for FQDN rules; the SKU means nothing without them.
        firewall_sku=firewall_sku if (fqdn_rules and outbound == "AllowOnlyApprovedOutbound") else None,
    )
