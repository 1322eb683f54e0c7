"""Imports go one way (docs/contracts.md section 1). Parsed from source, so a lazy import
inside a function counts too; one test runs jobs commands with Pulumi made unimportable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.source_imports import imports_of

ROOT = Path(__file__).resolve().parent.parent


def py_files(*parts: str) -> list[Path]:
    base = ROOT.joinpath(*parts)
    return sorted(base.rglob("*.py")) if base.is_dir() else [base]


def matches(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def offenders(files: list[Path], forbidden: tuple[str, ...], allowed: tuple[str, ...] = (),
              top_level_only: bool = False) -> dict[str, list[str]]:
    bad = {}
    for path in files:
        hits = sorted(m for m in imports_of(path, top_level_only=top_level_only)
                      if matches(m, forbidden) and not matches(m, allowed))
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    return bad


CATALOG_FETCHER = ROOT / "amlhpc" / "core" / "catalog" / "refresh.py"


def test_core_imports_no_sdk_and_nothing_else_from_the_repository():
    """core is shared by infra, jobs and images: pure Python, pydantic and the standard library.
    The catalog's fetcher (a command, imported by nothing in core) reads Azure through azure-core."""
    shared = [p for p in py_files("amlhpc", "core") if p != CATALOG_FETCHER]
    assert offenders(shared, ("pulumi", "pulumi_azure_native", "azure", "amlhpc.infra", "amlhpc.jobs", "amlhpc.images")) == {}
    assert offenders([CATALOG_FETCHER], ("pulumi", "pulumi_azure_native", "azure", "amlhpc.infra", "amlhpc.jobs", "amlhpc.images"),
                     allowed=("azure.core", "azure.mgmt.core", "azure.identity")) == {}
    assert list(offenders(shared, ("amlhpc.core.catalog.refresh",))) == ["amlhpc/core/catalog/__main__.py"]


def test_runtime_imports_nothing_else_from_the_repository():
    """amlhpc/jobs/runtime ships into the training image on its own."""
    assert offenders(py_files("amlhpc", "jobs", "runtime"), ("amlhpc.core", "amlhpc.infra", "amlhpc.images", "amlhpc.jobs", "pulumi", "azure.ai"),
                     allowed=("amlhpc.jobs.runtime",)) == {}


def test_infra_never_imports_jobs():
    assert offenders(py_files("amlhpc", "infra"), ("amlhpc.jobs",)) == {}


def test_images_use_core_not_infra():
    assert offenders(py_files("amlhpc", "images"), ("amlhpc.infra", "pulumi", "pulumi_azure_native")) == {}


def test_jobs_reach_infra_only_for_the_offline_plan_and_stack_files():
    """jobs never creates Azure resources; it may plan offline (amlhpc.infra.plan) and read stack files
    (amlhpc.infra.config) for messages, both lazily."""
    jobs_files = [p for p in py_files("amlhpc", "jobs") if "runtime" not in p.parts]
    assert offenders(jobs_files, ("pulumi", "pulumi_azure_native", "amlhpc.infra"),
                     allowed=("amlhpc.infra.plan", "amlhpc.infra.config")) == {}
    assert offenders(jobs_files, ("amlhpc.infra", "pulumi"), top_level_only=True) == {}


@pytest.mark.parametrize("path", py_files("amlhpc", "core") + [ROOT / "amlhpc" / "infra" / "naming.py", ROOT / "amlhpc" / "infra" / "quirks.py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_shared_pieces_import_no_pulumi(path):
    assert offenders([path], ("pulumi", "pulumi_azure_native", "azure.ai", "amlhpc.infra.components", "amlhpc.infra.program",
                              "amlhpc.infra.plan")) == {}


def test_config_imports_pulumi_only_lazily():
    """A bad config must fail before Pulumi is even loaded at module level."""
    modules = sorted((ROOT / "amlhpc" / "infra" / "config").glob("*.py"))
    assert len(modules) > 5, "amlhpc/infra/config/ is a package of modules by concern"
    longest = max(modules, key=lambda p: len(p.read_text().splitlines()))
    assert len(longest.read_text().splitlines()) < 400, f"{longest.name} grew past one concern: split it"
    for path in modules:
        assert not any(m.startswith("pulumi") for m in imports_of(path, top_level_only=True)), path.name


def test_components_never_read_pulumi_config():
    for path in py_files("amlhpc", "infra", "components"):
        assert "pulumi.Config(" not in path.read_text(), path.name


_BLOCK_PULUMI = """
import importlib.abc, runpy, sys
class NoPulumi(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pulumi" or name.startswith(("pulumi.", "pulumi_")):
            raise ImportError(f"test: {name} must not be imported by this command")
sys.meta_path.insert(0, NoPulumi())
sys.argv = ["jobs", *sys.argv[1:]]
runpy.run_module("amlhpc.jobs", run_name="__main__")
"""


def run_without_pulumi(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _BLOCK_PULUMI, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


class TestJobsWithoutPulumi:
    """Reading outputs from a file or a deployed stack needs no Pulumi SDK."""

    def test_estimate_from_an_outputs_file(self):
        result = run_without_pulumi(["estimate", "cosmoflow", "--stack", "dev", "--outputs",
                                     "tests/fixtures/outputs/dev.json", "--nodes", "2", "--hours", "3"])
        assert result.returncode == 0, result.stderr
        assert "total: 2 x Standard_ND96asr_v4 x 3 h" in result.stdout

    def test_dry_run_submit_from_a_deployed_stack(self, tmp_path):
        """`pulumi stack output` (the CLI, faked on PATH) is read; the SDK is never imported."""
        document = json.loads((ROOT / "tests" / "fixtures" / "outputs" / "prod.json").read_text())
        fake = tmp_path / "pulumi"
        fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(document)}\nEOF\n")
        fake.chmod(0o755)
        result = run_without_pulumi(["submit", "nccl-allreduce", "--stack", "prod", "--dry-run"],
                                    env={"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
        assert result.returncode == 0, result.stderr
        assert "compute: azureml:" in result.stdout

    def test_the_blocker_blocks(self):
        """--offline runs the program, so it needs Pulumi: the blocker must stop it."""
        result = run_without_pulumi(["estimate", "cosmoflow", "--stack", "dev", "--offline", "--debug"])
        assert result.returncode != 0 and "must not be imported" in result.stderr
