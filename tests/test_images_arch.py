"""Each image declares the GPU and host architectures it runs on, and every GPU size of the
catalog has an image that fits it (the V100 sizes the CUDA-12 TensorFlow image, MI300X the
ROCm image, Grace the arm64 build)."""

from __future__ import annotations

import pytest

from amlhpc.core import skus
from amlhpc.images import catalog


@pytest.mark.parametrize("name", skus.names())
def test_every_catalog_size_has_a_fitting_image(name):
    sku = skus.get(name)
    fits = catalog.fitting(sku.gpu_vendor, sku.gpu_arch, sku.host_arch)
    assert fits, f"no image runs on {name} ({sku.gpu_vendor} {sku.gpu_arch}, {sku.host_arch})"


@pytest.mark.parametrize("name, image", [
    ("Standard_ND96isr_MI300X_v5", "aml-hpc-rocm"),
    ("Standard_ND128isr_GB300_v6", "aml-hpc-pytorch-arm64"),
    ("Standard_ND128isr_NDR_GB200_v6", "aml-hpc-pytorch-arm64"),
    ("Standard_ND96isr_H200_v5", "aml-hpc-pytorch"),
    ("Standard_NC40ads_H100_v5", "aml-hpc-pytorch"),
])
def test_the_pytorch_image_for_each_generation(name, image):
    sku = skus.get(name)
    assert [s.name for s in catalog.fitting(sku.gpu_vendor, sku.gpu_arch, sku.host_arch, "pytorch")] == [image]


def test_cuda_13_is_refused_on_volta_with_the_reason():
    """amlhpc/images/pins.toml: CUDA 13 drops Volta (compute capability 7.0)."""
    v100 = skus.get("Standard_ND40rs_v2")
    why = catalog.PYTORCH.runs_on(v100.gpu_vendor, v100.gpu_arch, v100.host_arch)
    assert "sm_75+" in why and "sm_70" in why and "Volta" in why
    assert catalog.TENSORFLOW.runs_on(v100.gpu_vendor, v100.gpu_arch, v100.host_arch) == ""


def test_host_and_vendor_mismatches_say_which():
    assert "x86_64 hosts" in catalog.PYTORCH.runs_on("nvidia", "sm_100", "aarch64")
    assert "nvidia GPUs" in catalog.PYTORCH.runs_on("amd", "gfx942", "x86_64")
    assert "amd GPUs" in catalog.ROCM.runs_on("nvidia", "sm_90", "x86_64")


def test_grace_image_takes_the_doca_azure_pins_for_arm64():
    from amlhpc.images.pins import load_pins

    args = catalog.build_args(catalog.PYTORCH_ARM64, load_pins())
    assert args["HOST_ARCH"] == "aarch64" and args["IB_USERSPACE"] == "doca" and args["DOCA_VERSION"] == "3.2.2"
    assert args["DCGM_VERSION"] == "1:4.5.3-1" and args["DOCA_KEY"]
    rocm = catalog.build_args(catalog.ROCM, load_pins())
    assert rocm["DOCA_VERSION"] == "3.2.3" and "DCGM_VERSION" not in rocm and rocm["RCCL_TESTS_COMMIT"]
