"""jobs.submit with a fake MLClient (pytest-mock): what the client receives for submit,
stream, cancel, download and quota."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from azure.ai.ml.entities import CommandJob

from core.errors import UserError
from jobs import build, recipes, submit
from jobs.runtime import contract
from tests.jobs_helpers import stack_outputs


@pytest.fixture
def client(mocker):
    fake = mocker.MagicMock(name="MLClient")
    fake.jobs.create_or_update.side_effect = lambda job, **kw: SimpleNamespace(
        name=job.name, studio_url=f"https://ml.azure.com/runs/{job.name}")
    return fake


def _plan(name="cosmoflow", stack="dev", **kwargs):
    return build.plan_job(recipes.load(name, kwargs.pop("overrides", None)), stack_outputs(stack), **kwargs)


def test_submit_sends_the_command_job(client, tmp_path):
    plan = _plan()
    printed = []
    created = submit.submit(client, plan, tmp_path, echo=printed.append)
    job = client.jobs.create_or_update.call_args.args[0]
    assert isinstance(job, CommandJob)
    assert client.jobs.create_or_update.call_args.kwargs == {"experiment_name": "cosmoflow"}
    assert job.distribution.type == "pytorch" and job.distribution.process_count_per_instance == 8
    assert job.resources.instance_count == 2 and job.resources.shm_size == "3100m"
    assert job.compute == "nd-a100" and job.code == str(tmp_path)
    assert json.loads(job.environment_variables[contract.STAGE_JSON])[0]["name"] == "cosmoflow"
    assert job.environment_variables["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"
    assert created.name == plan.name
    assert any("studio: https://ml.azure.com/runs/" in line for line in printed)
    client.jobs.stream.assert_not_called()


def test_submit_with_inputs_and_follow(client, tmp_path):
    plan = _plan("maskrcnn", "prod")
    submit.submit(client, plan, tmp_path, follow=True, echo=lambda s: None)
    job = client.jobs.create_or_update.call_args.args[0]
    assert job.distribution.type == "mpi"
    assert job.inputs["coco"].mode == "download" and job.inputs["coco"].path == "azureml://datastores/datasets/paths/coco2017/"
    client.jobs.stream.assert_called_once_with(plan.name)


def test_stream_cancel_download(client, tmp_path):
    submit.stream(client, "job-1", "ws")
    client.jobs.stream.assert_called_with("job-1")
    submit.cancel(client, "job-1", "ws")
    client.jobs.begin_cancel.assert_called_once_with("job-1")
    client.jobs.begin_cancel.return_value.result.assert_called_once()
    target = submit.download(client, "job-1", "ws", tmp_path / "dl", output_name="checkpoints")
    client.jobs.download.assert_called_once_with("job-1", download_path=str(tmp_path / "dl"), output_name="checkpoints", all=False)
    assert target.is_dir()


def test_unknown_job_is_a_user_error(client):
    from azure.core.exceptions import ResourceNotFoundError

    client.jobs.get.side_effect = ResourceNotFoundError("nope")
    with pytest.raises(UserError) as info:
        submit.status(client, "no-such-job", "mlw")
    assert "job no-such-job: not found" in info.value.render()


def test_quota_needed_vs_available(client):
    outputs = stack_outputs("dev")
    client.compute.list_sizes.return_value = [SimpleNamespace(name="Standard_ND96asr_v4"), SimpleNamespace(name="Standard_NC24ads_A100_v4")]
    client.compute.list_usage.return_value = [
        SimpleNamespace(name=SimpleNamespace(value="lowPriorityCores"), current_value=48, limit=200),
        SimpleNamespace(name=SimpleNamespace(value="StandardNDASv4_A100Family"), current_value=0, limit=0),
    ]
    lines = submit.quota(client, outputs, [("nd-a100", "Standard_ND96asr_v4", "LowPriority", 2)])
    client.compute.list_usage.assert_called_once_with(location="swedencentral")
    client.compute.list_sizes.assert_called_once_with(location="swedencentral")
    assert [(line.quota_name, line.needed, line.available, line.ok) for line in lines] == [("lowPriorityCores", 192, 152, False)]


def test_quota_size_not_offered(client):
    client.compute.list_sizes.return_value = [SimpleNamespace(name="Standard_NC24ads_A100_v4")]
    with pytest.raises(UserError) as info:
        submit.quota(client, stack_outputs("dev"), [("nd-a100", "Standard_ND96asr_v4", "LowPriority", 1)])
    assert "Standard_ND96asr_v4 is not offered" in info.value.render()


def test_study_jobs_and_metrics(client, tmp_path):
    jobs = [SimpleNamespace(name="a", tags={"study": "s1"}), SimpleNamespace(name="b", tags={"study": "s2"}), SimpleNamespace(name="c", tags=None)]
    client.jobs.list.return_value = jobs
    assert [j.name for j in submit.study_jobs(client, "s1", "ws")] == ["a"]

    def fake_download(name, download_path, output_name, all):
        folder = tmp_path.joinpath(download_path, "artifacts", "outputs", "aml-hpc")
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({"throughput": 123.0}))

    client.jobs.download.side_effect = fake_download
    assert submit.job_metrics(client, "a", "ws") == {"throughput": 123.0}
