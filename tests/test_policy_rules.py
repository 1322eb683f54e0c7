"""Policy rules over hand-made resource views: each rule passes a good resource and names
the problem and the fix for a bad one. Pure functions, no Pulumi."""

from __future__ import annotations

import copy
import importlib
import inspect

import pytest

from amlhpc.core import skus
from amlhpc.infra.policy import RULES, RULES_BY_NAME, Limits, ResourceView, StackView, run_rules
from amlhpc.infra.policy.model import DEFAULT_LIMITS, NotVisible
from amlhpc.infra.policy.rules import (
    BLOB_CONTAINER,
    BUDGET,
    COMPUTE,
    CONTAINER_REGISTRY,
    DATASET_COMPONENT,
    KEY_VAULT,
    RESOURCE_GROUP,
    STORAGE_ACCOUNT,
    TAGGABLE,
    duration_minutes,
)

DEV = StackView("dev", "environment", {"owner": "me@example.com", "environment": "dev"})
EXP = StackView("exp-bert", "experiment", {})
TAGS = {"owner": "me@example.com", "environment": "dev", "stack": "dev"}
EXP_TAGS = {**TAGS, "stack": "exp-bert", "expiresAt": "2026-12-31T00:00:00Z"}

IB_SKU = next(s for s in skus.names() if skus.get(s).infiniband and skus.get(s).price)
TCP_SKU = next(s for s in skus.names() if not skus.get(s).infiniband and skus.get(s).gpus > 0)


def urn(type_token: str, name: str, parent: str | None = None, stack: str = "dev") -> str:
    qualified = f"{parent}${type_token}" if parent else type_token
    return f"urn:pulumi:{stack}::aml-hpc::{qualified}::{name}"


def cluster(*, sku: str = IB_SKU, min_nodes: float = 0.0, max_nodes: float = 2.0, idle: str | None = "PT10M",
            tags: dict | None = None, ssh_key: str | None = None, password: str | None = None,
            public_ip: bool | None = True, port: str | None = "Disabled", subnet: str | None = None,
            protect: bool = False) -> ResourceView:
    scale = {"minNodeCount": min_nodes, "maxNodeCount": max_nodes}
    if idle is not None:
        scale["nodeIdleTimeBeforeScaleDown"] = idle
    props: dict = {"vmSize": sku, "scaleSettings": scale, "osType": "Linux"}
    if public_ip is not None:
        props["enableNodePublicIp"] = public_ip
    if port is not None:
        props["remoteLoginPortPublicAccess"] = port
    if subnet:
        props["subnet"] = {"id": subnet}
    if ssh_key or password:
        creds = {"adminUserName": "azureuser"}
        if ssh_key:
            creds["adminUserSshPublicKey"] = ssh_key
        if password:
            creds["adminUserPassword"] = password
        props["userAccountCredentials"] = creds
    inputs = {"computeName": "gpu", "tags": dict(TAGS if tags is None else tags),
              "properties": {"computeType": "AmlCompute", "properties": props}}
    return ResourceView(urn(COMPUTE, "cluster-gpu-compute", "aml-hpc:compute:GpuCluster"), COMPUTE,
                        "cluster-gpu-compute", inputs, protect=protect, retain_on_delete=False)


def account(name: str = "data-account", parent: str | None = DATASET_COMPONENT, *, protect: bool = False,
            retain: bool | None = True, **overrides) -> ResourceView:
    inputs = {"accountName": "amlhpcdevds1", "enableHttpsTrafficOnly": True, "minimumTlsVersion": "TLS1_2",
              "allowBlobPublicAccess": False, "tags": dict(TAGS)}
    for key, value in overrides.items():
        if value is None:
            inputs.pop(key, None)
        else:
            inputs[key] = value
    return ResourceView(urn(STORAGE_ACCOUNT, name, parent), STORAGE_ACCOUNT, name, inputs,
                        protect=protect, retain_on_delete=retain)


def group(*, protect: bool = False, retain: bool | None = False) -> ResourceView:
    return ResourceView(urn(RESOURCE_GROUP, "core-rg", "aml-hpc:core:ResourceGroup"), RESOURCE_GROUP, "core-rg",
                        {"resourceGroupName": "rg-amlhpc-dev", "tags": dict(TAGS)}, protect=protect,
                        retain_on_delete=retain)


def budget(amount: float = 3000.0, emails: list[str] | None = None, enabled: bool = True) -> ResourceView:
    contact = ["ops@example.com"] if emails is None else emails
    inputs = {"amount": amount, "notifications": {"actual-80": {"enabled": enabled, "threshold": 80.0,
                                                                "contactEmails": contact}}}
    return ResourceView(urn(BUDGET, "budget-budget", "aml-hpc:cost:Budget"), BUDGET, "budget-budget", inputs)


def findings(rule: str, resource: ResourceView, stack: StackView = DEV, limits: Limits = DEFAULT_LIMITS):
    check = RULES_BY_NAME[rule].check_resource
    assert check is not None
    return list(check(resource, stack, limits))


def stack_findings(rule: str, resources: list[ResourceView], stack: StackView = DEV):
    check = RULES_BY_NAME[rule].check_stack
    assert check is not None
    return list(check(resources, stack, Limits()))


class TestRuleSet:
    def test_rule_names_are_unique_and_each_has_one_check(self):
        """Each rule is either a resource or a stack check, never both or neither."""
        assert len({r.name for r in RULES}) == len(RULES)
        for rule in RULES:
            assert (rule.check_resource is None) != (rule.check_stack is None), rule.name
            assert rule.level in ("mandatory", "advisory")

    def test_the_issue_rules_are_all_mandatory(self):
        """Every rule the platform requires blocks a deployment; only opt-in reports are advisory."""
        advisory = {r.name for r in RULES if r.level == "advisory"}
        assert advisory == {"gpu-idle-nodes-opted-in", "tcp-multi-node-opted-in", "dataset-storage-unlocked-opted-in",
                            "managed-network-outbound", "cluster-region-unlisted-opted-in"}


class TestGpuScaleToZero:
    def test_min_zero_passes(self):
        """A cluster that scales to zero breaks neither idle-node rule."""
        assert findings("gpu-scale-to-zero", cluster()) == []
        assert findings("gpu-idle-nodes-opted-in", cluster()) == []

    def test_idle_nodes_without_opt_in_are_mandatory(self):
        """minNodes > 0 without the allowIdleNodes tag names the cluster, the count and the opt-in."""
        (found,) = findings("gpu-scale-to-zero", cluster(min_nodes=2.0))
        assert "'gpu' keeps 2 node(s)" in found.message
        assert "minNodes: 0" in found.fix and "allowIdleNodes: true" in found.fix

    def test_opt_in_downgrades_to_advisory_with_the_cost(self):
        """With the tag, the mandatory rule is quiet and the advisory one prices the idle nodes."""
        opted = cluster(min_nodes=1.0, tags={**TAGS, "allowIdleNodes": "true"})
        assert findings("gpu-scale-to-zero", opted) == []
        (found,) = findings("gpu-idle-nodes-opted-in", opted)
        daily = skus.get(IB_SKU).price.usd_per_hour * 24
        assert f"${daily:,.0f}/day" in found.message

    def test_non_gpu_clusters_are_not_judged(self):
        """CPU clusters are outside the GPU rules."""
        cpu = cluster(sku="Standard_D4s_v5", min_nodes=1.0, max_nodes=4.0, idle=None)
        for rule in ("gpu-scale-to-zero", "gpu-idle-scale-down", "multi-node-infiniband"):
            assert findings(rule, cpu) == []


class TestGpuIdleScaleDown:
    def test_within_limit_passes(self):
        """An idle time at the limit passes."""
        assert findings("gpu-idle-scale-down", cluster(idle="PT30M"), limits=Limits(30)) == []

    def test_over_limit_names_minutes_and_limit(self):
        """An idle time over the limit reports both numbers and the key to change."""
        (found,) = findings("gpu-idle-scale-down", cluster(idle="PT1H"), limits=Limits(30))
        assert "60 minutes (PT1H)" in found.message and "limit is 30" in found.message
        assert "idleMinutes" in found.fix

    def test_limit_is_configurable(self):
        """The same cluster passes under a looser limit."""
        assert findings("gpu-idle-scale-down", cluster(idle="PT1H"), limits=Limits(90)) == []

    def test_unset_and_malformed_fail(self):
        """Without a parsable scale-down time the rule cannot confirm nodes are released."""
        (unset,) = findings("gpu-idle-scale-down", cluster(idle=None))
        assert "unset" in unset.message
        (bad,) = findings("gpu-idle-scale-down", cluster(idle="20 minutes"))
        assert "'20 minutes'" in bad.message and "not an ISO 8601 duration" in bad.message

    @pytest.mark.parametrize("text,minutes", [("PT20M", 20), ("PT120S", 2), ("PT1H30M", 90), ("P1D", 1440),
                                              ("PT90S", 1.5)])
    def test_durations(self, text, minutes):
        """ISO 8601 durations convert to minutes."""
        assert duration_minutes(text) == minutes

    @pytest.mark.parametrize("text", ["", "P", "PT", "20M", "PT20", "P1DT"])
    def test_not_durations(self, text):
        """Malformed durations are rejected, not read as zero."""
        assert duration_minutes(text) is None


class TestSsh:
    KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleKeyMaterial"

    def test_enabled_port_on_public_nodes_is_public_ssh(self):
        """SSH with the port Enabled on public IPs is refused, with both ways out."""
        (found,) = findings("no-public-ssh", cluster(ssh_key=self.KEY, port="Enabled"))
        assert "opens SSH (port 22)" in found.message
        assert "ssh block" in found.fix and "isolation: private" in found.fix

    def test_not_specified_without_vnet_is_public(self):
        """NotSpecified means open on public nodes outside a VNet (Azure's semantics)."""
        assert findings("no-public-ssh", cluster(ssh_key=self.KEY, port="NotSpecified"))
        assert findings("no-public-ssh", cluster(ssh_key=self.KEY, port=None))

    def test_not_specified_in_a_vnet_is_closed(self):
        """NotSpecified with a subnet keeps the port closed."""
        assert findings("no-public-ssh", cluster(ssh_key=self.KEY, port="NotSpecified", subnet="/sub/x")) == []

    def test_no_public_ip_is_never_public(self):
        """Nodes without public IPs cannot expose SSH, whatever the port setting."""
        assert findings("no-public-ssh", cluster(ssh_key=self.KEY, port="Enabled", public_ip=False)) == []

    def test_no_credentials_no_ssh(self):
        """Without credentials there is no SSH to expose."""
        assert findings("no-public-ssh", cluster(port="Enabled")) == []

    def test_password_is_refused_and_never_echoed(self):
        """A password login is refused and the message does not contain the password."""
        (found,) = findings("no-password-login", cluster(password="hunter2-Secret!", public_ip=False))
        assert "password login" in found.message
        assert "hunter2" not in found.message + found.fix

    def test_key_only_passes_password_rule(self):
        """Key-only SSH passes the password rule."""
        assert findings("no-password-login", cluster(ssh_key=self.KEY)) == []


class TestMultiNodeInfiniband:
    def test_ib_size_passes(self):
        """An InfiniBand size may scale out."""
        assert findings("multi-node-infiniband", cluster(sku=IB_SKU, max_nodes=8.0)) == []

    def test_tcp_size_multi_node_fails_and_lists_ib_sizes(self):
        """A non-IB size over one node is refused; the fix lists the IB sizes from the catalog."""
        (found,) = findings("multi-node-infiniband", cluster(sku=TCP_SKU, max_nodes=2.0))
        assert TCP_SKU in found.message and "no InfiniBand" in found.message
        assert IB_SKU in found.fix and "maxNodes: 1" in found.fix

    def test_single_node_tcp_size_passes(self):
        """One node needs no InfiniBand."""
        assert findings("multi-node-infiniband", cluster(sku=TCP_SKU, max_nodes=1.0)) == []

    def test_opt_in_downgrades_to_advisory(self):
        """With allowTcpMultiNode the mandatory rule is quiet and the advisory one reports."""
        opted = cluster(sku=TCP_SKU, max_nodes=2.0, tags={**TAGS, "allowTcpMultiNode": "true"})
        assert findings("multi-node-infiniband", opted) == []
        (found,) = findings("tcp-multi-node-opted-in", opted)
        assert "over TCP by choice" in found.message

    def test_unknown_size_is_judged_by_its_name(self):
        """Sizes missing from the catalog are judged by Azure's naming ('r' = RDMA) and say so."""
        (found,) = findings("multi-node-infiniband", cluster(sku="Standard_NC48ads_H200_v9", max_nodes=4.0))
        assert "inferred from the size name" in found.message
        assert findings("multi-node-infiniband", cluster(sku="Standard_ND192isr_B200_v9", max_nodes=4.0)) == []


class TestStorage:
    def test_secure_account_passes(self):
        """HTTPS only, TLS 1.2 and no public blobs pass."""
        assert findings("storage-secure", account()) == []

    @pytest.mark.parametrize("override,expected", [
        ({"enableHttpsTrafficOnly": False}, "does not require HTTPS"),
        ({"enableHttpsTrafficOnly": None}, "does not require HTTPS"),
        ({"minimumTlsVersion": "TLS1_0"}, "minimumTlsVersion TLS1_0"),
        ({"minimumTlsVersion": None}, "unset, which Azure reads as TLS1_0"),
        ({"allowBlobPublicAccess": True}, "anonymous blob access"),
        ({"allowBlobPublicAccess": None}, "anonymous blob access"),
    ])
    def test_each_weakness_is_named(self, override, expected):
        """Each insecure or missing setting gets its own message naming the account."""
        (found,) = findings("storage-secure", account(**override))
        assert expected in found.message and "'amlhpcdevds1'" in found.message

    def test_tls13_passes(self):
        """TLS 1.3 is stricter than the floor."""
        assert findings("storage-secure", account(minimumTlsVersion="TLS1_3")) == []

    def test_public_container_fails(self):
        """A container with anonymous access is refused."""
        container = ResourceView(urn(BLOB_CONTAINER, "data-datasets", DATASET_COMPONENT), BLOB_CONTAINER,
                                 "data-datasets", {"containerName": "datasets", "publicAccess": "Blob"})
        (found,) = findings("storage-secure", container)
        assert "'datasets' allows anonymous read access" in found.message

    def test_dataset_storage_must_be_retained_or_protected(self):
        """Dataset storage that `pulumi destroy` would delete is refused; retained or protected passes."""
        (found,) = findings("dataset-storage-retained", account(retain=False))
        assert "would be deleted" in found.message and "retain_on_delete=True" in found.fix
        assert findings("dataset-storage-retained", account(retain=True)) == []
        assert findings("dataset-storage-retained", account(retain=False, protect=True)) == []

    def test_workspace_storage_need_not_be_retained(self):
        """Only storage under the DatasetStorage component holds datasets."""
        ws = account("ml-storage", parent="aml-hpc:ml:Workspace", retain=False)
        assert findings("dataset-storage-retained", ws) == []

    def test_retention_unknown_is_not_visible(self):
        """The policy pack cannot see retainOnDelete: the rule says so instead of guessing."""
        with pytest.raises(NotVisible, match="infra plan"):
            findings("dataset-storage-retained", account(retain=None))

    def test_group_of_retained_only_data_must_be_kept(self):
        """Retained-only dataset storage in a deletable resource group is refused, naming the group."""
        (found,) = stack_findings("dataset-resource-group-retained", [group(), account(retain=True)])
        assert "'rg-amlhpc-dev'" in found.message and "data-account" in found.message
        assert found.urn == group().urn

    @pytest.mark.parametrize("resources", [
        [group(retain=True), account(retain=True)],
        [group(protect=True), account(retain=True)],
        [group(), account(protect=True)],
    ])
    def test_group_rule_passes_when_data_survives(self, resources):
        """A retained/protected group, or protected data, keeps the datasets."""
        assert stack_findings("dataset-resource-group-retained", resources) == []


class TestSecretsAndImages:
    def vault(self, **props) -> ResourceView:
        base = {"enablePurgeProtection": True, "enableSoftDelete": True, "tenantId": "t"}
        base.update(props)
        return ResourceView(urn(KEY_VAULT, "ml-kv", "aml-hpc:ml:Workspace"), KEY_VAULT, "ml-kv",
                            {"vaultName": "kv-amlhpc-dev", "properties": base, "tags": dict(TAGS)})

    def test_vault_with_purge_protection_passes(self):
        """Purge protection on passes."""
        assert findings("key-vault-purge-protection", self.vault()) == []

    def test_vault_without_purge_protection_fails(self):
        """Missing or false purge protection is refused, naming the vault."""
        (found,) = findings("key-vault-purge-protection", self.vault(enablePurgeProtection=False))
        assert "'kv-amlhpc-dev' can be purged" in found.message
        props = {"tenantId": "t"}
        bare = ResourceView(urn(KEY_VAULT, "kv"), KEY_VAULT, "kv", {"properties": props})
        assert findings("key-vault-purge-protection", bare)

    def test_soft_delete_off_fails(self):
        """Disabling soft delete defeats purge protection."""
        (found,) = findings("key-vault-purge-protection", self.vault(enableSoftDelete=False))
        assert "disables soft delete" in found.message

    def test_registry_admin_user(self):
        """The admin user is refused; off or unset (Azure's default is off) passes."""
        def registry(**inputs):
            return ResourceView(urn(CONTAINER_REGISTRY, "ml-acr"), CONTAINER_REGISTRY, "ml-acr",
                                {"registryName": "amlhpcdevacr", **inputs})
        (found,) = findings("registry-admin-user-off", registry(adminUserEnabled=True))
        assert "'amlhpcdevacr' enables the shared admin user" in found.message
        assert findings("registry-admin-user-off", registry(adminUserEnabled=False)) == []
        assert findings("registry-admin-user-off", registry()) == []


class TestBudget:
    def test_stack_with_alerting_budget_passes(self):
        """A positive budget that emails someone passes."""
        assert stack_findings("stack-budget", [group(), budget()]) == []

    def test_no_budget_names_the_stack_file_key(self):
        """A stack without a budget is told which key to add to which file."""
        (found,) = stack_findings("stack-budget", [group()], StackView("exp-bert", "experiment"))
        assert "'exp-bert' declares no consumption budget" in found.message
        assert "Pulumi.exp-bert.yaml" in found.fix and "aml-hpc:budget" in found.fix
        assert found.urn is None

    def test_budget_that_alerts_nobody_fails(self):
        """No contacts, or only disabled notifications, alert nobody."""
        (silent,) = stack_findings("stack-budget", [budget(emails=[])])
        assert "alerts nobody" in silent.message
        assert stack_findings("stack-budget", [budget(enabled=False)])

    def test_zero_amount_fails(self):
        """A zero budget is no budget."""
        (found,) = stack_findings("stack-budget", [budget(amount=0.0)])
        assert "no positive amount" in found.message


class TestRequiredTags:
    def test_tagged_resource_passes(self):
        """owner and environment present pass on environment stacks."""
        assert findings("required-tags", account()) == []

    def test_missing_tags_are_listed(self):
        """Every missing required tag is named."""
        bare = account(tags={"stack": "dev"})
        (found,) = findings("required-tags", bare)
        assert "owner, environment" in found.message

    def test_taggable_type_without_tags_input_is_checked(self):
        """A taggable type that forgot its tags entirely is caught."""
        vnet = ResourceView(urn("azure-native:network:VirtualNetwork", "net"), "azure-native:network:VirtualNetwork",
                            "net", {"virtualNetworkName": "v"})
        assert findings("required-tags", vnet)

    def test_untaggable_type_is_skipped(self):
        """Role assignments have no tags to check."""
        role = ResourceView(urn("azure-native:authorization:RoleAssignment", "r"),
                            "azure-native:authorization:RoleAssignment", "r", {"principalId": "p"})
        assert findings("required-tags", role) == []

    def test_experiments_need_a_readable_expiry(self):
        """Experiment resources need expiresAt, as an ISO date teardown can read."""
        (missing,) = findings("required-tags", cluster(tags=TAGS), EXP)
        assert "expiresAt" in missing.message
        assert findings("required-tags", cluster(tags=EXP_TAGS), EXP) == []
        (bad,) = findings("required-tags", cluster(tags={**EXP_TAGS, "expiresAt": "next tuesday"}), EXP)
        assert "'next tuesday'" in bad.message


class TestExperimentClustersOnly:
    def test_clusters_and_budgets_pass(self):
        """Experiments may own clusters and budgets."""
        assert findings("experiment-clusters-only", cluster(tags=EXP_TAGS), EXP) == []
        assert findings("experiment-clusters-only", budget(), EXP) == []

    def test_storage_in_an_experiment_fails(self):
        """Storage in an experiment stack would be destroyed by teardown: refused."""
        (found,) = findings("experiment-clusters-only", account(), EXP)
        assert "owns azure-native:storage:StorageAccount" in found.message
        assert "environment stack" in found.fix

    def test_environment_stacks_may_own_anything(self):
        """The rule is about experiments only."""
        assert findings("experiment-clusters-only", account(), DEV) == []


class TestRunRules:
    def test_sorted_mandatory_first_with_levels(self):
        """run_rules reports every rule's findings, mandatory before advisory."""
        resources = [group(retain=True), account(), budget(),
                     cluster(min_nodes=1.0, tags={**TAGS, "allowIdleNodes": "true"}, idle="PT2H")]
        violations = run_rules(resources, DEV)
        assert [(v.rule, v.level) for v in violations] == [
            ("gpu-idle-scale-down", "mandatory"), ("gpu-idle-nodes-opted-in", "advisory")]

    def test_input_is_not_mutated(self):
        """Rules read; they never change the resource inputs."""
        resource = cluster(ssh_key=TestSsh.KEY, port="Enabled")
        before = copy.deepcopy(dict(resource.inputs))
        run_rules([resource], DEV)
        assert dict(resource.inputs) == before


class TestViews:
    def test_type_chain_from_urn(self):
        """The URN's qualified type gives the parent component chain."""
        view = account()
        assert view.type_chain == (DATASET_COMPONENT, STORAGE_ACCOUNT)
        assert view.within(DATASET_COMPONENT) and not view.within("aml-hpc:ml:Workspace")

    def test_stack_kind_from_name(self):
        """exp-* stacks are experiments, fully qualified or not."""
        assert StackView.kind_of("exp-a") == "experiment"
        assert StackView.kind_of("organization/aml-hpc/exp-a") == "experiment"
        assert StackView.kind_of("prod") == "environment"


def _sdk_class(type_token: str):
    _, module, name = type_token.split(":")
    return getattr(importlib.import_module(f"pulumi_azure_native.{module}"), name)


@pytest.mark.parametrize("type_token", sorted(TAGGABLE | {
    BLOB_CONTAINER, BUDGET, "azure-native:storage:BlobServiceProperties", "azure-native:network:Subnet",
    "azure-native:authorization:RoleAssignment", "azure-native:machinelearningservices:Datastore",
    "azure-native:network:PrivateDnsZoneGroup",
}))
def test_taggable_list_matches_the_sdk(type_token):
    """TAGGABLE holds exactly the types whose pulumi-azure-native resource takes `tags`."""
    params = inspect.signature(_sdk_class(type_token)._internal_init).parameters
    assert ("tags" in params) == (type_token in TAGGABLE)
