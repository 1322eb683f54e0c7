"""The release installs and runs as a tool: the wheel built from this checkout, installed with
uv into a clean environment in a temporary folder, runs from outside the repository.

Built and installed once per session (about 10 s with uv's cache warm: `make test` has just
synced the same locked packages), then: `aml-hpc --version`, the offline plan of a sample
project from one of its subfolders (the project found by its Pulumi.yaml), and a job
rendered for it with `--project` from elsewhere. The two slow commands run side by side.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
    uv_run("export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes", "--no-header", "-q",
           "-o", str(work / "constraints.txt"))
    uv_run("venv", "-q", "--python", sys.executable, str(work / "venv"))
    (wheel,) = (work / "dist").glob("aml_hpc-*.whl")
    # every tracked file of the packages, the data the tools read included: recipes, the
    # catalog, Dockerfiles and amlhpc/images/common, workloads, the policy pack
    listed = subprocess.run(["git", "ls-files", "amlhpc"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    names = set(zipfile.ZipFile(wheel).namelist())
    assert listed and not [f for f in listed if f not in names], [f for f in listed if f not in names][:10]
    uv_run("pip", "install", "-q", "--python", str(work / "venv" / "bin" / "python"), str(wheel),
           "-c", str(work / "constraints.txt"))
    return work / "venv" / "bin"


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
