"""Every recipe renders on every catalog size its image fits, with that image, the size's
tuning and its topology; a job whose image cannot run on the cluster's GPUs or CPUs is refused
at render time with the reason and the image that fits (the CUDA 13 PyTorch image on V100 was
rendered and scheduled before: every kernel then failed on the nodes)."""

from __future__ import annotations

import copy
import json

import pytest

from amlhpc.core import nccl, skus
from amlhpc.core.errors import UserError
from amlhpc.core.outputs import StackOutputs
from amlhpc.images import catalog
from amlhpc.jobs import recipes
from amlhpc.jobs.plan import build
from tests.jobs_helpers import outputs_doc

INPUTS = {"cosmoflow": {"inputs.cosmoflow.path": "cosmoflow/mini"}, "cosmoflow-tf": {"inputs.cosmoflow.path": "cosmoflow/mini"},
          "maskrcnn": {"inputs.coco.path": "coco2017"}}


def outputs_with(sku_name: str) -> StackOutputs:
    """The dev fixture's outputs with one cluster of `sku_name` and every image registered."""
    doc = copy.deepcopy(outputs_doc("dev"))
    sku = skus.get(sku_name)
    doc["clusters"] = {"gpus": {"sku": sku.name, "minNodes": 0, "maxNodes": 4, "priority": "Dedicated",
                                "gpusPerNode": sku.gpus, "infiniband": sku.infiniband, "sshEnabled": False,
                                "idleMinutes": 10}}
    server = doc["registry"]["loginServer"]
    doc["registry"]["environments"] = {s.name: f"{server}/{s.repository}:0123456789ab" for s in catalog.IMAGES}
    doc["registry"]["environmentIds"] = {s.name: f"azureml:{s.name}:0123456789ab" for s in catalog.IMAGES}
    if sku.price is None:  # as a stack that sets aml-hpc:prices for the size carries it
        doc["prices"][sku.name] = {"usdPerHour": 100.0, "region": "eastus", "asOf": "stack",
                                   "source": "Pulumi.dev.yaml: aml-hpc:prices"}
    return StackOutputs.model_validate(doc)


def recipe_for(name: str, image: str | None = None):
    sets = dict(INPUTS.get(name, {}))
    if image:
        sets["environment.registered"] = image
    return recipes.load(name, sets)


def cases():
    for name in recipes.available():
        framework = recipes.load(name, INPUTS.get(name, {})).framework
        for sku_name in skus.names():
            sku = skus.get(sku_name)
            fits = catalog.fitting(sku.gpu_vendor, sku.gpu_arch, sku.host_arch, framework)
            if fits:
                yield pytest.param(name, sku_name, fits[0].name, id=f"{name}-{sku_name.removeprefix('Standard_')}")


@pytest.mark.parametrize("recipe, sku_name, image", list(cases()))
def test_each_recipe_renders_on_each_size_it_fits(recipe, sku_name, image):
    sku = skus.get(sku_name)
    nodes = 2 if sku.infiniband else 1
    plan = build.plan_job(recipe_for(recipe, image), outputs_with(sku_name), nodes=nodes, allow_tcp=True,
                          name="render-test")
    assert plan.sku == sku_name and plan.environment == {"reference": f"azureml:{image}:0123456789ab"}
    env = plan.environment_variables
    for setting in nccl.for_size(sku_name, "pytorch" if plan.distribution != "mpi" else "mpi"):
        assert setting.name in env, f"{setting.name} missing on {sku_name}"
        if setting.resolve == "topology":  # a topology or graph file: in the job's code snapshot
            assert env[setting.name] == f"nccl-topo/{setting.value}", setting.name
    facts = json.loads(env["AMLHPC_SKU_JSON"])
    assert (facts["gpu_arch"], facts["host_arch"]) == (sku.gpu_arch, sku.host_arch)


def test_the_cuda_13_pytorch_image_is_refused_on_nd40rs_v2_with_the_image_that_fits():
    """The V100 case: refused at render, with the reason (CUDA 13 dropped Volta) and the image
    that runs there (the CUDA 12.8 TensorFlow image)."""
    with pytest.raises(UserError) as info:
        build.plan_job(recipe_for("nccl-allreduce"), outputs_with("Standard_ND40rs_v2"), name="v100")
    text = info.value.render()
    assert "environment: image aml-hpc-pytorch cannot run on Standard_ND40rs_v2" in text
    assert "sm_75+" in text and "sm_70" in text and "Volta" in text
    assert "aml-hpc-tensorflow does" in text


def test_the_tensorflow_recipe_renders_on_v100():
    plan = build.plan_job(recipe_for("cosmoflow-tf"), outputs_with("Standard_ND40rs_v2"), name="v100-tf")
    assert plan.environment == {"reference": "azureml:aml-hpc-tensorflow:0123456789ab"}


@pytest.mark.parametrize("sku_name, fits", [("Standard_ND96isr_MI300X_v5", "aml-hpc-rocm"),
                                             ("Standard_ND128isr_GB300_v6", "aml-hpc-pytorch-arm64")])
def test_the_x86_cuda_image_is_refused_on_mi300x_and_grace_naming_the_one_that_fits(sku_name, fits):
    with pytest.raises(UserError) as info:
        build.plan_job(recipe_for("nccl-allreduce"), outputs_with(sku_name), name="wrong-image")
    text = info.value.render()
    assert f"image aml-hpc-pytorch cannot run on {sku_name}" in text
    assert f"--set environment.registered={fits}" in text


def test_a_raw_image_reference_into_the_registry_is_checked_too():
    recipe = recipes.load("nccl-allreduce", {"environment.registered": None,
                                             "environment.image": "myacr.azurecr.io/aml-hpc/pytorch:abc"})
    with pytest.raises(UserError, match="image aml-hpc-pytorch cannot run on Standard_ND40rs_v2"):
        build.plan_job(recipe, outputs_with("Standard_ND40rs_v2"), name="raw")


def test_a_foreign_image_renders_with_a_warning_that_it_is_unchecked():
    recipe = recipes.load("nccl-allreduce", {"environment.registered": None, "environment.image": "docker.io/me/mine:1"})
    plan = build.plan_job(recipe, outputs_with("Standard_ND96isr_H100_v5"), name="foreign")
    assert any("is not an amlhpc/images/ image" in w and "sm_90" in w for w in plan.warnings)


def test_grace_blackwell_jobs_carry_the_nvlink_domain():
    plan = build.plan_job(recipe_for("nccl-allreduce", "aml-hpc-pytorch-arm64"), outputs_with("Standard_ND128isr_GB300_v6"),
                          nodes=2, name="gb")
    env = plan.environment_variables
    assert env["NCCL_MNNVL_ENABLE"] == "1" and json.loads(env["AMLHPC_SKU_JSON"])["nvlink_domain"]["vms"] == 18
