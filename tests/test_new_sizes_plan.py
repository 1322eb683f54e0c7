"""The offline plan of a stack with one cluster of each new size: the sizes AmlCompute runs plan
(cluster, quota family, price), the ones Azure ML cannot run are refused for clusters with the
reason and where to run them instead, never as an unknown size."""

from __future__ import annotations

import copy

import pytest
import yaml

from amlhpc.core import skus
from amlhpc.core.errors import UserError
from amlhpc.infra.config import REPO_ROOT
from amlhpc.infra.plan import evaluate
from tests.plan_helpers import write_stack

COMPUTE = "azure-native:machinelearningservices:Compute"
RUNNABLE = {"h200": "Standard_ND96isr_H200_v5", "nch100a": "Standard_NC40ads_H100_v5",
            "nch100b": "Standard_NC80adis_H100_v5", "nca100": "Standard_NC48ads_A100_v4"}
NOT_ON_AZURE_ML = ["Standard_ND96isr_MI300X_v5", "Standard_ND128isr_NDR_GB200_v6", "Standard_ND128isr_GB300_v6"]


def dev_config(clusters: list[dict]) -> dict:
    config = copy.deepcopy(yaml.safe_load((REPO_ROOT / "Pulumi.dev.yaml").read_text())["config"])
    config["aml-hpc:clusters"] = clusters
    return config


def test_one_cluster_of_each_new_size_azure_ml_runs_plans_with_quota_and_price(tmp_path):
    """In eastus, the one region amlhpc/core/catalog/availability.toml records for the NC H100 v5 and
    NC48ads sizes so far (the dev stack's swedencentral would be refused for them)."""
    clusters = [{"name": name, "sku": sku, "maxNodes": 2 if skus.get(sku).infiniband else 1}
                for name, sku in RUNNABLE.items()]
    config = dev_config(clusters)
    config["azure-native:location"] = "eastus"
    write_stack(tmp_path, "gpus", config)
    plan = evaluate("gpus", tmp_path)
    sizes = {r.inputs["computeName"]: r.inputs["properties"]["properties"]["vmSize"] for r in plan.of_type(COMPUTE)
             if r.inputs["properties"]["computeType"] == "AmlCompute" and r.inputs["computeName"] in RUNNABLE}
    assert sizes == RUNNABLE
    families = {f for need in plan.quota for f in need.families}
    assert {"standardNDISRH200V5Family", "StandardNCadsH100v5Family", "StandardNCADSA100v4Family"} <= families
    priced = plan.outputs["prices"]
    for sku in ("Standard_NC40ads_H100_v5", "Standard_NC80adis_H100_v5", "Standard_NC48ads_A100_v4"):
        assert priced[sku]["usdPerHour"] > 0, priced


@pytest.mark.parametrize("sku", NOT_ON_AZURE_ML)
def test_sizes_azure_ml_cannot_run_are_refused_with_the_reason(tmp_path, sku):
    write_stack(tmp_path, "gpus", dev_config([{"name": "big", "sku": sku, "maxNodes": 2}]))
    with pytest.raises(UserError) as info:
        evaluate("gpus", tmp_path)
    text = info.value.render()
    assert "aml-hpc:clusters[0].sku" in text and f"Azure Machine Learning cannot run {sku} on AmlCompute" in text
    assert skus.get(sku).azureml.reason in text and "unknown VM size" not in text
    assert "fix: choose a size AmlCompute runs" in text and "Standard_ND96isr_H100_v5" in text
