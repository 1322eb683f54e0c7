"""The offline plan of hardened stacks, one per isolation mode (public, our own VNet, Azure
ML's managed network, with approved-only and with internet outbound) and with the customer-
managed key, diagnostics, HBI, the delete lock and a way in turned on: the resources exist,
are wired to each other, pass the policy rules, and every input passes the conformance
check against Azure's SDK models (tests/conformance)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from amlhpc.infra.plan import evaluate
from amlhpc.infra.plan.mocks import PlanMocks
from amlhpc.infra.policy import check_plan, render
from tests.conformance.conformance_rows import ROWS
from tests.conformance.test_conformance import findings_for
from tests.test_config import GOOD_ENV, PUBKEY
from tests.test_hardening_config import HAND_OFF

COSMOS = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
ENV = {**GOOD_ENV, "aml-hpc:clusters": [{"name": "nd-h100", "sku": "Standard_ND96isr_H100_v5", "maxNodes": 2}]}
STACKS = {
    "hard": {**ENV, "aml-hpc:encryption": {"customerManagedKey": True, "cosmosDbPrincipalId": COSMOS},
             "aml-hpc:diagnostics": {"retentionDays": 60, "storageReads": True}, "aml-hpc:hbiWorkspace": True},
    "priv": {**ENV, "aml-hpc:network": {
        "isolation": "private", "addressSpace": "10.50.0.0/16", "endpointSubnet": "10.50.128.0/18",
        "wayIn": {"bastion": {}, "jumpBox": {"publicKey": PUBKEY}, "ciRunners": {}}}},
    "mngd": {**ENV, "aml-hpc:network": {"isolation": "managed", "addressSpace": "10.60.0.0/16", "wayIn": HAND_OFF},
             "aml-hpc:mlRegistry": {"enabled": True}},
    "mnet": {**ENV, "aml-hpc:network": {"isolation": "managed", "addressSpace": "10.70.0.0/16",
                                        "outbound": "AllowInternetOutbound", "wayIn": HAND_OFF}},
    "exp-onmngd": {"azure-native:location": "eastus", "aml-hpc:owner": "team@example.com",
                   "aml-hpc:environment": "mngd", "aml-hpc:expiresAt": "2030-01-01T00:00:00Z",
                   "aml-hpc:clusters": [{"name": "sweep", "sku": "Standard_ND96isr_H100_v5", "maxNodes": 2}],
                   "aml-hpc:budget": {"monthlyAmountUsd": 1000, "alertEmails": ["team@example.com"]}},
}

KEY_VAULT_CRYPTO_SERVICE_ENCRYPTION_USER = "e147488a-f6f5-4113-8e2d-b22465e65bf6"  # Azure built-in roles, security


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("stacks")
    for name, config in STACKS.items():
        (path / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": config}))
    return path


@pytest.fixture(scope="module")
def plans(root) -> dict:
    return {name: evaluate(name, root) for name in STACKS}


def problems(type_token: str, inputs: dict) -> list[str]:
    """What the conformance check finds in one resource's inputs (empty when it conforms)."""
    return [f"{f.path}: {f.message}" for f in findings_for(ROWS[type_token], inputs)]


def one(plan, type_token: str, name: str | None = None):
    found = [r for r in plan.of_type(type_token) if name is None or r.name == name]
    assert len(found) == 1, [r.name for r in plan.of_type(type_token)]
    return found[0]


def workspace(plan) -> dict:
    return one(plan, "azure-native:machinelearningservices:Workspace").inputs


def cluster_props(plan, name: str = "cluster-nd-h100-compute") -> dict:
    """The GPU cluster's AmlCompute properties (the stack also has the controller's cluster)."""
    return one(plan, "azure-native:machinelearningservices:Compute", name).inputs["properties"]["properties"]


# What the security baseline refuses in these non-dev environments, and nothing else: `hard`
# keeps public network access (its point is the key, diagnostics and HBI), `mnet` lets jobs
# reach the whole internet, and so does `priv` through its NAT gateway (egress is controlled
# only by a managed network that allows approved outbound). Every other mode passes every
# mandatory rule.
BASELINE_REFUSES = {"hard": {"no-public-network-access", "no-public-ips", "egress-controlled"},
                    "mnet": {"no-internet-outbound", "egress-controlled"}, "priv": {"egress-controlled"}}


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_every_mode_passes_the_mandatory_policy_rules(plans, stack):
    violations = check_plan(plans[stack].to_json())
    refused = {v.rule for v in violations if v.level == "mandatory"}
    assert refused == BASELINE_REFUSES.get(stack, set()), render(violations, stack)


@pytest.mark.parametrize("stack", sorted(s for s in STACKS if not s.startswith("exp-")))
def test_every_declared_input_is_known_to_azures_models(plans, stack):
    checked = 0
    for r in plans[stack].custom_resources():
        assert problems(r.type, r.inputs) == [], r.name
        checked += 1
    assert checked >= 3


class TestKeysDiagnosticsHbiLock:
    def test_the_key_and_who_may_use_it(self, plans):
        plan = plans["hard"]
        key = one(plan, "azure-native:keyvault:Key")
        assert key.inputs["properties"]["kty"] == "RSA" and key.inputs["properties"]["keySize"] == 3072
        assert key.protect and key.inputs["vaultName"] == plan.config.names.key_vault
        grants = [r for r in plan.of_type("azure-native:authorization:RoleAssignment")
                  if r.inputs["roleDefinitionId"].endswith(KEY_VAULT_CRYPTO_SERVICE_ENCRYPTION_USER)]
        assert len(grants) == 2 and all(g.inputs["scope"].endswith(f"/keys/{key.inputs['keyName']}") for g in grants)
        assert COSMOS in {g.inputs["principalId"] for g in grants}
        assert all(g.inputs["principalType"] == "ServicePrincipal" for g in grants)
        identity = one(plan, "azure-native:managedidentity:UserAssignedIdentity", "ml-cmk-identity")
        assert identity.inputs["resourceName"] == f"{plan.config.names.identity}-cmk"

    def test_the_workspace_is_encrypted_with_it_and_waits_for_the_grants(self, plans):
        plan = plans["hard"]
        ws = workspace(plan)
        assert ws["identity"]["type"] == "SystemAssigned,UserAssigned"
        [cmk_identity] = ws["identity"]["userAssignedIdentities"]
        assert cmk_identity.endswith(f"/userAssignedIdentities/{plan.config.names.identity}-cmk")
        encryption = ws["encryption"]
        assert encryption["status"] == "Enabled" and encryption["identity"]["userAssignedIdentity"] == cmk_identity
        assert encryption["keyVaultProperties"]["keyVaultArmId"].endswith(f"/vaults/{plan.config.names.key_vault}")
        assert ws["hbiWorkspace"] is True
        grants = {r.urn for r in plan.of_type("azure-native:authorization:RoleAssignment") if "cmk" in r.name}
        assert grants and grants <= set(one(plan, "azure-native:machinelearningservices:Workspace").depends_on)

    def test_the_workspace_names_the_versioned_key_azure_returns(self, root, monkeypatch):
        """keyUriWithVersion is Azure's answer, not an input: give the mock one and follow it."""
        computed = PlanMocks._computed

        def with_key_uri(self, type_token, inputs, logical):
            out = computed(self, type_token, inputs, logical)
            if type_token == "azure-native:keyvault:Key":
                out["keyUriWithVersion"] = f"https://{inputs['vaultName']}.vault.azure.net/keys/{inputs['keyName']}/abc123"
            return out

        monkeypatch.setattr(PlanMocks, "_computed", with_key_uri)
        plan = evaluate("hard", root)
        key_id = workspace(plan)["encryption"]["keyVaultProperties"]["keyIdentifier"]
        assert key_id == f"https://{plan.config.names.key_vault}.vault.azure.net/keys/cmk-workspace/abc123"

    def test_diagnostics_reach_log_analytics_from_every_resource(self, plans):
        plan = plans["hard"]
        settings = {r.name.removeprefix("diagnostics-"): r.inputs
                    for r in plan.of_type("azure-native:monitor:DiagnosticSetting")}
        assert set(settings) == {"workspace", "key-vault", "datasets-blob", "workspace-storage-blob"}
        logs = one(plan, "azure-native:operationalinsights:Workspace").inputs
        assert logs["retentionInDays"] == 60
        for s in settings.values():
            assert s["name"] == "to-log-analytics" and s["workspaceId"].endswith(f"/workspaces/{logs['workspaceName']}")
        assert settings["workspace"]["logs"] == [{"categoryGroup": "allLogs", "enabled": True}]
        assert settings["workspace"]["logAnalyticsDestinationType"] == "Dedicated"
        assert settings["key-vault"]["logs"] == [{"categoryGroup": "audit", "enabled": True}]
        data = plan.config.names.dataset_storage
        assert settings["datasets-blob"]["resourceUri"].endswith(f"/storageAccounts/{data}/blobServices/default")
        assert {c["category"] for c in settings["datasets-blob"]["logs"]} == {"StorageRead", "StorageWrite", "StorageDelete"}
        assert settings["datasets-blob"]["metrics"] == [{"category": "Transaction", "enabled": True}]

    def test_reads_stay_out_of_the_logs_unless_asked(self, plans):
        assert plans["priv"].of_type("azure-native:monitor:DiagnosticSetting") == []  # off unless declared
        from amlhpc.infra.components.diagnostics import platform_targets
        targets = platform_targets(workspace_id="w", vault_id="v", storage_account_ids={"datasets": "a"})
        assert targets[-1].log_categories == ("StorageWrite", "StorageDelete")

    def test_the_dataset_account_is_locked_and_the_lock_outlives_the_stack(self, plans):
        plan = plans["hard"]
        lock = one(plan, "azure-native:authorization:ManagementLockByScope")
        assert lock.inputs["level"] == "CanNotDelete" and lock.retain_on_delete and not lock.protect
        assert lock.inputs["scope"].endswith(f"/storageAccounts/{plan.config.names.dataset_storage}")
        assert "aml-hpc:data:DatasetStorage" in lock.urn  # a child of the data it guards

    @pytest.mark.parametrize("stack", ["hard", "priv"])
    def test_what_the_lock_covers_is_protected_and_nothing_else(self, plans, stack):
        """Azure refuses deleting anything under the lock: those resources are protected so
        `make down` leaves them (tests/lifecycle proves it), the rest are not."""
        plan = plans[stack]
        account = one(plan, "azure-native:authorization:ManagementLockByScope").inputs["scope"].lower()

        def covered(r) -> bool:
            targets = [r.inputs.get("scope"), r.inputs.get("resourceUri")]
            targets += [c.get("privateLinkServiceId") for c in r.inputs.get("privateLinkServiceConnections") or []]
            return any(t and (t.lower() == account or t.lower().startswith(account + "/")) for t in targets)

        kinds = ("azure-native:authorization:RoleAssignment", "azure-native:monitor:DiagnosticSetting",
                 "azure-native:network:PrivateEndpoint")
        extensions = [r for r in plan.resources if r.type in kinds]
        inside = [r for r in extensions if covered(r)]
        assert {r.name for r in inside} >= {"access-datasets-read", "access-checkpoints-write", "access-ws-datasets-preview"}
        assert all(r.protect for r in inside)
        # (the customer-managed key's grants are protected with the key, whatever the lock)
        assert not any(r.protect for r in extensions if not covered(r) and "CustomerManagedKey" not in r.urn)
        assert ("endpoints-datasets-blob" in {r.name for r in inside}) == (stack == "priv")
        assert ("diagnostics-datasets-blob" in {r.name for r in inside}) == (stack == "hard")

    def test_every_role_assignment_is_named_by_scope_principal_and_role(self, plans):
        from amlhpc.infra.components.access import role_assignment_name

        for plan in plans.values():
            grants = plan.of_type("azure-native:authorization:RoleAssignment")
            names = [g.inputs["roleAssignmentName"] for g in grants]
            assert names == [role_assignment_name(g.inputs["scope"], g.inputs["principalId"], g.inputs["roleDefinitionId"])
                             for g in grants]
            assert len(set(names)) == len(names)
        assert role_assignment_name("/S/x", "P", "/R") == role_assignment_name("/s/X", "p", "/r")  # ARM ids: no case

    def test_no_lock_and_no_key_where_not_asked(self, plans):
        for stack in ("priv", "mngd"):
            assert plans[stack].of_type("azure-native:keyvault:Key") == []
            assert "encryption" not in workspace(plans[stack]) and "hbiWorkspace" not in workspace(plans[stack])


class TestOwnVnetWithAWayIn:
    def test_clusters_sit_in_our_compute_subnet(self, plans):
        props = cluster_props(plans["priv"])
        assert props["enableNodePublicIp"] is False and props["subnet"]["id"].endswith("/subnets/compute")

    def test_subnets_take_the_free_space_one_after_another(self, plans):
        plan = plans["priv"]
        subnets = {r.inputs["subnetName"]: r for r in plan.of_type("azure-native:network:Subnet")}
        assert {k: v.inputs["addressPrefix"] for k, v in subnets.items()} == {
            "compute": "10.50.0.0/17", "endpoints": "10.50.128.0/18", "AzureBastionSubnet": "10.50.192.0/26",
            "jump-box": "10.50.192.64/28", "ci-runners": "10.50.192.96/27"}
        # Azure serialises subnet changes on a VNet: each way-in subnet waits for the one before.
        assert subnets["jump-box"].urn in subnets["ci-runners"].depends_on
        assert subnets["AzureBastionSubnet"].urn in subnets["jump-box"].depends_on
        assert subnets["AzureBastionSubnet"].depends_on  # and the first waits for the network
        for name in ("jump-box", "ci-runners"):
            assert subnets[name].inputs["defaultOutboundAccess"] is False and "natGateway" in subnets[name].inputs

    def test_bastion_with_native_client_tunnels(self, plans):
        plan = plans["priv"]
        bastion = one(plan, "azure-native:network:BastionHost").inputs
        assert bastion["sku"] == {"name": "Standard"} and bastion["enableTunneling"] is True
        [config] = bastion["ipConfigurations"]
        assert config["subnet"]["id"].endswith("/subnets/AzureBastionSubnet")
        ip = one(plan, "azure-native:network:PublicIPAddress", "way-in-bastion-ip").inputs
        assert ip["sku"] == {"name": "Standard"} and ip["publicIPAllocationMethod"] == "Static"

    def test_the_jump_box_takes_keys_only_and_no_public_ip(self, plans):
        plan = plans["priv"]
        vm = one(plan, "azure-native:compute:VirtualMachine")
        linux = vm.inputs["osProfile"]["linuxConfiguration"]
        assert linux["disablePasswordAuthentication"] is True and "adminPassword" not in vm.inputs["osProfile"]
        assert linux["ssh"]["publicKeys"] == [{"path": "/home/azureuser/.ssh/authorized_keys", "keyData": PUBKEY}]
        assert vm.inputs["securityProfile"]["securityType"] == "TrustedLaunch"
        assert "properties.osProfile" not in vm.replace_on_changes and "osProfile" in vm.replace_on_changes
        nic = one(plan, "azure-native:network:NetworkInterface").inputs
        assert all("publicIPAddress" not in c for c in nic["ipConfigurations"])
        rules = {r["name"]: r for r in one(plan, "azure-native:network:NetworkSecurityGroup", "way-in-nsg")
                 .inputs["securityRules"]}
        assert rules["ssh-from-bastion"]["sourceAddressPrefix"] == "10.50.192.0/26"
        assert rules["ssh-from-bastion"]["destinationPortRange"] == "22"
        assert rules["deny-internet-inbound"]["access"] == "Deny"


class TestManagedNetwork:
    def test_outbound_rules_reach_our_data_registry_and_package_sources(self, plans):
        plan = plans["mngd"]
        ws = workspace(plan)
        network = ws["managedNetwork"]
        assert network["isolationMode"] == "AllowOnlyApprovedOutbound" and network["firewallSku"] == "Standard"
        rules = network["outboundRules"]
        data = rules["pe-datasets-blob"]["destination"]
        assert data["serviceResourceId"].endswith(f"/storageAccounts/{plan.config.names.dataset_storage}")
        assert data["subresourceTarget"] == "blob" and rules["pe-datasets-blob"]["type"] == "PrivateEndpoint"
        registry = rules["pe-ml-registry"]["destination"]
        assert registry["serviceResourceId"].endswith(f"/registries/{plan.config.names.ml_registry}")
        assert registry["subresourceTarget"] == "amlregistry"
        fqdn = sorted(r["destination"] for r in rules.values() if r["type"] == "FQDN")
        assert fqdn == ["files.pythonhosted.org", "pypi.org"]  # no general-purpose code host
        assert ws["provisionNetworkNow"] is True and ws["publicNetworkAccess"] == "Disabled"

    def test_clusters_take_no_subnet_and_no_public_ip(self, plans):
        for name in ("cluster-nd-h100-compute", "controller-compute"):  # the GPU cluster and the managed runs' controller
            props = cluster_props(plans["mngd"], name)
            assert props["enableNodePublicIp"] is False and "subnet" not in props, name
            assert props["remoteLoginPortPublicAccess"] == "Disabled", name

    def test_our_vnet_keeps_only_the_endpoints(self, plans):
        plan = plans["mngd"]
        assert [r.inputs["subnetName"] for r in plan.of_type("azure-native:network:Subnet")] == ["endpoints"]
        assert plan.of_type("azure-native:network:NatGateway") == []
        assert len(plan.of_type("azure-native:network:PrivateEndpoint")) >= 6  # people and CI still need them
        account = next(r for r in plan.resources if r.name == "data-account").inputs
        assert account["publicNetworkAccess"] == "Disabled"
        assert plan.outputs["network"] == {"isolation": "managed", "subnetId": None}

    def test_the_firewall_cost_and_open_internet_are_reported(self, plans):
        cost = [v for v in check_plan(plans["mngd"].to_json()) if v.rule == "managed-network-outbound"]
        assert len(cost) == 1 and cost[0].level == "advisory" and "$912/month" in cost[0].message
        # Outside dev open internet is refused (no-internet-outbound), not merely reported.
        internet = [v for v in check_plan(plans["mnet"].to_json()) if v.rule == "no-internet-outbound"]
        assert len(internet) == 1 and internet[0].level == "mandatory"
        assert "any host on the internet" in internet[0].message

    def test_internet_outbound_keeps_only_the_private_endpoint_rules(self, plans):
        network = workspace(plans["mnet"])["managedNetwork"]
        assert network["isolationMode"] == "AllowInternetOutbound" and "firewallSku" not in network
        assert set(network["outboundRules"]) == {"pe-datasets-blob"}

    def test_an_experiment_follows_its_environments_managed_network(self, plans):
        plan = plans["exp-onmngd"]
        props = cluster_props(plan, "cluster-sweep-compute")
        assert props["enableNodePublicIp"] is False and "subnet" not in props
        assert plan.outputs["network"]["isolation"] == "managed"


class TestTheModelCheckCanFail:
    """The conformance check is only worth something if a wrong input makes it speak."""

    @pytest.mark.parametrize("stack,type_token,mutate,fragment", [
        ("mngd", "azure-native:machinelearningservices:Workspace",
         lambda i: i["managedNetwork"].update(isolationMode="Closed"), "'Closed' is not one of"),
        ("mngd", "azure-native:machinelearningservices:Workspace",
         lambda i: i["managedNetwork"]["outboundRules"]["pe-datasets-blob"]["destination"].update(serviceId="x"),
         "has no property 'serviceId'"),
        ("hard", "azure-native:machinelearningservices:Workspace",
         lambda i: i["encryption"]["keyVaultProperties"].update(keyUri="x"), "has no property 'keyUri'"),
        ("hard", "azure-native:monitor:DiagnosticSetting", lambda i: i.update(logz=[]), "has no property 'logz'"),
        ("hard", "azure-native:authorization:ManagementLockByScope", lambda i: i.update(lockLevel="CanNotDelete"),
         "has no property 'lockLevel'"),
        ("priv", "azure-native:compute:VirtualMachine",
         lambda i: i["osProfile"]["linuxConfiguration"].update(disablePasswordAuth=True),
         "has no property 'disablePasswordAuth'"),
        ("priv", "azure-native:network:BastionHost", lambda i: i["sku"].update(name="Gold"), "'Gold' is not one of"),
        ("priv", "azure-native:network:Subnet", lambda i: i.update(natGateway=["x"]), "expected an object"),
    ])
    def test_a_wrong_input_is_named(self, plans, stack, type_token, mutate, fragment):
        resource = plans[stack].of_type(type_token)[0]
        inputs = copy.deepcopy(resource.inputs)
        mutate(inputs)
        found = problems(type_token, inputs)
        assert any(fragment in f for f in found), found


class TestAgainstAzuresOwnExamples:
    """Azure's REST examples for API 2025-12-01 (reference copy in tests/fixtures/azure) show the
    same shapes the program declares, and the model check accepts them."""

    examples = __import__("json").loads((Path(__file__).parent / "fixtures" / "azure" / "ml-2025-12-01-examples.json")
                                        .read_text())

    def test_the_model_check_accepts_azures_workspace_example(self):
        body = self.examples["workspaceCreate"]["body"]
        body = {"workspaceName": "mlw-example", "resourceGroupName": "rg", **{k: v for k, v in body.items() if k != "properties"},
                **body["properties"]}
        found = problems("azure-native:machinelearningservices:Workspace", body)
        # The example carries one property that neither azure-ai-ml's model nor pulumi-azure-native
        # knows; we never send it.
        assert found == ["managedNetwork.enableFirewallLog: ManagedNetworkSettings has no property 'enableFirewallLog'"]

    def test_our_key_settings_have_the_examples_shape(self, plans):
        example = self.examples["workspaceCreate"]["body"]
        ours = workspace(plans["hard"])
        assert ours["identity"]["type"] == example["identity"]["type"]
        enc, ref = ours["encryption"], example["properties"]["encryption"]
        assert enc["status"] == ref["status"] and set(enc["identity"]) == set(ref["identity"])
        # identityClientId is optional (empty in the example); keyIdentifier is Azure's answer, see above.
        assert set(enc["keyVaultProperties"]) | {"keyIdentifier", "identityClientId"} == set(ref["keyVaultProperties"])

    def test_our_fqdn_rules_have_the_examples_shape(self, plans):
        example = self.examples["outboundRuleCreate"]["body"]["properties"]
        rules = workspace(plans["mngd"])["managedNetwork"]["outboundRules"]
        fqdn = [r for r in rules.values() if r["type"] == "FQDN"]
        assert fqdn and all(set(r) <= set(example) and r["category"] == example["category"] for r in fqdn)
