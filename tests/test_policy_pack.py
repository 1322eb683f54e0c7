"""The policy pack as the Pulumi engine runs it: `python -m pulumi.policy` serving
amlhpc/infra/policy/pack over gRPC, asked the same questions `pulumi preview --policy-pack` asks
(GetAnalyzerInfo, Analyze per resource, AnalyzeStack, Configure). The resources come from
real offline plans, and the answers must match `check_plan` on the same plan - except the
rules that need retainOnDelete, which the analyzer protocol does not carry: those must
say "not applicable" and point at the offline check."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from datetime import UTC, datetime

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from amlhpc.infra.config import REPO_ROOT
from amlhpc.infra.plan import evaluate
from amlhpc.infra.policy import RULES, check_plan

PACK_DIR = REPO_ROOT / "amlhpc" / "infra" / "policy" / "pack"
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
NEEDS_RETENTION = {"dataset-storage-retained", "dataset-resource-group-retained"}
LEVELS = {"mandatory": analyzer_pb2.MANDATORY, "advisory": analyzer_pb2.ADVISORY}


class PackServer:
    """One policy pack process, started the way the engine's analyzer plugin starts it."""

    def __init__(self, stack: str | None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
        if stack:
            env.update(PULUMI_STACK=stack, PULUMI_PROJECT="aml-hpc", PULUMI_DRY_RUN="true")
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", str(PACK_DIR)],
            cwd=PACK_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        port = self.process.stdout.readline().decode().strip()
        if not port.isdigit():
            self.process.kill()
            raise RuntimeError(f"policy pack did not start: {self.process.stderr.read().decode()}")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = analyzer_pb2_grpc.AnalyzerStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.process.terminate()
        self.process.wait(timeout=10)

    def analyze(self, item: dict) -> analyzer_pb2.AnalyzeResponse:
        return self.stub.Analyze(analyzer_pb2.AnalyzeRequest(
            type=item["type"], properties=_struct(item["inputs"]), urn=item["urn"], name=item["name"],
            options=analyzer_pb2.AnalyzerResourceOptions(protect=item["options"]["protect"]),
        ))

    def analyze_stack(self, items: list[dict]) -> analyzer_pb2.AnalyzeResponse:
        return self.stub.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=[
            analyzer_pb2.AnalyzerResource(
                type=i["type"], properties=_struct(i["inputs"]), urn=i["urn"], name=i["name"],
                options=analyzer_pb2.AnalyzerResourceOptions(protect=i["options"]["protect"]),
                parent=i.get("parent") or "", dependencies=i["options"].get("dependsOn", []),
            ) for i in items
        ]))

    def preview(self, plan: dict) -> tuple[set[tuple[str, str]], list, set[str]]:
        """(policy, urn) of every violation, the diagnostics, and the not-applicable policies."""
        custom = [r for r in plan["resources"] if r["custom"]]
        responses = [self.analyze(r) for r in custom] + [self.analyze_stack(custom)]
        diagnostics = [d for resp in responses for d in resp.diagnostics]
        skipped = {n.policy_name for resp in responses for n in resp.not_applicable}
        return {(d.policyName, d.urn) for d in diagnostics}, diagnostics, skipped


def _struct(value: dict) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


@pytest.fixture(scope="module")
def servers():
    started: dict[str | None, PackServer] = {}

    def get(stack: str | None) -> PackServer:
        if stack not in started:
            started[stack] = PackServer(stack)
        return started[stack]

    yield get
    for server in started.values():
        server.close()


@pytest.fixture(scope="module")
def dev_plan() -> dict:
    return evaluate("dev", REPO_ROOT, now=NOW).to_json()


def resource(plan: dict, name: str) -> dict:
    return next(r for r in plan["resources"] if r["name"] == name)


def broken(plan: dict) -> dict:
    """The dev plan with several rules broken at once."""
    plan = copy.deepcopy(plan)
    compute = resource(plan, "cluster-nd-a100-compute")["inputs"]
    props = compute["properties"]["properties"]
    props["scaleSettings"]["minNodeCount"] = 1.0
    props["scaleSettings"]["nodeIdleTimeBeforeScaleDown"] = "PT2H"
    props["remoteLoginPortPublicAccess"] = "Enabled"
    props["userAccountCredentials"] = {"adminUserName": "azureuser", "adminUserSshPublicKey": "ssh-ed25519 AAAA x"}
    nc = resource(plan, "cluster-nc-a100-compute")["inputs"]["properties"]["properties"]
    nc["scaleSettings"]["maxNodeCount"] = 4.0
    resource(plan, "data-account")["inputs"]["minimumTlsVersion"] = "TLS1_0"
    resource(plan, "ml-acr")["inputs"]["adminUserEnabled"] = True
    resource(plan, "ml-kv")["inputs"]["properties"]["enablePurgeProtection"] = False
    del resource(plan, "ml-logs")["inputs"]["tags"]["environment"]
    plan["resources"] = [r for r in plan["resources"] if r["type"] != "azure-native:consumption:Budget"]
    return plan


class TestAnalyzerInfo:
    def test_every_rule_is_a_policy_at_its_level(self, servers):
        """The pack serves one policy per rule, at the rule's enforcement level and type."""
        info = servers("dev").stub.GetAnalyzerInfo(empty_pb2.Empty())
        assert info.name == "aml-hpc"
        served = {p.name: p for p in info.policies}
        assert set(served) == {r.name for r in RULES}
        for rule in RULES:
            policy = served[rule.name]
            assert policy.enforcementLevel == LEVELS[rule.level], rule.name
            expected = analyzer_pb2.POLICY_TYPE_RESOURCE if rule.check_resource else analyzer_pb2.POLICY_TYPE_STACK
            assert policy.policy_type == expected, rule.name
        assert "maxIdleMinutes" in served["gpu-idle-scale-down"].configSchema.properties


class TestParityWithOfflineCheck:
    def test_same_violations_as_check_plan(self, servers, dev_plan):
        """Every violation check_plan finds, the pack finds on the same resource (retention aside)."""
        plan = broken(dev_plan)
        expected = {(v.rule, v.urn or "") for v in check_plan(plan) if v.rule not in NEEDS_RETENTION}
        found, _, _ = servers("dev").preview(plan)
        assert found == expected
        rules = {rule for rule, _ in found}
        assert {"gpu-scale-to-zero", "gpu-idle-scale-down", "no-public-ssh", "multi-node-infiniband",
                "storage-secure", "registry-admin-user-off", "key-vault-purge-protection", "required-tags",
                "stack-budget"} <= rules

    def test_clean_plan_has_no_violations(self, servers, dev_plan):
        """The shipped dev plan raises nothing the pack can see."""
        found, _, _ = servers("dev").preview(dev_plan)
        assert found == set()

    def test_retention_rules_say_not_applicable(self, servers, dev_plan):
        """Without retainOnDelete the pack skips the retention rules and says where they run."""
        response = servers("dev").analyze(resource(dev_plan, "data-account"))
        reasons = {n.policy_name: n.reason for n in response.not_applicable}
        assert "infra plan" in reasons["dataset-storage-retained"]

    def test_protected_dataset_storage_needs_no_retention_info(self, servers, dev_plan):
        """Protected storage (prod) passes the retention rule in the pack as well."""
        item = copy.deepcopy(resource(dev_plan, "data-account"))
        item["options"]["protect"] = True
        response = servers("dev").analyze(item)
        assert "dataset-storage-retained" not in {n.policy_name for n in response.not_applicable}
        assert "dataset-storage-retained" not in {d.policyName for d in response.diagnostics}

    def test_diagnostic_carries_level_message_and_fix(self, servers, dev_plan):
        """A violation reaches the engine as mandatory, with the message and the fix."""
        _, diagnostics, _ = servers("dev").preview(broken(dev_plan))
        ssh = next(d for d in diagnostics if d.policyName == "no-public-ssh")
        assert ssh.enforcementLevel == analyzer_pb2.MANDATORY
        assert "cluster 'nd-a100' opens SSH" in ssh.message and "fix: remove the cluster's ssh block" in ssh.message
        assert ssh.policyPackName == "aml-hpc"


class TestPreviewRealities:
    def test_unknown_value_is_reported_not_passed(self, servers, dev_plan):
        """A value unknown during preview gives an advisory 'can't run' note, never a silent pass."""
        item = copy.deepcopy(resource(dev_plan, "data-account"))
        item["inputs"]["minimumTlsVersion"] = UNKNOWN_STRING_VALUE
        response = servers("dev").analyze(item)
        notes = [d for d in response.diagnostics if d.policyName == "storage-secure"]
        assert len(notes) == 1 and "during preview" in notes[0].message
        assert notes[0].enforcementLevel == analyzer_pb2.ADVISORY

    @pytest.mark.parametrize("stack", ["exp-demo", None])
    def test_experiment_kind_from_engine_or_tag(self, servers, dev_plan, stack):
        """An experiment is recognised from PULUMI_STACK, or from the resource's stack tag."""
        item = copy.deepcopy(resource(dev_plan, "cluster-nd-a100-compute"))
        item["inputs"]["tags"]["stack"] = "exp-demo"
        response = servers(stack).analyze(item)
        tags = [d for d in response.diagnostics if d.policyName == "required-tags"]
        assert len(tags) == 1 and "expiresAt" in tags[0].message
        item["inputs"]["tags"]["expiresAt"] = "2026-12-31T00:00:00Z"
        assert not [d for d in servers(stack).analyze(item).diagnostics if d.policyName == "required-tags"]

    def test_policy_config_sets_the_idle_limit(self, servers, dev_plan):
        """--policy-pack-config maxIdleMinutes loosens the idle rule (its own server: config is state)."""
        server = servers("prod")
        item = copy.deepcopy(resource(dev_plan, "cluster-nd-a100-compute"))
        item["inputs"]["properties"]["properties"]["scaleSettings"]["nodeIdleTimeBeforeScaleDown"] = "PT60M"
        assert any(d.policyName == "gpu-idle-scale-down" for d in server.analyze(item).diagnostics)
        server.stub.Configure(analyzer_pb2.ConfigureAnalyzerRequest(policyConfig={
            "gpu-idle-scale-down": analyzer_pb2.PolicyConfig(enforcementLevel=analyzer_pb2.MANDATORY,
                                                             properties=_struct({"maxIdleMinutes": 90})),
        }))
        assert not any(d.policyName == "gpu-idle-scale-down" for d in server.analyze(item).diagnostics)


def test_pack_runs_with_the_interpreter_the_deploy_script_gives_pulumi():
    """PulumiPolicy.yaml names no virtualenv (an installed pack has none beside it): Pulumi runs
    it with PULUMI_PYTHON_CMD, which scripts/pulumi-stack.sh sets to the interpreter aml-hpc
    runs in (the clone's .venv, or the installed tool's), where amlhpc.infra.policy imports."""
    import yaml

    project = yaml.safe_load((PACK_DIR / "PulumiPolicy.yaml").read_text())
    assert project["runtime"] == {"name": "python", "options": {"toolchain": "pip"}}
    script = (REPO_ROOT / "scripts" / "pulumi-stack.sh").read_text()
    assert "export PULUMI_PYTHON_CMD" in script and "PYTHON=${AMLHPC_PYTHON:-.venv/bin/python}" in script


def test_the_pack_reads_the_stack_not_the_environment_tag(servers, dev_plan):
    """A prod preview whose resources say environment: dev still gets prod's baseline (the
    adapter once built its view from tags the stack file writes)."""
    item = copy.deepcopy(resource(dev_plan, "data-account"))
    item["inputs"]["allowSharedKeyAccess"] = True
    assert item["inputs"]["tags"]["environment"] == "dev" and item["inputs"]["publicNetworkAccess"] != "Disabled"
    on_prod = {d.policyName for d in servers("prod").analyze(item).diagnostics}
    assert {"no-shared-key-storage", "no-public-network-access", "environment-tag-is-the-stacks"} <= on_prod
    on_dev = {d.policyName for d in servers("dev").analyze(item).diagnostics}
    assert "no-public-network-access" not in on_dev and "environment-tag-is-the-stacks" not in on_dev
