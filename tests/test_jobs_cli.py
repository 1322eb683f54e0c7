"""`python -m amlhpc.jobs`: dry-run YAML, exit 2 with one error block for bad input, nothing
submitted, and the submit path with a fake MLClient."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from amlhpc.jobs.cli import main as cli
from tests.jobs_helpers import outputs_file

runner = CliRunner()


def run(*args):
    return runner.invoke(cli.app, [str(a) for a in args])


@pytest.fixture
def fake_client(mocker):
    fake = mocker.MagicMock(name="MLClient")
    fake.jobs.create_or_update.side_effect = lambda job, **kw: SimpleNamespace(name=job.name, studio_url="https://ml.azure.com/x")
    mocker.patch("amlhpc.jobs.azure.submit.connect", return_value=fake)
    return fake


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_dry_run_prints_loadable_yaml(tmp_path, stack, fake_client, monkeypatch):
    """Saved in the folder it was printed in, the YAML loads: `code:` is relative to it."""
    from azure.ai.ml import load_job

    monkeypatch.chdir(tmp_path)
    result = run("submit", "cosmoflow", "--stack", stack, "--outputs", outputs_file(stack), "--dry-run")
    assert result.exit_code == 0, result.output
    path = tmp_path / "job.yml"
    path.write_text(result.stdout)
    job = load_job(path)
    assert job.distribution.type == "pytorch"
    fake_client.jobs.create_or_update.assert_not_called()


def test_dry_run_offline(monkeypatch, fake_client):
    """--offline goes through amlhpc.infra.plan.offline_outputs."""
    import amlhpc.infra.plan
    from tests.jobs_helpers import outputs_doc

    monkeypatch.setattr(amlhpc.infra.plan, "offline_outputs", lambda stack, root=None: outputs_doc(stack))
    result = run("submit", "bert-pretrain", "--stack", "dev", "--offline", "--dry-run")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["distribution"]["type"] == "pytorch"


@pytest.mark.parametrize("args, message", [
    (["submit", "nope", "--stack", "dev"], "unknown recipe 'nope'"),
    (["submit", "cosmoflow", "--stack", "dev", "--cluster", "gpu"], "unknown cluster 'gpu'"),
    (["submit", "cosmoflow", "--stack", "dev", "--nodes", "9"], "scales to at most 2"),
    (["submit", "cosmoflow", "--stack", "dev", "--set", "processes_per_node=9"], "9 processes per node but Standard_ND96asr_v4 has 8 GPUs"),
    (["submit", "cosmoflow", "--stack", "dev", "--set", "nodes=many"], "nodes: 'many' (from --set)"),
    (["submit", "cosmoflow", "--stack", "dev", "--set", "inputs.cosmoflow.path=null"], "input 'cosmoflow' has no path"),
])
def test_bad_input_exits_2_and_submits_nothing(args, message, fake_client):
    result = run(*args, "--outputs", outputs_file("dev"))
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
    fake_client.jobs.create_or_update.assert_not_called()


def test_outputs_missing_key_exits_2(tmp_path, fake_client):
    import json

    from tests.jobs_helpers import outputs_doc

    doc = outputs_doc("dev")
    del doc["workspace"]
    path = tmp_path / "o.json"
    path.write_text(json.dumps(doc))
    result = run("submit", "cosmoflow", "--stack", "dev", "--outputs", path)
    assert result.exit_code == 2 and "workspace: stack outputs are missing this key" in result.stderr
    fake_client.jobs.create_or_update.assert_not_called()


def test_submit_refuses_over_ceiling_unless_yes(fake_client):
    over = ["submit", "cosmoflow", "--stack", "prod", "--outputs", outputs_file("prod"), "--hours", "100"]
    result = run(*over)
    assert result.exit_code == 2 and "exceeds the recipe's cost ceiling" in result.stderr
    fake_client.jobs.create_or_update.assert_not_called()
    result = run(*over, "--yes")
    assert result.exit_code == 0, result.output
    fake_client.jobs.create_or_update.assert_called_once()
    assert "studio: https://ml.azure.com/x" in result.stdout


def test_debug_shows_traceback():
    result = run("submit", "nope", "--stack", "dev", "--outputs", outputs_file("dev"), "--debug")
    assert result.exit_code != 0 and result.exception is not None


def test_estimate_as_nag_cosmoflow_tutorial():
    result = run("estimate", "cosmoflow", "--stack", "prod", "--outputs", outputs_file("prod"), "--nodes", "4", "--hours", "11.5")
    assert result.exit_code == 0, result.output
    assert "4,522.72" in result.stdout  # 4 x 98.32 x 11.5
    assert "OVER: estimate $4,522.72 exceeds the recipe's cost ceiling $3,000.00" in " ".join(result.stdout.split())
    assert "refuses it without --yes" in result.stdout


def test_estimate_within_limits_says_so():
    result = run("estimate", "cosmoflow", "--stack", "prod", "--outputs", outputs_file("prod"), "--nodes", "1", "--hours", "1")
    assert result.exit_code == 0, result.output
    assert "OVER" not in result.stdout
    assert "within the recipe's ceiling $3,000.00 and the stack's monthly budget" in " ".join(result.stdout.split())


def test_status_and_cancel(fake_client):
    fake_client.jobs.get.return_value = SimpleNamespace(name="j1", status="Running", display_name="d", experiment_name="e",
                                                       compute="nd-a100", creation_context=None, studio_url="u", tags={})
    result = run("status", "j1", "--stack", "dev", "--outputs", outputs_file("dev"))
    assert result.exit_code == 0 and "Running" in result.stdout
    result = run("cancel", "j1", "--stack", "dev", "--outputs", outputs_file("dev"))
    assert result.exit_code == 0
    fake_client.jobs.begin_cancel.assert_called_once_with("j1")


def test_scale_dry_run_renders_every_node_count(fake_client):
    result = run("scale", "nccl-allreduce", "--stack", "prod", "--outputs", outputs_file("prod"), "--dry-run")
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["resources"]["instance_count"] for d in docs] == [1, 2, 4, 8]
    assert len({d["tags"]["study"] for d in docs}) == 1
    fake_client.jobs.create_or_update.assert_not_called()


def test_scale_submits_tagged_study(fake_client):
    result = run("scale", "nccl-allreduce", "--stack", "dev", "--outputs", outputs_file("dev"))
    assert result.exit_code == 0, result.output
    sent = [c.args[0] for c in fake_client.jobs.create_or_update.call_args_list]
    assert [j.resources.instance_count for j in sent] == [1, 2]
    assert {j.tags["study"] for j in sent} == {sent[0].tags["study"]} and [j.tags["study_nodes"] for j in sent] == ["1", "2"]


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "amlhpc.jobs", "recipes"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "cosmoflow" in proc.stdout
