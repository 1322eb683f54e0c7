"""Every resource of every shipped and generated stack, held against Azure's own models
(tests/conformance/conformance_reference.py, one row per type in conformance_rows.py):
no property the model does not know, the right nesting, enum values the API accepts,
required properties present, read-only ones absent, names, lengths, patterns and ranges
as the specification says. One test per resource type; a failure names the stack, the
resource, the property and the rule.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from amlhpc.infra.adopt import provider_api_version
from amlhpc.infra.plan import evaluate
from amlhpc.infra.plan.mocks import FAKE_SUBSCRIPTION
from tests.conformance import conformance_reference as ref
from tests.conformance.conformance_rows import ROWS, Row
from tests.conformance.conformance_stacks import NOW, write_stacks


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("conformance-stacks")
    return {stack: evaluate(stack, root, now=NOW) for stack in write_stacks(root)}


def findings_for(row: Row, inputs: dict) -> list[ref.Finding]:
    out: list[ref.Finding] = []
    builder = ref.resolve(row.builder)
    path_inputs = ref.check_path_parameters(builder, inputs, {"subscription_id": FAKE_SUBSCRIPTION, **row.path_defaults}, out)
    for key, value in row.fixed_inputs.items():
        if inputs.get(key) != value:
            out.append(ref.Finding(key, f"{inputs.get(key)!r}: the API only has {value!r}"))
    body = ref.arm_shape({k: v for k, v in inputs.items() if ref.norm(k) not in path_inputs and k not in row.fixed_inputs})
    ref.check_model(body, ref.resolve(row.model), "", row.not_covered, out)
    for rule in row.rules:
        out.extend(rule(inputs))
    return out


@pytest.mark.parametrize("type_token", sorted(ROWS))
def test_resource_type_conforms(plans, type_token):
    row = ROWS[type_token]
    provider = provider_api_version(type_token)
    sdk = ref.api_version_of(ref.resolve(row.builder), {"subscription_id": FAKE_SUBSCRIPTION, **row.path_defaults})
    version = importlib.metadata.version(row.package)
    assert provider == sdk or row.note, (
        f"{type_token}: the provider targets {provider}, {row.package} {version} sends {sdk}; "
        "add a note saying why that model is the nearest reference")
    checked, problems = 0, []
    for stack, plan in plans.items():
        for resource in plan.of_type(type_token):
            checked += 1
            for finding in findings_for(row, resource.inputs):
                problems.append(f"{stack}: {resource.name}: {finding.path}: {finding.message}")
    assert checked, f"no stack declares {type_token}: drop the row or add the option to conformance_stacks"
    assert not problems, (f"{type_token} against {row.model} ({row.package} {version}, API {sdk}; "
                          f"provider API {provider}):\n  " + "\n  ".join(problems))


def test_every_type_in_the_stacks_has_a_row(plans):
    declared = {r.type for plan in plans.values() for r in plan.custom_resources()}
    missing = sorted(declared - set(ROWS))
    assert not missing, f"resource types without a conformance row (tests/conformance/conformance_rows.py): {missing}"


def test_not_covered_entries_say_why():
    for row in ROWS.values():
        for path, reason in row.not_covered.items():
            assert len(reason.split()) >= 5, f"{row.type}: {path} needs a reason, not {reason!r}"


class TestTheCheckCanFail:
    """The checker catches each kind of mistake (so a passing conformance test means something)."""

    def account(self, **changes):
        inputs = {"accountName": "amlhpcdevds12345", "resourceGroupName": "rg", "location": "eastus",
                  "kind": "StorageV2", "sku": {"name": "Standard_LRS"}, "minimumTlsVersion": "TLS1_2",
                  "enableHttpsTrafficOnly": True, "networkRuleSet": {"defaultAction": "Deny", "bypass": "AzureServices"}}
        inputs.update(changes)
        return {k: v for k, v in inputs.items() if v is not None}

    def messages(self, type_token, inputs):
        return [f"{f.path}: {f.message}" for f in findings_for(ROWS[type_token], inputs)]

    def test_a_valid_account_passes(self):
        assert self.messages("azure-native:storage:StorageAccount", self.account()) == []

    def test_unknown_property(self):
        assert any("no property 'supportsHttps'" in m for m in
                   self.messages("azure-native:storage:StorageAccount", self.account(supportsHttps=True)))

    def test_enum_value(self):
        found = self.messages("azure-native:storage:StorageAccount", self.account(minimumTlsVersion="TLS1_3x"))
        assert any(m.startswith("minimumTlsVersion:") and "not one of" in m for m in found)

    def test_nested_enum_and_required(self):
        found = self.messages("azure-native:storage:StorageAccount",
                              self.account(sku={"tier": "Standard"}, networkRuleSet={"defaultAction": "Block"}))
        assert any(m.startswith("sku.name: required") for m in found)
        assert any(m.startswith("networkRuleSet.defaultAction:") for m in found)

    def test_required_top_level(self):
        assert any(m.startswith("kind: required") for m in
                   self.messages("azure-native:storage:StorageAccount", self.account(kind=None)))

    def test_name_length_and_pattern(self):
        found = self.messages("azure-native:storage:StorageAccount", self.account(accountName="Amlhpc_DEV"))
        assert any("a name Azure refuses" in m for m in found)

    def test_read_only_property(self):
        found = self.messages("azure-native:keyvault:Vault", {
            "vaultName": "kv-ok-name", "resourceGroupName": "rg", "location": "eastus",
            "properties": {"tenantId": "00000000-0000-0000-0000-000000000000",
                           "sku": {"family": "A", "name": "standard"}, "hsmPoolResourceId": "x"}})
        assert any(m.startswith("properties.hsmPoolResourceId: read-only") for m in found)

    def test_numeric_range(self):
        found = self.messages("azure-native:storage:BlobServiceProperties", {
            "accountName": "acct123", "resourceGroupName": "rg", "blobServicesName": "default",
            "deleteRetentionPolicy": {"enabled": True, "days": 400}})
        assert any(m.startswith("deleteRetentionPolicy.days:") and "maximum 365" in m for m in found)

    def test_typespec_model_unknown_and_discriminator(self):
        found = self.messages("azure-native:machinelearningservices:Compute", {
            "computeName": "gpu", "workspaceName": "mlw", "resourceGroupName": "rg",
            "properties": {"computeType": "AmlCompute", "properties": {"vmSize": "x", "gpuCount": 8}}})
        assert any(m.startswith("properties.properties.gpuCount:") for m in found)
        found = self.messages("azure-native:machinelearningservices:Compute", {
            "computeName": "gpu", "workspaceName": "mlw", "resourceGroupName": "rg",
            "properties": {"computeType": "SlurmCluster"}})
        assert any("not one of" in m for m in found)

    def test_budget_notification_limit(self):
        notes = {f"n{i}": {"enabled": True, "operator": "GreaterThan", "threshold": i * 10,
                           "contactEmails": ["a@example.com"]} for i in range(6)}
        found = self.messages("azure-native:consumption:Budget", {
            "scope": "/subscriptions/s/resourceGroups/rg", "budgetName": "b", "amount": 1, "category": "Cost",
            "timeGrain": "Monthly", "timePeriod": {"startDate": "2026-11-01T00:00:00Z"}, "notifications": notes})
        assert any("at most 5" in m for m in found)
