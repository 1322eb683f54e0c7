"""The rules over offline plans of real stack files (amlhpc.infra.plan.evaluate under Pulumi mocks).

Where a valid stack file can break a rule, the test writes that stack file and checks the
message the plan gets. Where it cannot - the config validation or the components refuse
it first (TLS, purge protection, password login, tags...) - the test alters that one
resource in the plan JSON of the shipped dev stack, as a regression in the program would.
"""

from __future__ import annotations

import copy
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from amlhpc.core.errors import UserError
from amlhpc.infra.config import REPO_ROOT
from amlhpc.infra.plan import evaluate
from amlhpc.infra.policy import RULES, Limits, check_plan, has_mandatory, render, render_violations

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
PROJECT_FILES = ("Pulumi.yaml", "Pulumi.dev.yaml", "Pulumi.prod.yaml")


@pytest.fixture(scope="module")
def dev_plan() -> dict:
    return evaluate("dev", REPO_ROOT, now=NOW).to_json()


@pytest.fixture(scope="module")
def prod_plan() -> dict:
    return evaluate("prod", REPO_ROOT, now=NOW).to_json()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name in PROJECT_FILES:
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    return tmp_path


def edit_stack(root: Path, stack: str, change) -> None:
    """Apply `change(config)` to Pulumi.<stack>.yaml's config mapping."""
    path = root / f"Pulumi.{stack}.yaml"
    document = yaml.safe_load(path.read_text())
    change(document["config"])
    path.write_text(yaml.safe_dump(document, sort_keys=False))


def write_experiment(root: Path, name: str, config: dict) -> str:
    stack = f"exp-{name}"
    base = {"azure-native:location": "swedencentral", "aml-hpc:owner": "me@example.com",
            "aml-hpc:environment": "dev", "aml-hpc:expiresAt": "2026-12-01T00:00:00Z",
            "aml-hpc:clusters": [{"name": f"x-{name}", "sku": "Standard_ND96asr_v4", "maxNodes": 2}]}
    base.update(config)
    (root / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": base}, sort_keys=False))
    return stack


def violations_of(plan, rule: str):
    return [v for v in check_plan(plan) if v.rule == rule]


def cluster_config(config: dict, name: str) -> dict:
    return next(c for c in config["aml-hpc:clusters"] if c["name"] == name)


def resource(plan: dict, name: str) -> dict:
    return next(r for r in plan["resources"] if r["name"] == name)


class TestShippedStacks:
    def test_prod_passes_every_mandatory_rule(self, prod_plan):
        """The prod stack file as shipped deploys under the policy."""
        assert not has_mandatory(check_plan(prod_plan)), render(check_plan(prod_plan), "prod")

    def test_dev_passes_every_mandatory_rule(self, dev_plan):
        """The dev stack file as shipped deploys under the policy."""
        assert not has_mandatory(check_plan(dev_plan)), render(check_plan(dev_plan), "dev")

    def test_generated_experiment_passes(self, root):
        """An experiment stack made by new-experiment passes every rule."""
        from amlhpc.infra.lifecycle import new_experiment

        path = new_experiment("sweep", "dev", 7, root, NOW)
        stack = path.name[len("Pulumi."):-len(".yaml")]
        assert check_plan(evaluate(stack, root, now=NOW)) == []


def test_every_taggable_type_in_the_shipped_stacks_is_known(dev_plan, prod_plan):
    """Each Azure type the program declares that takes tags is in rules.TAGGABLE, so
    required-tags catches one that forgot its tags entirely."""
    import importlib
    import inspect

    from amlhpc.infra.policy.rules import TAGGABLE

    types = {r["type"] for plan in (dev_plan, prod_plan) for r in plan["resources"]
             if r["custom"] and r["type"].startswith("azure-native:")}
    missing = []
    for token in sorted(types):
        _, module, name = token.split(":")
        cls = getattr(importlib.import_module(f"pulumi_azure_native.{module}"), name)
        if "tags" in inspect.signature(cls._internal_init).parameters and token not in TAGGABLE:
            missing.append(token)
    assert missing == []


class TestConfigThatBreaksARule:
    def test_ssh_key_on_a_public_cluster_is_public_ssh(self, root):
        """dev (public network) + an SSH key on a cluster -> no-public-ssh on that cluster."""
        key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPolicyTestKeyMaterial0000 dev@laptop"
        edit_stack(root, "dev", lambda c: cluster_config(c, "nd-a100").update(ssh={"publicKey": key}))
        (found,) = violations_of(evaluate("dev", root, now=NOW), "no-public-ssh")
        assert found.level == "mandatory" and found.name == "cluster-nd-a100-compute"
        assert "cluster 'nd-a100' opens SSH (port 22) on public node IPs" in found.message
        assert "isolation: private" in found.fix

    def test_ssh_key_on_a_private_cluster_is_fine(self, root):
        """prod on our own VNet (private network, no node public IPs) may enable SSH by key."""
        key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPolicyTestKeyMaterial0000 dev@laptop"

        def private_with_ssh(config):
            config["aml-hpc:network"] = {"isolation": "private", "addressSpace": "10.40.0.0/16", "wayIn": {
                "handOff": {"via": "VPN", "addressPrefixes": ["172.16.0.0/12"]}}}
            cluster_config(config, "nd-h100").update(ssh={"publicKey": key})

        edit_stack(root, "prod", private_with_ssh)
        assert violations_of(evaluate("prod", root, now=NOW), "no-public-ssh") == []

    def test_long_idle_time(self, root):
        """idleMinutes 60 (valid config) is over the 30-minute policy limit."""
        edit_stack(root, "dev", lambda c: cluster_config(c, "nd-a100").update(idleMinutes=60))
        plan = evaluate("dev", root, now=NOW)
        (found,) = violations_of(plan, "gpu-idle-scale-down")
        assert found.message == ("GPU cluster 'nd-a100' keeps idle nodes for 60 minutes (PT60M); the limit is 30")
        assert [v for v in check_plan(plan, Limits(max_idle_minutes=60)) if v.rule == "gpu-idle-scale-down"] == []

    def test_environment_without_budget(self, root):
        """An environment stack file without aml-hpc:budget breaks stack-budget."""
        edit_stack(root, "dev", lambda c: c.pop("aml-hpc:budget"))
        (found,) = violations_of(evaluate("dev", root, now=NOW), "stack-budget")
        assert found.message == "stack 'dev' declares no consumption budget: nobody is told when spend runs away"
        assert "Pulumi.dev.yaml" in found.fix

    def test_experiment_without_budget(self, root):
        """An experiment stack file without its own budget breaks stack-budget too."""
        stack = write_experiment(root, "nobudget", {})
        (found,) = violations_of(evaluate(stack, root, now=NOW), "stack-budget")
        assert "'exp-nobudget' declares no consumption budget" in found.message
        assert "Pulumi.exp-nobudget.yaml" in found.fix

    def test_protect_data_keeps_dev_datasets_safe(self, root):
        """aml-hpc:protectData: true on dev clears the resource-group retention problem."""
        edit_stack(root, "dev", lambda c: c.update({"aml-hpc:protectData": True}))
        assert violations_of(evaluate("dev", root, now=NOW), "dataset-resource-group-retained") == []

    def test_tcp_multi_node_opt_in_is_advisory(self, root):
        """allowTcpMultiNode on a non-IB size is reported as an advisory, not refused."""
        edit_stack(root, "dev", lambda c: cluster_config(c, "nc-a100").update(maxNodes=2, allowTcpMultiNode=True))
        plan = evaluate("dev", root, now=NOW)
        assert violations_of(plan, "multi-node-infiniband") == []
        (found,) = violations_of(plan, "tcp-multi-node-opted-in")
        assert found.level == "advisory"

    def test_tcp_multi_node_without_visible_opt_in_is_refused(self, root):
        """Until the opt-in shows on the resource, multi-node TCP is refused by the policy."""
        edit_stack(root, "dev", lambda c: cluster_config(c, "nc-a100").update(maxNodes=2, allowTcpMultiNode=True))
        plan = evaluate("dev", root, now=NOW).to_json()
        compute = resource(plan, "cluster-nc-a100-compute")
        if compute["inputs"]["tags"].get("allowTcpMultiNode") == "true":
            compute["inputs"]["tags"].pop("allowTcpMultiNode")
        (found,) = violations_of(plan, "multi-node-infiniband")
        assert "scales to 2 nodes of Standard_NC24ads_A100_v4, which has no InfiniBand" in found.message

    def test_idle_nodes_opt_in_is_advisory(self, root):
        """allowIdleNodes + minNodes 1 is reported with its daily cost, not refused."""
        edit_stack(root, "dev", lambda c: cluster_config(c, "nd-a100").update(minNodes=1, allowIdleNodes=True))
        plan = evaluate("dev", root, now=NOW)
        assert violations_of(plan, "gpu-scale-to-zero") == []
        (found,) = violations_of(plan, "gpu-idle-nodes-opted-in")
        assert "/day" in found.message


class TestAlteredPlan:
    """Rules a valid stack file cannot break: one resource of the dev plan altered."""

    @pytest.fixture
    def plan(self, dev_plan) -> dict:
        return copy.deepcopy(dev_plan)

    def test_idle_nodes_without_opt_in(self, plan):
        """minNodeCount 1 on a cluster without the opt-in tag is refused."""
        scale = resource(plan, "cluster-nd-a100-compute")["inputs"]["properties"]["properties"]["scaleSettings"]
        scale["minNodeCount"] = 1.0
        (found,) = violations_of(plan, "gpu-scale-to-zero")
        assert found.message == "GPU cluster 'nd-a100' keeps 1 node(s) running while idle (minNodes 1)"

    def test_password_login(self, plan):
        """A node password is refused and not echoed."""
        props = resource(plan, "cluster-nd-a100-compute")["inputs"]["properties"]["properties"]
        props["userAccountCredentials"] = {"adminUserName": "azureuser", "adminUserPassword": "P@ssw0rd-hidden"}
        (found,) = violations_of(plan, "no-password-login")
        assert "allows password login" in found.message
        assert "P@ssw0rd" not in render(check_plan(plan), "dev")

    @pytest.mark.parametrize("key,value,expected", [
        ("minimumTlsVersion", "TLS1_0", "accepts TLS below 1.2"),
        ("enableHttpsTrafficOnly", False, "does not require HTTPS"),
        ("allowBlobPublicAccess", True, "does not forbid anonymous blob access"),
    ])
    def test_insecure_dataset_account(self, plan, key, value, expected):
        """Each weakened storage setting on the dataset account is named."""
        resource(plan, "data-account")["inputs"][key] = value
        (found,) = violations_of(plan, "storage-secure")
        assert found.name == "data-account" and expected in found.message

    def test_public_container(self, plan):
        """A public datasets container is refused."""
        resource(plan, "data-datasets")["inputs"]["publicAccess"] = "Container"
        (found,) = violations_of(plan, "storage-secure")
        assert "'datasets' allows anonymous read access" in found.message

    def test_dataset_storage_not_retained(self, plan):
        """Dataset storage neither retained nor protected is refused."""
        options = resource(plan, "data-account")["options"]
        options.update(retainOnDelete=False, protect=False)
        (found,) = violations_of(plan, "dataset-storage-retained")
        assert found.name == "data-account"

    def test_resource_group_retention_decides(self, plan):
        """Retained-only datasets need a retained group; retaining the group clears it."""
        for name in ("data-account", "data-datasets", "data-checkpoints"):
            resource(plan, name)["options"].update(protect=False, retainOnDelete=True)
        group = resource(plan, "core-rg")
        group["options"].update(protect=False, retainOnDelete=False)
        (found,) = violations_of(plan, "dataset-resource-group-retained")
        assert "resource group 'rg-amlhpc-dev' holds dataset storage" in found.message
        group["options"]["retainOnDelete"] = True
        assert violations_of(plan, "dataset-resource-group-retained") == []

    def test_key_vault_without_purge_protection(self, plan):
        """Purge protection off on the workspace's vault is refused."""
        resource(plan, "ml-kv")["inputs"]["properties"]["enablePurgeProtection"] = False
        (found,) = violations_of(plan, "key-vault-purge-protection")
        assert "can be purged" in found.message

    def test_registry_admin_user(self, plan):
        """The registry's admin user is refused."""
        resource(plan, "ml-acr")["inputs"]["adminUserEnabled"] = True
        (found,) = violations_of(plan, "registry-admin-user-off")
        assert found.name == "ml-acr"

    def test_missing_owner_tag(self, plan):
        """A resource without the owner tag is refused, naming it."""
        del resource(plan, "ml-logs")["inputs"]["tags"]["owner"]
        (found,) = violations_of(plan, "required-tags")
        assert found.name == "ml-logs" and "owner" in found.message

    def test_experiment_owning_storage(self, root, dev_plan):
        """An experiment plan that owns a storage account is refused."""
        stack = write_experiment(root, "owner", {"aml-hpc:budget": {"monthlyAmountUsd": 500,
                                                                     "alertEmails": ["me@example.com"]}})
        plan = evaluate(stack, root, now=NOW).to_json()
        assert violations_of(plan, "experiment-clusters-only") == []
        storage = copy.deepcopy(resource(dev_plan, "data-account"))
        storage["urn"] = storage["urn"].replace("urn:pulumi:dev::", f"urn:pulumi:{stack}::")
        storage["inputs"]["tags"]["expiresAt"] = "2026-12-01T00:00:00Z"
        plan["resources"].append(storage)
        (found,) = violations_of(plan, "experiment-clusters-only")
        assert "owns azure-native:storage:StorageAccount" in found.message


class TestCheckPlanApi:
    def test_accepts_a_plan_object(self, root):
        """check_plan takes the Plan as well as its JSON."""
        edit_stack(root, "dev", lambda c: c.pop("aml-hpc:budget"))
        plan = evaluate("dev", root, now=NOW)
        assert [v.rule for v in check_plan(plan)] == [v.rule for v in check_plan(plan.to_json())]

    def test_not_a_plan(self):
        """A document without resources is bad input naming the missing key."""
        with pytest.raises(UserError) as info:
            check_plan({"stack": "dev"})
        assert "resources: is missing" in info.value.render()

    def test_render_lists_level_rule_resource_and_fix(self, dev_plan):
        """The printed block names level, rule, resource and fix."""
        plan = copy.deepcopy(dev_plan)
        resource(plan, "ml-acr")["inputs"]["adminUserEnabled"] = True
        text = render(check_plan(plan), "dev")
        assert "MANDATORY registry-admin-user-off ml-acr:" in text
        assert "fix: set adminUserEnabled: false" in text

    def test_rich_rendering(self, dev_plan):
        """The terminal view shows level, rule, resource, message and fix, markup-safe."""
        import io

        from rich.console import Console

        plan = copy.deepcopy(dev_plan)
        resource(plan, "ml-acr")["inputs"]["adminUserEnabled"] = True
        resource(plan, "ml-acr")["name"] = "ml-acr[bold]"
        out = io.StringIO()
        render_violations(check_plan(plan), Console(file=out, width=200, color_system=None), "dev")
        text = out.getvalue()
        assert "MANDATORY registry-admin-user-off ml-acr[bold]" in text
        assert "fix: set adminUserEnabled: false" in text
        clean = io.StringIO()
        render_violations([], Console(file=clean, color_system=None), "prod")
        assert clean.getvalue().strip() == f"policy: stack 'prod' passes all {len(RULES)} rules"

    def test_render_clean(self, dev_plan):
        """A clean plan says so."""
        assert render(check_plan(dev_plan), "dev") == f"policy: stack 'dev' passes all {len(RULES)} rules"
