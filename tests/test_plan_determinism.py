"""The same stack gives the same plan, byte for byte: in separate processes, and whether
azure-native loads lazily (amlhpc/infra/plan/lazy_provider.py) or as the stock package."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from amlhpc.infra.config import REPO_ROOT
from amlhpc.infra.plan import lazy_provider
from tests.plan_helpers import SWEEP_EXPERIMENT

# Writes, for each stack, the CLI's two outputs (`plan --json` and the text) in one process.
SCRIPT = """
import json, sys
from pathlib import Path
from amlhpc.infra.plan import evaluate
from amlhpc.infra.plan.render import render
root, out = Path(sys.argv[1]), {}
for stack in sys.argv[2:]:
    plan = evaluate(stack, root)
    out[stack] = {"json": json.dumps(plan.to_json(), indent=2) + "\\n", "text": render(plan)}
print(json.dumps(out))
"""
EXPERIMENT = SWEEP_EXPERIMENT
STACKS = ("dev", "prod", "exp-sweep")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("stacks")
    for stack in ("dev", "prod"):
        (root / f"Pulumi.{stack}.yaml").write_text((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text())
    (root / "Pulumi.exp-sweep.yaml").write_text(yaml.safe_dump({"config": EXPERIMENT}))
    return root


def plans(root, **env) -> dict:
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(root), *STACKS], cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONHASHSEED": "random", **env},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def runs(root):
    return [plans(root), plans(root), plans(root, **{lazy_provider.EAGER_ENV: "1"})]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("form", ["json", "text"])
def test_byte_identical_across_processes(runs, stack, form):
    """Two evaluations in separate processes (hash seeds differ) give the same bytes."""
    first, second, _ = runs
    assert first[stack][form] == second[stack][form]


@pytest.mark.parametrize("stack", STACKS)
def test_lazy_and_stock_azure_native_give_the_same_plan(runs, stack):
    """The lazy loading of azure-native changes nothing but the time it takes."""
    lazy, _, eager = runs
    assert lazy[stack]["json"] == eager[stack]["json"] and lazy[stack]["text"] == eager[stack]["text"]


def test_json_is_in_canonical_order(runs):
    """Resources grouped by component (the component first), dependencies sorted."""
    document = json.loads(runs[0]["prod"]["json"])
    from amlhpc.infra.plan import canonical_order
    from amlhpc.infra.plan.mocks import RecordedResource

    resources = [RecordedResource.from_json(r) for r in document["resources"]]
    assert [r.urn for r in canonical_order(list(reversed(resources)))] == [r["urn"] for r in document["resources"]]
    for r in document["resources"]:
        assert r["options"]["dependsOn"] == sorted(r["options"]["dependsOn"])
    first = document["resources"][0]
    assert not first["custom"], "a component heads its group"
