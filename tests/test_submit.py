"""amlhpc.jobs.azure.submit against azure-ai-ml itself: a real MLClient whose HTTP answers come from a fake
Azure ML service with the service's JSON (tests/aml_fakes.py), so usage names, counts and
errors arrive exactly as the SDK hands them over."""

from __future__ import annotations

import json

import pytest
from azure.ai.ml.entities import CommandJob
from azure.ai.ml.exceptions import ValidationException

from amlhpc.core.errors import UserError
from amlhpc.jobs import recipes
from amlhpc.jobs.azure import submit
from amlhpc.jobs.plan import build
from amlhpc.jobs.runtime.base import contract
from tests.aml_fakes import created_job, ml_client, rest_json, service_error
from tests.jobs_helpers import stack_outputs

USAGE = dict(dedicated_used="0", dedicated_limit="400", a100_used="0", a100_limit="192", h100_used="96",
             h100_limit="384", lowpri_used="48", lowpri_limit="200")


def quota_client(**overrides: str):
    return ml_client({"/usages": (200, rest_json("usages.json", **{**USAGE, **overrides})),
                      "/vmSizes": (200, rest_json("vmsizes.json"))})


def _plan(name="cosmoflow", stack="dev", **kwargs):
    return build.plan_job(recipes.load(name, kwargs.pop("overrides", None)), stack_outputs(stack), **kwargs)


@pytest.fixture
def client(mocker):
    """MLClient for the job calls: create_or_update answers with the SDK's own entity."""
    real, transport = ml_client()
    mocker.patch.object(real.jobs, "create_or_update", side_effect=lambda job, **kw: created_job(job.name, status="Starting", study=""))
    mocker.patch.object(real.jobs, "stream")
    mocker.patch.object(real.jobs, "download")
    return real


class TestSubmit:
    def test_sends_the_command_job(self, client, tmp_path):
        plan = _plan()
        printed = []
        created = submit.submit(client, plan, tmp_path, echo=printed.append)
        job = client.jobs.create_or_update.call_args.args[0]
        assert isinstance(job, CommandJob)
        assert client.jobs.create_or_update.call_args.kwargs == {"experiment_name": "cosmoflow"}
        assert job.distribution.type == "pytorch" and job.distribution.process_count_per_instance == 8
        assert job.resources.instance_count == 2 and job.compute == "nd-a100"
        assert json.loads(job.environment_variables[contract.STAGE_JSON])[0]["name"] == "cosmoflow"
        assert created.name == plan.name and created.status == "Starting"
        assert any(f"studio: https://ml.azure.com/runs/{plan.name}" in line for line in printed)
        client.jobs.stream.assert_not_called()

    def test_follow_streams(self, client, tmp_path):
        plan = _plan("maskrcnn", "prod")
        submit.submit(client, plan, tmp_path, follow=True, echo=lambda s: None)
        client.jobs.stream.assert_called_once_with(plan.name)

    @pytest.mark.parametrize("status, code, message, title, fix", [
        (400, "UserError", "Invalid value for instanceCount: the cluster nd-a100 scales to 2 nodes", "rejected by Azure ML",
         "fix the value the message names"),
        (409, "Conflict", "Job cosmoflow-x already exists", "conflict", "submit again"),
        (404, "ResourceNotFound", "Compute nd-a100 not found in workspace mlw-amlhpc-dev", "not found",
         "the cluster, the environment or a datastore"),
    ])
    def test_service_errors_at_submit_are_one_block(self, client, tmp_path, status, code, message, title, fix):
        error = service_error(status, code, message)
        client.jobs.create_or_update.side_effect = error
        with pytest.raises(UserError) as info:
            submit.submit(client, _plan(), tmp_path, echo=lambda s: None)
        text = info.value.render()
        assert info.value.title == title and fix in text and message.split(":")[0] in text
        assert "Traceback" not in text and "check the job name" not in text

    def test_sdk_validation_error_is_one_block(self, client, tmp_path):
        client.jobs.create_or_update.side_effect = ValidationException(
            message="Command job's compute is not set", no_personal_data_message="compute not set")
        with pytest.raises(UserError) as info:
            submit.submit(client, _plan(), tmp_path, echo=lambda s: None)
        assert info.value.title == "invalid job" and "compute is not set" in info.value.render()


class TestJobCalls:
    def test_status_from_the_service(self):
        client, transport = ml_client({"/jobs/cosmoflow-1": (200, rest_json("job.json", name="cosmoflow-1", status="Running", study=""))})
        info = submit.status(client, "cosmoflow-1", "mlw")
        assert info["status"] == "Running" and info["compute"] == "nd-a100" and info["created"].startswith("2026-11-23")
        assert transport.requests[-1][0] == "GET" and "/workspaces/mlw-amlhpc-dev/jobs/cosmoflow-1" in transport.requests[-1][1]

    def test_unknown_job_is_a_user_error(self):
        client, _ = ml_client({"/jobs/no-such-job": (404, {"error": {"code": "UserError", "message": "Job no-such-job not found"}})})
        with pytest.raises(UserError) as info:
            submit.status(client, "no-such-job", "mlw")
        assert "job no-such-job: not found" in info.value.render() and "check the job name" in info.value.render()

    def test_study_jobs_filter_by_tag(self):
        jobs = {"value": [rest_json("job.json", name=n, status="Completed", study=s) for n, s in (("a", "s1"), ("b", "s2"))]}
        client, _ = ml_client({"/jobs": (200, jobs)})
        assert [j.name for j in submit.study_jobs(client, "s1", "ws")] == ["a"]

    def test_metrics_from_the_downloaded_outputs(self, client, tmp_path):
        def fake_download(name, download_path, output_name, all):
            folder = tmp_path.joinpath(download_path, "artifacts", "outputs", "aml-hpc")
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text(json.dumps({"throughput": 123.0}))

        client.jobs.download.side_effect = fake_download
        assert submit.job_metrics(client, "a", "ws") == {"throughput": 123.0}


class TestQuota:
    def test_reads_usage_as_the_sdk_returns_it(self):
        """azure-ai-ml's Usage keeps `name` as a dict and the count under currentValue."""
        client, transport = quota_client()
        rows = {r.name: r for r in submit.usages(client, "swedencentral")}
        row = rows["Standard NDSH100v5 Family Cluster Dedicated vCPUs"]
        assert (row.used, row.limit, row.key) == (96, 384, "standardndsh100v5family:dedicated")
        assert rows["Total Cluster LowPriority Regional vCPUs"].key == "lowPriorityCores"
        assert any("/locations/swedencentral/usages" in url for _, url in transport.requests)

    def test_low_priority_short_is_reported(self):
        client, transport = quota_client(lowpri_used="48", lowpri_limit="200")
        lines = submit.quota(client, stack_outputs("dev"), [("nd-a100", "Standard_ND96asr_v4", "LowPriority", 2)])
        assert [(line.quota_name, line.needed, line.used, line.limit, line.available, line.ok) for line in lines] == [
            ("lowPriorityCores", 192, 48, 200, 152, False)]
        assert "Total Cluster LowPriority Regional vCPUs" in lines[0].hint("swedencentral")
        assert any("/locations/swedencentral/vmSizes" in url for _, url in transport.requests)

    def test_dedicated_family_and_regional_total(self):
        client, _ = quota_client(a100_used="0", a100_limit="192", dedicated_used="300", dedicated_limit="400")
        lines = {line.quota_name: line for line in submit.quota(client, stack_outputs("dev"),
                                                                 [("nd-a100", "Standard_ND96asr_v4", "Dedicated", 2)])}
        assert lines["StandardNDASv4_A100Family"].ok is True and lines["StandardNDASv4_A100Family"].label.startswith("Standard NDASv4_A100")
        assert (lines["dedicatedCores"].needed, lines["dedicatedCores"].available, lines["dedicatedCores"].ok) == (192, 100, False)

    def test_workspace_and_cluster_rows_do_not_count(self):
        client, _ = quota_client()
        keys = [r.key for r in submit.usages(client, "swedencentral") if "workspaces" in r.id]
        assert keys and set(keys) == {None}

    def test_size_not_offered(self):
        client, _ = quota_client()
        with pytest.raises(UserError) as info:
            submit.quota(client, stack_outputs("dev"), [("nc", "Standard_NC24s_v3", "LowPriority", 1)])
        assert "Standard_NC24s_v3 is not offered" in info.value.render()

    def test_unknown_size_in_the_outputs_is_a_user_error(self):
        client, _ = quota_client()
        with pytest.raises(UserError) as info:
            submit.quota(client, stack_outputs("dev"), [("nd-a100", "Standard_ND96asr_v9", "LowPriority", 1)])
        assert "clusters.nd-a100.sku: unknown VM size 'Standard_ND96asr_v9'" in info.value.render()


class TestCommands:
    """`python -m amlhpc.jobs quota` and `submit` end to end, with the fake service behind MLClient."""

    def run(self, mocker, args, client=None):
        from typer.testing import CliRunner

        from amlhpc.jobs.cli.main import app
        from tests.jobs_helpers import outputs_file

        if client is not None:
            mocker.patch.object(submit, "connect", return_value=client)
        return CliRunner().invoke(app, [*args, "--outputs", str(outputs_file("dev"))])

    def test_quota_exits_1_when_short(self, mocker):
        client, _ = quota_client(lowpri_used="150", lowpri_limit="200")
        result = self.run(mocker, ["quota", "--stack", "dev"], client)
        assert result.exit_code == 1, result.output
        assert "Total Cluster LowPriority Regional vCPUs" in result.output and "fix: request" in result.output
        assert "?" not in result.output.split("fix:")[0].split("clusters")[-1].replace("-", "")

    def test_quota_exits_0_with_room(self, mocker):
        client, _ = quota_client(lowpri_used="0", lowpri_limit="2000", a100_limit="2000", dedicated_limit="4000")
        result = self.run(mocker, ["quota", "--stack", "dev"], client)
        assert result.exit_code == 0, result.output

    def test_offline_without_dry_run_is_refused(self, mocker):
        connect = mocker.patch.object(submit, "connect")
        from typer.testing import CliRunner

        from amlhpc.jobs.cli.main import app

        result = CliRunner().invoke(app, ["submit", "cosmoflow", "--stack", "dev", "--offline"])
        assert result.exit_code == 2 and "--offline" in result.output and "--dry-run" in result.output
        connect.assert_not_called()

    def test_retired_size_is_warned_at_submit(self, mocker, tmp_path):
        """A retired V100 size: warned at submit (the TensorFlow recipe: its CUDA 12.8 image runs on Volta)."""
        from typer.testing import CliRunner

        from amlhpc.jobs.cli.main import app
        from tests.jobs_helpers import outputs_doc

        doc = outputs_doc("dev")
        doc["clusters"]["nc-v3"] = {**doc["clusters"]["nc-a100"], "sku": "Standard_NC24s_v3", "gpusPerNode": 4}
        path = tmp_path / "outputs.json"
        path.write_text(json.dumps(doc))
        result = CliRunner().invoke(app, ["submit", "cosmoflow-tf", "--stack", "dev", "--outputs", str(path), "--cluster", "nc-v3",
                                          "--nodes", "1", "--dry-run"])
        assert result.exit_code == 0, result.output
        assert "was retired by Azure on 2025-09-30" in result.output
