"""A stack's offline plan as another git revision declares it: its stack file and its program.

`plan_at(rev, stack)` extracts the tree of `rev` (`git archive`, so the repository, its
index and its worktree list are left untouched) into a temporary directory and runs that
revision's own `python -m amlhpc.infra plan --stack S --json` there, with this environment's
interpreter. A stack file that does not exist at `rev` gives an empty base: everything
is new. Used by `python -m amlhpc.infra plan --diff-ref REV` and the pull-request workflow.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from amlhpc.core.errors import Problem, UserError
from amlhpc.infra.config import REPO_ROOT

TIMEOUT_S = 300


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=TIMEOUT_S)
    except FileNotFoundError:
        raise UserError([Problem("--diff-ref", "", "git is not installed",
                                 "install git, or save the base plan with `plan --json` and use --diff FILE")],
                        "cannot read another revision") from None


def resolve(rev: str, root: Path = REPO_ROOT) -> str:
    """The commit `rev` names, or a UserError saying how to get it."""
    proc = _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if proc.returncode != 0:
        inside = _git(root, "rev-parse", "--is-inside-work-tree").returncode == 0
        hint = (f"fetch it first (`git fetch origin {rev.split('/')[-1]}`; in GitHub Actions, check out "
                "with fetch-depth: 0), or name a commit, branch or tag that exists here"
                if inside else f"run from a git checkout of the repository ({root} is not one)")
        raise UserError([Problem("--diff-ref", rev, "is not a commit in this repository", hint)],
                        "cannot read another revision")
    return proc.stdout.decode().strip()


def extract(commit: str, destination: Path, root: Path = REPO_ROOT) -> None:
    """The tree of `commit` written under `destination`."""
    proc = _git(root, "archive", "--format=tar", commit)
    if proc.returncode != 0:
        raise UserError([Problem("--diff-ref", commit, f"git archive failed: {proc.stderr.decode().strip()}")],
                        "cannot read another revision")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as archive:
        archive.extractall(destination, filter="data")


def plan_at(rev: str, stack: str, root: Path = REPO_ROOT) -> tuple[dict[str, Any] | None, str]:
    """(the plan document of `stack` at `rev`, or None when its stack file is absent there;
    a label such as `main (3f2c1ab)`)."""
    commit = resolve(rev, root)
    label = f"{rev} ({commit[:7]})" if not commit.startswith(rev) else commit[:7]
    with tempfile.TemporaryDirectory(prefix="aml-hpc-plan-") as tmp:
        tree = Path(tmp)
        extract(commit, tree, root)
        if not (tree / f"Pulumi.{stack}.yaml").is_file():
            return None, label
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run([sys.executable, "-m", "amlhpc.infra", "plan", "--stack", stack, "--json"],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-12:]
        raise UserError([Problem(f"Pulumi.{stack}.yaml at {label}", "",
                                 "the plan at that revision failed:\n      " + "\n      ".join(detail),
                                 "compare with a revision whose plan works, or save a base with "
                                 "`plan --json` and use --diff FILE")],
                        "cannot plan the base revision")
    try:
        return json.loads(proc.stdout), label
    except ValueError:
        raise UserError([Problem(f"Pulumi.{stack}.yaml at {label}", "",
                                 "`plan --json` at that revision did not print a JSON document")],
                        "cannot plan the base revision") from None
