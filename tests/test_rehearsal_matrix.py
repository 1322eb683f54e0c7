"""Every shipped recipe rehearses here (2 cores, no GPU) with its local profile, or is refused
within 5 s, before anything starts, naming what it needs. Each case runs the real command
line, `python -m amlhpc.jobs run RECIPE --local`, on 2 simulated nodes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from amlhpc.jobs import recipes
from amlhpc.jobs.runtime.base import contract
from tests.jobs_helpers import outputs_file

REPO = Path(__file__).resolve().parent.parent
RUNS = ("cosmoflow", "nccl-allreduce", "bert-pretrain", "llm-pretrain", "node-health")
REFUSED = {
    # recipe: what the refusal must name
    "cosmoflow-tf": ["tensorflow, horovod.tensorflow", "aml-hpc-tensorflow image"],
    "maskrcnn": ["needs an NVIDIA GPU", "inputs.coco.mode: is download", "github.com:443"],
}
REFUSAL_LIMIT_S = 5.0


def test_every_shipped_recipe_is_in_the_matrix():
    """A new recipe must be added here: it rehearses, or it says why it cannot."""
    assert set(RUNS) | set(REFUSED) == set(recipes.available())


def test_every_profile_validates_with_the_recipe():
    for name in recipes.available():
        recipe = recipes.load(name, local=True)
        assert recipe.local.requires is not None
        for key in recipe.local.overrides:
            assert key.split(".")[0] in type(recipe).model_fields


def rehearse(recipe: str, tmp_path: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    """`jobs run RECIPE --local` on 2 nodes x 1 process; later flags (--nodes, --name) win."""
    argv = [sys.executable, "-m", "amlhpc.jobs", "run", recipe, "--local", "--nodes", "2", "--procs-per-node", "1",
            "--outputs", str(outputs_file("dev")), "--workdir", str(tmp_path / "work"),
            "--name", f"matrix-{recipe}", *extra]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def blob_env(azurite):
    env = {**os.environ, contract.BLOB_CONNECTION_STRING: azurite.connection_string, "COLUMNS": "200"}
    env.pop("PYTHONPATH", None)
    return env


def _loss_lines(stdout: str) -> list[dict]:
    found = []
    for line in stdout.splitlines():
        text = line.split("] ", 1)[-1].strip()
        if text.startswith("{") and '"loss"' in text:
            found.append(json.loads(text))
    return found


@pytest.mark.slow
@pytest.mark.azurite
@pytest.mark.parametrize("recipe", RUNS)
def test_runs_here(recipe, tmp_path, blob_env):
    # The health gate runs in the node-health case (and tests/test_rehearsal.py); here it
    # would only repeat the same checks before every workload.
    extra = [] if recipe == "node-health" else ["--set", "health=off"]
    if recipe == "cosmoflow":
        # the demo's dataset, given with --data (the profile's own dataset is what
        # README.md's `jobs run cosmoflow --local` uses), uploaded to a prefix of its own
        data = tmp_path / "cosmoflow-data"
        generate = recipes.load("cosmoflow").local.data["cosmoflow"].replace("{dir}", str(data)).split()
        subprocess.run([sys.executable, *generate[1:]], cwd=REPO, check=True, capture_output=True)
        extra += ["--data", f"cosmoflow={data}", "--set", f"inputs.cosmoflow.path=matrix/{uuid.uuid4().hex[:8]}"]
    name = f"matrix-{recipe}-{uuid.uuid4().hex[:6]}"
    result = rehearse(recipe, tmp_path, blob_env, "--name", name, *extra)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "rehearsal succeeded: 2 processes" in log
    work = tmp_path / "work"
    if recipe == "cosmoflow":
        assert f"uploaded {tmp_path / 'cosmoflow-data'} -> datasets/rehearsal-data/cosmoflow/" in log
        assert f"input 'cosmoflow' stages exactly the 32 file(s) of {tmp_path / 'cosmoflow-data'}" in log
        assert "the local dataset for input" not in log, "--data wins over the profile's dataset"
        losses = _loss_lines(result.stdout)
        assert losses and {entry["epoch"] for entry in losses} == {0, 1}, "two epochs, as the profile says"
        first_version = re.search(r"latest\s+version\s+(\S+)", log).group(1)
        # each node staged its own share, decompressed, byte-identical to the source
        staged = {p.name: p.read_bytes() for p in work.glob("node*/scratch/cosmoflow/**/*.tfrecord")}
        assert staged == {p.name: p.read_bytes() for p in (tmp_path / "cosmoflow-data").rglob("*.tfrecord")}
        assert len(list(work.glob("node*/outputs/aml-hpc/launch-node*.json"))) == 2
        # the same name again with --resume, on one node, one epoch longer: it resumes from the checkpoint
        command = recipes.load("cosmoflow", local=True).command + " --epochs 3"
        again = rehearse(recipe, tmp_path, blob_env, "--name", name, "--nodes", "1", *extra, "--set", f"command={command}",
                         "--resume")
        assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
        assert "resumed from" in again.stdout
        # a version of 2 ranks resumed on 1: the small files restored, the data read by range by the rank
        assert "every part's small files, to reshard for 1 ranks (the ranks read the data by range)" in again.stdout
        assert list(work.glob("node0/scratch/amlhpc-checkpoints/*/versions/step-*/.ranged/*.have"))
        assert {entry["epoch"] for entry in _loss_lines(again.stdout)} == {2}, "only the third epoch is left"
        assert re.search(r"latest\s+version\s+(\S+)", again.stdout).group(1) != first_version
    elif recipe == "bert-pretrain":
        losses = _loss_lines(result.stdout)
        assert losses and all(entry["loss"] > 0 for entry in losses)
        header = next(json.loads(line.split("] ", 1)[-1]) for line in result.stdout.splitlines() if '"params"' in line)
        assert header["deepspeed"] is False and header["world"] == 2
        assert header["params"] < 5e6, "the profile's small model, not BERT-large"
    elif recipe == "llm-pretrain":
        steps = [json.loads(line.split("] ", 1)[-1]) for line in result.stdout.splitlines() if '"tokens_per_s"' in line]
        assert [s["step"] for s in steps] == list(range(1, 9)), "every step logs its rate"
        assert all(s["tokens_per_s"] > 0 and 0 < s["mfu"] < 1 for s in steps)
        assert sorted(p.name for p in work.glob("node*/scratch/amlhpc-checkpoints/*/versions/step-*/rank-*.json")) == [
            "rank-0.json", "rank-0.json", "rank-1.json", "rank-1.json"], "each node holds its shards of steps 4 and 8"
    elif recipe == "nccl-allreduce":
        report = json.loads((work / "node0" / "outputs" / "aml-hpc" / "allreduce.json").read_text())
        assert [row["bytes"] for row in report["sizes"]][-1] == 4 << 20
        assert report["world_size"] == 2 and report["backend"] == "gloo" and report["verdict"] == "not judged"
    elif recipe == "node-health":
        reports = sorted((work).glob("node*/outputs/aml-hpc/health/health-node*.json"))
        assert len(reports) == 2, log[-3000:]


@pytest.mark.parametrize("recipe", sorted(REFUSED))
def test_refused_fast_before_anything_starts(recipe, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != contract.BLOB_CONNECTION_STRING}
    env["COLUMNS"] = "400"
    started = time.monotonic()
    result = rehearse(recipe, tmp_path, env)
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stdout + result.stderr
    assert elapsed < REFUSAL_LIMIT_S, f"refused after {elapsed:.1f} s"
    assert f"cannot rehearse {recipe} on this machine" in result.stderr
    for needed in REFUSED[recipe]:
        assert needed in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "work").exists(), "nothing staged"
    assert "Blob:" not in result.stdout, "no Azurite started"
