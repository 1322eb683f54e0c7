"""The offline plan of whole stacks: what dev, prod and an experiment declare, the outputs
contract, no secrets, cost and quota, and the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from amlhpc.core import skus
from amlhpc.core.errors import UserError
from amlhpc.infra.config import REPO_ROOT, ControllerConfig
from amlhpc.infra.plan import evaluate
from tests.plan_helpers import SWEEP_EXPERIMENT

FIXTURES = Path(__file__).parent / "fixtures" / "outputs"
SECRET_MARKERS = ("AccountKey=", "SharedAccessSignature", "sig=", "PRIVATE KEY", "password", "connectionString")

CONTROLLER_FULL_SCALE = ControllerConfig().max_nodes * ControllerConfig().price
"""The managed runs' controller cluster (jobs-controller, Standard_D2s_v3) at full scale, $/hour."""


@pytest.fixture(scope="module")
def dev():
    return evaluate("dev")


@pytest.fixture(scope="module")
def prod():
    return evaluate("prod")


def types(plan) -> list[str]:
    return [r.type for r in plan.custom_resources()]


def shape(value):
    """Keys all the way down (values ignored) - what the contract fixes."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    return type(value).__name__ if value is not None else None


class TestOutputsContract:
    @pytest.mark.parametrize("stack", ["dev", "prod"])
    def test_document_matches_the_contract(self, stack, request):
        plan = request.getfixturevalue(stack)
        fixture = json.loads((FIXTURES / f"{stack}.json").read_text())
        assert set(plan.outputs) == set(fixture)
        for key in ("storage", "identity", "network", "registry"):
            assert set(plan.outputs[key]) == set(fixture[key]), key
        assert plan.outputs["clusters"] == fixture["clusters"]
        assert plan.outputs["datastores"] == {"datasets": "datasets", "checkpoints": "checkpoints"}

    @pytest.mark.parametrize("stack", ["dev", "prod"])
    def test_no_secret_in_outputs(self, stack, request):
        plan = request.getfixturevalue(stack)
        assert plan.secret_outputs == []
        text = json.dumps(plan.outputs)
        for marker in SECRET_MARKERS:
            assert marker not in text
        assert not any(r.secret_inputs for r in plan.resources), "nothing we declare needs a secret"

    def test_cluster_facts_come_from_the_catalog(self, dev):
        nd = dev.outputs["clusters"]["nd-a100"]
        assert nd["gpusPerNode"] == skus.get("Standard_ND96asr_v4").gpus and nd["infiniband"] is True


class TestEnvironmentStacks:
    def test_dev_declares_the_platform(self, dev):
        t = types(dev)
        for required in ("resources:ResourceGroup", "storage:StorageAccount", "keyvault:Vault",
                         "containerregistry:Registry", "machinelearningservices:Workspace",
                         "applicationinsights:Component", "operationalinsights:Workspace",
                         "managedidentity:UserAssignedIdentity", "machinelearningservices:Datastore",
                         "authorization:RoleAssignment", "consumption:Budget"):
            assert f"azure-native:{required}" in t, required
        assert t.count("azure-native:machinelearningservices:Compute") == 3  # two GPU clusters, the controllers'
        assert "azure-native:network:VirtualNetwork" not in t, "public isolation has no VNet of ours"

    def test_dev_data_is_retained_not_protected(self, dev):
        data = [r for r in dev.resources if r.type in ("azure-native:storage:BlobContainer",)
                or (r.type == "azure-native:storage:StorageAccount" and r.name == "data-account")]
        # the account and its datasets, checkpoints and supervision containers
        assert len(data) == 4 and all(r.retain_on_delete and not r.protect for r in data)

    def test_prod_is_isolated_and_protected(self, prod):
        t = types(prod)
        # ours (workspace, its storage, vault, ACR, the datasets) and the ML registry's: the
        # registry, its ACR and its storage in each of its two regions (tests/test_registry_isolation.py)
        assert t.count("azure-native:network:PrivateEndpoint") == 10
        groups = sorted(r.inputs["privateLinkServiceConnections"][0]["groupIds"][0]
                        for r in prod.of_type("azure-native:network:PrivateEndpoint"))
        assert groups == ["amlregistry", "amlworkspace", "blob", "blob", "blob", "blob", "file", "registry",
                          "registry", "vault"]
        assert t.count("azure-native:privatedns:PrivateZone") == 6
        assert "azure-native:network:NatGateway" in t and "azure-native:network:NetworkSecurityGroup" in t
        account = next(r for r in prod.resources if r.name == "data-account")
        assert account.protect and account.retain_on_delete
        compute = prod.of_type("azure-native:machinelearningservices:Compute")[0].inputs["properties"]["properties"]
        # Managed isolation (docs/isolation.md): the nodes live in Azure ML's managed VNet.
        assert compute["enableNodePublicIp"] is False and "subnet" not in compute
        workspace = prod.of_type("azure-native:machinelearningservices:Workspace")[0].inputs
        assert workspace["managedNetwork"]["isolationMode"] == "AllowOnlyApprovedOutbound"
        assert "azure-native:machinelearningservices:Registry" in t
        assert prod.outputs["network"] == {"isolation": "managed", "subnetId": None}

    def test_clusters_wait_for_their_access(self, prod):
        """Nodes must not start before role assignments and the workspace endpoint exist."""
        compute = prod.of_type("azure-native:machinelearningservices:Compute")[0]
        roles = {r.urn for r in prod.of_type("azure-native:authorization:RoleAssignment") if r.name.startswith("access-")}
        endpoint = next(r.urn for r in prod.of_type("azure-native:network:PrivateEndpoint")
                        if r.inputs["privateLinkServiceConnections"][0]["groupIds"] == ["amlworkspace"])
        # the cluster identity's three and its job I/O on the keyless workspace storage, and the
        # workspace identity's read of the datasets
        assert len(roles) == 5 and roles | {endpoint} <= set(compute.depends_on)


class TestCostAndQuota:
    def test_dev_cost_from_catalog_prices(self, dev):
        expected = 2 * 27.197 + 1 * 3.673 + CONTROLLER_FULL_SCALE
        assert dev.cost.full_scale_usd_per_hour == pytest.approx(expected)
        assert dev.cost.idle_usd_per_day == 0, "every cluster, the controller's too, scales to zero"
        assert [c.name for c in dev.cost.clusters][-1] == "jobs-controller"

    def test_low_priority_pools_into_one_quota(self, dev):
        (need,) = dev.quota
        assert need.quota_name == "lowPriorityCores" and need.vcpus == 2 * 96 + 1 * 24
        assert set(need.families) == {"StandardNDASv4_A100Family", "StandardNCADSA100v4Family"}

    def test_prod_dedicated_quota_per_family(self, prod):
        assert [(q.quota_name, q.vcpus) for q in prod.quota] == [("standardNDSH100v5Family", 768)]


def _env_dir(tmp_path: Path, extra_stacks: dict[str, dict]) -> Path:
    shutil.copy(REPO_ROOT / "Pulumi.dev.yaml", tmp_path / "Pulumi.dev.yaml")
    for stack, config in extra_stacks.items():
        (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}))
    return tmp_path


class TestExperimentStacks:
    def test_adds_clusters_to_the_environment_workspace(self, tmp_path):
        plan = evaluate("exp-sweep", _env_dir(tmp_path, {"exp-sweep": SWEEP_EXPERIMENT}))
        assert sorted(types(plan)) == ["azure-native:consumption:Budget", "azure-native:machinelearningservices:Compute"]
        # no StackReference: the environment's published outputs (amlhpc/infra/published.py)
        assert not [r for r in plan.resources if r.type.startswith("pulumi:pulumi:")]
        compute = plan.of_type("azure-native:machinelearningservices:Compute")[0]
        assert compute.inputs["workspaceName"] == "mlw-amlhpc-dev" and compute.inputs["tags"]["stack"] == "exp-sweep"
        budget = plan.of_type("azure-native:consumption:Budget")[0]
        assert budget.inputs["filter"]["dimensions"]["name"] == "ResourceId"
        assert budget.inputs["filter"]["dimensions"]["values"][0].endswith("/computes/sweep-a100")
        assert plan.outputs["expiresAt"] == "2026-12-31T00:00:00Z"
        assert list(plan.outputs["clusters"]) == ["sweep-a100"]
        assert plan.outputs["storage"] == plan.environment.outputs["storage"]

    def test_cluster_name_taken_in_environment(self, tmp_path):
        clash = {**SWEEP_EXPERIMENT, "aml-hpc:clusters": [{"name": "nd-a100", "sku": "Standard_ND96asr_v4", "maxNodes": 2}]}
        with pytest.raises(UserError) as info:
            evaluate("exp-clash", _env_dir(tmp_path, {"exp-clash": clash}))
        assert "cluster 'nd-a100' already exists in environment 'dev'" in info.value.render()


class TestBadConfigRegistersNothing:
    def test_program_never_runs(self, tmp_path, monkeypatch):
        import amlhpc.infra.program

        called = []
        monkeypatch.setattr(amlhpc.infra.program, "build", lambda *a, **k: called.append(1))
        bad = yaml.safe_load((REPO_ROOT / "Pulumi.dev.yaml").read_text())
        bad["config"]["aml-hpc:clusters"][0]["sku"] = "Standard_Bogus"
        (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(bad))
        with pytest.raises(UserError):
            evaluate("dev", tmp_path)
        assert called == []


class TestPrices:
    def test_unpriced_size_is_reported_and_override_prices_it(self, tmp_path, unpriced_size):
        config = yaml.safe_load((REPO_ROOT / "Pulumi.dev.yaml").read_text())["config"]
        config["aml-hpc:clusters"] = [{"name": "h200", "sku": "Standard_ND96isr_H200_v5", "maxNodes": 2}]
        (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": config}))
        assert evaluate("dev", tmp_path).cost.unpriced == ["h200"]
        config["aml-hpc:prices"] = {"Standard_ND96isr_H200_v5": 110.0}
        (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": config}))
        plan = evaluate("dev", tmp_path)
        assert plan.cost.unpriced == [] and plan.cost.full_scale_usd_per_hour == pytest.approx(220.0 + CONTROLLER_FULL_SCALE)


class TestCli:
    def run(self, *args):
        env = {**os.environ, "COLUMNS": "250"}
        return subprocess.run([sys.executable, "-m", "amlhpc.infra", *args], cwd=REPO_ROOT, capture_output=True, text=True, env=env)

    def test_prod_json_is_valid_and_has_the_outputs_document(self, prod):
        result = self.run("plan", "--stack", "prod", "--json")
        assert result.returncode == 0, result.stderr
        assert result.stdout == json.dumps(prod.to_json(), indent=2) + "\n", "the same bytes as in this process"
        document = json.loads(result.stdout)
        assert document["outputs"]["workspace"] == "mlw-amlhpc-prod"
        assert document["cost"]["fullScaleUsdPerHour"] == pytest.approx(8 * 98.32 + CONTROLLER_FULL_SCALE)
        assert all({"type", "name", "inputs", "options"} <= set(r) for r in document["resources"])

    def test_unknown_stack_exits_2_with_the_fix(self):
        result = self.run("plan", "--stack", "staging")
        assert result.returncode == 2
        assert "Pulumi.staging.yaml" in result.stderr and "make new-experiment" in result.stderr
        assert "Traceback" not in result.stderr

    def test_text_plan_marks_retained_and_replace_on_change(self):
        result = self.run("plan", "--stack", "dev")
        assert result.returncode == 0, result.stderr
        assert "[retained]" in result.stdout and "replace on change of enableNodePublicIp, identity, osType," in result.stdout
        assert "Full scale:" in result.stdout and "lowPriorityCores" in result.stdout
