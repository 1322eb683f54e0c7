"""Each component built directly under the recording mock runtime: properties, secure
defaults, options (protect/retain/replace), and refusals when options contradict."""

from __future__ import annotations

import pulumi
import pytest
from pulumi_azure_native import resources as azure_resources

from amlhpc.infra import quirks
from amlhpc.infra.components import inherited_depends_on
from amlhpc.infra.components.access import Access, AccessArgs, Grant, grants_for
from amlhpc.infra.components.budget import Budget, BudgetArgs
from amlhpc.infra.components.dataset_storage import DatasetStorage, DatasetStorageArgs
from amlhpc.infra.components.gpu_cluster import GpuCluster, GpuClusterArgs
from amlhpc.infra.components.private_endpoints import (
    EndpointTarget,
    PrivateEndpoints,
    PrivateEndpointsArgs,
)
from amlhpc.infra.components.resource_group import ResourceGroup, ResourceGroupArgs
from amlhpc.infra.components.workspace import Workspace, WorkspaceArgs
from amlhpc.infra.naming import StackNames
from amlhpc.infra.plan import record

TAGS = {"owner": "o@example.com", "environment": "dev", "stack": "dev"}


def only(resources, type_token):
    found = [r for r in resources if r.type == type_token]
    assert len(found) == 1, f"expected one {type_token}, got {len(found)}"
    return found[0]


def cluster_waiting_for(depends_on):
    """The cluster's recorded Compute, and the resource group its component is told to wait
    for as `depends_on(group)` says."""
    def program():
        rg = azure_resources.ResourceGroup("rg", resource_group_name="rg-x", location="eastus")
        args = dict(resource_group_name="rg", workspace_name="ws", location="eastus", cluster_name="nd-a100",
                    sku="Standard_ND96asr_v4", max_nodes=4, identity_id="/subscriptions/s/uai/id", tags=TAGS)
        GpuCluster("c", GpuClusterArgs(**args), opts=pulumi.ResourceOptions(depends_on=depends_on(rg)))
    resources, _, _ = record(program)
    group = only(resources, "azure-native:resources:ResourceGroup")
    return only(resources, "azure-native:machinelearningservices:Compute"), group


def cluster(**overrides):
    args = dict(resource_group_name="rg", workspace_name="ws", location="eastus", cluster_name="nd-a100",
                sku="Standard_ND96asr_v4", max_nodes=4, identity_id="/subscriptions/s/uai/id", tags=TAGS)
    args.update(overrides)
    resources, _, _ = record(lambda: GpuCluster("c", GpuClusterArgs(**args)) and None)
    return only(resources, "azure-native:machinelearningservices:Compute")


class TestResourceGroup:
    def test_tags_and_name(self):
        resources, _, _ = record(lambda: ResourceGroup("core", ResourceGroupArgs("rg-x", "eastus", TAGS)) and None)
        rg = only(resources, "azure-native:resources:ResourceGroup")
        assert rg.inputs["resourceGroupName"] == "rg-x" and rg.inputs["tags"] == TAGS

    def test_required_tags_enforced(self):
        with pytest.raises(pulumi.RunError, match="must include 'owner'"):
            record(lambda: ResourceGroup("core", ResourceGroupArgs("rg", "eastus", {"stack": "dev"})) and None)


class TestDatasetStorage:
    def build(self, **overrides):
        args = dict(resource_group_name="rg", account_name="amlhpcdata01", location="eastus", tags=TAGS)
        args.update(overrides)
        resources, outputs, _ = record(lambda: {"endpoint": DatasetStorage("data", DatasetStorageArgs(**args)).blob_endpoint})
        return resources, outputs

    def test_secure_defaults(self):
        resources, outputs = self.build()
        account = only(resources, "azure-native:storage:StorageAccount")
        i = account.inputs
        assert i["enableHttpsTrafficOnly"] is True and i["minimumTlsVersion"] == "TLS1_2"
        assert i["allowBlobPublicAccess"] is False and i["allowSharedKeyAccess"] is False
        assert i["kind"] == "StorageV2" and i["sku"]["name"] == "Standard_LRS" and i["accessTier"] == "Hot"
        assert i["publicNetworkAccess"] == "Enabled"
        assert outputs["endpoint"] == "https://amlhpcdata01.blob.core.windows.net/"

    def test_containers_and_soft_delete(self):
        resources, _ = self.build(soft_delete_days=21)
        containers = sorted(r.inputs["containerName"] for r in resources if r.type == "azure-native:storage:BlobContainer")
        assert containers == ["checkpoints", "datasets", "supervision"]
        assert all(r.inputs["publicAccess"] == "None" for r in resources if r.type == "azure-native:storage:BlobContainer")
        service = only(resources, "azure-native:storage:BlobServiceProperties")
        assert service.inputs["deleteRetentionPolicy"] == {"enabled": True, "days": 21}
        assert service.inputs["containerDeleteRetentionPolicy"] == {"enabled": True, "days": 21}

    @pytest.mark.parametrize("protect", [True, False])
    def test_data_is_retained_and_protected_outside_dev(self, protect):
        resources, _ = self.build(protect=protect)
        data = [r for r in resources if r.type in ("azure-native:storage:StorageAccount", "azure-native:storage:BlobContainer")]
        assert len(data) == 4  # the account and its three containers
        assert all(r.retain_on_delete for r in data)
        assert all(r.protect is protect for r in data)

    def test_premium_tier_and_private_network(self):
        resources, _ = self.build(tier="PremiumBlockBlob", private=True, allow_shared_key_access=True)
        i = only(resources, "azure-native:storage:StorageAccount").inputs
        assert i["kind"] == "BlockBlobStorage" and i["sku"]["name"] == "Premium_LRS" and "accessTier" not in i
        assert i["publicNetworkAccess"] == "Disabled" and i["networkRuleSet"]["defaultAction"] == "Deny"
        assert i["allowSharedKeyAccess"] is True


class TestWorkspace:
    def build(self, private, **kwargs):
        names = StackNames.derive("amlhpc", "dev", "eastus")
        resources, outputs, _ = record(lambda: {"login": Workspace("ml", WorkspaceArgs(
            "rg", "eastus", names, "tenant", private, TAGS, **kwargs)).registry_login_server})
        return resources, outputs

    def test_the_registry_tier_the_stack_declares(self):
        resources, _ = self.build(False, registry_sku="Premium")
        assert only(resources, "azure-native:containerregistry:Registry").inputs["sku"]["name"] == "Premium"

    @pytest.mark.parametrize("private", [False, True])
    def test_dependencies_are_secure(self, private):
        resources, outputs = self.build(private)
        expected = "Disabled" if private else "Enabled"
        vault = only(resources, "azure-native:keyvault:Vault").inputs["properties"]
        assert vault["enableRbacAuthorization"] is True and vault["enablePurgeProtection"] is True
        assert vault["publicNetworkAccess"] == expected
        acr = only(resources, "azure-native:containerregistry:Registry").inputs
        assert acr["adminUserEnabled"] is False and acr["publicNetworkAccess"] == expected
        assert acr["sku"]["name"] == ("Premium" if private else "Standard")
        ws = only(resources, "azure-native:machinelearningservices:Workspace").inputs
        assert ws["publicNetworkAccess"] == expected and ws["v1LegacyMode"] is False
        for key in ("keyVault", "applicationInsights", "containerRegistry", "storageAccount"):
            assert ws[key].startswith("/subscriptions/")
        insights = only(resources, "azure-native:applicationinsights:Component").inputs
        assert insights["workspaceResourceId"].endswith("/workspaces/log-amlhpc-dev")
        assert only(resources, "azure-native:managedidentity:UserAssignedIdentity").inputs["resourceName"] == "id-amlhpc-dev-compute"
        assert outputs["login"].endswith(".azurecr.io")

    def test_workspace_storage_is_its_own_account(self):
        resources, _ = self.build(False)
        accounts = [r.inputs["accountName"] for r in resources if r.type == "azure-native:storage:StorageAccount"]
        assert accounts == [StackNames.derive("amlhpc", "dev", "eastus").workspace_storage]


class TestGpuCluster:
    def test_defaults_scale_to_zero_and_ssh_off(self):
        c = cluster()
        props = c.inputs["properties"]["properties"]
        assert props["scaleSettings"] == {"minNodeCount": 0, "maxNodeCount": 4, "nodeIdleTimeBeforeScaleDown": "PT10M"}
        assert props["vmSize"] == "Standard_ND96asr_v4" and props["vmPriority"] == "Dedicated"
        assert props["osType"] == "Linux" and props["remoteLoginPortPublicAccess"] == "Disabled"
        assert "userAccountCredentials" not in props and "subnet" not in props
        assert c.inputs["properties"]["disableLocalAuth"] is True
        assert c.inputs["identity"] == {"type": "UserAssigned", "userAssignedIdentities": ["/subscriptions/s/uai/id"]}

    def test_immutable_fields_replace_and_delete_first(self):
        c = cluster()
        assert set(c.replace_on_changes) == set(quirks.CLUSTER_REPLACE_ON_CHANGES)
        assert {p.rsplit(".", 1)[-1] for p in c.replace_on_changes} == {
            "vmSize", "vmPriority", "subnet", "enableNodePublicIp", "osType",
            "userAccountCredentials", "remoteLoginPortPublicAccess", "identity"}
        assert c.delete_before_replace is True

    def test_ssh_key_only(self):
        c = cluster(ssh_public_key="ssh-ed25519 AAAAkey", idle_minutes=5, priority="LowPriority")
        props = c.inputs["properties"]["properties"]
        assert props["userAccountCredentials"] == {"adminUserName": "azureuser", "adminUserSshPublicKey": "ssh-ed25519 AAAAkey"}
        assert "adminUserPassword" not in props["userAccountCredentials"]
        assert props["remoteLoginPortPublicAccess"] == "Enabled"
        assert props["vmPriority"] == "LowPriority" and props["scaleSettings"]["nodeIdleTimeBeforeScaleDown"] == "PT5M"

    def test_private_mode_no_public_ip_in_subnet(self):
        c = cluster(node_public_ip=False, subnet_id="/sub/vnet/subnets/compute", ssh_public_key="ssh-rsa AAAAkey")
        props = c.inputs["properties"]["properties"]
        assert props["enableNodePublicIp"] is False and props["subnet"] == {"id": "/sub/vnet/subnets/compute"}
        assert props["remoteLoginPortPublicAccess"] == "Disabled", "SSH only from inside the VNet"

    def test_contradictions_refused(self):
        with pytest.raises(pulumi.RunError, match="needs a subnet"):
            cluster(node_public_ip=False)
        with pytest.raises(pulumi.RunError, match="exceeds maxNodes"):
            cluster(min_nodes=5)


class TestAccess:
    SCOPES = {"container:datasets": "/acct/containers/datasets", "container:checkpoints": "/acct/containers/checkpoints",
              "registry": "/acr", "workspace-storage": "/ws-storage"}

    def test_cluster_identity_least_privilege(self):
        """The GPU clusters' identity reads datasets, writes checkpoints, pulls images: Azure's
        built-in role GUIDs (Azure built-in roles, storage and containers), nothing else."""
        grants = grants_for("compute", self.SCOPES, "pid")
        resources, _, _ = record(lambda: Access("access", AccessArgs("sub-1", grants)) and None)
        roles = {r.inputs["scope"]: r.inputs["roleDefinitionId"] for r in resources
                 if r.type == "azure-native:authorization:RoleAssignment"}
        assert roles == {
            "/acct/containers/datasets": quirks.role_definition_id("sub-1", "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"),
            "/acct/containers/checkpoints": quirks.role_definition_id("sub-1", "ba92f5b4-2d11-453d-a403-e96b0029c9fe"),
            "/acr": quirks.role_definition_id("sub-1", "7f951dda-4ed3-4680-a7ca-43fe172d538d"),
        }

    def test_facts_add_the_rights_they_name(self):
        """With the workspace storage keyless, the identity also writes job I/O there."""
        keys = [g.key for g in grants_for("compute", self.SCOPES, "pid", {"identity-storage"})]
        assert keys == ["datasets-read", "checkpoints-write", "acr-pull", "compute-ws-storage"]

    def test_a_missing_scope_is_an_error_not_a_dropped_grant(self):
        with pytest.raises(KeyError, match="no resource id for scope 'registry'"):
            grants_for("compute", {k: v for k, v in self.SCOPES.items() if k != "registry"}, "pid")

    def test_locked_grants_are_protected(self):
        protected = {g.key: g.protect for g in grants_for("compute", self.SCOPES, "pid", locked=True)}
        assert protected == {"datasets-read": True, "checkpoints-write": True, "acr-pull": False}

    def test_duplicate_keys_refused(self):
        grants = [Grant("x", "reader", "/s", "p"), Grant("x", "reader", "/t", "p")]
        with pytest.raises(pulumi.RunError, match="duplicate grant keys"):
            record(lambda: Access("access", AccessArgs("sub", grants)) and None)

    def test_roles_outside_the_model_refused(self):
        with pytest.raises(pulumi.RunError, match="not in amlhpc/core/catalog/permissions.toml"):
            record(lambda: Access("access", AccessArgs("sub", [Grant("x", "owner-ish", "/s", "p")])) and None)


class TestPrivateEndpoints:
    def test_endpoint_per_target_with_dns(self):
        zones = {z: f"/zones/{z}" for group in quirks.PRIVATE_DNS_ZONES.values() for z in group}
        targets = [EndpointTarget("kv", "/vault", "vault"), EndpointTarget("workspace", "/ws", "amlworkspace")]
        resources, _, _ = record(lambda: PrivateEndpoints("pe", PrivateEndpointsArgs(
            "rg", "eastus", "/subnet", zones, targets, "amlhpc-prod", TAGS)) and None)
        endpoints = [r for r in resources if r.type == "azure-native:network:PrivateEndpoint"]
        assert sorted(e.inputs["privateLinkServiceConnections"][0]["groupIds"][0] for e in endpoints) == ["amlworkspace", "vault"]
        groups = {len(r.inputs["privateDnsZoneConfigs"]) for r in resources if r.type == "azure-native:network:PrivateDnsZoneGroup"}
        assert groups == {1, 2}, "the workspace registers in two zones"

    def test_missing_zone_refused(self):
        with pytest.raises(pulumi.RunError, match="no private DNS zone"):
            record(lambda: PrivateEndpoints("pe", PrivateEndpointsArgs(
                "rg", "eastus", "/subnet", {}, [EndpointTarget("kv", "/vault", "vault")], "x")) and None)


class TestBudget:
    def test_alerts_and_experiment_filter(self):
        resources, _, _ = record(lambda: Budget("b", BudgetArgs(
            "budget-x", "/subscriptions/s/resourceGroups/rg", 500, ["a@example.com"], [80, 50],
            resource_ids=["/subscriptions/s/resourceGroups/RG/providers/X/computes/Sweep"])) and None)
        budget = only(resources, "azure-native:consumption:Budget")
        assert budget.inputs["amount"] == 500 and budget.inputs["timeGrain"] == "Monthly"
        assert sorted(budget.inputs["notifications"]) == ["actual-50", "actual-80", "forecast-100"]
        # Compute tags never reach cost records: experiments filter on their clusters' ids,
        # lower-cased as Cost Management keeps them.
        assert budget.inputs["filter"] == {"dimensions": {"name": "ResourceId", "operator": "In",
                                                          "values": ["/subscriptions/s/resourcegroups/rg/providers/x/computes/sweep"]}}
        assert budget.inputs["timePeriod"]["startDate"].endswith("-01T00:00:00Z")

    def test_needs_an_email(self):
        with pytest.raises(pulumi.RunError, match="alert email"):
            record(lambda: Budget("b", BudgetArgs("b", "/rg", 10, [])) and None)


class TestInheritedDependsOn:
    """Children do not inherit a component's depends_on: the cluster passes it on."""

    def test_a_list_reaches_the_cluster(self):
        compute, group = cluster_waiting_for(lambda rg: [rg])
        assert group.urn in compute.depends_on

    def test_one_resource_reaches_the_cluster(self):
        # Pulumi accepts a single resource; list(resource) raised TypeError before.
        compute, group = cluster_waiting_for(lambda rg: rg)
        assert group.urn in compute.depends_on

    def test_none_and_empty(self):
        assert inherited_depends_on(None) == []
        assert inherited_depends_on(pulumi.ResourceOptions()) == []
        assert inherited_depends_on(pulumi.ResourceOptions(depends_on=[])) == []

    def test_an_output_of_a_list_is_refused_by_name(self):
        with pytest.raises(TypeError, match="depends_on must be a resource or a list"):
            inherited_depends_on(pulumi.ResourceOptions(depends_on=pulumi.Output.from_input([])))
