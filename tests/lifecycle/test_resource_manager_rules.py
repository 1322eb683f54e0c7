"""The emulator refuses what Resource Manager refuses and answers GETs as Azure does:
role-assignment uniqueness and immutability, required properties, the resource envelope of
every answer, secrets never echoed, server-filled fields of the Key, the Vault and the VM held
to Azure's recorded examples, an identity turned on by an update, forceNew for every declared
type, and a down-then-up that adopts retained resources whose GETs carry Azure's defaults."""

from __future__ import annotations

import json

import pulumi
import pytest
import yaml
from pulumi_azure_native import keyvault, network, resources

from tests.conformance.conformance_rows import ROWS
from tests.lifecycle import lifecycle_answers as answers
from tests.lifecycle.lifecycle_cloud import AzureError, FakeAzure
from tests.lifecycle.lifecycle_engine import FORCE_NEW, Engine, response_to_inputs
from tests.lifecycle.lifecycle_tooling import Adopter, clone

SUB = "aaaaaaaa-0000-0000-0000-000000000001"
RG = f"/subscriptions/{SUB}/resourceGroups/rg"
ACCOUNT_TYPE = "azure-native:storage:StorageAccount"
ROLE_TYPE = "azure-native:authorization:RoleAssignment"
READER = "acdd72a7-3385-48ef-bd42-f606fba81ae7"
PRINCIPAL = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


@pytest.fixture
def azure() -> FakeAzure:
    cloud = FakeAzure()
    cloud.put("azure-native:resources:ResourceGroup", RG, "rg", {"location": "East US"})
    return cloud


def assignment(guid: str) -> str:
    return f"{RG}/providers/Microsoft.Authorization/roleAssignments/{guid}"


def grant(principal: str = PRINCIPAL, role: str = f"/subscriptions/{SUB}/providers/Microsoft.Authorization/roleDefinitions/{READER}"):
    return {"principalId": principal, "roleDefinitionId": role, "scope": RG, "principalType": "ServicePrincipal"}


class TestRoleAssignments:
    def test_one_assignment_per_scope_role_and_principal_whatever_the_spelling(self, azure):
        """Three spellings of one (scope, role, principal): the GUIDs in upper case, the role id in
        the tenant form. Resource Manager keeps the first and refuses the others."""
        azure.put(ROLE_TYPE, assignment("11111111-0000-4000-8000-000000000001"), "a", grant())
        with pytest.raises(AzureError, match="RoleAssignmentExists"):
            azure.put(ROLE_TYPE, assignment("11111111-0000-4000-8000-000000000002"), "b", grant(PRINCIPAL.upper()))
        tenant_form = f"/providers/Microsoft.Authorization/roleDefinitions/{READER.upper()}"
        with pytest.raises(AzureError, match="RoleAssignmentExists"):
            azure.put(ROLE_TYPE, assignment("11111111-0000-4000-8000-000000000003"), "c", grant(role=tenant_form))
        with pytest.raises(AzureError, match="RoleAssignmentExists"):
            azure.put(ROLE_TYPE, assignment("11111111-0000-4000-8000-000000000004").upper().replace("/SUBSCRIPTIONS", "/subscriptions"),
                      "d", grant(PRINCIPAL.upper(), tenant_form))
        assert len(azure.role_assignments(RG)) == 1

    def test_the_same_assignment_can_be_put_again(self, azure):
        guid = "22222222-0000-4000-8000-000000000001"
        azure.put(ROLE_TYPE, assignment(guid), "a", grant())
        azure.put(ROLE_TYPE, assignment(guid.upper()), "a", grant(PRINCIPAL.upper()))  # the same, spelt otherwise
        assert len(azure.role_assignments(RG)) == 1

    def test_changing_the_principal_is_refused(self, azure):
        guid = "33333333-0000-4000-8000-000000000001"
        azure.put(ROLE_TYPE, assignment(guid), "a", grant())
        with pytest.raises(AzureError, match="RoleAssignmentUpdateNotPermitted: Tenant ID, application ID, "
                                             "principal ID, and scope are not allowed to be updated"):
            azure.put(ROLE_TYPE, assignment(guid), "a", grant("9f8e7d6c-0000-4000-8000-000000000009"))
        assert azure.get(assignment(guid)).body["principalId"] == PRINCIPAL


class TestRequiredProperties:
    ACCOUNT = f"{RG}/providers/Microsoft.Storage/storageAccounts/acct"
    FULL = {"location": "eastus", "kind": "StorageV2", "sku": {"name": "Standard_LRS"}}

    @pytest.mark.parametrize(("missing", "error"), [("location", "LocationRequired"),
                                                     ("kind", "Required property 'kind' not found"),
                                                     ("sku", "Required property 'sku' not found")])
    def test_a_storage_account_without_a_required_property_is_refused(self, azure, missing, error):
        body = {k: v for k, v in self.FULL.items() if k != missing}
        with pytest.raises(AzureError, match=error):
            azure.put(ACCOUNT_TYPE, self.ACCOUNT, "acct", body)
        assert not azure.exists(self.ACCOUNT)

    def test_nested_required_properties_too(self, azure):
        with pytest.raises(AzureError, match="sku.name"):
            azure.put(ACCOUNT_TYPE, self.ACCOUNT, "acct", {**self.FULL, "sku": {"tier": "Standard"}})

    def test_an_update_is_held_to_the_same_rule(self, azure):
        azure.put(ACCOUNT_TYPE, self.ACCOUNT, "acct", self.FULL)
        with pytest.raises(AzureError, match="Required property 'kind'"):
            azure.put(ACCOUNT_TYPE, self.ACCOUNT, "acct", {"location": "eastus", "sku": {"name": "Standard_LRS"}})

    def test_a_role_assignment_needs_its_principal(self, azure):
        with pytest.raises(AzureError, match="principalId|principal_id"):
            azure.put(ROLE_TYPE, assignment("44444444-0000-4000-8000-000000000001"), "a",
                      {"roleDefinitionId": grant()["roleDefinitionId"], "scope": RG})


class TestAnswers:
    VAULT = f"{RG}/providers/Microsoft.KeyVault/vaults/kv-answers"
    KEY = f"{VAULT}/keys/cmk"
    VM = f"{RG}/providers/Microsoft.Compute/virtualMachines/vm-box"

    def test_every_answer_has_the_resource_envelope(self, azure):
        account = TestRequiredProperties.ACCOUNT
        azure.put(ACCOUNT_TYPE, account, "acct", {**TestRequiredProperties.FULL, "location": "East US 2"})
        answer = azure.response(account)
        assert (answer["id"], answer["name"], answer["type"]) == (account, "acct", "Microsoft.Storage/storageAccounts")
        assert answer["location"] == "eastus2" and answer["provisioningState"] == "Succeeded"
        group = azure.response(RG)
        assert (group["type"], group["location"], group["properties"]["provisioningState"]) == (
            "Microsoft.Resources/resourceGroups", "eastus", "Succeeded")
        role = assignment("55555555-0000-4000-8000-000000000001")
        azure.put(ROLE_TYPE, role, "r", grant())
        assert azure.response(role)["type"] == "Microsoft.Authorization/roleAssignments"

    def vault_and_key(self, azure):
        azure.put("azure-native:keyvault:Vault", self.VAULT, "kv-answers", {
            "location": "East US", "properties": {"tenantId": "t", "sku": {"family": "A", "name": "standard"},
                                                  "enablePurgeProtection": True}})
        azure.put("azure-native:keyvault:Key", self.KEY, "cmk", {"properties": {"kty": "RSA"}})

    def test_key_and_vault_carry_what_azure_fills_in(self, azure):
        self.vault_and_key(azure)
        vault, key = azure.response(self.VAULT), azure.response(self.KEY)
        assert vault["properties"]["vaultUri"] == "https://kv-answers.vault.azure.net"
        assert vault["properties"]["provisioningState"] == "Succeeded" and vault["tags"] == {}
        props = key["properties"]
        assert props["attributes"]["enabled"] is True and props["attributes"]["recoveryLevel"] == "Recoverable"
        assert props["keySize"] == 2048 and props["keyOps"] == ["encrypt", "decrypt", "sign", "verify", "wrapKey", "unwrapKey"]
        assert props["keyUri"] == "https://kv-answers.vault.azure.net:443/keys/cmk"
        assert props["keyUriWithVersion"].startswith(props["keyUri"] + "/") and key["location"] == "eastus"
        assert azure.response(self.KEY) == key  # the version is the key's, the same on every GET

    def test_what_the_request_set_is_kept(self, azure):
        self.vault_and_key(azure)
        azure.put("azure-native:keyvault:Key", self.KEY, "cmk", {"properties": {"kty": "RSA", "keySize": 3072,
                                                                                  "attributes": {"enabled": False}}})
        props = azure.response(self.KEY)["properties"]
        assert props["keySize"] == 3072 and props["attributes"]["enabled"] is False

    def vm(self, azure, **extra):
        body = {"location": "eastus", "hardwareProfile": {"vmSize": "Standard_B2s"},
                "osProfile": {"computerName": "box", "adminUsername": "azureuser", "adminPassword": "Secret-1234!",
                              "linuxConfiguration": {"disablePasswordAuthentication": False}},
                "storageProfile": {"osDisk": {"createOption": "FromImage"}},
                "networkProfile": {"networkInterfaces": [{"id": f"{RG}/providers/Microsoft.Network/networkInterfaces/nic"}]},
                **extra}
        azure.put("azure-native:compute:VirtualMachine", self.VM, "vm-box", body)
        return azure.response(self.VM)

    def test_a_vm_never_echoes_its_password_and_carries_azures_fields(self, azure):
        answer = self.vm(azure)
        assert "adminPassword" not in answer["osProfile"] and "Secret-1234!" not in json.dumps(answer)
        assert answer["osProfile"]["secrets"] == [] and answer["storageProfile"]["osDisk"]["osType"] == "Linux"
        assert answer["storageProfile"]["dataDisks"] == [] and len(answer["vmId"]) == 36
        assert answer["provisioningState"] == "Succeeded"
        assert azure.get(self.VM).body["osProfile"]["adminPassword"] == "Secret-1234!"  # Azure has it; it never says so

    def test_an_identity_turned_on_by_an_update_gets_its_principal(self, azure):
        assert "identity" not in self.vm(azure)
        answer = self.vm(azure, identity={"type": "SystemAssigned"})
        principal = answer["identity"]["principalId"]
        assert len(principal) == 36 and answer["identity"]["tenantId"] == azure.tenant
        assert self.vm(azure, identity={"type": "SystemAssigned"})["identity"]["principalId"] == principal  # kept
        assert "principalId" not in (self.vm(azure, identity={"type": "None"}).get("identity") or {})

    def test_read_back_keeps_writable_properties_only(self, azure):
        """azure-native's ResponseToSdkInputs on the Key: Azure's defaults become inputs, what
        only Azure sets (the URIs, created, updated, recoveryLevel) does not."""
        self.vault_and_key(azure)
        inputs = response_to_inputs("azure-native:keyvault:Key", azure.response(self.KEY))
        assert inputs["properties"] == {"kty": "RSA", "attributes": {"enabled": True}, "keySize": 2048,
                                        "keyOps": ["encrypt", "decrypt", "sign", "verify", "wrapKey", "unwrapKey"]}
        assert "id" not in inputs and "type" not in inputs and "name" not in inputs


class TestHeldToAzuresExamples:
    @pytest.mark.parametrize("type_token", sorted(answers.EXAMPLE_FIELDS))
    def test_every_field_the_answers_reproduce_is_in_the_example(self, type_token):
        path, fields = answers.EXAMPLE_FIELDS[type_token]
        body = answers.example(type_token)
        for field in fields:
            answers.wire_path(body, field)  # raises KeyError when the example does not have it

    @pytest.mark.parametrize("type_token", sorted(answers.SERVER_FILLED))
    def test_server_filled_fields_are_what_the_answer_adds_to_the_request(self, type_token):
        path, _ = answers.EXAMPLE_FIELDS[type_token]
        document = json.loads((answers.REFERENCE / path).read_text())
        request = document["parameters"].get("parameters")
        body = document["responses"]["200"]["body"]
        flattened = type_token == answers.VM  # azure-native flattens the VM's `properties`
        for field in answers.SERVER_FILLED[type_token]:
            wire = f"properties.{field}" if flattened else field
            answers.wire_path(body, wire)
            if request is not None:
                with pytest.raises(KeyError):
                    answers.wire_path(request, wire)

    def test_write_only_paths_are_sent_and_never_answered(self):
        for paths in answers.WRITE_ONLY.values():
            for field, path in paths:
                document = json.loads((answers.REFERENCE / path).read_text())
                answers.wire_path(document["parameters"]["parameters"], f"properties.{field}")
                for status in ("200", "201"):
                    with pytest.raises(KeyError):
                        answers.wire_path(document["responses"][status]["body"], f"properties.{field}")


class TestForceNew:
    def test_every_declared_type_has_its_replacement_rules(self):
        """The conformance rows are every type the program declares (test_conformance holds them
        to the stacks); each has the provider's forceNew properties here, not five of them."""
        assert set(ROWS) <= set(FORCE_NEW), sorted(set(ROWS) - set(FORCE_NEW))

    def test_moving_a_private_endpoint_to_another_subnet_replaces_it(self, azure):
        """forceNewMap: Network/PrivateEndpoint subnet (pulumi-azure-native#3883)."""
        engine = Engine(FakeAzure(), SUB)

        def build(subnet: str):
            def program() -> dict:
                group = resources.ResourceGroup("rg", resource_group_name="rg", location="eastus")
                network.PrivateEndpoint("pe", private_endpoint_name="pe", resource_group_name="rg", location="eastus",
                                        subnet=network.SubnetArgs(id=f"{RG}/providers/Microsoft.Network/virtualNetworks/v/subnets/{subnet}"),
                                        opts=pulumi.ResourceOptions(depends_on=[group], delete_before_replace=True))
                return {}
            return program

        engine.up("s", build("a"))
        engine.up("s", build("b"))
        assert ("replace", "urn:pulumi:s::aml-hpc::azure-native:network:PrivateEndpoint::pe") in engine.last_steps


class TestDownThenUpWithAzuresDefaults:
    def test_retained_key_vault_and_workspace_are_adopted_as_azure_answers_them(self, tmp_path):
        """An unlocked stack with a customer-managed key: `down` keeps the Key, its Vault and the
        workspace; their GETs carry what Azure fills in (the Key's attributes, keyOps, keySize and
        URIs, the Vault's URI and provisioning state). The Key and the Vault are protected, so
        they stay in the stack's state: a backend without that state (another clone, a lost
        backend) is where the next `up` adopts all three. It imports them with Azure's values as
        inputs, updates in place, replaces nothing, and the `up` after it has no step."""
        from tests.conformance.conformance_stacks import EVERYTHING

        azure = FakeAzure()
        config = {**EVERYTHING, "aml-hpc:protectData": False, "aml-hpc:network": {"isolation": "public"},
                  "aml-hpc:clusters": [{"name": "nc-a100", "sku": "Standard_NC24ads_A100_v4", "maxNodes": 1}]}
        root = clone(tmp_path / "cmk")
        (root / "Pulumi.cmk.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        adopter = Adopter(azure, root, SUB)
        adopter.make_up("cmk")
        adopter.make_down("cmk")
        [key] = azure.of_type("azure-native:keyvault:Key")
        [vault] = azure.of_type("azure-native:keyvault:Vault")
        assert azure.of_type("azure-native:machinelearningservices:Workspace")
        answer = azure.response(key.id)["properties"]
        assert answer["keyOps"] and answer["keyUri"].endswith(":443/keys/" + key.name)
        assert azure.response(vault.id)["properties"]["provisioningState"] == "Succeeded"

        adopter = Adopter(azure, root, SUB)  # the same stack file (its name suffix), an empty backend
        adopter.make_up("cmk")
        adopted_types = {u.split("::")[2].rsplit("$", 1)[-1] for u in adopter.adopted}
        assert {"azure-native:keyvault:Key", "azure-native:keyvault:Vault",
                "azure-native:machinelearningservices:Workspace"} <= adopted_types
        assert not [s for s in adopter.engine.last_steps if s[0] == "replace"], adopter.engine.last_steps
        state_key = next(r for r in adopter.state("cmk").values() if r.type == "azure-native:keyvault:Key")
        assert state_key.id == key.id and state_key.outputs["properties"]["keyUriWithVersion"] == answer["keyUriWithVersion"]
        adopter.make_up("cmk")
        assert adopter.engine.last_steps == [], adopter.engine.last_steps


def test_a_vault_program_reads_back_azures_answer(tmp_path):
    """The Pulumi program sees Azure's answer as the Vault's outputs (vaultUri, provisioningState)."""
    azure = FakeAzure()
    engine = Engine(azure, SUB)

    def program() -> dict:
        group = resources.ResourceGroup("rg", resource_group_name="rg", location="eastus")
        vault = keyvault.Vault("kv", vault_name="kv-outputs", resource_group_name="rg", location="East US",
                               properties=keyvault.VaultPropertiesArgs(tenant_id="t", sku=keyvault.SkuArgs(family="A", name="standard")),
                               opts=pulumi.ResourceOptions(depends_on=[group]))
        return {"uri": vault.properties.vault_uri, "location": vault.location}

    outputs = engine.up("s", program)
    assert outputs == {"uri": "https://kv-outputs.vault.azure.net", "location": "eastus"}
