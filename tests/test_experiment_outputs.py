"""An experiment stack's offline outputs are a complete outputs document: what it inherits
from its environment arrives with the environment's nulls, so a job can be planned against
the experiment offline (`jobs submit RECIPE --stack exp-x --offline --dry-run`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from amlhpc.core.outputs import StackOutputs
from amlhpc.infra import lifecycle, outputs
from amlhpc.infra.config import REPO_ROOT
from amlhpc.infra.plan import evaluate
from amlhpc.jobs import recipes
from amlhpc.jobs.plan import build
from amlhpc.jobs.plan import outputs as jobs_outputs


class TestInheritedEntries:
    def test_nullable_keys_a_stack_reference_dropped_come_back_as_null(self):
        assert outputs.inherited("registry", {"loginServer": "x.azurecr.io", "environments": {}, "environmentIds": {}}) == {
            "loginServer": "x.azurecr.io", "environments": {}, "environmentIds": {}, "mlRegistry": None}
        assert outputs.inherited("network", {"isolation": "public"}) == {"isolation": "public", "subnetId": None}

    def test_required_keys_are_not_invented(self):
        assert outputs.inherited("identity", {"clientId": "c"}) == {"clientId": "c"}

    def test_values_that_are_not_models_pass_unchanged(self):
        assert outputs.inherited("workspace", "mlw-x") == "mlw-x"
        assert outputs.inherited("controller", None) is None


@pytest.mark.slow
def test_new_experiment_plans_a_job_offline(tmp_path: Path):
    shutil.copy(REPO_ROOT / "Pulumi.dev.yaml", tmp_path)
    lifecycle.new_experiment("x", "dev", 7, root=tmp_path)
    plan = evaluate("exp-x", tmp_path)
    document = jobs_outputs.validate(plan.outputs, "offline plan of Pulumi.exp-x.yaml", "-")
    assert isinstance(document, StackOutputs)
    env = plan.environment.outputs
    for key in ("registry", "network", "storage", "identity", "datastores"):
        assert plan.outputs[key] == env[key], key
    assert document.registry.ml_registry is None and document.network.subnet_id is None
    job = build.plan_job(recipes.load("cosmoflow"), document)
    assert job.cluster in document.clusters
