"""Rehearsals that cannot report success on the wrong data or the wrong run, through the real
command line (`jobs run RECIPE --local`, in process) on two simulated nodes, Azurite as Blob:

- `--data INPUT=DIR` stages exactly DIR's files, though the recipe's own input prefix holds
  other blobs; an empty DIR is refused before anything starts;
- the same name again starts a new run: the earlier one is kept, whole, under a name of its
  own, and the new one does not resume its checkpoints;
- `--resume` of a finished run says it had finished and trained nothing; `--resume` of a name
  with no run is refused.

The training is amlhpc.jobs.workloads.synthetic (no framework: each attempt takes seconds);
staging, the launcher and checkpoints are the real ones."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from amlhpc.jobs.local import faults
from tests.jobs_helpers import outputs_file

pytestmark = [pytest.mark.slow, pytest.mark.azurite]

TRAIN = "python -m amlhpc.jobs.workloads.synthetic --steps 6 --step-s 0.05 --checkpoint-every 3"


def run(azurite, *args: str):
    from amlhpc.jobs.cli.main import app

    return CliRunner().invoke(app, ["run", "cosmoflow", "--local", "--nodes", "2", "--procs-per-node", "1",
                                    "--outputs", str(outputs_file("dev")), "--set", f"command={TRAIN}",
                                    "--set", "health=off", *args],
                              env={"AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string, "COLUMNS": "250"})


def staged(workdir: Path) -> set[str]:
    """Every file the nodes staged for the cosmoflow input, relative to the input's folder."""
    return {p.relative_to(node / "scratch" / "cosmoflow").as_posix()
            for node in workdir.glob("node*") for p in (node / "scratch" / "cosmoflow").rglob("*") if p.is_file()}


def test_data_stages_exactly_the_folder_and_a_rerun_is_a_new_run(azurite, tmp_path):
    from amlhpc.jobs.runtime.blob import blobio

    # the recipe's own input prefix holds an older dataset: it must not reach the nodes
    path = f"honest/{uuid.uuid4().hex[:8]}"
    datasets = blobio.container_client("datasets", connection_string=azurite.connection_string)
    if not datasets.exists():
        datasets.create_container()
    for i in range(4):
        datasets.upload_blob(f"{path}/old/stale-{i}.bin", b"old data")
    mine = tmp_path / "mine"
    (mine / "train").mkdir(parents=True)
    for name in ("train/a.bin", "train/b.bin", "c.bin"):
        (mine / name).write_bytes(name.encode() * 100)
    name = f"honest-{uuid.uuid4().hex[:6]}"
    workdir = tmp_path / name
    common = ("--name", name, "--workdir", str(workdir), "--set", f"inputs.cosmoflow.path={path}")

    first = run(azurite, *common, "--data", f"cosmoflow={mine}")
    assert first.exit_code == 0, first.output[-4000:]
    assert f"input 'cosmoflow' stages exactly the 3 file(s) of {mine}" in first.output
    assert "datasets/rehearsal-data/cosmoflow/" in first.output
    assert staged(workdir) == {"train/a.bin", "train/b.bin", "c.bin"}, "DIR's files and nothing else"
    assert "rehearsal succeeded" in first.output

    # the same name again: a new run; the first is kept under a name of its own, records and all
    again = run(azurite, *common, "--data", f"cosmoflow={mine}")
    assert again.exit_code == 0, again.output[-4000:]
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(f"{name}-")]
    assert len(kept) == 1 and (kept[0] / "attempts.jsonl").is_file() and (kept[0] / "node0" / "user_logs").is_dir()
    assert f"an earlier run of {name} (succeeded, 1 attempt(s)) is kept as {kept[0].name}" in again.output
    assert f"checkpoints of an earlier run are stored under cosmoflow/{name}" in again.output
    assert "resumed from" not in again.output and "starting fresh" in again.output, "a new run trains from step 0"
    record = json.loads((workdir / "run.json").read_text())
    assert record["key"] != name and json.loads((kept[0] / "run.json").read_text())["key"] == name

    # --resume of the finished run: it says so and trains nothing
    resumed = run(azurite, *common, "--resume", "--json")
    assert resumed.exit_code == 0, resumed.output[-4000:]
    assert f"rehearsal {name} had already finished: it resumed at step 6 and trained nothing (0 steps)" in resumed.stderr
    assert "rehearsal succeeded" not in resumed.output
    result = json.loads(resumed.stdout)
    assert (result["outcome"], result["resumedFrom"], result["lastStep"]) == ("already finished", 6, 6)
    assert len((workdir / "attempts.jsonl").read_text().splitlines()) == 2, "the continued run has two attempts"


def test_an_empty_folder_and_nothing_to_resume_are_refused_before_anything_starts(azurite, tmp_path):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    refused = run(azurite, "--name", "empty-data", "--workdir", str(tmp_path / "w"), "--data", f"cosmoflow={empty}")
    assert refused.exit_code == 2 and f"{empty} holds no files" in refused.output
    assert "Blob:" not in refused.output and not (tmp_path / "w").exists()
    nothing = run(azurite, "--name", "never-ran", "--workdir", str(tmp_path / "never"), "--resume")
    assert nothing.exit_code == 2 and "no earlier rehearsal of that name" in nothing.output
    assert "drop --resume to start it" in nothing.output and not (tmp_path / "never").exists()


def readme_managed_example() -> list[str]:
    """The managed rehearsal README.md shows, as its words."""
    import re
    import shlex

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    line = re.search(r"`(python -m amlhpc\.jobs run [^`]*--managed --fault preempt@[^`]*)`", readme).group(1)
    return shlex.split(line)


@pytest.mark.timeout(600)  # torch on two simulated nodes, twice: two minutes on a quiet 2-core machine
def test_the_readmes_managed_example_resumes_from_a_checkpoint(azurite, tmp_path):
    """README.md's `run cosmoflow --local --managed --fault preempt@step=6,node=1`, as written
    (plus where to put it): the preempted attempt's checkpoint reaches Blob and the next attempt
    resumes from it, not from the start."""
    import os
    import subprocess
    import sys

    from amlhpc.jobs.managed.record import RecordStore
    from amlhpc.jobs.runtime.blob import blobio

    argv = readme_managed_example()
    assert argv[:4] == ["python", "-m", "amlhpc.jobs", "run"] and "--fault" in argv
    name = f"readme-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string, "COLUMNS": "250"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run([sys.executable, *argv[1:], "--name", name, "--workdir", str(tmp_path / name),
                             "--outputs", str(outputs_file("dev")), "--quiet"], cwd=Path(__file__).resolve().parent.parent,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    record, _ = RecordStore(blobio.container_client("supervision", connection_string=azurite.connection_string),
                            f"cosmoflow/{name}").load()
    preempted, finished = record.attempts
    step = faults.parse(argv[argv.index("--fault") + 1]).step
    assert preempted.cause == "preempted" and preempted.last_step >= step
    assert finished.resumed_version is not None, "the second attempt resumed from a checkpoint, not from the start"
    assert f"resuming from checkpoint {finished.resumed_version}" in result.stdout
    import re

    resumed_at = int(re.search(r"resumed from step-(\d+) \(step \d+\)", result.stdout).group(1))
    assert 0 < resumed_at <= step, "a checkpoint written before the preemption"
    assert "resuming from the start (no checkpoint yet)" in result.stdout.split("attempt 2")[0], "attempt 1 had none"
