"""The everyday commands az ml and SkyPilot users expect, each with its bad input's message:
`--local` on status, cancel, stream and download (a rehearsal cancelled from another shell
stops and its record says so); list filters and `-o table|json|tsv`; `submit --json`;
`connect` (Azure ML's job services); no `--offline` suggested where it is refused; tables
that keep to 80 columns off a terminal and say how to get every value.

Rehearsal records are tests/fixtures/runs/ (recorded rehearsals); Azure ML is azure-ai-ml's
MLClient over the fake transport (tests/aml_fakes.py) or its entities where the service's
answer is the subject."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from tests.jobs_helpers import outputs_file

REPO = Path(__file__).resolve().parent.parent
RECORDED = REPO / "tests" / "fixtures" / "runs" / "cosmoflow-recorded"
MANAGED = RECORDED.parent / "cosmoflow-managed"


def run(*args: str, env: dict[str, str] | None = None):
    from amlhpc.jobs.cli.main import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """Two recorded rehearsals in a project's .rehearsal/."""
    from amlhpc.jobs.local import folders

    shutil.copytree(RECORDED, tmp_path / ".rehearsal" / "cosmoflow-recorded")
    shutil.copytree(MANAGED, tmp_path / ".rehearsal" / "cosmoflow-managed")
    monkeypatch.setattr(folders, "REHEARSALS", tmp_path / ".rehearsal")
    return tmp_path


class TestLocalRuns:
    def test_status_stream_and_download_of_a_rehearsal(self, project, tmp_path):
        status = run("status", "cosmoflow-recorded", "--local", "--json")
        assert status.exit_code == 0, status.output
        document = json.loads(status.stdout)
        assert document["state"] == "succeeded" and document["running"] is None and len(document["attempts"]) == 2
        assert "state" in run("status", "cosmoflow-recorded", "--local").stdout
        stream = run("stream", "cosmoflow-recorded", "--local")
        assert stream.exit_code == 0 and stream.stdout == (RECORDED / "node0/user_logs/std_log_process_0.txt").read_text()
        target = tmp_path / "got"
        download = run("download", "cosmoflow-recorded", "--local", "--path", str(target), "--all", "--json")
        assert download.exit_code == 0, download.output
        assert json.loads(download.stdout)["path"] == str(target)
        assert (target / "node1" / "outputs" / "aml-hpc" / "staging-node1.json").is_file()
        assert (target / "node0" / "user_logs" / "std_log_process_0.txt").is_file() and (target / "attempts.jsonl").is_file()

    def test_cancel_of_a_rehearsal_that_is_not_running_is_refused(self, project):
        result = run("cancel", "cosmoflow-recorded", "--local")
        assert result.exit_code == 2 and "is not running (state: succeeded): there is nothing to cancel" in result.stderr

    def test_a_stack_or_local_is_needed(self, project):
        for command in ("status", "cancel", "stream", "download"):
            result = run(command, "cosmoflow-recorded")
            assert result.exit_code == 2 and "add --stack S" in result.stderr and "--local" in result.stderr, command

    def test_list_filters_and_formats(self, project):
        everything = json.loads(run("list", "--local", "--json").stdout)
        assert {r["run"] for r in everything} == {"cosmoflow-recorded", "cosmoflow-managed"}
        succeeded = json.loads(run("list", "--local", "-o", "json", "--state", "succeeded").stdout)
        assert len(succeeded) == 2, "a state matches its start: 'succeeded: attempt 2 completed' too"
        assert json.loads(run("list", "--local", "--json", "--state", "failed").stdout) == []
        tsv = run("list", "--local", "-o", "tsv", "--state", "Succeeded", "--since", "2026-11-01")
        lines = tsv.stdout.splitlines()
        assert lines[0].split("\t") == ["run", "kind", "state", "attempts", "cost", "created", "recipe", "user"]
        assert len(lines) == 3 and all(len(line.split("\t")) == 8 for line in lines)
        assert run("list", "--local", "--json", "--since", "2099-01-01").stdout.strip() == "[]"
        assert json.loads(run("list", "--local", "--json", "--recipe", "nothing").stdout) == []

    @pytest.mark.parametrize("args, says", [
        (("--since", "yesterday"), "is neither an age nor a date"),
        (("-o", "json", "--json", "-o", "tsv"), "--json and -o tsv ask for two formats"),
        (("-o", "yaml"), "'yaml' is not one of"),
    ])
    def test_bad_list_flags_say_what_is_allowed(self, project, args, says):
        result = run("list", "--local", *args)
        words = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())  # typer's error panel, unwrapped
        assert result.exit_code == 2 and says in words, result.output


@pytest.mark.slow
@pytest.mark.azurite
def test_a_rehearsal_cancelled_from_another_shell_stops_and_says_canceled(azurite, tmp_path, monkeypatch):
    """`jobs run` in one process, `jobs cancel RUN --local` in this one."""
    from amlhpc.jobs.local import control, folders

    monkeypatch.setattr(folders, "REHEARSALS", tmp_path / ".rehearsal")
    name = f"cancel-{uuid.uuid4().hex[:6]}"
    folder = tmp_path / ".rehearsal" / name
    env = {**os.environ, "AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string, "COLUMNS": "200"}
    env.pop("PYTHONPATH", None)
    rehearsal = subprocess.Popen(
        [sys.executable, "-m", "amlhpc.jobs", "run", "cosmoflow", "--local", "--nodes", "2", "--procs-per-node", "1",
         "--outputs", str(outputs_file("dev")), "--name", name, "--workdir", str(folder), "--set", "health=off",
         "--set", "inputs={}", "--set", "command=python -m amlhpc.jobs.workloads.synthetic --steps 100000 --step-s 0.1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not list(folder.glob("node0/scratch/.amlhpc-launch/*/progress/rank-0.json")):
            assert rehearsal.poll() is None, rehearsal.stdout.read()[-3000:] if rehearsal.stdout else ""
            assert time.monotonic() < deadline, "the rehearsal did not start training"
            time.sleep(0.2)
        assert control.running(folder) is not None
        assert json.loads(run("list", "--local", "--json", "--state", "running").stdout)[0]["run"] == name
        result = run("cancel", name, "--local", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {**json.loads(result.stdout), "run": name, "canceled": True}
        code = rehearsal.wait(timeout=60)
    finally:
        if rehearsal.poll() is None:
            os.killpg(rehearsal.pid, signal.SIGKILL)
            rehearsal.wait()
    output = rehearsal.stdout.read() if rehearsal.stdout else ""
    assert code == 1 and f"rehearsal {name} canceled" in output, output[-3000:]
    line = json.loads((folder / "attempts.jsonl").read_text().splitlines()[-1])
    assert line["canceled"]["by"] and all(c != 0 for c in line["exit_codes"].values())
    shown = json.loads(run("status", name, "--local", "--json").stdout)
    assert shown["state"].startswith("canceled (by ") and shown["running"] is None
    assert not (folder / control.RUNNING_FILE).exists()


@pytest.fixture()
def workspace(mocker):
    from tests.aml_fakes import ml_client
    from tests.test_runs import JOBS

    client, transport = ml_client({"/jobs": (200, {"value": JOBS})})
    for document in JOBS:
        transport.routes[f"/jobs/{document['name']}"] = (200, document)
    mocker.patch("amlhpc.jobs.azure.submit.connect", return_value=client)
    return client


class TestAzureCommands:
    def test_list_filters_azure_runs_by_user_and_state(self, workspace, mocker):
        from amlhpc.jobs.managed.record import Record
        from tests.test_runs import RECORD

        mocker.patch("amlhpc.jobs.managed.client.read", return_value=Record.from_json(RECORD))
        base = ("list", "--stack", "dev", "--outputs", str(outputs_file("dev")), "--json")
        failed = json.loads(run(*base, "--state", "failed").stdout)
        assert [r["run"] for r in failed] == ["bert-20261124-090000-bbbb"]
        mine = json.loads(run(*base, "--user", "someone", "--recipe", "cosmoflow").stdout)
        assert mine and all(r["user"] == "someone" and r["recipe"] == "cosmoflow" for r in mine)
        assert json.loads(run(*base, "--user", "nobody").stdout) == []

    def test_connect_prints_each_service_and_the_ssh_command(self, workspace, mocker):
        from azure.ai.ml.entities import ServiceInstance

        services = {"ssh": ServiceInstance(type="SSH", status="Running", endpoint="ssh://10.0.0.4:50022", port=50022),
                    "vs_code": ServiceInstance(type="VSCode", status="Running",
                                               endpoint="https://ml.azure.com/vscode/x?nodeIndex=0")}
        asked = mocker.patch("amlhpc.jobs.azure.submit.services", return_value=services)
        opened = mocker.patch("webbrowser.open")
        result = run("connect", "cosmoflow-20261125-100000-aaaa", "--stack", "dev", "--outputs", str(outputs_file("dev")),
                     "--node", "1", "--json", "--open")
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        assert (asked.call_args.args[1], asked.call_args.args[3]) == ("cosmoflow-20261125-100000-aaaa", 1)
        assert [s["name"] for s in document["services"]] == ["ssh", "vs_code"]
        assert document["sshCommand"].startswith("az ml job connect-ssh --name cosmoflow-20261125-100000-aaaa "
                                                 "--node-index 1 --private-key-file-path ~/.ssh/id_ed25519")
        opened.assert_called_once_with("https://ml.azure.com/vscode/x?nodeIndex=0")

    def test_connect_to_a_job_without_services_says_how_to_add_them(self, workspace, mocker):
        mocker.patch("amlhpc.jobs.azure.submit.services", return_value={})
        result = run("connect", "cosmoflow-20261125-100000-aaaa", "--stack", "dev", "--outputs", str(outputs_file("dev")))
        assert result.exit_code == 2 and "exposes no services" in result.stderr and "services:" in result.stderr

    def test_submit_json_is_the_created_job_alone_on_stdout(self, workspace, mocker):
        created = SimpleNamespace(name="cosmoflow-20261128-000000-cafe", status="Starting",
                                  studio_url="https://ml.azure.com/runs/cosmoflow-20261128-000000-cafe")
        submitted = mocker.patch("amlhpc.jobs.azure.submit.submit", return_value=created)
        result = run("submit", "cosmoflow", "--stack", "dev", "--outputs", str(outputs_file("dev")), "--json")
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        assert document["job"] == created.name and document["status"] == "Starting" and document["studioUrl"]
        assert document["nodes"] == 2 and document["estimateUsd"] > 0
        assert submitted.call_args.kwargs["follow"] is False
        dry = json.loads(run("submit", "cosmoflow", "--stack", "dev", "--outputs", str(outputs_file("dev")), "--dry-run",
                             "--json").stdout)
        assert dry["dryRun"] is True and dry["job"]["compute"] and dry["job"]["resources"]["instance_count"] == 2

    def test_a_scaling_study_dry_run_as_json(self):
        result = run("scale", "cosmoflow", "--stack", "dev", "--outputs", str(outputs_file("dev")), "--dry-run", "--json")
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        assert document["dryRun"] is True and [j["resources"]["instance_count"] for j in document["jobs"]] == [1, 2]

    def test_without_pulumi_azure_commands_never_suggest_offline(self, mocker):
        mocker.patch("shutil.which", return_value=None)
        for args in (("status", "job-1"), ("list",), ("show", "job-1"), ("logs", "job-1")):
            result = run(*args, "--stack", "dev")
            assert result.exit_code == 2, result.output
            assert "the pulumi command is not installed" in result.stderr and "--offline" not in result.stderr, args
            assert "--outputs FILE" in result.stderr and "--local" in result.stderr


class TestTablesOffATerminal:
    def test_a_piped_table_keeps_to_80_columns_and_says_how_to_get_every_value(self):
        from amlhpc.jobs import recipes

        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "AMLHPC_TABLE_WIDTH")}
        table = subprocess.run([sys.executable, "-m", "amlhpc.jobs", "recipes"], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=120)
        assert table.returncode == 0 and "…" not in table.stdout
        assert max(len(line) for line in table.stdout.splitlines()) <= 80
        assert "-o tsv (lists) or --json prints every value on one line" in " ".join(table.stdout.split())
        tsv = subprocess.run([sys.executable, "-m", "amlhpc.jobs", "recipes", "-o", "tsv"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
        for name in recipes.available():
            assert f"{name}\t" in tsv.stdout and recipes.load(name).description in tsv.stdout

    def test_columns_set_by_the_user_wins(self):
        env = {**{k: v for k, v in os.environ.items() if k != "AMLHPC_TABLE_WIDTH"}, "COLUMNS": "200"}
        table = subprocess.run([sys.executable, "-m", "amlhpc.jobs", "recipes"], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=120)
        assert max(len(line) for line in table.stdout.splitlines()) > 80 and "wrapped to" not in table.stdout


class TestSshService:
    KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBHk3Nw2Qz3q8e6tW1zM2xX0f9Yx7m1o5J4nKqLw0bVx ada@laptop"

    def test_a_recipe_asks_azure_ml_for_an_ssh_service_on_every_node(self):
        from azure.ai.ml.entities import SshJobService

        from amlhpc.jobs import recipes
        from amlhpc.jobs.plan import build
        from tests.jobs_helpers import stack_outputs

        recipe = recipes.load("cosmoflow", {"services.ssh.public_keys": self.KEY})
        plan = build.plan_job(recipe, stack_outputs("dev"))
        job = build.to_command_job(plan, "code")
        ssh = job.services["ssh"]
        assert isinstance(ssh, SshJobService) and ssh.ssh_public_keys == self.KEY and ssh.nodes == "all"

    @pytest.mark.parametrize("value", ["-----BEGIN OPENSSH PRIVATE KEY-----\nabc", "not a key", ""])
    def test_anything_but_public_key_lines_is_refused(self, value):
        from amlhpc.core.errors import UserError
        from amlhpc.jobs import recipes

        with pytest.raises(UserError) as refused:
            recipes.load("cosmoflow", {"services.ssh.public_keys": value})
        assert "services.ssh.public_keys" in refused.value.render()
        assert "never a private key" in refused.value.render()
