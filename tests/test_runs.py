"""`jobs list`, `show`, `logs` and `report` against a stack's workspace: azure-ai-ml's own
MLClient over the fake Azure ML transport (tests/aml_fakes.py) for the job list, the
managed run's record from the recorded managed rehearsal, the downloads written as Azure ML
lays them out (user_logs/std_log_process_<rank>.txt, outputs/...)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from amlhpc.jobs.cli import run_index as runs
from amlhpc.jobs.managed.record import Record
from tests.aml_fakes import ml_client, rest_json
from tests.jobs_helpers import outputs_file

MANAGED = Path(__file__).parent / "fixtures" / "runs" / "cosmoflow-managed"
RECORD = json.loads((MANAGED / "supervision.json").read_text())


def job(name: str, status: str, created: str, **tags: str) -> dict:
    document = rest_json("job.json", name=name, status=status, study="")
    document["properties"]["tags"] = {"recipe": "cosmoflow", **tags}
    document["systemData"]["createdAt"] = created
    return document


JOBS = [
    job("cosmoflow-20261125-100000-aaaa", "Completed", "2026-11-25T10:00:00Z", estimated_usd="652.73",
        processes_per_node="8"),
    job("cosmoflow-managed", "Completed", "2026-11-25T18:54:00Z", managed_run="cosmoflow-managed", role="controller",
        record="checkpoints/cosmoflow/cosmoflow-managed/supervision.json"),
    job("cosmoflow-managed-a1", "Failed", "2026-11-25T18:54:30Z", managed_run="cosmoflow-managed",
        processes_per_node="8"),
    job("cosmoflow-managed-a2", "Completed", "2026-11-25T18:55:40Z", managed_run="cosmoflow-managed",
        processes_per_node="8"),
    job("bert-20261124-090000-bbbb", "Failed", "2026-11-24T09:00:00Z", estimated_usd="12.50"),
]


@pytest.fixture()
def workspace(mocker):
    """The jobs of a workspace, as the service lists them; the managed run's record."""
    client, transport = ml_client({"/jobs": (200, {"value": JOBS})})
    for document in JOBS:  # GET of one job
        transport.routes[f"/jobs/{document['name']}"] = (200, document)
    mocker.patch("amlhpc.jobs.azure.submit.connect", return_value=client)
    mocker.patch("amlhpc.jobs.managed.client.read", return_value=Record.from_json(RECORD))
    # the run's controller markers in Blob: none beyond what the record lists
    mocker.patch("amlhpc.jobs.managed.client.store_for", return_value=SimpleNamespace(controller_jobs=lambda: []))
    return client, transport


def run(*args: str):
    from amlhpc.jobs.cli.main import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def test_list_groups_a_managed_run_and_says_where_costs_come_from(workspace):
    result = run("list", "--stack", "dev", "--outputs", str(outputs_file("dev")), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["run"] for r in rows] == ["cosmoflow-managed", "cosmoflow-20261125-100000-aaaa", "bert-20261124-090000-bbbb"]
    managed = rows[0]
    total = sum(a["usd"] for a in RECORD["attempts"])
    assert managed["kind"] == "managed" and managed["state"] == "succeeded" and managed["attempts"] == 2
    assert managed["cost"].startswith(f"${total:,.2f}") and managed["cost"].endswith("(record)")
    assert rows[1] == {**rows[1], "kind": "plain", "state": "Completed", "attempts": 1, "cost": "est. $652.73"}
    assert rows[2]["state"] == "Failed"
    table = run("list", "--stack", "dev", "--outputs", str(outputs_file("dev")), "--limit", "1")
    assert table.exit_code == 0 and "cosmoflow-managed" in table.stdout and "bert" not in table.stdout


def test_an_unreadable_record_leaves_the_cost_unknown_and_says_why(workspace, mocker):
    from amlhpc.core.errors import Problem, UserError

    mocker.patch("amlhpc.jobs.managed.client.read", side_effect=UserError([Problem("acct/c", "p", "access denied to the "
                                                                            "managed run's record", "a role")]))
    rows = json.loads(run("list", "--stack", "dev", "--outputs", str(outputs_file("dev")), "--json").stdout)
    assert rows[0]["cost"] == "?" and "access denied" in rows[0]["detail"] and rows[0]["state"] == "Completed"


def _download_as_azure_ml(processes: int = 16):
    """A stand-in for MLClient.jobs.download that writes what Azure ML keeps for a job."""
    def download(client, name, workspace, path, output_name=None, everything=False):
        logs = path / "artifacts" / "user_logs"
        logs.mkdir(parents=True, exist_ok=True)
        for rank in range(processes):
            (logs / f"std_log_process_{rank}.txt").write_text(f"{name} rank {rank}\n")
        return path
    return download


def test_logs_of_a_node_are_its_processes(workspace, mocker):
    mocker.patch("amlhpc.jobs.azure.submit.download", side_effect=_download_as_azure_ml())
    result = run("logs", "cosmoflow-20261125-100000-aaaa", "--stack", "dev", "--outputs", str(outputs_file("dev")),
                 "--node", "1")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"[{r}] cosmoflow-20261125-100000-aaaa rank {r}" for r in range(8, 16)]
    first = run("logs", "cosmoflow-20261125-100000-aaaa", "--stack", "dev", "--outputs", str(outputs_file("dev")))
    assert first.stdout == "cosmoflow-20261125-100000-aaaa rank 0\n"


def test_logs_of_a_managed_run_are_its_latest_attempts(workspace, mocker):
    mocker.patch("amlhpc.jobs.azure.submit.download", side_effect=_download_as_azure_ml())
    result = run("logs", "cosmoflow-managed", "--stack", "dev", "--outputs", str(outputs_file("dev")))
    assert result.exit_code == 0 and result.stdout == "cosmoflow-managed-a2 rank 0\n", result.output


def test_follow_streams_and_refuses_a_node(workspace, mocker):
    stream = mocker.patch("amlhpc.jobs.azure.submit.stream")
    assert run("logs", "cosmoflow-managed", "--stack", "dev", "--outputs", str(outputs_file("dev")), "-f").exit_code == 0
    assert stream.call_args.args[1] == "cosmoflow-managed-a2"
    refused = run("logs", "cosmoflow-managed", "--stack", "dev", "--outputs", str(outputs_file("dev")), "-f",
                  "--node", "1")
    assert refused.exit_code == 2 and "streams the first process" in refused.stderr


def test_report_of_a_managed_run_downloads_each_attempt(workspace, mocker, tmp_path, monkeypatch):
    monkeypatch.setenv("AMLHPC_PROJECT", str(tmp_path))
    (tmp_path / "Pulumi.yaml").write_text("name: aml-hpc\n")
    import amlhpc.core.project

    monkeypatch.setattr(amlhpc.core.project, "scratch", lambda *a, **k: tmp_path / ".scratch")

    def download(client, name, workspace, path, output_name=None, everything=False):
        shutil.copytree(MANAGED / "node0", path / "node0")  # the recorded attempt's node folder
        return path

    fetched = mocker.patch("amlhpc.jobs.azure.submit.download", side_effect=download)
    result = run("report", "cosmoflow-managed", "--stack", "dev", "--outputs", str(outputs_file("dev")))
    assert result.exit_code == 0, result.output
    assert [c.args[1] for c in fetched.call_args_list] == ["cosmoflow-managed-a1", "cosmoflow-managed-a2"]
    page = tmp_path / ".scratch" / "runs" / "cosmoflow-managed" / "report.html"
    html = page.read_text()
    assert str(page) in result.stdout and "Failed: preempted" in html and "the managed run&#x27;s record" in html


def test_show_prints_the_status_as_json(workspace):
    result = run("show", "cosmoflow-20261125-100000-aaaa", "--stack", "dev", "--outputs", str(outputs_file("dev")),
                 "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "Completed"
    managed = json.loads(run("show", "cosmoflow-managed", "--stack", "dev", "--outputs", str(outputs_file("dev")),
                             "--json").stdout)
    assert managed["managedRun"]["state"] == "succeeded" and len(managed["managedRun"]["attemptRows"]) == 2


def test_log_names_follow_azure_mls_numbering():
    assert runs.log_names(8, None) == ["std_log_process_0.txt"]
    assert runs.log_names(4, 2) == [f"std_log_process_{r}.txt" for r in (8, 9, 10, 11)]


class TestFollowingARehearsal:
    def test_follow_prints_what_is_appended_until_done(self, tmp_path):
        log = tmp_path / "std_log_process_0.txt"
        log.write_text("first\n")
        calls, lines = [], []

        def done() -> bool:
            calls.append(1)
            if len(calls) == 1:
                with log.open("a") as f:
                    f.write("second\n")
                return False
            return True

        runs.follow([log], lines.append, done, poll_s=0)
        assert lines == ["first", "second"] and len(calls) == 2

    def test_running_means_a_training_process_is_alive(self, tmp_path):
        import os
        import subprocess
        import sys

        from amlhpc.jobs.runtime.base.progress import launch_state_dir

        progress = launch_state_dir(tmp_path / "node0" / "scratch", "run", 0, "20261128T000000-1a2b", "progress")
        progress.mkdir(parents=True)
        (progress / "rank-0.json").write_text(json.dumps({"step": 3, "pid": os.getpid()}))
        assert runs.rehearsal_running(tmp_path)
        ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        (progress / "rank-0.json").write_text(json.dumps({"step": 3, "pid": int(ended.stdout)}))
        assert not runs.rehearsal_running(tmp_path)
