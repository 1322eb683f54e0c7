"""An environment's published outputs (amlhpc/infra/published.py): what its up writes and its
experiments read instead of a StackReference, which would need the environment's passphrase.
The document is checked against the outputs model on both sides; every refusal names the file
or key and the fix."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from amlhpc.core.errors import UserError
from amlhpc.infra import published
from amlhpc.infra.plan import offline_outputs

NOW = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def dev_outputs():
    return offline_outputs("dev")


def test_an_environments_outputs_round_trip(dev_outputs, tmp_path):
    document = published.publish(dev_outputs, "dev", now=NOW)
    assert document["kind"] == published.KIND and document["publishedAt"] == "2026-11-29T08:00:00Z"
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(document))
    found = published.read(path, "dev")
    assert found.outputs == dev_outputs and found.source == str(path)


def _refused(call, *fragments: str) -> str:
    with pytest.raises(UserError) as info:
        call()
    text = info.value.render()
    for fragment in fragments:
        assert fragment in text, text
    return text


class TestRefused:
    def test_a_secret_is_never_published(self, dev_outputs):
        leaked = {**dev_outputs, "identity": {**dev_outputs["identity"], "clientId": published.MASKED}}
        _refused(lambda: published.publish(leaked, "dev"), "identity", "holds a secret")

    def test_another_environments_outputs(self, dev_outputs):
        _refused(lambda: published.publish(dev_outputs, "prod"), "not of environment 'prod'")

    def test_an_experiments_outputs(self, dev_outputs):
        experiment = {**dev_outputs, "kind": "experiment", "stack": "exp-x"}
        _refused(lambda: published.publish(experiment, "dev"), "experiment stack 'exp-x'")

    def test_a_missing_key_names_it_and_the_fix(self, dev_outputs):
        partial = {k: v for k, v in dev_outputs.items() if k != "workspaceId"}
        _refused(lambda: published.publish(partial, "dev"), "workspaceId", "make up STACK=dev")

    def test_a_document_of_another_environment(self, dev_outputs, tmp_path):
        path = tmp_path / "p.json"
        path.write_text(json.dumps(published.publish(dev_outputs, "dev")))
        _refused(lambda: published.read(path, "prod"), str(path), "published by another environment")

    def test_a_document_edited_to_name_another_workspace_shape(self, dev_outputs, tmp_path):
        document = published.publish(dev_outputs, "dev")
        broken = copy.deepcopy(document)
        broken["outputs"]["network"] = "public"
        path = tmp_path / "p.json"
        path.write_text(json.dumps(broken))
        _refused(lambda: published.read(path, "dev"), "network")

    @pytest.mark.parametrize("text, fragment", [("{", "is not JSON"), ('{"kind": "x"}', "is not an aml-hpc environment")])
    def test_not_a_document(self, tmp_path, text, fragment):
        path = tmp_path / "p.json"
        path.write_text(text)
        _refused(lambda: published.read(path, "dev"), fragment)

    def test_no_file(self, tmp_path):
        _refused(lambda: published.read(tmp_path / "none.json", "dev"), "cannot be read", "make up STACK=dev")

    def test_the_program_without_the_variable_says_how_to_run_it(self):
        _refused(lambda: published.from_environ("dev", {}), published.VARIABLE, "make preview STACK=<experiment> (or up)")

    def test_an_output_the_document_lacks(self, dev_outputs):
        found = published.EnvironmentOutputs("dev", {}, "p.json")
        _refused(lambda: found.require_output("workspace"), "published no such output")
        assert found.get_output("controller") is not None  # an optional one: None inside, no error


class TestCommands:
    """The two commands scripts/pulumi-stack.sh runs: exit 0, or 2 with the problem and no traceback."""

    def run(self, *args):
        return subprocess.run([sys.executable, "-m", "amlhpc.infra.published", *args], capture_output=True, text=True,
                              timeout=120)

    def test_write_then_check(self, dev_outputs, tmp_path):
        (tmp_path / "out.json").write_text(json.dumps(dev_outputs))
        written = self.run("write", "--environment", "dev", "--outputs", str(tmp_path / "out.json"),
                           "--out", str(tmp_path / "published.json"))
        assert written.returncode == 0, written.stderr
        checked = self.run("check", "--environment", "dev", "--file", str(tmp_path / "published.json"))
        assert checked.returncode == 0 and "environment dev's outputs, published" in checked.stdout
        wrong = self.run("check", "--environment", "prod", "--file", str(tmp_path / "published.json"))
        assert wrong.returncode == 2 and "published by another environment" in wrong.stderr
        assert "Traceback" not in wrong.stderr

    def test_write_refuses_what_is_not_outputs_and_writes_nothing(self, tmp_path):
        (tmp_path / "out.json").write_text("not json")
        result = self.run("write", "--environment", "dev", "--outputs", str(tmp_path / "out.json"),
                          "--out", str(tmp_path / "published.json"))
        assert result.returncode == 2 and "not readable JSON" in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / "published.json").exists()
