"""`plan --diff`: real plan pairs of changed stack files, what they add, remove, replace and
update, how cost and quota move, the text and Markdown a pull request shows, and the
comparison with another git revision."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from amlhpc.core import skus
from amlhpc.core.errors import UserError
from amlhpc.infra.cli import app
from amlhpc.infra.config import REPO_ROOT, ControllerConfig
from amlhpc.infra.plan import evaluate
from amlhpc.infra.plan.diff import (
    REASON_LOCATION,
    REASON_REPLACE_ON_CHANGES,
    REASON_RESOURCE_ID,
    changes,
    diff,
)
from amlhpc.infra.plan.render_diff import MARKER, render_markdown, render_text
from amlhpc.infra.plan.revision import plan_at
from tests.plan_helpers import repository_copy

COMPUTE = "azure-native:machinelearningservices:Compute"


def config(stack: str = "prod") -> dict:
    return yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]


def plan_of(tmp_path: Path, cfg: dict, stack: str = "prod", now: datetime | None = None) -> dict:
    folder = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": cfg}))
    return evaluate(stack, folder, now=now).to_json()


@pytest.fixture(scope="module")
def prod() -> dict:
    return evaluate("prod").to_json()


def only(result, action):
    found = [r for r in result.resources if r.action == action]
    assert len(found) == 1, [(r.action, r.name) for r in result.resources]
    return found[0]


class TestRealPlanPairs:
    def test_vm_size_change_replaces_the_cluster(self, tmp_path, prod):
        cfg = config()
        cfg["aml-hpc:clusters"][0]["sku"] = "Standard_ND96asr_v4"
        result = diff(prod, plan_of(tmp_path, cfg), "base", "head")
        change = only(result, "replace")
        assert change.resource.type == COMPUTE and change.name == "mlw-amlhpc-prod/nd-h100"
        vm = next(c for c in change.changes if c.path == "properties.properties.vmSize")
        assert (vm.before, vm.after, vm.replaces) == ("Standard_ND96isr_H100_v5", "Standard_ND96asr_v4",
                                                      REASON_REPLACE_ON_CHANGES)
        assert [c.path for c in change.changes if c.replaces] == ["properties.properties.vmSize"]
        assert result.count("update") == result.count("add") == result.count("remove") == 0
        text = render_text(result)
        assert "! machinelearningservices:Compute  mlw-amlhpc-prod/nd-h100" in text
        assert "[replaces: replace-on-change]" in text and "deleted, then created again" in text
        # Cost and quota move with the size: 8 nodes at the catalog's prices.
        old, new = skus.get("Standard_ND96isr_H100_v5"), skus.get("Standard_ND96asr_v4")
        assert result.cost[0].change == pytest.approx(8 * (new.price.usd_per_hour - old.price.usd_per_hour), abs=0.01)
        assert {(d.label, d.before, d.after) for d in result.quota} == {
            (f"{old.quota_family} (Dedicated)", 8 * old.vcpus, None),
            (f"{new.quota_family} (Dedicated)", None, 8 * new.vcpus)}

    def test_added_cluster_adds_cost_and_quota(self, tmp_path, prod):
        cfg = config()
        cfg["aml-hpc:clusters"].append({"name": "nd-extra", "sku": "Standard_ND96isr_H100_v5", "maxNodes": 4,
                                        "priority": "Dedicated"})
        result = diff(prod, plan_of(tmp_path, cfg), "base", "head")
        added = only(result, "add")
        assert added.resource.type == COMPUTE and added.name == "mlw-amlhpc-prod/nd-extra"
        assert added.component == "cluster-nd-extra"
        h100 = skus.get("Standard_ND96isr_H100_v5")
        assert result.cost[0].change == pytest.approx(4 * h100.price.usd_per_hour, abs=0.01)
        (quota,) = result.quota
        assert (quota.before, quota.after, quota.change) == (8 * h100.vcpus, 12 * h100.vcpus, 4 * h100.vcpus)
        assert [d.label.split(" ")[0] for d in result.clusters] == ["nd-extra"]
        assert any(c.path == "clusters.nd-extra.maxNodes" and c.after == 4 for c in result.outputs)
        text = render_text(result)
        assert "+ machinelearningservices:Compute  mlw-amlhpc-prod/nd-extra" in text
        controller = ControllerConfig().max_nodes * ControllerConfig().price
        assert (f"full scale: ${8 * h100.price.usd_per_hour + controller:,.2f}/hour -> "
                f"${12 * h100.price.usd_per_hour + controller:,.2f}/hour") in text

    def test_removed_cluster_is_removed_with_its_cost(self, tmp_path):
        base_cfg = config("dev")
        base = plan_of(tmp_path, base_cfg, "dev")
        head_cfg = copy.deepcopy(base_cfg)
        gone = head_cfg["aml-hpc:clusters"].pop()
        result = diff(base, plan_of(tmp_path, head_cfg, "dev"), "base", "head")
        removed = only(result, "remove")
        assert removed.name == f"mlw-amlhpc-dev/{gone['name']}"
        assert result.cost[0].change == pytest.approx(
            -gone["maxNodes"] * skus.get(gone["sku"]).price.usd_per_hour, abs=0.01)
        assert result.quota and all(d.change < 0 for d in result.quota)
        assert f"- machinelearningservices:Compute  mlw-amlhpc-dev/{gone['name']}" in render_text(result)

    def test_region_and_name_changes_replace(self, tmp_path, prod):
        cfg = config()
        cfg["azure-native:location"] = "westus3"
        result = diff(prod, plan_of(tmp_path, cfg), "base", "head")
        account = next(r for r in result.resources if r.resource.name == "data-account")
        assert account.action == "replace"
        assert {c.path: c.replaces for c in account.changes}["location"] == REASON_LOCATION
        moved = [r for r in result.resources if any(c.path == "location" for c in r.changes)]
        assert len(moved) > 20 and all(r.action == "replace" for r in moved)

        cfg = config()
        cfg["aml-hpc:namePrefix"] = "hpcml"
        result = diff(prod, plan_of(tmp_path, cfg), "base", "head")
        group = next(r for r in result.resources if r.resource.type == "azure-native:resources:ResourceGroup")
        assert group.action == "replace" and {c.replaces for c in group.changes} == {REASON_RESOURCE_ID}
        assert "PROTECTED: `pulumi up` refuses to replace it" in render_text(result), "the data account is protected"

    def test_ignore_changes_are_not_updates(self, tmp_path):
        """The budget's start date follows the month; its timePeriod is in ignoreChanges."""
        cfg = config("dev")
        before = plan_of(tmp_path, cfg, "dev", now=datetime(2026, 11, 23, tzinfo=UTC))
        after = plan_of(tmp_path, cfg, "dev", now=datetime(2027, 2, 1, tzinfo=UTC))
        budgets = [r for r in after["resources"] if r["type"] == "azure-native:consumption:Budget"]
        assert budgets and budgets[0]["inputs"]["timePeriod"] != next(
            r for r in before["resources"] if r["type"] == "azure-native:consumption:Budget")["inputs"]["timePeriod"]
        result = diff(before, after, "base", "head")
        assert not [r for r in result.resources if r.resource.type == "azure-native:consumption:Budget"]

    def test_same_plan_is_no_change(self, prod):
        result = diff(prod, copy.deepcopy(prod), "base", "head")
        custom = [r for r in prod["resources"] if r["custom"]]
        assert len(custom) > 40, "the prod plan has its resources"
        assert result.empty and result.resources == [] and result.unchanged == len(custom)
        assert "No change to resources, cost, quota or outputs" in render_markdown(result)


class TestOfflineSemantics:
    def test_removed_protected_and_retained_resources_say_so(self, prod):
        head = copy.deepcopy(prod)
        head["resources"] = [r for r in head["resources"] if r["name"] != "data-account"]
        text = render_text(diff(prod, head, "base", "head"))
        assert "- storage:StorageAccount  amlhpcprodds694a1" in text
        assert "PROTECTED: `pulumi up` fails" in text and "stays in Azure" in text

    def test_option_changes_are_updates_and_dependencies_are_not(self, prod):
        head = copy.deepcopy(prod)
        account = next(r for r in head["resources"] if r["name"] == "data-account")
        account["options"]["protect"] = False
        account["options"]["dependsOn"] = []
        change = only(diff(prod, head, "base", "head"), "update")
        assert [(c.path, c.before, c.after) for c in change.option_changes] == [("options.protect", True, False)]
        assert change.changes == ()

    def test_numbers_compare_by_value(self):
        assert changes({"a": 3.0, "b": True}, {"a": 3, "b": 1}) == [changes({"b": True}, {"b": 1})[0]]

    def test_an_older_plan_without_ignore_changes_is_not_an_option_change(self, prod):
        base = copy.deepcopy(prod)
        for r in base["resources"]:
            del r["options"]["ignoreChanges"]
        assert diff(base, prod, "base", "head").resources == []


class TestMarkdown:
    def test_pull_request_section(self, tmp_path, prod):
        cfg = config()
        cfg["aml-hpc:clusters"][0]["maxNodes"] = 4
        section = render_markdown(diff(prod, plan_of(tmp_path, cfg), "main (abc1234)", "head"))
        title, blank, against, _, fence, *body = section.splitlines()
        assert title.startswith("#### `prod`: 1 to update; full scale -$393.28/hour; quota ")
        assert against == "Against main (abc1234)." and fence == "```diff" and body[-1] == "```"
        assert "~ properties.properties.scaleSettings.maxNodeCount: 8 -> 4" in [line.strip() for line in body]
        assert MARKER.startswith("<!--") and MARKER.endswith("-->")


def run_plan(*args: str, cwd: Path = REPO_ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "amlhpc.infra", "plan", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


class TestCli:
    def test_diff_against_a_saved_plan(self, tmp_path, prod):
        base = copy.deepcopy(prod)
        compute = next(r for r in base["resources"] if r["type"] == COMPUTE)
        compute["inputs"]["properties"]["properties"]["vmSize"] = "Standard_ND96asr_v4"
        (tmp_path / "base.json").write_text(json.dumps(base))
        result = CliRunner().invoke(app, ["plan", "--stack", "prod", "--diff", str(tmp_path / "base.json"), "--json"])
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        assert document["summary"]["replace"] == 1
        (replaced,) = document["resources"]
        assert replaced["changes"] == [{"path": "properties.properties.vmSize", "before": "Standard_ND96asr_v4",
                                        "after": "Standard_ND96isr_H100_v5", "replaces": REASON_REPLACE_ON_CHANGES}]

    @pytest.mark.parametrize(("content", "message"), [
        (None, "no such file"),
        ("{not json", "not a JSON document"),
        ('{"stack": "prod"}', "resources: missing: this is not an offline plan"),
        ('{"resources": [{"urn": "u"}]}', "resources[0]: lacks type, name"),
    ])
    def test_bad_base_file_exits_2_with_the_fix(self, tmp_path, content, message):
        path = tmp_path / "base.json"
        if content is not None:
            path.write_text(content)
        result = CliRunner().invoke(app, ["plan", "--stack", "prod", "--diff", str(path)])
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert message in result.output and "python -m amlhpc.infra plan --stack STACK --json > FILE" in result.output

    @pytest.mark.parametrize(("args", "message"), [
        (["--diff", "x.json", "--diff-ref", "HEAD"], "--diff, --diff-ref: both given"),
        (["--markdown"], "--markdown: formats a diff"),
        (["--diff-ref", "HEAD", "--markdown", "--json"], "--markdown, --json: both given"),
    ])
    def test_contradicting_flags_exit_2(self, args, message):
        result = CliRunner().invoke(app, ["plan", "--stack", "dev", *args])
        assert result.exit_code == 2 and message in result.output


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    repository_copy(root)
    return root


class TestDiffRef:
    def test_change_in_the_working_tree_against_head(self, repository):
        """The base is planned from the committed stack file and program."""
        stack_file = repository / "Pulumi.dev.yaml"
        original = stack_file.read_text()
        cfg = yaml.safe_load(original)
        cfg["config"]["aml-hpc:clusters"][0]["maxNodes"] += 2
        stack_file.write_text(yaml.safe_dump(cfg))
        try:
            result = run_plan("--stack", "dev", "--diff-ref", "main", "--json", cwd=repository,
                              PYTHONPATH=str(repository))
        finally:
            stack_file.write_text(original)
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["base"].startswith("main (") and document["summary"]["update"] == 1
        (update,) = document["resources"]
        assert {"path": "properties.properties.scaleSettings.maxNodeCount",
                "before": cfg["config"]["aml-hpc:clusters"][0]["maxNodes"] - 2,
                "after": cfg["config"]["aml-hpc:clusters"][0]["maxNodes"]} in update["changes"]
        assert document["cost"][0]["change"] > 0

    def test_stack_absent_at_the_revision(self, repository):
        """A stack file the change adds has an empty base (planned nothing, so no subprocess)."""
        assert plan_at("main", "staging", repository)[0] is None
        head = evaluate("dev").to_json()
        result = diff({"stack": "staging", "resources": []}, head, "main", "head")
        custom = [r for r in head["resources"] if r["custom"]]
        assert custom and result.count("add") == len(custom) and result.unchanged == 0

    def test_unknown_revision_says_how_to_fetch_it(self, repository):
        with pytest.raises(UserError) as info:
            plan_at("origin/nope", "dev", repository)
        assert "origin/nope: is not a commit in this repository" in info.value.render()
        assert "fetch-depth: 0" in info.value.render()
