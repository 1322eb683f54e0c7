"""Experiment stack lifecycle: expiry selection, the stack-file generator, the teardown
summary and the two typer commands, on stack files in a temporary directory."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from amlhpc.core import skus
from amlhpc.core.errors import EXIT_USAGE, UserError
from amlhpc.infra import lifecycle, naming
from amlhpc.infra.config import REPO_ROOT, load_stack_config
from amlhpc.infra.lifecycle import (
    MAX_DAYS,
    experiment_stacks,
    expired_stacks,
    expiry_report,
    new_experiment,
    teardown_summary,
)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name in ("Pulumi.yaml", "Pulumi.dev.yaml", "Pulumi.prod.yaml"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    return tmp_path


def write_stack(root: Path, stack: str, expires: str | None, environment: str = "dev", raw: str | None = None):
    path = root / f"Pulumi.{stack}.yaml"
    if raw is not None:
        path.write_text(raw)
        return path
    config = {"azure-native:location": "swedencentral", "aml-hpc:owner": "me@example.com",
              "aml-hpc:environment": environment,
              "aml-hpc:clusters": [{"name": f"c-{stack[4:]}"[:16], "sku": "Standard_ND96asr_v4", "maxNodes": 2}]}
    if expires is not None:
        config["aml-hpc:expiresAt"] = expires
    path.write_text(yaml.safe_dump({"config": config}))
    return path


def problems_text(exc: pytest.ExceptionInfo[UserError]) -> str:
    return exc.value.render()


class TestExpiredStacks:
    def test_past_and_exact_expiry_are_expired_future_is_not(self, root):
        """expiresAt at or before now is expired; after now is active."""
        write_stack(root, "exp-old", "2026-11-20T00:00:00Z")
        write_stack(root, "exp-now", "2026-11-22T12:00:00Z")
        write_stack(root, "exp-later", "2026-11-22T12:00:01Z")
        assert [s.stack for s in expired_stacks(root, NOW)] == ["exp-now", "exp-old"]

    def test_dates_and_offsets(self, root):
        """A bare date means midnight UTC; offsets are honoured."""
        write_stack(root, "exp-date", "2026-11-22")            # midnight UTC, before noon
        write_stack(root, "exp-east", "2026-11-22T13:30:00+02:00")  # 11:30 UTC, before noon
        write_stack(root, "exp-west", "2026-11-22T08:00:00-05:00")  # 13:00 UTC, after noon
        assert [s.stack for s in expired_stacks(root, NOW)] == ["exp-date", "exp-east"]

    def test_environment_stacks_are_never_listed(self, root):
        """dev and prod have no expiry and are never candidates."""
        assert expired_stacks(root, NOW + timedelta(days=10_000)) == []
        assert experiment_stacks(root) == []

    def test_unreadable_expiry_is_invalid_not_skipped(self, root):
        """Missing or malformed expiry and broken YAML are reported, with the reason."""
        write_stack(root, "exp-none", None)
        write_stack(root, "exp-bad", "next friday")
        write_stack(root, "exp-yaml", None, raw="config: [unclosed\n")
        report = expiry_report(root, NOW)
        reasons = {e["stack"]: e["problem"] for e in report["invalid"]}
        assert reasons["exp-none"] == "aml-hpc:expiresAt is missing"
        assert reasons["exp-bad"] == "aml-hpc:expiresAt 'next friday' is not an ISO 8601 date or date-time"
        assert "not valid YAML" in reasons["exp-yaml"]
        assert report["expired"] == [] and report["active"] == []

    def test_report_document(self, root):
        """The JSON document the teardown workflow reads."""
        write_stack(root, "exp-a", "2026-11-01T00:00:00Z", environment="prod")
        write_stack(root, "exp-b", "2027-01-01T00:00:00Z")
        report = expiry_report(root, NOW)
        assert report["now"] == "2026-11-22T12:00:00Z"
        assert report["expired"] == [{"stack": "exp-a", "file": "Pulumi.exp-a.yaml", "environment": "prod",
                                      "expiresAt": "2026-11-01T00:00:00Z", "problem": None}]
        assert [e["stack"] for e in report["active"]] == ["exp-b"]

    def test_default_now_is_the_current_time(self, root):
        """Without `now`, expiry is judged against the clock."""
        write_stack(root, "exp-past", "2000-01-01T00:00:00Z")
        write_stack(root, "exp-future", "2999-01-01T00:00:00Z")
        assert [s.stack for s in expired_stacks(root)] == ["exp-past"]


class TestNewExperiment:
    def test_writes_a_stack_file_the_config_accepts(self, root):
        """The file is an experiment on dev that expires in DAYS, copying dev's InfiniBand cluster."""
        path = new_experiment("bert-sweep", "dev", 7, root, NOW)
        assert path == root / "Pulumi.exp-bert-sweep.yaml"
        cfg = load_stack_config("exp-bert-sweep", root)
        dev = load_stack_config("dev", root)
        template = next(c for c in dev.clusters if skus.get(c.sku).infiniband)
        assert cfg.kind == "experiment" and cfg.environment == "dev"
        assert cfg.expires_at == NOW + timedelta(days=7)
        (cluster,) = cfg.clusters
        assert (cluster.name, cluster.sku, cluster.max_nodes, cluster.min_nodes) == \
               ("bert-sweep", template.sku, template.max_nodes, 0)
        assert cfg.owner == dev.owner and cfg.location == dev.location
        assert cfg.tags()["expiresAt"] == "2026-11-29T12:00:00Z"

    def test_budget_covers_full_scale_for_the_lifetime(self, root):
        """The default budget is the cluster at full scale for every day, rounded up to $100."""
        new_experiment("budgeted", "dev", 3, root, NOW)
        cfg = load_stack_config("exp-budgeted", root)
        (cluster,) = cfg.clusters
        hourly = skus.get(cluster.sku).price.usd_per_hour
        assert cfg.budget.monthly_amount_usd == math.ceil(hourly * cluster.max_nodes * 24 * 3 / 100) * 100
        assert cfg.budget.alert_emails == list(load_stack_config("dev", root).budget.alert_emails)

    def test_options_override_the_template(self, root):
        """owner, size, node count and budget can be given."""
        new_experiment("small", "dev", 2, root, NOW, owner="ana@example.com", sku="standard_nc24ads_a100_v4",
                       max_nodes=1, budget_usd=250)
        cfg = load_stack_config("exp-small", root)
        assert cfg.owner == "ana@example.com"
        assert cfg.clusters[0].sku == "Standard_NC24ads_A100_v4" and cfg.clusters[0].max_nodes == 1
        assert cfg.budget.monthly_amount_usd == 250

    def test_accepts_the_exp_prefix(self, root):
        """NAME may be given with or without exp-."""
        assert new_experiment("exp-run1", "prod", 1, root, NOW).name == "Pulumi.exp-run1.yaml"

    def test_never_overwrites(self, root):
        """An existing stack file is refused and left byte for byte as it was."""
        path = new_experiment("keep", "dev", 7, root, NOW)
        before = path.read_bytes()
        with pytest.raises(UserError) as info:
            new_experiment("keep", "prod", 30, root, NOW)
        assert "stack 'exp-keep' already exists" in problems_text(info)
        assert "pulumi config set aml-hpc:expiresAt" in problems_text(info)
        assert path.read_bytes() == before

    @pytest.mark.parametrize("name", ["Bert", "bert_sweep", "-bert", "bert-", "a" * 21, ""])
    def test_bad_names(self, root, name):
        """Names that are not 1-20 of a-z, 0-9 and inner hyphens are refused; nothing is written."""
        with pytest.raises(UserError) as info:
            new_experiment(name, "dev", 7, root, NOW)
        assert "is not a valid experiment name" in problems_text(info)
        assert "e.g. bert-sweep" in problems_text(info)
        assert experiment_stacks(root) == []

    def test_unknown_environment_lists_the_environments(self, root):
        """ENV must be an environment stack file here."""
        with pytest.raises(UserError) as info:
            new_experiment("x", "staging", 7, root, NOW)
        assert "no environment stack 'staging'" in problems_text(info)
        assert "environments here: dev, prod" in problems_text(info)

    def test_experiment_is_not_an_environment(self, root):
        """An experiment cannot join another experiment."""
        new_experiment("base", "dev", 7, root, NOW)
        with pytest.raises(UserError) as info:
            new_experiment("child", "exp-base", 7, root, NOW)
        assert "'exp-base' is an experiment stack, not an environment" in problems_text(info)

    @pytest.mark.parametrize("days", [0, -1, MAX_DAYS + 1, True, 1.5])
    def test_bad_days(self, root, days):
        """DAYS is a whole number from 1 to MAX_DAYS."""
        with pytest.raises(UserError) as info:
            new_experiment("x", "dev", days, root, NOW)
        assert f"from 1 to {MAX_DAYS}" in problems_text(info)

    def test_unknown_sku_suggests(self, root):
        """A mistyped size gets a near match."""
        with pytest.raises(UserError) as info:
            new_experiment("x", "dev", 7, root, NOW, sku="Standard_ND96asr_v5")
        assert "unknown VM size 'Standard_ND96asr_v5'" in problems_text(info)
        assert "did you mean" in problems_text(info)

    def test_unpriced_size_needs_a_budget(self, root, monkeypatch):
        """Without a reference price the budget cannot be sized: ask for it. Every AmlCompute size
        of the catalog has a price today (ND H200 v5's came from its public snapshot), so one is
        made unpriced here."""
        unpriced = next(n for n in skus.names() if skus.get(n).azureml.amlcompute)
        real = skus.get
        monkeypatch.setattr(skus, "get", lambda n: dataclasses.replace(real(n), price=None) if n == unpriced else real(n))
        with pytest.raises(UserError) as info:
            new_experiment("x", "dev", 7, root, NOW, sku=unpriced)
        assert "--budget-usd" in problems_text(info)
        new_experiment("x", "dev", 7, root, NOW, sku=unpriced, budget_usd=5000)
        assert load_stack_config("exp-x", root).budget.monthly_amount_usd == 5000

    def test_environment_without_budget_needs_an_email_owner(self, root):
        """With no budget contacts to copy, an email owner becomes the contact; else it is asked for."""
        dev = root / "Pulumi.dev.yaml"
        document = yaml.safe_load(dev.read_text())
        del document["config"]["aml-hpc:budget"]
        document["config"]["aml-hpc:owner"] = "ml-platform"
        dev.write_text(yaml.safe_dump(document))
        with pytest.raises(UserError) as info:
            new_experiment("x", "dev", 7, root, NOW)
        assert "pass --owner you@example.com" in problems_text(info)
        new_experiment("x", "dev", 7, root, NOW, owner="ana@example.com")
        assert load_stack_config("exp-x", root).budget.alert_emails == ["ana@example.com"]

    def test_cluster_names_never_collide(self, root):
        """Cluster names avoid the environment's and other experiments' clusters, and stay valid."""
        names = []
        (root / "Pulumi.exp-odd.yaml").write_text("config: [not, a, mapping]\n")  # ignored, not fatal
        for experiment in ("nd-a100", "long-experiment-one", "long-experiment-two", "7b-run"):
            new_experiment(experiment, "dev", 7, root, NOW)
            (cluster,) = load_stack_config(f"exp-{experiment}", root).clusters
            names.append(cluster.name)
        dev_clusters = {c.name for c in load_stack_config("dev", root).clusters}
        assert len(set(names)) == len(names) and not set(names) & dev_clusters
        assert all(naming.check("cluster", n) is None for n in names)

    def test_file_explains_itself(self, root):
        """The generated file says what it is, when it goes, and to commit it."""
        text = new_experiment("doc", "dev", 7, root, NOW).read_text()
        assert text.startswith("# Experiment stack: clusters added to the 'dev' environment's workspace.")
        assert "Commit this file" in text and "2026-11-29T12:00:00Z" in text
        assert "pulumi config set aml-hpc:expiresAt <ISO date> --stack exp-doc" in text
        assert not list(root.glob(".Pulumi.*"))  # no temporary file left behind


class TestTeardownSummary:
    def test_lists_destroyed_and_kept(self):
        """Destroyed stacks, kept data, failures, orphans, live and unreadable stacks all appear."""
        report = {"now": "2026-11-22T12:00:00Z",
                  "expired": [{"stack": "exp-a", "environment": "dev", "expiresAt": "2026-11-01T00:00:00Z"},
                              {"stack": "exp-b", "environment": "prod", "expiresAt": "2026-11-02T00:00:00Z"},
                              {"stack": "exp-c", "environment": "dev", "expiresAt": "2026-11-03T00:00:00Z"}],
                  "active": [{"stack": "exp-d", "expiresAt": "2026-12-01T00:00:00Z"}],
                  "invalid": [{"stack": "exp-e", "problem": "aml-hpc:expiresAt is missing"}]}
        text = teardown_summary(report, {"exp-a": "destroyed", "exp-b": "failed", "exp-z": "orphaned"},
                                ["dev", "prod"])
        destroyed, kept = text.split("### Kept")
        assert "| exp-a | dev | 2026-11-01T00:00:00Z | destroyed and removed from the backend |" in destroyed
        assert "`Pulumi.exp-a.yaml`" in destroyed and "exp-b" not in destroyed
        assert "datasets and checkpoints of `dev`" in kept and "datasets and checkpoints of `prod`" in kept
        assert "| exp-b | destroy FAILED" in kept
        assert "| exp-z | on the backend with no stack file" in kept
        assert "| exp-d | expires 2026-12-01T00:00:00Z |" in kept
        assert "| exp-e | cannot read its expiry: aml-hpc:expiresAt is missing |" in kept
        assert "| exp-c | expired but not processed" in kept

    def test_nothing_expired(self):
        """A quiet day says so."""
        text = teardown_summary({"now": "t", "expired": [], "active": [], "invalid": []}, {}, ["dev"])
        assert "Nothing expired." in text

    def test_from_workflow_files(self, tmp_path):
        """The workflow's files (JSON report, TSV outcomes) give the same summary."""
        report = {"now": "t", "expired": [{"stack": "exp-a", "environment": "dev", "expiresAt": "x"}],
                  "active": [], "invalid": []}
        (tmp_path / "expired.json").write_text(json.dumps(report))
        (tmp_path / "outcomes.tsv").write_text("exp-a\tnot-deployed\n\n")
        text = lifecycle.teardown_summary_files(str(tmp_path / "expired.json"), str(tmp_path / "outcomes.tsv"), "dev")
        assert text == teardown_summary(report, {"exp-a": "not-deployed"}, ["dev"])


class TestCommands:
    @pytest.fixture
    def cli(self, root, monkeypatch):
        monkeypatch.setattr(lifecycle, "REPO_ROOT", root)
        app = typer.Typer()
        app.command("expired")(lifecycle.expired_command)
        app.command("new-experiment")(lifecycle.new_experiment_command)
        runner = CliRunner()
        return lambda *args: runner.invoke(app, list(args))

    def test_expired_json(self, cli, root):
        """--json prints the report; --now judges at another time."""
        write_stack(root, "exp-a", "2026-11-01T00:00:00Z")
        result = cli("expired", "--json", "--now", "2026-11-22T12:00:00Z")
        assert result.exit_code == 0
        assert [e["stack"] for e in json.loads(result.stdout)["expired"]] == ["exp-a"]
        early = json.loads(cli("expired", "--json", "--now", "2026-10-01").stdout)
        assert early["expired"] == [] and [e["stack"] for e in early["active"]] == ["exp-a"]

    def test_expired_table(self, cli, root):
        """The human view lists each stack with its status and sums up."""
        write_stack(root, "exp-a", "2026-11-01T00:00:00Z")
        write_stack(root, "exp-b", "2026-12-01T00:00:00Z")
        result = cli("expired", "--now", "2026-11-22T12:00:00Z")
        assert result.exit_code == 0
        assert "expired 21 day(s) ago" in result.stdout and "expires in 8 day(s)" in result.stdout
        assert "1 expired: exp-a" in result.stdout

    def test_expired_bad_now(self, cli):
        """A bad --now is a usage error naming the option."""
        result = cli("expired", "--now", "soon")
        assert result.exit_code == EXIT_USAGE
        assert "--now: 'soon' is not an ISO 8601 date" in result.stderr

    def test_new_experiment_command(self, cli, root):
        """The command writes the file and prints the next steps."""
        result = cli("new-experiment", "demo", "--env", "dev", "--days", "3")
        assert result.exit_code == 0, result.output
        assert "created Pulumi.exp-demo.yaml" in result.stdout and "make up STACK=exp-demo" in result.stdout
        assert load_stack_config("exp-demo", root).expires_at is not None

    def test_new_experiment_command_bad_input(self, cli, root):
        """Bad input exits 2 with the problem on stderr and writes nothing."""
        result = cli("new-experiment", "Demo", "--days", "400")
        assert result.exit_code == EXIT_USAGE
        assert "'Demo' is not a valid experiment name" in result.stderr
        assert "400 is not a whole number of days" in result.stderr  # every problem at once
        assert not list(root.glob("Pulumi.exp-*.yaml"))
