"""amlhpc.jobs.plan.outputs: the three sources and the checks on the outputs document."""

from __future__ import annotations

import json
import subprocess

import pytest

from amlhpc.core.errors import UserError
from amlhpc.jobs.plan import outputs
from tests.jobs_helpers import outputs_doc, outputs_file


def test_file_source():
    loaded = outputs.load("dev", outputs_file=outputs_file("dev"))
    assert loaded.source == "file" and loaded.outputs.clusters["nd-a100"].max_nodes == 2
    assert loaded.outputs.storage.blob_endpoint.startswith("https://")


def test_missing_key_is_named(tmp_path):
    """Stack outputs missing a key: each missing key named with the fix."""
    doc = outputs_doc("dev")
    del doc["storage"]["blobEndpoint"]
    del doc["clusters"]["nd-a100"]["maxNodes"]
    path = tmp_path / "out.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError) as info:
        outputs.load("dev", outputs_file=path)
    text = info.value.render()
    assert "storage.blobEndpoint: stack outputs are missing this key" in text
    assert "clusters.nd-a100.maxNodes: stack outputs are missing this key" in text
    assert "pulumi stack output --json --stack dev" in text


def test_missing_datastore(tmp_path):
    doc = outputs_doc("dev")
    del doc["datastores"]["checkpoints"]
    path = tmp_path / "out.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError) as info:
        outputs.load("dev", outputs_file=path)
    assert "datastores.checkpoints" in info.value.render()


def test_wrong_stack(tmp_path):
    with pytest.raises(UserError) as info:
        outputs.load("dev", outputs_file=outputs_file("prod"))
    assert "for stack 'prod', not 'dev'" in info.value.render()


def test_offline_source_uses_plan(monkeypatch):
    """--offline calls amlhpc.infra.plan.offline_outputs (monkeypatched here to the fixture)."""
    import amlhpc.infra.plan

    calls = []
    monkeypatch.setattr(amlhpc.infra.plan, "offline_outputs", lambda stack, root=None: calls.append(stack) or outputs_doc(stack))
    loaded = outputs.load("prod", offline=True)
    assert calls == ["prod"] and loaded.source == "offline" and "nd-h100" in loaded.outputs.clusters


def test_real_offline_plan_document_validates():
    """The offline plan of dev (amlhpc.infra.plan) gives a document with every key jobs need."""
    loaded = outputs.load("dev", offline=True)
    assert loaded.outputs.clusters["nd-a100"].sku == "Standard_ND96asr_v4"


def test_deployed_needs_pulumi_cli(monkeypatch):
    monkeypatch.setattr(outputs.shutil, "which", lambda name: None)
    with pytest.raises(UserError) as info:
        outputs.load("dev")
    assert "pulumi command is not installed" in info.value.render() and "--offline" in info.value.render()


def test_deployed_runs_pulumi_without_secrets(monkeypatch):
    monkeypatch.setattr(outputs.shutil, "which", lambda name: "/usr/bin/pulumi")
    seen = []

    def runner(cmd, **kwargs):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(outputs_doc("dev")), stderr="")

    loaded = outputs.load("dev", runner=runner)
    assert seen == [["pulumi", "stack", "output", "--json", "--stack", "dev"]] and loaded.source == "deployed"
    assert "--show-secrets" not in seen[0]


def test_deployed_failure_is_explained(monkeypatch):
    monkeypatch.setattr(outputs.shutil, "which", lambda name: "/usr/bin/pulumi")
    failing = lambda cmd, **kw: subprocess.CompletedProcess(cmd, 255, stdout="", stderr="error: no stack named 'dev' found")  # noqa: E731
    with pytest.raises(UserError) as info:
        outputs.load("dev", runner=failing)
    assert "no stack named 'dev' found" in info.value.render() and "pulumi login" in info.value.render()


def test_prices_come_with_the_outputs_not_the_local_stack_file(tmp_path):
    """A local stack file's price override is not read: the outputs carry the stack's prices."""
    (tmp_path / "Pulumi.dev.yaml").write_text("config:\n  aml-hpc:prices:\n    Standard_ND96asr_v4: 12.5\n")
    loaded = outputs.load("dev", outputs_file=outputs_file("dev"), root=tmp_path)
    assert loaded.outputs.stack_prices()["Standard_ND96asr_v4"].usd_per_hour == 27.197


def test_unknown_key_is_named(tmp_path):
    doc = outputs_doc("dev")
    doc["storage"]["blobEndpiont"] = doc["storage"].pop("blobEndpoint")
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError) as info:
        outputs.load("dev", outputs_file=path)
    text = info.value.render()
    assert "storage.blobEndpiont: is not a key of aml-hpc's stack outputs" in text
    assert "storage.blobEndpoint: stack outputs are missing this key" in text
