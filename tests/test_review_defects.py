"""The defects a review of the plans against Azure's specifications and Microsoft's
documentation found: one test class per defect, each asserting what Azure requires, with the
source of the rule in the test's docstring.

Every rule here is Azure's, not ours: budget notification limits (the Consumption API's
Budget model), compute and registry name rules (Microsoft Learn and the REST
specification), the data-plane roles identity-only storage and identity-based datastores
need, the private endpoint a private registry needs, which compute settings can change
after creation (the Compute update model carries scale settings only), what Cost
Management attributes to whom, and what the plan leaves public.
"""

from __future__ import annotations

import re
import shutil
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from amlhpc.core.errors import UserError
from amlhpc.infra import naming, quirks
from amlhpc.infra.config import REPO_ROOT, parse
from amlhpc.infra.lifecycle import new_experiment
from amlhpc.infra.plan import evaluate

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
ENV = {
    "azure-native:location": "eastus",
    "aml-hpc:owner": "team@example.com",
    "aml-hpc:clusters": [{"name": "nd-a100", "sku": "Standard_ND96asr_v4", "maxNodes": 2}],
    "aml-hpc:budget": {"monthlyAmountUsd": 1000, "alertEmails": ["team@example.com"]},
}
GROUP = "11111111-2222-3333-4444-555555555555"
ROLE_NAMES = {
    "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1": "Storage Blob Data Reader",  # Azure built-in roles, storage
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
    "69566ab7-960f-475b-8e7c-b3118f30c6bd": "Storage File Data Privileged Contributor",
    "acdd72a7-3385-48ef-bd42-f606fba81ae7": "Reader",
}


def azure_accepts_compute_name(name: str) -> bool:
    """The documented rule, written out independently of amlhpc.infra.naming."""
    if not 3 <= len(name) <= 24 or not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*", name):
        return False
    return "-" not in name or re.search(r"[A-Za-z]", name[name.rindex("-"):]) is not None


def stack_root(tmp_path: Path, **stacks: dict) -> Path:
    shutil.copy(REPO_ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    for name in ("dev", "prod"):
        shutil.copy(REPO_ROOT / f"Pulumi.{name}.yaml", tmp_path / f"Pulumi.{name}.yaml")
    for name, config in stacks.items():
        (tmp_path / f"Pulumi.{name.replace('_', '-')}.yaml").write_text(yaml.safe_dump({"config": config}))
    return tmp_path


def grants(plan) -> list[tuple[str, str, str]]:
    """(role name or guid, scope, principal) of every role assignment in the plan."""
    out = []
    for r in plan.of_type("azure-native:authorization:RoleAssignment"):
        guid = r.inputs["roleDefinitionId"].rsplit("/", 1)[-1]
        out.append((ROLE_NAMES.get(guid, guid), r.inputs["scope"], r.inputs["principalId"]))
    return out


class TestBudgetNotificationLimit:
    """A consumption budget takes at most five notifications (azure-mgmt-consumption,
    Budget.notifications: "Budget can have up to five notifications"); thresholds plus
    the forecast alert must fit, or the deploy fails in Azure."""

    def test_six_notifications_are_refused_with_the_key_and_the_fix(self):
        flat = dict(ENV)
        flat["aml-hpc:budget"] = {"monthlyAmountUsd": 1000, "alertEmails": ["a@example.com"],
                                  "thresholdsPercent": [25, 50, 75, 90, 100]}
        with pytest.raises(UserError) as info:
            parse("dev", flat, "Pulumi.dev.yaml", now=NOW)
        text = info.value.render()
        assert "aml-hpc:budget.thresholdsPercent" in text
        assert "at most 5 notifications" in text and "forecast" in text

    def test_five_notifications_fit(self):
        flat = dict(ENV)
        flat["aml-hpc:budget"] = {"monthlyAmountUsd": 1000, "alertEmails": ["a@example.com"],
                                  "thresholdsPercent": [50, 80, 95, 100]}
        assert parse("dev", flat, "Pulumi.dev.yaml", now=NOW).budget is not None

    def test_the_component_refuses_too_many_too(self):
        from amlhpc.infra.components import ComponentError
        from amlhpc.infra.components.budget import Budget, BudgetArgs
        from amlhpc.infra.plan import record

        with pytest.raises(ComponentError, match="at most 5"):
            record(lambda: Budget("b", BudgetArgs("b", "/subscriptions/s/resourceGroups/rg", 10, ["a@example.com"],
                                                  [10, 20, 30, 40, 50])) and None)


class TestComputeAndRegistryNames:
    """Compute cluster names: 3-24 characters, letters, digits and hyphens, starting with a
    letter, and a hyphen must be followed by at least one letter later in the name
    (Microsoft Learn, "Create compute clusters"; the resource naming rules allow 3-32 for
    AmlCompute, so 3-24 satisfies both). ML registry names: ASCII only, 3-32 characters
    (REST specification registries.json RegistryNameParameter `^[a-zA-Z0-9][a-zA-Z0-9\\-_]{2,32}$`
    allows 33; Microsoft's registry documentation says at most 32: the intersection)."""

    @pytest.mark.parametrize("name", ["sweep-2", "ab", "gpu-a100-1", "a" * 25, "nd-h100-8x"])
    def test_compute_names_azure_rejects(self, name):
        expected_valid = azure_accepts_compute_name(name)
        assert expected_valid == (name == "nd-h100-8x")  # only there a letter follows the last hyphen
        assert (naming.check("cluster", name) is None) == expected_valid

    @pytest.mark.parametrize("name", ["nd-a100", "abc", "a" * 24, "sweep-v2", "bert-large-run-b"])
    def test_compute_names_azure_accepts(self, name):
        assert naming.check("cluster", name) is None

    @pytest.mark.parametrize("experiment", ["sweep-2", "run-1", "a-1", "x", "2024-11-23-1"])
    def test_new_experiment_derives_a_valid_cluster_name(self, tmp_path, experiment):
        root = stack_root(tmp_path)
        path = new_experiment(experiment, "dev", 7, root, now=NOW)
        cluster = yaml.safe_load(path.read_text())["config"]["aml-hpc:clusters"][0]["name"]
        assert azure_accepts_compute_name(cluster) and naming.check("cluster", cluster) is None, cluster

    def test_registry_names_are_ascii_and_at_most_32(self):
        assert naming.check("mlRegistry", "mlr-café") is not None
        assert naming.check("mlRegistry", "r" * 33) is not None
        assert naming.check("mlRegistry", "r" * 32) is None


def identity_env(auth: str | None = None, private: bool = False) -> dict:
    config = dict(ENV)
    config["aml-hpc:submitters"] = [{"principalId": GROUP, "principalType": "Group"}]
    if auth:
        config["aml-hpc:workspaceStorageAuth"] = auth
    if private:
        config["aml-hpc:network"] = {"isolation": "private", "addressSpace": "10.40.0.0/16", "wayIn": {
            "handOff": {"via": "VPN", "addressPrefixes": ["172.16.0.0/12"]}}}
    return config


class TestIdentityOnlyWorkspaceStorage:
    """With systemDatastoresAuthMode identity and shared keys off, the users who submit need
    Storage Blob Data Contributor and Storage File Data Privileged Contributor on the
    workspace storage account, and a compute identity that reads and writes job data needs
    Storage Blob Data Contributor (Microsoft Learn, "Disable shared key access for your
    workspace's storage account (preview)", which also calls the mode a preview not
    recommended for production)."""

    def test_identity_mode_grants_the_data_plane_roles(self, tmp_path):
        plan = evaluate("lab", stack_root(tmp_path, lab=identity_env("identity")), now=NOW)
        ws = plan.of_type("azure-native:machinelearningservices:Workspace")[0]
        assert ws.inputs["systemDatastoresAuthMode"] == "Identity"
        storage_id = ws.inputs["storageAccount"]
        given = grants(plan)
        compute = plan.outputs["identity"]["principalId"]
        assert ("Storage Blob Data Contributor", storage_id, compute) in given
        assert ("Storage Blob Data Contributor", storage_id, GROUP) in given
        assert ("Storage File Data Privileged Contributor", storage_id, GROUP) in given

    def test_access_key_mode_keeps_keys_on_the_workspace_storage_only(self, tmp_path):
        plan = evaluate("lab", stack_root(tmp_path, lab=identity_env("accessKey")), now=NOW)
        ws = plan.of_type("azure-native:machinelearningservices:Workspace")[0]
        assert ws.inputs["systemDatastoresAuthMode"] == "AccessKey"
        accounts = {r.name: r for r in plan.of_type("azure-native:storage:StorageAccount")}
        assert accounts["ml-storage"].inputs["allowSharedKeyAccess"] is True
        assert accounts["data-account"].inputs["allowSharedKeyAccess"] is False

    def test_no_environment_defaults_to_an_account_key(self):
        """An account key opens every job's snapshots and outputs, and the baseline refuses
        shared keys on storage outside dev: identity is the default in dev and prod alike (the
        preview caveat is docs/security.md's to state), and prod's workspace storage takes no key."""
        assert evaluate("dev", now=NOW).config.workspace_storage_auth == "identity"
        prod = evaluate("prod", now=NOW)
        assert prod.config.workspace_storage_auth == "identity"
        accounts = {r.name: r for r in prod.of_type("azure-native:storage:StorageAccount")}
        assert accounts["ml-storage"].inputs["allowSharedKeyAccess"] is False


class TestDatastorePreviewAccess:
    """Identity-based datastores preview data in studio through the workspace's managed
    identity: it needs Storage Blob Data Reader on a storage account that is not the
    workspace default, and Reader on the storage account's private endpoints when the
    account is private (Microsoft Learn, "Use Azure Machine Learning studio in an Azure
    virtual network", Datastore: Azure Storage Account)."""

    def test_workspace_identity_reads_the_dataset_account(self, tmp_path):
        plan = evaluate("lab", stack_root(tmp_path, lab=identity_env()), now=NOW)
        ws = plan.of_type("azure-native:machinelearningservices:Workspace")[0]
        principal = ws_principal(plan)
        account = plan.of_type("azure-native:storage:StorageAccount")
        data = next(a for a in account if a.name == "data-account")
        assert principal and ws.inputs["identity"]["type"] == "SystemAssigned"
        assert ("Storage Blob Data Reader", arm_id(plan, data), principal) in grants(plan)

    def test_private_storage_endpoints_are_readable_by_the_workspace(self, tmp_path):
        plan = evaluate("lab", stack_root(tmp_path, lab=identity_env(private=True)), now=NOW)
        principal = ws_principal(plan)
        endpoints = {r.name: arm_id(plan, r) for r in plan.of_type("azure-native:network:PrivateEndpoint")}
        readers = {scope for role, scope, who in grants(plan) if role == "Reader" and who == principal}
        for key in ("endpoints-datasets-blob", "endpoints-ws-blob", "endpoints-ws-file"):
            assert endpoints[key] in readers, key


def ws_principal(plan) -> str:
    """The principal Azure gives the workspace's system-assigned identity (the plan's mock)."""
    from amlhpc.infra.plan.mocks import FAKE_SUBSCRIPTION, PlanMocks

    ws = plan.of_type("azure-native:machinelearningservices:Workspace")[0]
    return PlanMocks(FAKE_SUBSCRIPTION)._computed(ws.type, ws.inputs, ws.name)["identity"]["principalId"]  # noqa: SLF001


def arm_id(plan, resource) -> str:
    from amlhpc.infra.plan.mocks import FAKE_SUBSCRIPTION, PlanMocks

    return PlanMocks(FAKE_SUBSCRIPTION)._arm_id(resource.type, resource.inputs, resource.name)  # noqa: SLF001


class TestPrivateRegistryEndpoint:
    """A registry with public network access disabled is reachable only through a private
    endpoint with sub-resource amlregistry in privatelink.api.azureml.ms (Microsoft Learn,
    "Azure Private Endpoint DNS zone values"; "Network isolation with Azure Machine
    Learning registries")."""

    def test_prod_registry_has_an_endpoint_in_its_zone(self):
        plan = evaluate("prod", now=NOW)
        registry = plan.of_type("azure-native:machinelearningservices:Registry")[0]
        assert registry.inputs["publicNetworkAccess"] == "Disabled"
        endpoints = [e for e in plan.of_type("azure-native:network:PrivateEndpoint")
                     if e.inputs["privateLinkServiceConnections"][0]["groupIds"] == ["amlregistry"]]
        assert len(endpoints) == 1
        assert endpoints[0].inputs["privateLinkServiceConnections"][0]["privateLinkServiceId"] == arm_id(plan, registry)
        zones = [g for g in plan.of_type("azure-native:network:PrivateDnsZoneGroup")
                 if g.inputs["privateEndpointName"] == endpoints[0].inputs["privateEndpointName"]]
        assert [c["name"] for c in zones[0].inputs["privateDnsZoneConfigs"]] == ["privatelink-api-azureml-ms"]


class TestClusterSettingsFixedAtCreation:
    """Azure ML updates an existing cluster only through ClusterUpdateParameters, whose
    properties carry scaleSettings and nothing else (azure-ai-ml's ARM models, API
    2025-12-01): SSH credentials, the public SSH port and the identity only take effect on
    a new cluster, so changing them must replace it."""

    def test_ssh_and_identity_replace_the_cluster(self):
        paths = set(quirks.CLUSTER_REPLACE_ON_CHANGES)
        assert {"properties.properties.userAccountCredentials",
                "properties.properties.remoteLoginPortPublicAccess", "identity"} <= paths

    def test_every_replace_path_names_a_declared_input(self):
        plan = evaluate("prod", now=NOW)
        for compute in plan.of_type("azure-native:machinelearningservices:Compute"):
            for path in compute.replace_on_changes:
                node = compute.inputs
                parts = path.split(".")
                for part in parts[:-1]:
                    node = node[part]
                assert isinstance(node, dict), path


class TestExperimentBudgetAttribution:
    """Tags on Microsoft.MachineLearningServices/workspaces/computes do not reach cost
    reports (Azure Resource Manager, "Tag support for Azure resources"), so a budget filtered
    on the experiment's stack tag never counts its clusters. Cost Management records
    compute cost against the compute resource (Cloud Adoption Framework, "Manage budgets,
    costs, and quota for Azure Machine Learning at organizational scale": cost breakdown at
    the compute level), so the experiment's budget filters on its clusters' resource ids."""

    def test_budget_watches_the_experiments_own_clusters(self, tmp_path):
        root = stack_root(tmp_path)
        path = new_experiment("sweep", "dev", 7, root, now=NOW)
        stack = path.name[len("Pulumi."):-len(".yaml")]
        plan = evaluate(stack, root, now=NOW)
        budget = plan.of_type("azure-native:consumption:Budget")[0]
        flt = budget.inputs["filter"]
        assert "tags" not in flt
        computes = [arm_id(plan, c).lower() for c in plan.of_type("azure-native:machinelearningservices:Compute")]
        assert flt["dimensions"] == {"name": "ResourceId", "operator": "In", "values": computes}


class TestBudgetStartInUtc:
    """Budgets start on the first of a month in UTC (Consumption API BudgetTimePeriod); a
    deploy at 05:00 on 1 December in UTC+14 is still 30 November in UTC."""

    def test_start_month_is_the_utc_month(self):
        kiritimati = timezone(timedelta(hours=14))
        assert quirks.budget_start_date(datetime(2026, 12, 1, 5, 0, tzinfo=kiritimati)) == "2026-11-01T00:00:00Z"


class TestWhatStaysPublic:
    """Under private isolation every resource with a public network switch turns it off,
    or says why it cannot: Log Analytics and Application Insights ingest and answer queries
    publicly unless an Azure Monitor Private Link Scope is set up, which this plan does
    not do. Docstrings must not promise more than the plan does."""

    def test_private_plan_disables_or_explains_every_public_switch(self):
        plan = evaluate("prod", now=NOW)
        public_by_design = getattr(quirks, "PUBLIC_BY_DESIGN", {})
        for resource in plan.custom_resources():
            switches = {k: v for k, v in flatten(resource.inputs).items()
                        if k.rsplit(".", 1)[-1].startswith("publicNetworkAccess")}
            monitor = resource.type in ("azure-native:operationalinsights:Workspace",
                                        "azure-native:applicationinsights:Component")
            if monitor or any(v != "Disabled" for v in switches.values()):
                assert resource.type in public_by_design and public_by_design[resource.type].strip(), resource.name

    def test_workspace_docstring_says_what_stays_public(self):
        from amlhpc.infra.components import workspace

        source = " ".join(Path(workspace.__file__).read_text().split())
        assert "off on every dependency" not in source
        assert "Private Link Scope" in source


def flatten(value, prefix: str = "") -> dict:
    out = {}
    if isinstance(value, dict):
        for key, inner in value.items():
            out.update(flatten(inner, f"{prefix}.{key}" if prefix else key))
    elif prefix:
        out[prefix] = value
    return out
