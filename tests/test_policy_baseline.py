"""The security baseline on a prod stack: each insecure configuration is refused by a mandatory
rule naming the resource and the fix; the same configuration in dev passes the network rules
(dev is public by design) but never the role rules.

The stacks are the shipped Pulumi.prod.yaml with one thing changed, evaluated as the offline
plan does (the real program under Pulumi's mocks); what the stack file cannot express (a
wildcard rule, an Owner assignment, a stray public IP) is added to the plan's resources, as
another branch of the program or a hand-written resource would add it."""

from __future__ import annotations

import copy

import pytest
import yaml

from amlhpc.core.errors import UserError
from amlhpc.infra.config import REPO_ROOT
from amlhpc.infra.plan import evaluate
from amlhpc.infra.policy import check_plan, render
from amlhpc.infra.policy.outbound import allowed_hosts

PROD = yaml.safe_load((REPO_ROOT / "Pulumi.prod.yaml").read_text())["config"]
ROLE = "azure-native:authorization:RoleAssignment"
# Azure's built-in role GUIDs (Azure built-in roles: privileged, general).
OWNER, UAA, RBAC_ADMIN = ("8e3af657-a8ff-443c-a75c-2fe8c4bcb635", "18d7d88d-d35e-4fb5-a5c3-7773c20a72d9",
                          "f58310d9-a9f6-439a-9e8d-f62e7b41a168")


def prod_with(tmp_path, name: str = "prod", **changes) -> dict:
    config = copy.deepcopy(PROD)
    for key, value in changes.items():
        config[f"aml-hpc:{key}"] = value
    (tmp_path / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": config}))
    return evaluate(name, tmp_path).to_json()


def mandatory(plan: dict) -> dict[str, list]:
    out: dict[str, list] = {}
    for v in check_plan(plan):
        if v.level == "mandatory":
            out.setdefault(v.rule, []).append(v)
    return out


@pytest.fixture(scope="module")
def prod() -> dict:
    return evaluate("prod").to_json()


def with_resource(plan: dict, type_token: str, name: str, inputs: dict) -> dict:
    plan = copy.deepcopy(plan)
    plan["resources"].append({"urn": f"urn:pulumi:prod::aml-hpc::{type_token}::{name}", "type": type_token,
                              "name": name, "custom": True, "inputs": inputs, "options": {}})
    return plan


def role_assignment(guid: str, condition: str | None = None, environment: str = "prod") -> dict:
    inputs = {"roleDefinitionId": f"/subscriptions/s/providers/Microsoft.Authorization/roleDefinitions/{guid}",
              "principalId": "11111111-2222-3333-4444-555555555555", "principalType": "User",
              "scope": "/subscriptions/s/resourceGroups/rg-amlhpc-prod", "tags": {"environment": environment}}
    if condition is not None:
        inputs |= {"condition": condition, "conditionVersion": "2.0"}
    return inputs


def test_shipped_prod_passes_every_mandatory_rule(prod):
    assert mandatory(prod) == {}, render(check_plan(prod), "prod")


class TestNetwork:
    def test_prod_on_the_public_internet_is_refused(self, tmp_path):
        """isolation: public on prod used to pass every rule."""
        found = mandatory(prod_with(tmp_path, network={"isolation": "public"}))
        public = {v.name for v in found["no-public-network-access"]}
        assert {"data-account", "ml-storage", "ml-kv", "ml-acr", "ml-mlw", "registry-registry"} <= public
        assert all("environment 'prod'" in v.message and "isolation: managed" in v.fix
                   for v in found["no-public-network-access"])
        assert {v.name for v in found["no-public-ips"]} == {"cluster-nd-h100-compute", "controller-compute"}

    def test_internet_outbound_is_refused_not_advised(self, tmp_path):
        network = {**PROD["aml-hpc:network"], "outbound": "AllowInternetOutbound"}
        network.pop("fqdnRules")
        network.pop("firewallSku")
        [v] = mandatory(prod_with(tmp_path, network=network))["no-internet-outbound"]
        assert "any host on the internet" in v.message and "AllowOnlyApprovedOutbound" in v.fix

    def test_prod_on_a_private_network_is_refused(self, tmp_path):
        """isolation: private passed every rule, and its jobs reached the internet through the NAT gateway."""
        network = {"isolation": "private", "addressSpace": "10.40.0.0/16", "endpointSubnet": "10.40.128.0/18",
                   "wayIn": PROD["aml-hpc:network"]["wayIn"]}
        found = mandatory(prod_with(tmp_path, network=network))
        assert set(found) == {"egress-controlled"}, found
        [v] = found["egress-controlled"]
        assert "NAT gateway" in v.message and "AllowOnlyApprovedOutbound" in v.fix

    def test_a_host_not_on_the_allow_list_is_refused(self, tmp_path):
        network = {**PROD["aml-hpc:network"], "fqdnRules": ["pypi.org", "github.com"]}
        [v] = mandatory(prod_with(tmp_path, network=network))["outbound-fqdn-allow-listed"]
        assert "'github.com'" in v.message and "amlhpc/infra/policy/outbound.toml" in v.fix

    def test_a_wildcard_is_refused_by_config_and_by_policy(self, tmp_path, prod):
        with pytest.raises(UserError, match=r"fqdnRules\[0\]: '\*.ngrok.io' is a wildcard"):
            prod_with(tmp_path, network={**PROD["aml-hpc:network"], "fqdnRules": ["*.ngrok.io"]})
        plan = copy.deepcopy(prod)
        ws = next(r for r in plan["resources"] if r["type"] == "azure-native:machinelearningservices:Workspace")
        ws["inputs"]["managedNetwork"]["outboundRules"]["fqdn-s3"] = {"type": "FQDN", "destination": "*.amazonaws.com",
                                                                      "category": "UserDefined"}
        [v] = mandatory(plan)["outbound-fqdn-allow-listed"]
        assert "wildcard '*.amazonaws.com'" in v.message

    def test_a_public_ip_that_is_not_bastions_or_nats_is_refused(self, prod):
        plan = with_resource(prod, "azure-native:network:PublicIPAddress", "stray-ip",
                             {"publicIpAddressName": "pip-stray", "tags": {"environment": "prod"}})
        [v] = mandatory(plan)["no-public-ips"]
        assert v.name == "stray-ip" and "neither Azure Bastion nor a NAT gateway" in v.message

    def test_the_way_ins_bastion_and_nat_ips_are_accepted(self, prod):
        ips = sorted(r["name"] for r in prod["resources"] if r["type"] == "azure-native:network:PublicIPAddress")
        assert ips == ["way-in-bastion-ip", "way-in-nat-ip"] and "no-public-ips" not in mandatory(prod)

    def test_dev_stays_public_by_design(self):
        assert {"no-public-network-access", "no-public-ips", "no-shared-key-storage"}.isdisjoint(
            mandatory(evaluate("dev").to_json()))


class TestStorage:
    def test_an_account_key_on_the_workspace_storage_is_refused(self, tmp_path):
        [v] = mandatory(prod_with(tmp_path, workspaceStorageAuth="accessKey"))["no-shared-key-storage"]
        assert v.name == "ml-storage" and "workspaceStorageAuth: identity" in v.fix

    def test_shared_key_on_the_dataset_account_is_refused(self, tmp_path):
        storage = {**PROD["aml-hpc:storage"], "allowSharedKeyAccess": True}
        [v] = mandatory(prod_with(tmp_path, storage=storage))["no-shared-key-storage"]
        assert v.name == "data-account" and "allowSharedKeyAccess: false" in v.fix


class TestRoles:
    @pytest.mark.parametrize("guid, name", [(OWNER, "Owner"), (UAA, "User Access Administrator"),
                                            (RBAC_ADMIN, "Role Based Access Control Administrator")])
    @pytest.mark.parametrize("environment", ["prod", "dev"])
    def test_privileged_roles_are_refused_everywhere(self, prod, guid, name, environment):
        plan = with_resource(prod, ROLE, "grant-everything", role_assignment(guid, environment=environment))
        [v] = mandatory(plan)["no-privileged-roles"]
        assert f"gives {name} with no condition" in v.message and "constrain-roles" in v.fix

    def test_rbac_administrator_needs_a_condition_that_constrains_roles(self, prod):
        from amlhpc.core.permissions import MODEL

        loose = "@Resource[Microsoft.Storage/storageAccounts/blobServices/containers:ContainerName] StringEquals 'x'"
        [v] = mandatory(with_resource(prod, ROLE, "loose", role_assignment(RBAC_ADMIN, loose)))["no-privileged-roles"]
        assert "is not the model's constrain-roles condition" in v.message
        tight = role_assignment(RBAC_ADMIN, MODEL.constrain_roles_condition("s"))
        assert "no-privileged-roles" not in mandatory(with_resource(prod, ROLE, "tight", tight))

    def test_a_condition_that_also_allows_owner_is_refused(self, prod):
        """It holds the model's clauses (a substring test passed it), with Owner added to the list."""
        from amlhpc.core.permissions import MODEL

        exact = MODEL.constrain_roles_condition("s")
        with_owner = exact.replace("GuidEquals {", "GuidEquals {" + OWNER + ", ")
        assert with_owner != exact
        [v] = mandatory(with_resource(prod, ROLE, "deploy-role-assignments",
                                      role_assignment(RBAC_ADMIN, with_owner)))["no-privileged-roles"]
        assert "not the model's constrain-roles condition" in v.message and "word for word" in v.fix

    @pytest.mark.parametrize("name", ["access-gpu-contributor", "access-checkpoints-write"])
    def test_contributor_on_the_gpu_identity_is_refused(self, prod, name):
        """Contributor is a role some right names (the deploy identity's): that alone let it
        through. Named after no right, or after the GPU identity's checkpoint right: refused."""
        contributor = "b24988ac-6180-42a0-ab88-20f7382dd24c"
        plan = with_resource(prod, ROLE, name, {**role_assignment(contributor), "principalType": "ServicePrincipal"})
        [v] = mandatory(plan)["role-in-permission-model"]
        assert repr(name) in v.message and ("no right's key" in v.message or "not Storage Blob Data Contributor" in v.message)

    def test_the_gpu_identitys_workspace_storage_right_without_its_condition_is_refused(self, prod):
        """The job-writes-only condition keeps jobs off every code snapshot: dropped, it is refused."""
        plan = copy.deepcopy(prod)
        (grant,) = [r for r in plan["resources"] if r["name"] == "access-compute-ws-storage"]
        del grant["inputs"]["condition"], grant["inputs"]["conditionVersion"]
        [v] = mandatory(plan)["role-in-permission-model"]
        assert "no condition, not the model's job-writes-only" in v.message

    def test_a_right_at_the_wrong_scope_is_refused(self, prod):
        plan = copy.deepcopy(prod)
        (grant,) = [r for r in plan["resources"] if r["name"] == "access-datasets-read"]
        grant["inputs"]["scope"] = grant["inputs"]["scope"].replace("/containers/datasets", "/containers/supervision")
        [v] = mandatory(plan)["role-in-permission-model"]
        assert "not the model's container:datasets" in v.message

    def test_a_role_outside_the_model_is_refused(self, prod):
        network_contributor = "4d97b98b-1d4f-4787-a291-c67834d212e7"  # Azure built-in roles, networking
        [v] = mandatory(with_resource(prod, ROLE, "extra", role_assignment(network_contributor)))["role-in-permission-model"]
        assert network_contributor in v.message and "amlhpc/core/catalog/permissions.toml" in v.fix


class TestTheEnvironmentIsTheStack:
    """One line, `aml-hpc:environment: dev` in Pulumi.prod.yaml, once switched the baseline off: the
    policy read "outside dev" from a tag the config writes. An environment stack is its name."""

    def test_the_config_refuses_another_environment_on_an_environment_stack(self, tmp_path):
        with pytest.raises(UserError) as info:
            prod_with(tmp_path, environment="dev")
        text = info.value.render()
        assert "aml-hpc:environment" in text and "'dev' is not this stack" in text
        assert "remove aml-hpc:environment from Pulumi.prod.yaml" in text

    def test_the_same_name_is_accepted(self, tmp_path):
        assert mandatory(prod_with(tmp_path, environment="prod")) == {}

    def test_prod_tagged_dev_public_and_with_shared_keys_is_refused(self, tmp_path):
        """What the red team deployed, past the config: every resource tagged dev, public, keys on."""
        storage = {**PROD["aml-hpc:storage"], "allowSharedKeyAccess": True}
        plan = prod_with(tmp_path, network={"isolation": "public"}, storage=storage, workspaceStorageAuth="accessKey")
        for r in plan["resources"]:
            if isinstance((r.get("inputs") or {}).get("tags"), dict):
                r["inputs"]["tags"]["environment"] = "dev"
        plan["outputs"]["tags"]["environment"] = "dev"
        plan["outputs"]["environment"] = "dev"
        found = mandatory(plan)
        assert {"data-account", "ml-storage"} <= {v.name for v in found["no-public-network-access"]}
        assert {v.name for v in found["no-shared-key-storage"]} == {"data-account", "ml-storage"}
        assert "environment-tag-is-the-stacks" in found
        assert "tagged environment 'dev' in stack 'prod'" in found["environment-tag-is-the-stacks"][0].message

    def test_an_experiment_follows_its_environment(self, prod):
        from amlhpc.infra.policy import ResourceView, StackView, run_rules

        public = ResourceView("urn:pulumi:exp-x::aml-hpc::azure-native:machinelearningservices:Compute::c",
                              "azure-native:machinelearningservices:Compute", "c",
                              {"computeName": "c", "tags": {"environment": "dev"},
                               "properties": {"computeType": "AmlCompute", "properties": {"vmSize": "Standard_D4s_v3"}}})
        on = {env: {v.rule for v in run_rules([public], StackView("exp-x", "experiment", environment=env))}
              for env in ("dev", "prod", None)}
        assert "no-public-ips" not in on["dev"]
        assert "no-public-ips" in on["prod"] and "environment-tag-is-the-stacks" in on["prod"]
        assert "no-public-ips" in on[None], "an experiment whose environment is unknown is outside dev"


def test_default_outbound_rules_are_all_allow_listed():
    from amlhpc.infra.config import DEFAULT_FQDN_RULES

    assert set(DEFAULT_FQDN_RULES) <= set(allowed_hosts())
    assert "github.com" not in allowed_hosts()


class TestDatasetsKeptOutsideDev:
    """`protectData: false` with the dataset lock off passed every rule in prod: nothing kept the
    datasets from `pulumi destroy`, the portal or the CLI."""

    def test_neither_protected_nor_locked_is_refused_in_prod(self, tmp_path):
        plan = prod_with(tmp_path, protectData=False, locks={"datasetStorage": False})
        [v] = mandatory(plan)["dataset-storage-kept"]
        assert "neither protected nor locked outside dev" in v.message and "aml-hpc:protectData: false" in v.fix

    @pytest.mark.parametrize("changes", [{"protectData": False, "locks": {"datasetStorage": True}},
                                         {"locks": {"datasetStorage": False}}])
    def test_either_one_is_enough(self, tmp_path, changes):
        assert "dataset-storage-kept" not in mandatory(prod_with(tmp_path, **changes))

    def test_dev_may_keep_neither(self):
        assert "dataset-storage-kept" not in mandatory(evaluate("dev").to_json())
