"""`python -m amlhpc.jobs submit --managed`, `status` and `cancel` of a managed run: rendered and
validated offline, bad input refused with exit 2, the history read from the run's record."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from amlhpc.images.catalog import CONTROLLER, release
from amlhpc.jobs.cli import main as cli
from amlhpc.jobs.managed import render
from amlhpc.jobs.managed.policy import Policy
from amlhpc.jobs.managed.record import Attempt, Record, RecordStore
from amlhpc.jobs.managed.settings import MANAGED_JSON
from amlhpc.jobs.runtime.base import contract
from tests.jobs_helpers import outputs_doc, outputs_file


def plan_outputs(stack: str):
    from amlhpc.jobs.plan import outputs

    return outputs.load(stack, offline=True).outputs

REPO = Path(__file__).resolve().parent.parent


def run_jobs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "amlhpc.jobs", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def dry_run():
    result = run_jobs("submit", "cosmoflow", "--stack", "dev", "--offline", "--dry-run", "--managed", "--max-restarts", "5")
    assert result.returncode == 0, result.stderr
    return result


class TestDryRun:
    def test_shows_the_controller_job_then_the_training_template(self, dry_run):
        controller, training = list(yaml.safe_load_all(dry_run.stdout))
        assert controller["command"] == "python -m amlhpc.jobs.managed.controller"
        assert controller["compute"] == "azureml:jobs-controller" and controller["resources"]["instance_count"] == 1
        outputs = plan_outputs("dev")
        assert controller["environment"] == outputs.registry.environment_ids["aml-hpc-controller"], \
            "the stack's controller image: Azure ML builds nothing"
        assert controller["environment"] == f"azureml:aml-hpc-controller:{release(CONTROLLER).tag}"
        assert training["command"].startswith("python -m amlhpc.jobs.runtime.launch -- ") and training["code"] == ".."
        assert training["compute"] == "azureml:nd-a100" and training["tags"]["managed_run"] == controller["name"]
        assert contract.WATCHDOG_JSON in training["environment_variables"]
        assert "managed run" in dry_run.stderr and "retried: preempted" in dry_run.stderr

    def test_the_controller_settings_match_the_training(self, dry_run):
        controller, training = list(yaml.safe_load_all(dry_run.stdout))
        settings = json.loads(controller["environment_variables"][MANAGED_JSON])
        checkpoint = json.loads(training["environment_variables"][contract.CHECKPOINT_JSON])
        assert settings["storage"]["prefix"] == checkpoint["prefix"] == f"cosmoflow/{settings['run']}"
        assert settings["storage"]["container"] == "checkpoints" and settings["storage"]["supervision"] == "supervision"
        policy = Policy.from_json(settings["policy"])
        assert [t.template for t in policy.targets] == [render.TEMPLATE_PATH] and policy.targets[0].cluster == "nd-a100"
        assert re.fullmatch(r"[0-9a-f]{64}", settings["secret"]) and settings["resume"] is None
        assert policy.checkpoint_interval_s == 600 and policy.straggler_factor == 1.5
        assert policy.max_restarts == 5 and policy.nodes == 2 and policy.limit_usd == 3000
        assert "preempted" in policy.retry_on and "training_error" not in policy.retry_on
        offline_controller = controller["identity"]["client_id"]
        assert controller["environment_variables"]["AZURE_CLIENT_ID"] == offline_controller
        assert controller["tags"]["record"] == f"supervision/cosmoflow/{settings['run']}/supervision.json"
        assert training["tags"]["record"] == controller["tags"]["record"], "an attempt leads to its record too"

    def test_both_documents_load_with_azure_ai_ml(self, dry_run, tmp_path):
        from azure.ai.ml import load_job

        for i, document in enumerate(yaml.safe_load_all(dry_run.stdout)):
            if document["code"] != "..":  # relative to the folder the dry run printed in
                document["code"] = str(REPO / document["code"])
            (tmp_path / "managed").mkdir(exist_ok=True)
            path = tmp_path / "managed" / f"{i}.yml"
            path.write_text(yaml.safe_dump(document))
            assert load_job(path).type == "command"

    def test_the_snapshot_holds_the_controller_and_the_template(self, dry_run):
        controller, _ = list(yaml.safe_load_all(dry_run.stdout))
        code = Path(controller["code"])
        assert (code / "amlhpc" / "jobs" / "managed" / "controller.py").is_file() and (code / "amlhpc" / "jobs" / "runtime" / "launch" / "launcher.py").is_file()
        assert (code / "amlhpc" / "jobs" / "workloads" / "cosmoflow" / "train.py").is_file()
        template = yaml.safe_load((code / render.TEMPLATE_PATH).read_text())
        assert template["tags"]["managed_run"] == controller["name"]


class TestBadInput:
    def test_max_restarts_needs_managed(self):
        result = run_jobs("submit", "cosmoflow", "--stack", "dev", "--outputs", str(outputs_file("dev")), "--dry-run",
                          "--max-restarts", "2")
        assert result.returncode == 2 and "--max-restarts: only applies to a managed run" in result.stderr

    def test_managed_needs_checkpoints(self):
        result = run_jobs("submit", "cosmoflow", "--stack", "dev", "--outputs", str(outputs_file("dev")), "--dry-run",
                          "--managed", "--set", "checkpoint.enabled=false")
        assert result.returncode == 2 and "a managed run resumes from checkpoints" in result.stderr
        assert "Traceback" not in result.stderr

    def test_managed_needs_a_controller_cluster(self, tmp_path):
        doc = outputs_doc("dev")
        doc["controller"] = None
        path = tmp_path / "old-dev.json"
        path.write_text(json.dumps(doc))
        result = run_jobs("submit", "cosmoflow", "--stack", "dev", "--outputs", str(path), "--dry-run", "--managed")
        assert result.returncode == 2 and "declares no controller cluster" in result.stderr
        assert "aml-hpc:controller" in result.stderr

    def test_bad_retry_entry_in_the_recipe(self):
        result = run_jobs("submit", "cosmoflow", "--stack", "dev", "--outputs", str(outputs_file("dev")), "--dry-run",
                          "--managed", "--set", "managed.retry_on=[preempted,canceled]")
        assert result.returncode == 2 and "'canceled' is never retried" in result.stderr


@pytest.mark.azurite
class TestStatusAndCancel:
    """`status` and `cancel` in-process: the MLClient faked (its jobs' statuses change when
    canceled), the record in Azurite."""

    def setup(self, mocker, container):
        run = "cosmoflow-20261123-100000-abcd"
        prefix = f"cosmoflow/{run}"
        policy = Policy(nodes=2, usd_per_node_hour=10.0, expected_hours=4, limit_usd=300, limit_source="ceiling")
        record = Record(run=run, recipe="cosmoflow", policy=policy.to_json(), attempts=[
            Attempt(1, f"{run}-a1", state="ended", started_at="2026-11-23T10:00:00+00:00",
                    ended_at="2026-11-23T11:00:00+00:00", status="Failed", cause="preempted", retryable=True,
                    first_step=0, last_step=40, nodes=2, usd=20.0),
            Attempt(2, f"{run}-a2", state="running", started_at="2026-11-23T11:05:00+00:00", status="Running",
                    resumed_version="000003-20261123T105500Z-ab12", first_step=40, nodes=2, usd_per_hour=20.0)])
        store = RecordStore(container, prefix)
        store.create(record)
        store.add_controller(f"{run}-c1a2b", "resumed")
        tags = {"managed_run": run, "role": "controller", "record": f"{container.container_name}/{prefix}/supervision.json"}
        statuses = {run: "Failed", f"{run}-c1a2b": "Running", f"{run}-a1": "Failed", f"{run}-a2": "Running"}
        fake = mocker.MagicMock(name="MLClient")
        fake.jobs.get.side_effect = lambda name: SimpleNamespace(
            name=name, status=statuses[name], tags=tags if name.startswith(f"{run}-c") or name == run else
            {"managed_run": run, "attempt": name[-1], "record": tags["record"]}, display_name=name,
            experiment_name="cosmoflow", compute="jobs-controller", creation_context=None, studio_url=None)
        fake.jobs.begin_cancel.side_effect = lambda name: statuses.__setitem__(name, "Canceled")
        mocker.patch("amlhpc.jobs.azure.submit.connect", return_value=fake)
        mocker.patch("amlhpc.jobs.managed.client.store_for", lambda outputs, place: RecordStore(container, place.prefix))
        return run, fake, store

    def test_status_shows_every_attempt_every_controller_and_the_total(self, mocker, container):
        run, _, _ = self.setup(mocker, container)
        result = CliRunner().invoke(cli.app, ["status", f"{run}-a2", "--stack", "dev", "--outputs", str(outputs_file("dev"))],
                                    env={"COLUMNS": "300"})
        assert result.exit_code == 0, result.output
        text = result.output
        assert f"managed run {run} (running; controllers: {run} Failed; {run}-c1a2b Running)" in text
        assert f"{run}-a1" in text and "preempted (retried)" in text and "000003-20261123T105500Z-ab12 (step 40)" in text
        assert "limit $300.00 (ceiling)" in text and "total: $" in text

    def test_cancel_of_a_resumed_run_stops_its_controller_then_the_attempt(self, mocker, container):
        run, fake, store = self.setup(mocker, container)
        result = CliRunner().invoke(cli.app, ["cancel", f"{run}-c1a2b", "--stack", "dev",
                                              "--outputs", str(outputs_file("dev"))])
        assert result.exit_code == 0, result.output
        assert [c.args[0] for c in fake.jobs.begin_cancel.call_args_list] == [f"{run}-c1a2b", f"{run}-a2"]
        record, _ = store.load()
        assert record.state == "canceled" and store.cancel_request()["id"] in record.cancels_handled
        assert record.attempts[1].cause == "canceled"


def test_the_controller_imports_only_what_its_image_has():
    """The controller job's image has the standard library and three Azure SDKs; its code
    is amlhpc/jobs/managed and amlhpc/jobs/runtime. render.py and client.py run on the laptop only."""
    from tests.test_import_direction import offenders, py_files

    controller_side = [p for p in py_files("amlhpc", "jobs", "managed") if p.name not in ("render.py", "client.py")]
    assert offenders(controller_side, ("amlhpc.core", "amlhpc.infra", "amlhpc.images", "amlhpc.jobs", "pulumi", "pydantic", "yaml", "rich", "typer"),
                     allowed=("amlhpc.jobs.managed", "amlhpc.jobs.runtime")) == {}
    assert offenders(controller_side, ("amlhpc.jobs.managed.render", "amlhpc.jobs.managed.client")) == {}


@pytest.mark.parametrize("flags, message", [
    (["--fault", "preempt@step=3"], "--fault: preempt@step=3: the supervision recovers from it: only a managed "
                                    "rehearsal acts it out\n      fix: add --managed"),
    (["--managed", "--fault", "preempt@step=3", "--fault", "hang@step=3"],
     "preempt@step=3 and hang@step=3: one node fault at a step per attempt and generation"),
    (["--managed", "--fault", "preempt@step=3,node=2"], "node 2 does not exist (2 simulated node(s))\n      fix: pick node=0..1"),
    (["--managed", "--fault", "hang@stp=6"], "hang takes no key 'stp'\n      fix: hang takes: step: the training step"),
    (["--managed", "--fault", "lunch@step=3"], "'lunch' is not a fault kind\n      fix: kinds: preempt, hang, kill-host, slow, "
                                               "kill-controller, crash, error, stall"),
    (["--fault", "crash@step=3,rank=2"], "rank 2 does not exist (2 rank(s))"),
    (["--managed", "--resume"], "--resume: continues a managed rehearsal by its name"),
])
def test_rehearsal_fault_flags(flags, message):
    """A bad --fault is one error naming the spec, the key or value and what is accepted: exit 2, no
    traceback (tests/test_fault_spec.py checks every other refusal of the grammar, in process)."""
    result = run_jobs("run", "cosmoflow", "--local", "--nodes", "2", "--procs-per-node", "1", *flags)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
