"""The hardening policy rules over hand-made resource views: each passes the good case and
names the problem and the fix for the bad one (delete locks, managed networks, diagnostics,
key size, the jump box)."""

from __future__ import annotations

import importlib
import inspect

import pytest

from amlhpc.infra import quirks
from amlhpc.infra.policy import RULES_BY_NAME, ResourceView, StackView, run_rules
from amlhpc.infra.policy.model import DEFAULT_LIMITS
from amlhpc.infra.policy.rules import (
    COMPUTE,
    DIAGNOSTIC_SETTING,
    KEY_VAULT,
    KEY_VAULT_KEY,
    LOCK_AT_RESOURCE,
    LOCK_BY_SCOPE,
    NETWORK_INTERFACE,
    TAG_ALLOW_UNLOCKED,
    TAGGABLE,
    VIRTUAL_MACHINE,
    WORKSPACE,
)
from tests.test_policy_rules import TAGS, account, cluster, urn

STACK = StackView("stage", "environment", {"owner": "me@example.com", "environment": "stage"})
ACCOUNT_ID = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/amlhpcdevds1"


def findings(rule: str, resources: list[ResourceView]) -> list:
    return [v for v in run_rules(resources, STACK, DEFAULT_LIMITS) if v.rule == rule]


def view(type_token: str, name: str, inputs: dict, **kw) -> ResourceView:
    return ResourceView(urn(type_token, name), type_token, name, inputs, **kw)


def lock(scope: str = ACCOUNT_ID, level: str = "CanNotDelete") -> ResourceView:
    return view(LOCK_BY_SCOPE, "data-lock", {"lockName": "do-not-delete", "level": level, "scope": scope})


def managed_workspace(mode: str = "AllowOnlyApprovedOutbound", **network) -> ResourceView:
    return view(WORKSPACE, "ml-mlw", {"workspaceName": "mlw-x", "tags": dict(TAGS),
                                      "managedNetwork": {"isolationMode": mode, **network}})


class TestDatasetLock:
    def test_protected_data_without_a_lock_is_refused(self):
        [v] = findings("dataset-storage-locked", [account(protect=True)])
        assert v.level == "mandatory" and "'amlhpcdevds1' has no delete lock" in v.message
        assert "locks.datasetStorage" in v.fix

    @pytest.mark.parametrize("the_lock", [
        lock(), lock(level="ReadOnly"), lock(scope=ACCOUNT_ID.upper()),
        view(LOCK_AT_RESOURCE, "data-lock", {"level": "CanNotDelete", "resourceProviderNamespace": "Microsoft.Storage",
                                             "resourceType": "storageAccounts", "resourceName": "amlhpcdevds1"}),
    ])
    def test_a_lock_on_the_account_satisfies_it(self, the_lock):
        assert findings("dataset-storage-locked", [account(protect=True), the_lock]) == []

    def test_a_lock_elsewhere_does_not(self):
        elsewhere = lock(scope=ACCOUNT_ID.replace("amlhpcdevds1", "otheraccount"))
        assert len(findings("dataset-storage-locked", [account(protect=True), elsewhere])) == 1
        assert len(findings("dataset-storage-locked", [account(protect=True), lock(level="NotSpecified")])) == 1

    def test_unprotected_data_needs_no_lock(self):
        assert findings("dataset-storage-locked", [account(protect=False)]) == []

    def test_opting_out_downgrades_to_a_report(self):
        opted = account(protect=True, tags={**TAGS, TAG_ALLOW_UNLOCKED: "true"})
        assert findings("dataset-storage-locked", [opted]) == []
        [v] = findings("dataset-storage-unlocked-opted-in", [opted])
        assert v.level == "advisory" and "not locked in Azure by choice" in v.message


class TestLockedScopeProtected:
    """What a lock's scope holds must be protected, or `make down` fails with ScopeLocked."""

    CONTAINER = f"{ACCOUNT_ID}/blobServices/default/containers/datasets"
    INSIDE = [
        ("azure-native:authorization:RoleAssignment", {"scope": CONTAINER}),
        ("azure-native:authorization:RoleAssignment", {"scope": ACCOUNT_ID.upper()}),
        (DIAGNOSTIC_SETTING, {"resourceUri": f"{ACCOUNT_ID}/blobServices/default"}),
        ("azure-native:network:PrivateEndpoint", {"privateLinkServiceConnections": [{"privateLinkServiceId": ACCOUNT_ID}]}),
    ]

    @pytest.mark.parametrize(("type_token", "inputs"), INSIDE)
    def test_unprotected_under_the_lock_is_refused_and_protected_passes(self, type_token, inputs):
        [v] = findings("locked-scope-protected", [lock(), view(type_token, "x", inputs)])
        assert v.level == "mandatory" and "under the delete lock on 'amlhpcdevds1'" in v.message
        assert "ScopeLocked" in v.message and "protect=True" in v.fix
        assert findings("locked-scope-protected", [lock(), view(type_token, "x", inputs, protect=True)]) == []

    @pytest.mark.parametrize(("type_token", "inputs"), INSIDE)
    def test_without_the_lock_nothing_needs_it(self, type_token, inputs):
        assert findings("locked-scope-protected", [view(type_token, "x", inputs)]) == []

    def test_a_neighbour_with_a_longer_name_is_not_inside(self):
        neighbour = {"scope": ACCOUNT_ID + "2/blobServices/default/containers/datasets"}
        assert findings("locked-scope-protected",
                        [lock(), view("azure-native:authorization:RoleAssignment", "x", neighbour)]) == []


class TestManagedNetwork:
    def test_clusters_of_a_managed_workspace_take_no_subnet_nor_public_ip(self):
        bad = cluster(subnet="/subscriptions/s/.../subnets/compute", public_ip=True)
        found = findings("managed-network-clusters", [managed_workspace(), bad])
        assert len(found) == 2 and {"names a subnet" in v.message or "public IPs" in v.message for v in found} == {True}
        good = cluster(subnet=None, public_ip=False)
        assert findings("managed-network-clusters", [managed_workspace(), good]) == []

    def test_without_a_managed_network_the_rule_is_silent(self):
        bad = cluster(subnet="/subscriptions/s/.../subnets/compute", public_ip=True)
        assert findings("managed-network-clusters", [managed_workspace(mode="Disabled"), bad]) == []

    def test_internet_outbound_is_reported(self):
        """In dev (the stack's name decides, not a tag) it is advice; outside dev no-internet-outbound refuses it."""
        dev = StackView("dev", "environment", {"owner": "me@example.com", "environment": "dev"})
        [v] = [v for v in run_rules([managed_workspace("AllowInternetOutbound")], dev, DEFAULT_LIMITS)
               if v.rule == "managed-network-outbound"]
        assert v.level == "advisory" and "any host on the internet" in v.message
        assert findings("managed-network-outbound", [managed_workspace("AllowInternetOutbound")]) == []
        assert findings("no-internet-outbound", [managed_workspace("AllowInternetOutbound")])

    @pytest.mark.parametrize("sku", ["Standard", "Basic"])
    def test_fqdn_rules_report_their_firewalls_price(self, sku):
        rules = {"fqdn-pypi-org": {"type": "FQDN", "destination": "pypi.org"},
                 "pe-data": {"type": "PrivateEndpoint", "destination": {"serviceResourceId": ACCOUNT_ID}}}
        [v] = findings("managed-network-outbound", [managed_workspace(outboundRules=rules, firewallSku=sku)])
        monthly = quirks.AZURE_FIREWALL_USD_PER_HOUR[sku] * 730
        assert f"{sku} Azure Firewall" in v.message and f"${monthly:,.0f}/month" in v.message and "pypi.org" in v.message

    def test_private_endpoint_rules_alone_cost_no_firewall(self):
        rules = {"pe-data": {"type": "PrivateEndpoint", "destination": {"serviceResourceId": ACCOUNT_ID}}}
        assert findings("managed-network-outbound", [managed_workspace(outboundRules=rules)]) == []


class TestDiagnostics:
    def resources(self, *uris: str) -> list[ResourceView]:
        settings = [view(DIAGNOSTIC_SETTING, f"diag-{i}", {"resourceUri": u}) for i, u in enumerate(uris)]
        return [managed_workspace(), view(KEY_VAULT, "ml-kv", {"vaultName": "kv-x", "tags": dict(TAGS)}),
                account(), *settings]

    def test_none_at_all_is_a_choice(self):
        assert findings("diagnostics-complete", self.resources()) == []

    def test_a_gap_is_named(self):
        found = findings("diagnostics-complete", self.resources("/x/workspaces/mlw-x", "/x/vaults/kv-x"))
        assert len(found) == 1 and "storage account (blob service)" in found[0].message

    def test_complete_coverage_passes(self):
        complete = self.resources("/x/workspaces/mlw-x", "/x/vaults/kv-x", ACCOUNT_ID + "/blobServices/default")
        assert findings("diagnostics-complete", complete) == []


@pytest.mark.parametrize("props,bad", [
    ({"kty": "RSA", "keySize": 2048.0}, True), ({"kty": "RSA", "keySize": 3072.0}, False),
    ({"kty": "RSA-HSM", "keySize": 2048.0}, True), ({"kty": "EC", "curveName": "P-256"}, False),
])
def test_customer_managed_keys_are_rsa_3072_or_more(props, bad):
    found = findings("key-size", [view(KEY_VAULT_KEY, "ml-cmk-key", {"keyName": "cmk", "properties": props})])
    assert bool(found) is bad
    if bad:
        assert found[0].level == "mandatory" and "keySize: 3072" in found[0].fix


class TestJumpBox:
    def vm(self, **os_profile) -> ResourceView:
        return view(VIRTUAL_MACHINE, "way-in-jump-box", {"vmName": "vm-x", "tags": dict(TAGS), "osProfile": os_profile})

    def test_keys_only(self):
        assert findings("vm-ssh-key-only", [self.vm(linuxConfiguration={"disablePasswordAuthentication": True})]) == []

    def test_passwords_are_refused_and_never_echoed(self):
        found = findings("vm-ssh-key-only", [self.vm(adminPassword="hunter2!", linuxConfiguration={})])
        assert len(found) == 2 and all("hunter2" not in v.message + v.fix for v in found)

    def test_no_public_ip_on_a_nic(self):
        nic = view(NETWORK_INTERFACE, "nic", {"networkInterfaceName": "nic-x", "tags": dict(TAGS),
                                             "ipConfigurations": [{"name": "p", "publicIPAddress": {"id": "pip"}}]})
        [v] = findings("no-public-ip-on-nics", [nic])
        assert "'nic-x' has a public IP" in v.message and "Bastion" in v.fix
        nic_ok = view(NETWORK_INTERFACE, "nic", {"tags": dict(TAGS), "ipConfigurations": [{"name": "p"}]})
        assert findings("no-public-ip-on-nics", [nic_ok]) == []


def test_every_new_rule_is_registered():
    for name in ("dataset-storage-locked", "dataset-storage-unlocked-opted-in", "managed-network-clusters",
                 "managed-network-outbound", "diagnostics-complete", "key-size", "vm-ssh-key-only", "no-public-ip-on-nics",
                 "locked-scope-protected", "cluster-size-in-region", "cluster-region-unlisted-opted-in"):
        assert name in RULES_BY_NAME


@pytest.mark.parametrize("type_token", [DIAGNOSTIC_SETTING, LOCK_BY_SCOPE, LOCK_AT_RESOURCE])
def test_resources_that_take_no_tags_are_not_listed_taggable(type_token):
    _, module, name = type_token.split(":")
    cls = getattr(importlib.import_module(f"pulumi_azure_native.{module}"), name)
    assert "tags" not in inspect.signature(cls._internal_init).parameters and type_token not in TAGGABLE


def test_the_managed_cluster_rule_reads_amlcompute_only():
    other = view(COMPUTE, "ci", {"properties": {"computeType": "ComputeInstance"}, "tags": dict(TAGS)})
    assert findings("managed-network-clusters", [managed_workspace(), other]) == []



class TestSizesByRegion:
    """The stack file check, repeated over the plan: a size its region does not offer is
    refused unless the cluster opts in (then reported); a retired size always."""

    @staticmethod
    def placed(region: str, sku: str = "Standard_ND96asr_v4", opted: bool = False) -> ResourceView:
        import dataclasses

        tags = {**TAGS, "allowUnlistedRegion": "true"} if opted else dict(TAGS)
        base = cluster(sku=sku, tags=tags)
        return dataclasses.replace(base, inputs={**base.inputs, "location": region})

    @pytest.mark.parametrize(("region", "sku", "opted", "mandatory", "advisory"), [
        ("eastus", "Standard_ND96asr_v4", False, None, None),
        ("brazilsouth", "Standard_ND96asr_v4", False, "not offered in brazilsouth", None),
        ("brazilsouth", "Standard_ND96asr_v4", True, None, "does not list, by choice"),
        ("eastus", "Standard_ND96asr_v4", True, None, "now lists Standard_ND96asr_v4 in eastus"),
        ("eastus", "Standard_NC24s_v3", True, "was retired on 2025-09-30", None),
    ])
    def test_refused_reported_or_passed(self, region, sku, opted, mandatory, advisory):
        resources = [self.placed(region, sku, opted)]
        hard = findings("cluster-size-in-region", resources)
        soft = findings("cluster-region-unlisted-opted-in", resources)
        assert [v.level for v in hard] == (["mandatory"] if mandatory else [])
        assert [v.level for v in soft] == (["advisory"] if advisory else [])
        if mandatory:
            assert mandatory in hard[0].message
        if advisory:
            assert advisory in soft[0].message


def test_the_opt_in_shows_on_the_cluster_in_the_plan(tmp_path):
    import yaml

    from amlhpc.infra.plan import evaluate
    from tests.test_config import GOOD_ENV

    cluster_cfg = {"name": "nd-a100", "sku": "Standard_ND96asr_v4", "maxNodes": 2, "allowUnlistedRegion": True}
    config = {**GOOD_ENV, "azure-native:location": "brazilsouth", "aml-hpc:clusters": [cluster_cfg]}
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": config}))  # dev: public by design
    plan = evaluate("dev", tmp_path)
    [compute] = [r for r in plan.of_type(COMPUTE) if r.name == "cluster-nd-a100-compute"]  # not the controller
    assert compute.inputs["tags"]["allowUnlistedRegion"] == "true" and compute.inputs["location"] == "brazilsouth"
    from amlhpc.infra.policy import check_plan

    violations = check_plan(plan.to_json())
    assert [v.rule for v in violations if v.level == "mandatory"] == []
    assert "cluster-region-unlisted-opted-in" in {v.rule for v in violations}
