"""What the stack declares for managed runs' controllers: a CPU cluster that scales to zero,
its own identity with three narrow role assignments, the outputs entry jobs read, and the
config checks - under Pulumi's mock runtime, the outputs checked with amlhpc.core.outputs."""

from __future__ import annotations

import pytest

from amlhpc.core.errors import UserError
from amlhpc.core.outputs import StackOutputs
from amlhpc.infra import quirks
from amlhpc.infra.components.controller import ControllerCluster, ControllerClusterArgs
from amlhpc.infra.config import parse
from amlhpc.infra.plan import evaluate, record

COMPUTE = "azure-native:machinelearningservices:Compute"
ROLE = "azure-native:authorization:RoleAssignment"
TAGS = {"owner": "o@example.com", "environment": "dev", "stack": "dev"}
ACCOUNT = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/a"
SCOPES = {"workspace": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.MachineLearningServices/workspaces/ws",
          "container:checkpoints": f"{ACCOUNT}/blobServices/default/containers/checkpoints",
          "container:supervision": f"{ACCOUNT}/blobServices/default/containers/supervision",
          "registry": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerRegistry/registries/r",
          "workspace-storage": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/ws"}
# Azure's built-in role GUIDs (Azure built-in roles: storage, containers, AI + machine learning).
BLOB_READER, BLOB_CONTRIBUTOR, ACR_PULL = ("2a2b9908-6ea1-4ae2-8e65-a410df84e7d1", "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
                                           "7f951dda-4ed3-4680-a7ca-43fe172d538d")
AZUREML_DATA_SCIENTIST = "f6c7c914-8db3-469d-8ca1-694a8f32e121"


def build(**overrides):
    args = dict(resource_group_name="rg", workspace_name="ws", location="eastus", subscription_id="s",
                cluster_name="jobs-controller", sku="Standard_D2s_v3", identity_name="id-amlhpc-dev-controller",
                tags=TAGS, grant_scopes=SCOPES)
    args.update(overrides)
    resources, _, _ = record(lambda: ControllerCluster("controller", ControllerClusterArgs(**args)) and None)
    return resources


class TestComponent:
    def test_a_cpu_cluster_that_scales_to_zero(self):
        compute = next(r for r in build(max_nodes=3, idle_minutes=4) if r.type == COMPUTE)
        props = compute.inputs["properties"]
        assert props["computeType"] == "AmlCompute" and props["disableLocalAuth"] is True
        inner = props["properties"]
        assert inner["vmSize"] == "Standard_D2s_v3" and inner["vmPriority"] == "Dedicated" and inner["osType"] == "Linux"
        assert inner["scaleSettings"] == {"minNodeCount": 0, "maxNodeCount": 3, "nodeIdleTimeBeforeScaleDown": "PT4M"}
        assert inner["remoteLoginPortPublicAccess"] == "Disabled" and "userAccountCredentials" not in inner
        assert compute.inputs["identity"]["type"] == "UserAssigned"
        assert compute.replace_on_changes == sorted(quirks.CLUSTER_REPLACE_ON_CHANGES) and compute.delete_before_replace

    def test_least_privilege_each_at_its_own_scope(self):
        """A custom role on the workspace (not AzureML Data Scientist), write on `supervision`
        only, read on `checkpoints`, AcrPull: each at its own scope."""
        from amlhpc.core.permissions import MODEL

        resources = build()
        identity = next(r for r in resources if r.type == "azure-native:managedidentity:UserAssignedIdentity")
        assert identity.inputs["resourceName"] == "id-amlhpc-dev-controller"
        grants = {(r.inputs["roleDefinitionId"].rsplit("/", 1)[-1], r.inputs["scope"]) for r in resources if r.type == ROLE}
        assert grants == {(MODEL.role("controller").guid_in("s"), SCOPES["workspace"]),
                          (BLOB_CONTRIBUTOR, SCOPES["container:supervision"]),
                          (BLOB_READER, SCOPES["container:checkpoints"]),
                          (ACR_PULL, SCOPES["registry"])}
        assert AZUREML_DATA_SCIENTIST not in {guid for guid, _ in grants}
        assert all(r.inputs["principalType"] == "ServicePrincipal" for r in resources if r.type == ROLE)
        compute = next(r for r in resources if r.type == COMPUTE)
        assert {r.urn for r in resources if r.type == ROLE} <= set(compute.depends_on), "roles before nodes"

    def test_keyless_workspace_storage_gets_its_data_role(self):
        """dev's workspace storage takes no keys: the controller's job I/O there needs Storage Blob
        Data Contributor, or Azure ML's snapshot download and log upload get 403."""
        resources = build(grant_facts=frozenset({"identity-storage"}))
        grants = {(r.inputs["roleDefinitionId"].rsplit("/", 1)[-1], r.inputs["scope"]) for r in resources if r.type == ROLE}
        assert (BLOB_CONTRIBUTOR, SCOPES["workspace-storage"]) in grants

    def test_private_network(self):
        compute = next(r for r in build(subnet_id="/subscriptions/s/subnets/compute", node_public_ip=False)
                       if r.type == COMPUTE)
        inner = compute.inputs["properties"]["properties"]
        assert inner["enableNodePublicIp"] is False and inner["subnet"] == {"id": "/subscriptions/s/subnets/compute"}


@pytest.fixture(scope="module")
def prod():
    return evaluate("prod")


class TestStacks:
    def test_outputs_carry_the_controller_for_jobs(self, prod):
        outputs = StackOutputs.model_validate(prod.outputs)
        ctl = outputs.controller
        assert ctl is not None and ctl.cluster == "jobs-controller" and ctl.sku == "Standard_D2s_v3"
        assert ctl.usd_per_hour == 0.096 and "Azure Retail Prices API" in ctl.price_source
        assert ctl.identity.id.endswith("/userAssignedIdentities/id-amlhpc-prod-controller")
        assert ctl.identity.client_id != outputs.identity.client_id, "its own identity, not the GPU clusters'"

    def test_dev_controller_can_reach_the_workspace_storage(self):
        """dev is identity-only: its controller identity holds Storage Blob Data Contributor on
        the workspace storage account, as the GPU clusters' identity does."""
        dev = evaluate("dev")
        controller = dev.outputs["controller"]["identity"]["principalId"]
        storage_id = next(r for r in dev.of_type("azure-native:storage:StorageAccount") if r.name == "ml-storage")
        account = storage_id.inputs["accountName"]
        found = [r for r in dev.of_type(ROLE) if r.inputs["principalId"] == controller
                 and r.inputs["scope"].endswith(f"/storageAccounts/{account}")]
        assert [r.inputs["roleDefinitionId"].rsplit("/", 1)[-1] for r in found] == [BLOB_CONTRIBUTOR]

    def test_private_controller_waits_for_the_workspace_endpoint(self, prod):
        compute = next(r for r in prod.of_type(COMPUTE) if r.name == "controller-compute")
        endpoint = next(r.urn for r in prod.of_type("azure-native:network:PrivateEndpoint")
                        if r.inputs["privateLinkServiceConnections"][0]["groupIds"] == ["amlworkspace"])
        assert endpoint in compute.depends_on
        assert compute.inputs["properties"]["properties"]["enableNodePublicIp"] is False

    def test_experiments_pass_the_environments_controller_through(self, tmp_path):
        import shutil

        import yaml

        from amlhpc.infra.config import REPO_ROOT

        shutil.copy(REPO_ROOT / "Pulumi.dev.yaml", tmp_path / "Pulumi.dev.yaml")
        (tmp_path / "Pulumi.exp-ctl.yaml").write_text(yaml.safe_dump({"config": {
            **BASE, "aml-hpc:clusters": [{"name": "sweep", "sku": "Standard_ND96asr_v4", "maxNodes": 2}],
            "aml-hpc:environment": "dev", "aml-hpc:expiresAt": "2026-12-31"}}))
        plan = evaluate("exp-ctl", tmp_path)
        assert plan.outputs["controller"] == plan.environment.outputs["controller"]
        assert "controller-compute" not in [r.name for r in plan.of_type(COMPUTE)], "one controller cluster per workspace"


BASE = {"azure-native:location": "eastus", "aml-hpc:owner": "team@example.com",
        "aml-hpc:clusters": [{"name": "nd-a100", "sku": "Standard_ND96asr_v4", "maxNodes": 2}]}


class TestConfig:
    def test_defaults_and_price(self):
        cfg = parse("dev", BASE, "Pulumi.dev.yaml")
        assert (cfg.controller.enabled, cfg.controller.name, cfg.controller.max_nodes, cfg.controller.price) == \
            (True, "jobs-controller", 4, 0.096)

    @pytest.mark.parametrize("controller, fragments", [
        ({"name": "nd-a100"}, ["aml-hpc:controller.name", "also the name of one of aml-hpc:clusters"]),
        ({"sku": "Standard_D4s_v3"}, ["aml-hpc:controller.usdPerHour", "no price for Standard_D4s_v3"]),
        ({"name": "x"}, ["aml-hpc:controller.name", "cluster name"]),
        ({"maxNodes": 0}, ["aml-hpc:controller.maxNodes"]),
    ])
    def test_bad_values_are_named(self, controller, fragments):
        with pytest.raises(UserError) as info:
            parse("dev", {**BASE, "aml-hpc:controller": controller}, "Pulumi.dev.yaml")
        text = info.value.render()
        for fragment in fragments:
            assert fragment in text

    def test_experiments_cannot_declare_one(self):
        exp = {**BASE, "aml-hpc:environment": "dev", "aml-hpc:expiresAt": "2026-12-31", "aml-hpc:controller": {}}
        with pytest.raises(UserError, match="aml-hpc:controller: belongs to the environment stack"):
            parse("exp-x", exp, "Pulumi.exp-x.yaml")

    def test_disabled_declares_nothing(self, tmp_path):
        import yaml

        (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(
            {"config": {**BASE, "aml-hpc:controller": {"enabled": False}}}))
        plan = evaluate("dev", root=tmp_path)
        assert plan.outputs["controller"] is None
        assert [r.name for r in plan.of_type(COMPUTE)] == ["cluster-nd-a100-compute"]
