"""Imports go one way (docs/contracts.md section 1). Parsed from source, so a lazy import
inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def py_files(*parts: str) -> list[Path]:
    base = ROOT.joinpath(*parts)
    return sorted(base.rglob("*.py")) if base.is_dir() else [base]


def offenders(files: list[Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for path in files:
        hits = sorted(m for m in imports_of(path) if any(m == f or m.startswith(f + ".") for f in forbidden))
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    return bad


PURE_INFRA = [ROOT / "infra" / f for f in ("skus.py", "errors.py", "regions.py", "naming.py", "quirks.py")]


@pytest.mark.parametrize("path", PURE_INFRA, ids=lambda p: p.name)
def test_catalog_and_helpers_import_no_sdk(path):
    assert offenders([path], ("pulumi", "pulumi_azure_native", "azure", "jobs", "infra.config",
                              "infra.components", "infra.program", "infra.plan")) == {}


def test_runtime_imports_nothing_else_from_the_repository():
    """jobs/runtime ships into the training image on its own."""
    assert offenders(py_files("jobs", "runtime"), ("infra", "images", "jobs.build", "jobs.cli", "jobs.recipes",
                                                   "jobs.submit", "jobs.outputs", "jobs.data", "jobs.local",
                                                   "jobs.beeond", "jobs.workloads", "pulumi", "azure.ai")) == {}


def test_infra_never_imports_jobs():
    assert offenders(py_files("infra"), ("jobs",)) == {}


def test_config_imports_pulumi_only_lazily():
    """A bad config must fail before Pulumi is even loaded at module level."""
    tree = ast.parse((ROOT / "infra" / "config.py").read_text())
    top_level = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top_level |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(m.startswith("pulumi") for m in top_level)


def test_components_never_read_pulumi_config():
    for path in py_files("infra", "components"):
        assert "pulumi.Config(" not in path.read_text(), path.name


def test_jobs_never_creates_azure_resources():
    assert offenders([p for p in py_files("jobs")], ("pulumi_azure_native", "infra.components", "infra.program")) == {}
