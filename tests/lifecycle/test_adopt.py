"""amlhpc.infra.adopt on its own: the name suffix written once into a stack file, the import
document for retained resources, the URN form, the ARM existence probe and the CLI's bad
input (exit 2, the fix, nothing written)."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from amlhpc.core.errors import UserError
from amlhpc.infra import adopt, naming
from amlhpc.infra.config import NAME_SUFFIX_KEY, REPO_ROOT, load_stack_config
from amlhpc.infra.plan import evaluate
from tests.lifecycle.lifecycle_tooling import clone

SUB = "aaaaaaaa-0000-0000-0000-000000000001"


class TestSuffix:
    def test_written_once_under_config_keeping_the_comments(self, tmp_path):
        root = clone(tmp_path)
        before = (root / "Pulumi.dev.yaml").read_text()
        first = adopt.ensure_suffix("dev", root, make=lambda: "q7w2k9")
        text = (root / "Pulumi.dev.yaml").read_text()
        assert first == "q7w2k9" and text.startswith(before.split("config:")[0])  # header comments kept
        assert adopt.ensure_suffix("dev", root, make=lambda: "zzzzzz") == "q7w2k9"  # never replaced
        assert load_stack_config("dev", root).names.dataset_storage.endswith("q7w2k9")

    def test_random_by_default_and_valid(self, tmp_path):
        root = clone(tmp_path)
        suffixes = {adopt.ensure_suffix(s, root) for s in ("dev", "prod")}
        assert len(suffixes) == 2 and all(re.fullmatch(r"[a-z0-9]{6}", s) for s in suffixes)

    def test_a_random_suffix_always_reads_back_from_yaml_as_written(self):
        """All digits (`012345` is octal 5349) or `0x1f2e` would read as numbers: a letter leads."""
        for _ in range(20_000):
            suffix = naming.random_suffix()
            assert suffix[0].isalpha() and yaml.safe_load(f"k: {suffix}")["k"] == suffix
        assert yaml.safe_load("k: 012345")["k"] == 5349  # why: the rule this test holds

    def test_a_suffix_yaml_reads_as_a_number_is_refused_with_the_fix(self, tmp_path):
        (tmp_path / "Pulumi.lab.yaml").write_text(f"config:\n  {NAME_SUFFIX_KEY}: 012345\n")
        with pytest.raises(UserError) as info:
            adopt.ensure_suffix("lab", tmp_path)
        assert "5349" in info.value.render() and "quote it" in info.value.render()
        (tmp_path / "Pulumi.lab.yaml").write_text(f'config:\n  {NAME_SUFFIX_KEY}: "012345"\n')
        assert adopt.ensure_suffix("lab", tmp_path) == "012345"

    def test_experiments_own_no_global_names(self, tmp_path):
        root = clone(tmp_path)
        (root / "Pulumi.exp-x.yaml").write_text("config:\n  aml-hpc:environment: dev\n")
        assert adopt.ensure_suffix("exp-x", root) is None
        assert NAME_SUFFIX_KEY not in (root / "Pulumi.exp-x.yaml").read_text()

    def test_config_written_as_a_flow_mapping_is_rewritten(self, tmp_path):
        (tmp_path / "Pulumi.lab.yaml").write_text('config: {"azure-native:location": eastus}\n')
        adopt.ensure_suffix("lab", tmp_path, make=lambda: "abcd12")
        config = yaml.safe_load((tmp_path / "Pulumi.lab.yaml").read_text())["config"]
        assert config == {"azure-native:location": "eastus", NAME_SUFFIX_KEY: "abcd12"}

    def test_a_bad_suffix_in_the_file_is_reported_with_the_fix(self, tmp_path):
        (tmp_path / "Pulumi.lab.yaml").write_text(f"config:\n  {NAME_SUFFIX_KEY}: Bad_One\n")
        with pytest.raises(UserError) as info:
            adopt.ensure_suffix("lab", tmp_path)
        assert "aml-hpc:nameSuffix" in info.value.render() and "delete the line" in info.value.render()


@pytest.fixture(scope="module")
def dev_plan():
    return evaluate("dev", REPO_ROOT, subscription_id=SUB)


class TestImportDocument:
    def test_retained_resources_with_arm_ids_and_api_versions(self, dev_plan):
        retained = adopt.retained_resources(dev_plan)
        types = {r.type for r in retained}
        assert "azure-native:storage:BlobServiceProperties" not in types  # a singleton: never conflicts
        assert {"azure-native:resources:ResourceGroup", "azure-native:storage:StorageAccount",
                "azure-native:machinelearningservices:Workspace", "azure-native:keyvault:Vault",
                "azure-native:machinelearningservices:EnvironmentVersion"} <= types
        account = next(r for r in retained if r.name == "data-account")
        assert account.arm_id.startswith(f"/subscriptions/{SUB}/resourceGroups/rg-amlhpc-dev/providers/Microsoft.Storage/")
        assert account.api_version == "2024-01-01" and "pulumi:pulumi:Stack" not in account.urn

    def test_components_recreated_or_named_from_the_state(self, dev_plan):
        retained = adopt.retained_resources(dev_plan)
        data_parent = next(r.parent_urn for r in retained if r.name == "data-account")
        document = adopt.import_document(retained, {data_parent}, lambda r: r.name in {"data-account", "core-rg"})
        entries = {e["name"]: e for e in document["resources"]}
        assert document["nameTable"] == {"data": data_parent}  # the component kept by destroy
        assert entries["core"] == {"type": "aml-hpc:core:ResourceGroup", "name": "core", "component": True}
        assert entries["core-rg"]["parent"] == "core" and entries["data-account"]["parent"] == "data"
        assert list(entries) == ["core", "core-rg", "data-account"]  # parents first

    def test_nothing_in_azure_or_all_in_state_is_nothing_to_do(self, dev_plan):
        retained = adopt.retained_resources(dev_plan)
        assert adopt.import_document(retained, set(), lambda r: False) == {"resources": []}
        assert adopt.import_document(retained, {r.urn for r in retained}, lambda r: True) == {"resources": []}

    def test_urns_two_components_deep_get_the_engines_whole_type_chain(self):
        """Pulumi's mock runtime keeps only the parent's last type; the engine keeps them all."""
        from types import SimpleNamespace as R

        head = "urn:pulumi:dev::aml-hpc::"
        stack = R(urn=f"{head}pulumi:pulumi:Stack::aml-hpc-dev", type="pulumi:pulumi:Stack", name="aml-hpc-dev", parent=None)
        ws = R(urn=f"{head}pulumi:pulumi:Stack$aml-hpc:ml:Workspace::ml", type="aml-hpc:ml:Workspace", name="ml",
               parent=stack.urn)
        cmk = R(urn=f"{head}aml-hpc:ml:Workspace$aml-hpc:security:CustomerManagedKey::ml-cmk",
                type="aml-hpc:security:CustomerManagedKey", name="ml-cmk", parent=ws.urn)
        key = R(urn=f"{head}aml-hpc:security:CustomerManagedKey$azure-native:keyvault:Key::ml-cmk-key",
                type="azure-native:keyvault:Key", name="ml-cmk-key", parent=cmk.urn)
        urns = adopt.engine_urns([stack, ws, cmk, key])
        assert urns[key.urn] == (f"{head}aml-hpc:ml:Workspace$aml-hpc:security:CustomerManagedKey"
                                 "$azure-native:keyvault:Key::ml-cmk-key")
        assert urns[ws.urn] == f"{head}aml-hpc:ml:Workspace::ml" and stack.urn not in urns

    def test_nested_components_are_recreated_outermost_first_each_under_its_parent(self):
        head = "urn:pulumi:dev::aml-hpc::"
        ws, cmk = f"{head}aml-hpc:ml:Workspace::ml", f"{head}aml-hpc:ml:Workspace$aml-hpc:security:CustomerManagedKey::ml-cmk"
        key = adopt.Retained(f"{head}aml-hpc:ml:Workspace$aml-hpc:security:CustomerManagedKey$azure-native:keyvault:Key"
                             "::ml-cmk-key", "azure-native:keyvault:Key", "ml-cmk-key", cmk, "/k", "v",
                             ancestors=(cmk, ws))
        document = adopt.import_document([key], set(), lambda r: True)
        assert document["resources"] == [
            {"type": "aml-hpc:ml:Workspace", "name": "ml", "component": True},
            {"type": "aml-hpc:security:CustomerManagedKey", "name": "ml-cmk", "component": True, "parent": "ml"},
            {"type": "azure-native:keyvault:Key", "name": "ml-cmk-key", "id": "/k", "parent": "ml-cmk"},
        ]
        kept_workspace = adopt.import_document([key], {ws}, lambda r: True)
        assert kept_workspace["nameTable"] == {"ml": ws} and len(kept_workspace["resources"]) == 2

    def test_state_urns_in_the_engines_form(self):
        export = {"deployment": {"resources": [{"urn": "urn:pulumi:dev::aml-hpc::pulumi:pulumi:Stack$a:b:C::x"},
                                               {"urn": "urn:pulumi:dev::aml-hpc::a:b:C$t:u:V::y"}]}}
        assert adopt.state_urns(export) == {"urn:pulumi:dev::aml-hpc::a:b:C::x", "urn:pulumi:dev::aml-hpc::a:b:C$t:u:V::y"}

    def test_api_version_is_the_providers(self):
        assert adopt.provider_api_version("azure-native:machinelearningservices:Workspace") == "2025-12-01"
        with pytest.raises(AttributeError):
            adopt.provider_api_version("azure-native:storage:NoSuchThing")


class FakeTransport:
    """An azure-core transport answering GETs from a table of id -> status."""

    def __init__(self, statuses: dict[str, int]):
        self.statuses = statuses
        self.seen: list[str] = []

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return None

    def open(self):
        return None

    def close(self):
        return None

    def send(self, request, **kwargs):
        from azure.core.pipeline.transport import HttpResponse

        self.seen.append(request.url)
        path = request.url.split("management.azure.com", 1)[1].split("?")[0]
        status = self.statuses.get(path, 404)

        class Response(HttpResponse):
            def body(self):
                return b"{}"

        response = Response(request, None)
        response.status_code = status
        response.headers = {}
        return response


class FakeCredential:
    def get_token(self, *scopes, **kwargs):
        from azure.core.credentials import AccessToken

        return AccessToken("token", 2**31)


class TestArmProbe:
    def test_200_exists_404_does_not_other_stops(self, monkeypatch):
        from azure.mgmt.core import ARMPipelineClient

        transport = FakeTransport({"/subscriptions/s/resourceGroups/here": 200, "/subscriptions/s/resourceGroups/denied": 403})
        real = ARMPipelineClient.__init__
        monkeypatch.setattr(ARMPipelineClient, "__init__",
                            lambda self, *a, **k: real(self, *a, transport=transport, **k))
        exists = adopt.ArmReader(FakeCredential()).exists

        def retained(path):
            return adopt.Retained("urn", "t", "n", None, path, "2024-03-01")

        assert exists(retained("/subscriptions/s/resourceGroups/here")) is True
        assert exists(retained("/subscriptions/s/resourceGroups/gone")) is False
        assert "api-version=2024-03-01" in transport.seen[0]
        with pytest.raises(UserError, match="403"):
            exists(retained("/subscriptions/s/resourceGroups/denied"))


class TestCli:
    def test_bad_subscription_exits_2_with_the_fix(self, tmp_path):
        state = tmp_path / "state.json"
        state.write_text("{}")
        result = CliRunner().invoke(adopt.app, ["import-file", "--stack", "dev", "--state", str(state),
                                                "--subscription", "my-sub", "--out", str(tmp_path / "o.json")])
        assert result.exit_code == 2 and "az account show" in result.output
        assert not (tmp_path / "o.json").exists()

    def test_unreadable_state_exits_2_naming_the_export(self, tmp_path):
        result = CliRunner().invoke(adopt.app, ["import-file", "--stack", "dev", "--state", str(tmp_path / "none.json"),
                                                "--subscription", SUB, "--out", str(tmp_path / "o.json")])
        assert result.exit_code == 2 and "pulumi stack export --stack dev" in result.output

    def test_experiment_import_file_is_empty_without_touching_azure(self, tmp_path, monkeypatch):
        state = tmp_path / "state.json"
        state.write_text(json.dumps({"deployment": {"resources": []}}))
        out = tmp_path / "o.json"
        monkeypatch.setattr(adopt.ArmReader, "_get", lambda *a: pytest.fail("no Azure call for experiments"))
        result = CliRunner().invoke(adopt.app, ["import-file", "--stack", "exp-x", "--state", str(state),
                                                "--subscription", SUB, "--out", str(out)])
        assert result.exit_code == 0 and result.output.strip() == "0" and not out.exists()

    def test_suffix_command_writes_and_prints_the_suffix(self, tmp_path, monkeypatch):
        root = clone(tmp_path)
        monkeypatch.setattr(adopt, "REPO_ROOT", root)
        result = CliRunner().invoke(adopt.app, ["suffix", "--stack", "dev"])
        written = yaml.safe_load((root / "Pulumi.dev.yaml").read_text())["config"][NAME_SUFFIX_KEY]
        assert result.exit_code == 0 and result.output.strip() == written


def test_module_runs_as_a_script():
    """`python -m amlhpc.infra.adopt --help` (what scripts/pulumi-stack.sh calls) works."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "amlhpc.infra.adopt", "--help"], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 0 and "import-file" in result.stdout and "suffix" in result.stdout



class TestRoleAssignmentAdoption:
    """Retained grants are found in Azure by (scope, role, principal), the principal read
    from the identity in Azure: never by the offline plan's stand-in principal."""

    SCOPE = "/subscriptions/s/resourceGroups/g/providers/Microsoft.KeyVault/vaults/kv/keys/k"
    ROLE = "/subscriptions/s/providers/Microsoft.Authorization/roleDefinitions/e147488a-f6f5-4113-8e2d-b22465e65bf6"
    IDENTITY = "/subscriptions/s/resourceGroups/g/providers/Microsoft.ManagedIdentity/userAssignedIdentities/cmk"

    class Reader:
        def __init__(self, principal: str | None, assignments: list[dict]):
            self.principal, self.assignments = principal, assignments

        def exists(self, r):
            return True

        def read(self, arm_id, api_version):
            return {"properties": {"principalId": self.principal}} if self.principal else None

        def role_assignments(self, scope):
            return self.assignments

    def grant(self, principal: str, name: str | None = None, scope: str | None = None) -> dict:
        from amlhpc.infra.components.access import role_assignment_name

        at = scope or self.SCOPE
        name = name or role_assignment_name(at, principal, self.ROLE)
        return {"id": f"{at}/providers/Microsoft.Authorization/roleAssignments/{name}", "name": name,
                "properties": {"scope": at, "principalId": principal, "roleDefinitionId": self.ROLE.upper()}}

    def retained(self) -> adopt.Retained:
        return adopt.Retained("urn:grant", adopt.ROLE_ASSIGNMENT, "grant", None, "/planned-id", "2022-04-01",
                              inputs={"scope": self.SCOPE, "principalId": "stand-in", "roleDefinitionId": self.ROLE})

    def identities(self):
        return {"stand-in": adopt.IdentityRef(self.IDENTITY, "2023-01-31", "properties.principalId")}

    def test_found_by_the_real_principal_not_the_planned_id(self):
        real = self.grant("real-principal")
        above = self.grant("real-principal", scope="/subscriptions/s")  # inherited: listed by atScope(), not ours
        reader = self.Reader("real-principal", [above, self.grant("someone-else"), real])
        assert adopt.locate_assignment(self.retained(), reader, self.identities()) == real["id"]

    def test_nothing_to_adopt_when_the_identity_or_the_grant_is_gone(self):
        assert adopt.locate_assignment(self.retained(), self.Reader(None, []), self.identities()) is None
        assert adopt.locate_assignment(self.retained(), self.Reader("real", [self.grant("other")]),
                                       self.identities()) is None

    def test_a_grant_under_another_name_is_refused_with_the_fix(self):
        stray = self.grant("real", name="0f0f0f0f-0000-4000-8000-000000000000")
        with pytest.raises(UserError) as info:
            adopt.locate_assignment(self.retained(), self.Reader("real", [stray]), self.identities())
        assert "az role assignment delete --ids" in info.value.render() and stray["id"] in info.value.render()
