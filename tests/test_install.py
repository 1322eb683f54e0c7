"""The release installs and runs as a tool: the wheel built from this checkout, installed with
uv into a clean environment in a temporary folder, runs from outside the repository.

Built and installed once per session (about 10 s with uv's cache warm: `make test` has just
synced the same locked packages), then: `aml-hpc --version`, the offline plan of a sample
project from one of its subfolders (the project found by its Pulumi.yaml), and a job
rendered for it with `--project` from elsewhere. The two slow commands run side by side.

Then a team's project as a new user makes one, in a new folder: `aml-hpc init`, its recipe
with the team's own src/, the offline dry run written with --out and loaded by azure-ai-ml's
load_job, a local rehearsal of it, list/show/logs/report of that rehearsal, a long rehearsal
canceled from another shell, and `aml-hpc
infra preview` going as far as it can without the Pulumi CLI. The rehearsal needs what a user
installs beside the tool: PyTorch (here the shared environment's CPU build, linked into the
clean one as `pip install torch --index-url .../cpu` would put it) and Azurite (found on PATH,
where `npm install --global azurite` puts it: here the clone's node_modules/.bin).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from amlhpc.core.version import __version__

REPO = Path(__file__).resolve().parent.parent
COMMANDS = ("aml-hpc", "aml-hpc-infra", "aml-hpc-jobs", "aml-hpc-images")


def _uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv") or str(REPO / ".bootstrap" / "bin" / "uv")
    if not Path(found).exists() and not shutil.which(found):
        pytest.fail("uv not found: `make bootstrap` installs it (or put uv on PATH)")
    return found


def _clean_env() -> dict[str, str]:
    """A user's shell: nothing pointing at this checkout; bytecode written (the first command
    compiles what it imports, the later ones reuse it, as for anyone who installs it)."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "AMLHPC_PROJECT", "AMLHPC_BLOB_CONNECTION_STRING", "COLUMNS",
            "PYTHONDONTWRITEBYTECODE")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> Path:
    """bin/ of a fresh environment holding only the wheel and its locked dependencies."""
    uv, work = _uv(), tmp_path_factory.mktemp("release")
    env = _clean_env()

    def uv_run(*args: str, cwd: Path = REPO) -> None:
        result = subprocess.run([uv, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"uv {' '.join(args)}:\n{result.stdout}\n{result.stderr}"

    uv_run("build", "--wheel", "--out-dir", str(work / "dist"))
    uv_run("export", "--frozen", "--no-dev", "--all-extras", "--no-emit-project", "--no-hashes", "--no-header", "-q",
           "-o", str(work / "constraints.txt"))
    uv_run("venv", "-q", "--python", sys.executable, str(work / "venv"))
    (wheel,) = (work / "dist").glob("aml_hpc-*.whl")
    # every tracked file of the packages, the data the tools read included: recipes, the
    # catalog, Dockerfiles and amlhpc/images/common, workloads, the policy pack
    listed = subprocess.run(["git", "ls-files", "amlhpc"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    names = set(zipfile.ZipFile(wheel).namelist())
    assert listed and not [f for f in listed if f not in names], [f for f in listed if f not in names][:10]
    uv_run("pip", "install", "-q", "--python", str(work / "venv" / "bin" / "python"), f"{wheel}[report]",
           "-c", str(work / "constraints.txt"))
    _link_torch(work / "venv", work / "torch-site")
    return work / "venv" / "bin"


def _link_torch(venv: Path, folder: Path) -> None:
    """PyTorch, NumPy and what they require, from this test run's environment, on the clean one's
    path after its own packages (a .pth file): what a user's `pip install torch numpy` adds, without a
    download of hundreds of megabytes in the suite."""
    todo, seen = ["torch", "numpy"], set()
    folder.mkdir()
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        name = dist.metadata["Name"].lower()
        if name in seen:
            continue
        seen.add(name)
        todo += [re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in dist.requires or [] if "extra ==" not in r]
        base = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or []} - {".."}:
            if not top.endswith(".pth") and not (folder / top).exists():
                (folder / top).symlink_to(base / top)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "aml-hpc-test-torch.pth").write_text(f"{folder}\n")


@pytest.fixture()
def sample_project(tmp_path) -> Path:
    """A team's project: its Pulumi.yaml and one environment's stack file, nothing else."""
    project = tmp_path / "team-platform"
    (project / "notebooks" / "week1").mkdir(parents=True)
    for name in ("Pulumi.yaml", "Pulumi.dev.yaml"):
        shutil.copy(REPO / name, project / name)
    return project


@pytest.mark.slow
def test_installed_tool_runs_outside_the_repository(installed: Path, sample_project: Path, tmp_path: Path):
    env = _clean_env()
    for command in COMMANDS:
        version = subprocess.run([str(installed / command), "--version"], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=120)
        assert version.returncode == 0 and version.stdout.strip() == f"aml-hpc {__version__}", (command, version.stderr)
    where = subprocess.run([str(installed / "python"), "-c", "import amlhpc.jobs; print(amlhpc.jobs.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert str(installed.parent) in where.stdout and str(REPO) not in where.stdout, where.stdout + where.stderr

    plan = subprocess.Popen([str(installed / "aml-hpc"), "infra", "plan", "--stack", "dev", "--json"],
                            cwd=sample_project / "notebooks" / "week1", env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    job = subprocess.Popen([str(installed / "aml-hpc"), "--project", str(sample_project), "jobs", "submit", "cosmoflow",
                            "--stack", "dev", "--dry-run", "--offline"], cwd=outside, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    plan_out, plan_err = plan.communicate(timeout=300)
    job_out, job_err = job.communicate(timeout=300)

    assert plan.returncode == 0, plan_err[-3000:]
    assert "planning stack dev offline" in plan_err  # a step of seconds says what it does
    import json

    document = json.loads(plan_out)
    assert document["stack"] == "dev" and document["outputs"]["workspace"] == "mlw-amlhpc-dev"
    assert job.returncode == 0, job_err[-3000:]
    rendered = yaml.safe_load(job_out)
    assert rendered["compute"] == "azureml:nd-a100" and rendered["command"].startswith("python -m amlhpc.jobs.runtime.launch")
    code = Path(rendered["code"])
    assert not code.is_absolute() and (outside / code / "amlhpc" / "jobs" / "runtime" / "launch" / "launcher.py").is_file()
    assert (sample_project / ".scratch" / "code-snapshots") in (outside / code).resolve().parents
    assert str(tmp_path) not in job_out


@pytest.mark.slow
def test_outside_any_project_the_tool_says_where_to_go(installed: Path, tmp_path: Path):
    env = _clean_env()
    result = subprocess.run([str(installed / "aml-hpc"), "infra", "plan", "--stack", "dev"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no aml-hpc project" in result.stderr and "--project" in result.stderr
    bad = subprocess.run([str(installed / "aml-hpc"), "--project", str(tmp_path), "jobs", "recipes"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and f"no Pulumi.yaml in {tmp_path}" in bad.stderr
    recipes = subprocess.run([str(installed / "aml-hpc-jobs"), "recipes"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert recipes.returncode == 0 and "cosmoflow" in recipes.stdout, recipes.stderr


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.azurite
def test_a_team_project_from_init_to_preview(installed: Path, tmp_path: Path):
    """What a new team does first, from the installed wheel alone, in a folder of its own. The
    rehearsal (the longest step) runs beside the offline dry run, the preview and the
    experiment's stack file."""
    from azure.ai.ml import load_job

    env = _clean_env()
    env["PATH"] = os.pathsep.join([str(REPO / "node_modules" / ".bin"), *[p for p in env.get("PATH", "").split(os.pathsep)
                                                                         if p and not shutil.which("pulumi", path=p)]])
    aml_hpc = str(installed / "aml-hpc")

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([aml_hpc, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)

    made = run("init", "team", cwd=tmp_path)
    team = tmp_path / "team"
    assert made.returncode == 0, made.stderr
    assert "aml-hpc jobs run train --local" in made.stdout and "python -m" not in made.stdout
    assert "main" not in yaml.safe_load((team / "Pulumi.yaml").read_text())
    (team / "src" / "augment.py").write_text("SCALE = 3.0\n")  # the team's own code, beside train.py

    rehearsal = subprocess.Popen([aml_hpc, "jobs", "run", "train", "--local", "--quiet"], cwd=team, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dry_run = subprocess.Popen([aml_hpc, "jobs", "submit", "train", "--stack", "dev", "--offline", "--dry-run",
                                "--out", ".scratch/train.yml"], cwd=team / "src", env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, dry_err = dry_run.communicate(timeout=600)
    preview = run("infra", "preview", "dev", cwd=team)
    rehearsal_out, rehearsal_err = rehearsal.communicate(timeout=600)

    assert dry_run.returncode == 0, dry_err[-3000:]
    job = load_job(team / "src" / ".scratch" / "train.yml")
    code = (Path(job.base_path) / str(job.code)).resolve()
    assert (code / "train.py").is_file() and (code / "augment.py").is_file(), sorted(p.name for p in code.iterdir())
    assert (code / "amlhpc" / "jobs" / "runtime" / "launch" / "launcher.py").is_file()
    assert job.command.startswith("python -m amlhpc.jobs.runtime.launch -- python train.py")

    assert preview.returncode == 2, preview.stderr
    assert "the Pulumi CLI is not installed" in preview.stderr and "https://get.pulumi.com" in preview.stderr
    assert "Traceback" not in preview.stderr and "make " not in preview.stderr
    experiment = run("infra", "new-experiment", "sweep", "--env", "dev", "--days", "3", cwd=team)
    assert experiment.returncode == 0, experiment.stderr
    assert "aml-hpc infra preview exp-sweep" in experiment.stdout and "aml-hpc infra down exp-sweep" in experiment.stdout
    assert "make " not in experiment.stdout and "python -m" not in experiment.stdout

    assert rehearsal.returncode == 0, (rehearsal_out + rehearsal_err)[-4000:]
    assert "rehearsal succeeded" in rehearsal_out + rehearsal_err
    node = team / ".rehearsal" / "train-local" / "node0"
    assert (node / "train.py").is_file() and (node / "outputs" / "aml-hpc" / "metrics.json").is_file()

    listed = run("jobs", "list", "--local", "--json", cwd=team)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["run"], row["state"], row["recipe"]) == ("train-local", "succeeded", "train")
    shown = run("jobs", "show", "train-local", "--local", cwd=team)
    assert shown.returncode == 0 and "aml-hpc jobs report train-local --local" in shown.stdout, shown.stderr
    logs = run("jobs", "logs", "train-local", "--local", cwd=team)
    steps = [json.loads(line)["step"] for line in logs.stdout.splitlines() if line.startswith('{"step"')]
    assert logs.returncode == 0 and steps == list(range(1, 9)), logs.stdout[-2000:]
    report = run("jobs", "report", "train-local", "--local", cwd=team)
    assert report.returncode == 0, report.stderr
    assert (team / ".rehearsal" / "train-local" / "report.html").is_file()

    # a long rehearsal, canceled from another shell with the installed tool
    long = subprocess.Popen([aml_hpc, "jobs", "run", "train", "--local", "--name", "long", "--set", "health=off",
                             "--set", "command=python train.py --steps 1000000 --checkpoint-every 1000000"],
                            cwd=team, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        from amlhpc.jobs.runtime.base import progress

        deadline = time.monotonic() + 300
        while not progress.files(team / ".rehearsal" / "long" / "node0" / "scratch", name="rank-0.json"):
            assert long.poll() is None, long.stdout.read()[-3000:] if long.stdout else ""
            assert time.monotonic() < deadline, "the long rehearsal did not start training"
            time.sleep(0.2)
        canceled = run("jobs", "cancel", "long", "--local", cwd=team)
        assert canceled.returncode == 0, canceled.stderr
        code = long.wait(timeout=120)
    finally:
        if long.poll() is None:
            os.killpg(long.pid, signal.SIGKILL)
            long.wait()
    said = long.stdout.read() if long.stdout else ""
    assert code == 1 and "rehearsal long canceled" in said, said[-3000:]
    shown = run("jobs", "show", "long", "--local", cwd=team)
    assert shown.returncode == 0 and "canceled" in shown.stdout, shown.stdout + shown.stderr
