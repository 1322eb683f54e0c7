"""The local rehearsal's parts: the seams (Blob redirected to Azurite, rank variables), node
folders, the command line's refusals, a missing dataset. A whole rehearsal of every recipe,
and a resumed one, runs through the command line in tests/test_rehearsal_matrix.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from amlhpc.core.errors import UserError
from amlhpc.jobs import recipes
from amlhpc.jobs.local import rehearsal
from amlhpc.jobs.plan import build
from amlhpc.jobs.plan import outputs as outputs_mod
from amlhpc.jobs.runtime.base import contract

REPO = Path(__file__).resolve().parent.parent
TRAIN = ("python -m amlhpc.jobs.workloads.cosmoflow.train --input cosmoflow --batch-size 2 --conv-size 4 "
         "--n-conv-layers 3 --fc1 16 --fc2 8 --workers 0 --log-every 1 --epochs {epochs}")


class TestSeams:
    def test_blob_redirected_to_azurite_and_identity_dropped(self):
        env = {
            contract.STAGE_JSON: json.dumps([{"name": "x", "account_url": "https://acct.blob.core.windows.net/",
                                              "container": "datasets", "prefix": "p", "mode": "local"}]),
            contract.CHECKPOINT_JSON: json.dumps({"account_url": "https://acct.blob.core.windows.net/",
                                                  "container": "checkpoints", "prefix": "r"}),
            "AZURE_CLIENT_ID": "11111111-1111-1111-1111-111111111111",
            "NCCL_IB_PCI_RELAXED_ORDERING": "1",
        }
        out = rehearsal.redirect_blob(env, "http://127.0.0.1:1/acct", "conn")
        assert json.loads(out[contract.STAGE_JSON])[0]["account_url"] == "http://127.0.0.1:1/acct"
        assert json.loads(out[contract.CHECKPOINT_JSON])["account_url"] == "http://127.0.0.1:1/acct"
        assert out[contract.BLOB_CONNECTION_STRING] == "conn"
        assert "AZURE_CLIENT_ID" not in out and out["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"

    def test_torch_ranks(self):
        env = rehearsal.rank_env("pytorch", node=1, local_rank=1, nodes=2, procs_per_node=2, master_port=29500)
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == \
            ("3", "1", "4", "2", "1")
        assert env["MASTER_ADDR"] == "127.0.0.1" and "OMPI_COMM_WORLD_RANK" not in env

    def test_mpi_ranks(self):
        env = rehearsal.rank_env("mpi", node=1, local_rank=0, nodes=3, procs_per_node=4, master_port=29500)
        assert (env["OMPI_COMM_WORLD_RANK"], env["OMPI_COMM_WORLD_SIZE"], env["OMPI_COMM_WORLD_LOCAL_RANK"],
                env["OMPI_COMM_WORLD_LOCAL_SIZE"]) == ("4", "12", "0", "4")
        assert "RANK" not in env

    def test_each_node_gets_its_own_code_copy_and_scratch(self, tmp_path):
        snapshot = tmp_path / "snap"
        (snapshot / "amlhpc" / "jobs" / "runtime" / "launch").mkdir(parents=True)
        (snapshot / "amlhpc" / "__init__.py").write_text("")
        (snapshot / "amlhpc" / "jobs" / "runtime" / "launch" / "launcher.py").write_text("# launcher\n")
        folders = rehearsal.prepare_nodes(snapshot, tmp_path / "work", 3)
        assert [f.name for f in folders] == ["node0", "node1", "node2"]
        for f in folders:
            assert (f / "amlhpc" / "jobs" / "runtime" / "launch" / "launcher.py").read_text() == "# launcher\n"
            assert (f / "amlhpc" / "__init__.py").is_file(), "a regular package: the node's copy wins over the checkout"
            assert (f / "scratch").is_dir()
        assert not (folders[0] / "amlhpc" / "jobs").samefile(folders[1] / "amlhpc" / "jobs")

    def test_the_teams_code_is_copied_beside_the_runtime_and_a_rerun_drops_what_it_deleted(self, tmp_path):
        """The whole snapshot goes to each node (a team's train.py at the top, as Azure ML gives
        its working folder); a rerun replaces the code and keeps what the job wrote."""
        first = tmp_path / "snap1"
        (first / "amlhpc" / "jobs" / "runtime").mkdir(parents=True)
        (first / "train.py").write_text("v1")
        (first / "old_helper.py").write_text("gone next time")
        (node,) = rehearsal.prepare_nodes(first, tmp_path / "work", 1)
        assert (node / "train.py").read_text() == "v1" and (node / "old_helper.py").is_file()
        (node / "outputs").mkdir()
        (node / "outputs" / "metrics.json").write_text("{}")
        second = tmp_path / "snap2"
        (second / "amlhpc" / "jobs" / "runtime").mkdir(parents=True)
        (second / "train.py").write_text("v2")
        (node,) = rehearsal.prepare_nodes(second, tmp_path / "work", 1)
        assert (node / "train.py").read_text() == "v2" and not (node / "old_helper.py").exists()
        assert (node / "outputs" / "metrics.json").is_file() and (node / "scratch").is_dir()


class TestCli:
    def run(self, *args):
        return subprocess.run([sys.executable, "-m", "amlhpc.jobs", "run", *args], cwd=REPO, capture_output=True, text=True)

    def test_local_is_not_needed(self):
        """Rehearsing is `run`'s only mode: without --local it goes on to what the recipe needs."""
        result = self.run("cosmoflow-tf")
        assert result.returncode == 2 and "nothing to run" not in result.stderr
        assert "needs Python modules tensorflow" in result.stderr

    def test_unknown_recipe(self):
        result = self.run("cosmoflw", "--local")
        assert result.returncode == 2 and "did you mean cosmoflow" in result.stderr

    def test_bad_data_flag(self):
        result = self.run("cosmoflow", "--local", "--data", "cosmoflow=/no/such/folder")
        assert result.returncode == 2 and "is not INPUT=DIR with an existing folder" in result.stderr


def _plan(name: str, nodes: int, procs: int, epochs: int, health: str = "gate"):
    recipe = recipes.load("cosmoflow", recipes.parse_overrides([f"command={TRAIN.format(epochs=epochs)}", f"health={health}"]))
    outputs = outputs_mod.load("dev", offline=True).outputs
    return build.plan_job(recipe, outputs, nodes=nodes, processes_per_node=procs, name=name), outputs


@pytest.mark.slow
@pytest.mark.azurite
class TestRehearsal:
    def test_missing_dataset_names_the_upload(self, azurite):
        plan, outputs = _plan("nodata", 1, 1, 1)
        plan.staged_inputs[0]["prefix"] = "nothing/here"
        rehearsal.ensure_containers(list(outputs.storage.containers.values()), azurite.connection_string)
        with pytest.raises(UserError) as info:
            rehearsal.check_dataset(plan, azurite.connection_string)
        text = info.value.render()
        assert "no blobs under datasets/nothing/here/" in text and "python -m amlhpc.jobs data upload" in text
