"""Shared helpers for the plan and config tests: a stack file written from a config, and a
throwaway git repository holding this checkout."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from amlhpc.infra.config import REPO_ROOT

SWEEP_EXPERIMENT = {
    "azure-native:location": "swedencentral",
    "aml-hpc:owner": "researcher@example.com",
    "aml-hpc:environment": "dev",
    "aml-hpc:expiresAt": "2026-12-31",
    "aml-hpc:clusters": [{"name": "sweep-a100", "sku": "Standard_ND96asr_v4", "maxNodes": 4, "priority": "LowPriority"}],
    "aml-hpc:budget": {"monthlyAmountUsd": 500, "alertEmails": ["researcher@example.com"]},
}
"""An experiment stack on dev (Pulumi.exp-sweep.yaml's config) for the plan tests."""



def write_stack(root: Path, stack: str, config: dict) -> None:
    """Pulumi.<stack>.yaml in `root` holding `config` (keys in the order given), as a user writes it."""
    (root / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))


GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"]


def commit_all(root: Path, message: str) -> str:
    """Commit everything in `root`; return the commit id."""
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-q", "--allow-empty", "-m", message], cwd=root, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                          check=True).stdout.strip()


def repository_copy(root: Path) -> str:
    """This checkout's tracked files as a new git repository at `root` (branch main), one
    commit; returns its id."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    return commit_all(root, "base")
