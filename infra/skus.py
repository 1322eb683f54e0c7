"""Hardware catalog: the single source of facts about the Azure GPU VM sizes we support.

Pure data plus pure lookups: no I/O, no Pulumi, no Azure SDK. `infra/` uses it for
validation, quota and cost; `jobs/` uses it for processes per node, NCCL tuning, pinning
and health thresholds. Every field carries its unit in its name; every figure that came
from somewhere names its source in `source` or a comment.

Sources used below:
- seed000: NAG, "HPC-Scale AI on AzureML: Training CosmoFlow" (2021).
- seed001: "Deploying a Batch AI Cluster for Distributed Deep Learning" (NC v3 sizes).
- seed003: "Performance considerations for large scale deep learning training on Azure
  NDv4 (A100) series" (NUMA map, NVMe RAID, H2D threshold).
- seed004: Azure ML "Large Scale Distributed Training" guide (NC24rs_v3 vs NC24s_v3).
- azure-sizes: learn.microsoft.com VM size pages (vCPU, memory, temp storage, GPUs, IB).
- azure-nhc: Azure HPC node health check expected values (FIELD_NOTES.md).
- azure-retail: Azure retail prices API (prices.azure.com), Linux pay-as-you-go.
- nvidia: NVIDIA datasheets (dense tensor-core TFLOP/s without sparsity, HBM bandwidth).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

InfinibandGeneration = Literal["FDR", "EDR", "HDR", "NDR"]


@dataclass(frozen=True)
class NumaDomain:
    """One NUMA domain: its CPUs (a Linux cpulist, e.g. "0-23") and the GPUs attached to it."""

    node: int
    cpulist: str
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True)
class HealthThresholds:
    """Pass marks for node health checks; a check passes when measured >= the value.

    None means no published figure: the check still runs and reports, but cannot fail
    on that SKU.
    """

    h2d_gbytes_per_s_min: float | None
    """Host-to-device copy from pinned memory, per GPU, GB/s."""
    d2h_gbytes_per_s_min: float | None
    """Device-to-host copy into pinned memory, per GPU, GB/s."""
    nccl_allreduce_busbw_gbytes_per_s_min: float | None
    """Single-node NCCL all-reduce bus bandwidth (algbw x 2(n-1)/n), GB/s."""
    nccl_allreduce_message_bytes: int
    """Message size the all-reduce figure was published for."""
    ib_write_gbits_per_s_per_hca_min: float | None
    """GPUDirect RDMA write bandwidth per HCA, Gb/s."""
    gemm_fraction_of_peak_min: float
    """Dense GEMM throughput must reach this fraction of `Sku.gpu_peak_dense_tflops`."""
    nccl_multinode_busbw_gbytes_per_s: tuple[float, float, float] | None = None
    """Multi-node all-reduce (expected, warn below, fail below), GB/s."""
    source: str = "azure-nhc"


@dataclass(frozen=True)
class Price:
    """A reference on-demand price. Real bills differ: negotiated rates, low priority."""

    usd_per_hour: float
    region: str
    as_of: str
    source: str


@dataclass(frozen=True)
class Sku:
    """One Azure VM size. Immutable; look it up with `get()`."""

    name: str
    series: str
    quota_family: str
    """Compute usage name that bounds dedicated vCPUs (low priority uses `lowPriorityCores`)."""
    vcpus: int
    memory_gib: int
    temp_disk_gib: int
    gpus: int
    gpu_model: str
    gpu_memory_gib: int
    gpu_peak_dense_tflops: float
    """Per GPU, dense tensor-core rate for `gpu_gemm_dtype` (no sparsity)."""
    gpu_gemm_dtype: Literal["bf16", "fp16"]
    """The fastest 16-bit type the GPU has tensor cores for (V100 has no bf16)."""
    gpu_memory_gbytes_per_s: float
    ib_hcas: int
    """InfiniBand host channel adapters per node; 0 when the size has no InfiniBand."""
    ib_gbits_per_s_per_hca: int
    ib_generation: InfinibandGeneration | None
    nvme_devices: int
    """Local NVMe devices that can be striped into one RAID0 scratch volume."""
    nvme_total_gib: int
    storage_nic_gbits_per_s: float
    """What one node pulls from Blob in practice (not the NIC's nominal rate)."""
    health: HealthThresholds
    price: Price | None
    numa: tuple[NumaDomain, ...] | None = None
    """GPU-to-NUMA layout where it is published; runtime derives it from sysfs first."""
    nccl_topo_file: str | None = None
    """File name of the NCCL topology the size needs inside containers, if any."""
    notes: str = ""

    @property
    def infiniband(self) -> bool:
        return self.ib_hcas > 0

    @property
    def ib_gbits_per_s_per_gpu(self) -> float:
        """InfiniBand bandwidth available to each GPU, Gb/s (0 without InfiniBand)."""
        return self.ib_hcas * self.ib_gbits_per_s_per_hca / self.gpus if self.gpus else 0.0

    @property
    def gpu_order(self) -> tuple[int, ...] | None:
        """CUDA_VISIBLE_DEVICES order that walks NUMA domains in order, or None if unknown."""
        if self.numa is None:
            return None
        return tuple(g for domain in sorted(self.numa, key=lambda d: d.node) for g in domain.gpu_ids)


_NHC = "azure-nhc (Azure HPC node health checks), FIELD_NOTES.md"

_CATALOG: tuple[Sku, ...] = (
    Sku(
        name="Standard_ND40rs_v2",
        series="NDv2",
        quota_family="standardNDSv2Family",
        vcpus=40,
        memory_gib=672,
        temp_disk_gib=2948,
        gpus=8,
        gpu_model="V100-SXM2-32GB",
        gpu_memory_gib=32,
        gpu_peak_dense_tflops=125.0,  # nvidia: V100 SXM2 fp16 tensor
        gpu_gemm_dtype="fp16",
        gpu_memory_gbytes_per_s=900.0,
        ib_hcas=1,
        ib_gbits_per_s_per_hca=100,  # one EDR port shared by the node (azure-sizes)
        ib_generation="EDR",
        nvme_devices=0,
        nvme_total_gib=0,
        storage_nic_gbits_per_s=5.5,  # seed000: 5-6 Gb/s per node from Blob (2021)
        health=HealthThresholds(
            h2d_gbytes_per_s_min=9.0,
            d2h_gbytes_per_s_min=9.0,
            nccl_allreduce_busbw_gbytes_per_s_min=110.0,
            nccl_allreduce_message_bytes=8 << 30,
            ib_write_gbits_per_s_per_hca_min=None,
            gemm_fraction_of_peak_min=0.6,
            source=_NHC,
        ),
        price=Price(26.438, "southcentralus", "2021-05", "seed000 (on-demand, South Central US)"),
        notes="seed000's CosmoFlow size: ~300 MB/s input per GPU, ~2.5 GB/s per node.",
    ),
    Sku(
        name="Standard_ND96asr_v4",
        series="ND A100 v4",
        quota_family="StandardNDASv4_A100Family",
        vcpus=96,
        memory_gib=900,
        temp_disk_gib=2867,  # seed003: /mnt is a 2.8 TB SSD
        gpus=8,
        gpu_model="A100-SXM4-40GB",
        gpu_memory_gib=40,
        gpu_peak_dense_tflops=312.0,  # nvidia: A100 bf16 dense
        gpu_gemm_dtype="bf16",
        gpu_memory_gbytes_per_s=1555.0,
        ib_hcas=8,
        ib_gbits_per_s_per_hca=200,
        ib_generation="HDR",
        nvme_devices=8,
        nvme_total_gib=6500,  # seed003: 8 NVMe -> RAID0 ~7 TB at ~8 GB/s
        storage_nic_gbits_per_s=24.0,  # FIELD_NOTES: A100 nodes ~24 Gb/s
        health=HealthThresholds(
            h2d_gbytes_per_s_min=21.0,  # seed003 says > 20; azure-nhc uses 21
            d2h_gbytes_per_s_min=21.0,
            nccl_allreduce_busbw_gbytes_per_s_min=228.0,
            nccl_allreduce_message_bytes=8 << 30,
            ib_write_gbits_per_s_per_hca_min=180.0,
            gemm_fraction_of_peak_min=0.6,
            source=_NHC,
        ),
        price=Price(27.197, "eastus", "2026-08", "azure-retail"),
        numa=(
            # seed003 (check_app_pinning.py on ND96asr_v4)
            NumaDomain(0, "0-23", (2, 3)),
            NumaDomain(1, "24-47", (0, 1)),
            NumaDomain(2, "48-71", (6, 7)),
            NumaDomain(3, "72-95", (4, 5)),
        ),
        nccl_topo_file="ndv4-topo.xml",
    ),
    Sku(
        name="Standard_ND96amsr_A100_v4",
        series="NDm A100 v4",
        quota_family="standardNDAMSv4_A100Family",
        vcpus=96,
        memory_gib=1900,
        temp_disk_gib=6400,
        gpus=8,
        gpu_model="A100-SXM4-80GB",
        gpu_memory_gib=80,
        gpu_peak_dense_tflops=312.0,
        gpu_gemm_dtype="bf16",
        gpu_memory_gbytes_per_s=2039.0,
        ib_hcas=8,
        ib_gbits_per_s_per_hca=200,
        ib_generation="HDR",
        nvme_devices=8,
        nvme_total_gib=6400,  # azure-sizes: 6400 GiB temp storage on NVMe
        storage_nic_gbits_per_s=24.0,
        health=HealthThresholds(
            h2d_gbytes_per_s_min=None,
            d2h_gbytes_per_s_min=None,
            nccl_allreduce_busbw_gbytes_per_s_min=None,
            nccl_allreduce_message_bytes=8 << 30,
            ib_write_gbits_per_s_per_hca_min=180.0,  # same HDR fabric as ND96asr_v4
            gemm_fraction_of_peak_min=0.6,
            source=_NHC,
        ),
        price=Price(32.768, "eastus", "2026-08", "azure-retail"),
        nccl_topo_file="ndv4-topo.xml",
    ),
    Sku(
        name="Standard_ND96isr_H100_v5",
        series="ND H100 v5",
        quota_family="standardNDSH100v5Family",
        vcpus=96,
        memory_gib=1900,
        temp_disk_gib=1000,
        gpus=8,
        gpu_model="H100-SXM5-80GB",
        gpu_memory_gib=80,
        gpu_peak_dense_tflops=989.0,  # nvidia: H100 SXM bf16 dense
        gpu_gemm_dtype="bf16",
        gpu_memory_gbytes_per_s=3350.0,
        ib_hcas=8,
        ib_gbits_per_s_per_hca=400,
        ib_generation="NDR",
        nvme_devices=8,
        nvme_total_gib=28610,
        storage_nic_gbits_per_s=24.0,
        health=HealthThresholds(
            h2d_gbytes_per_s_min=48.0,
            d2h_gbytes_per_s_min=48.0,
            nccl_allreduce_busbw_gbytes_per_s_min=460.0,
            nccl_allreduce_message_bytes=16 << 30,
            ib_write_gbits_per_s_per_hca_min=380.0,
            gemm_fraction_of_peak_min=0.6,
            nccl_multinode_busbw_gbytes_per_s=(450.0, 400.0, 300.0),
            source=_NHC,
        ),
        price=Price(98.32, "eastus", "2026-08", "azure-retail"),
        nccl_topo_file="ndv5-topo.xml",
    ),
    Sku(
        name="Standard_ND96isr_H200_v5",
        series="ND H200 v5",
        quota_family="standardNDISRH200V5Family",
        vcpus=96,
        memory_gib=1850,
        temp_disk_gib=1000,
        gpus=8,
        gpu_model="H200-SXM-141GB",
        gpu_memory_gib=141,
        gpu_peak_dense_tflops=989.0,  # nvidia: H200 has H100's tensor cores
        gpu_gemm_dtype="bf16",
        gpu_memory_gbytes_per_s=4800.0,
        ib_hcas=8,
        ib_gbits_per_s_per_hca=400,
        ib_generation="NDR",
        nvme_devices=8,
        nvme_total_gib=28610,
        storage_nic_gbits_per_s=24.0,
        health=HealthThresholds(
            h2d_gbytes_per_s_min=None,
            d2h_gbytes_per_s_min=None,
            nccl_allreduce_busbw_gbytes_per_s_min=None,
            nccl_allreduce_message_bytes=16 << 30,
            ib_write_gbits_per_s_per_hca_min=380.0,  # same NDR fabric as H100 v5
            gemm_fraction_of_peak_min=0.6,
            source=_NHC,
        ),
        # No reference price we could verify: set `aml-hpc:prices` in the stack to cost it.
        price=None,
        nccl_topo_file="ndv5-topo.xml",
    ),
    Sku(
        name="Standard_NC24rs_v3",
        series="NCv3",
        quota_family="standardNCSv3Family",
        vcpus=24,
        memory_gib=448,
        temp_disk_gib=2948,
        gpus=4,
        gpu_model="V100-PCIE-16GB",
        gpu_memory_gib=16,
        gpu_peak_dense_tflops=112.0,  # nvidia: V100 PCIe fp16 tensor
        gpu_gemm_dtype="fp16",
        gpu_memory_gbytes_per_s=900.0,
        ib_hcas=1,
        ib_gbits_per_s_per_hca=56,  # FDR, shared by the node (seed001: the RDMA NC v3 size)
        ib_generation="FDR",
        nvme_devices=0,
        nvme_total_gib=0,
        storage_nic_gbits_per_s=5.5,
        health=HealthThresholds(
            h2d_gbytes_per_s_min=10.0,
            d2h_gbytes_per_s_min=10.0,
            nccl_allreduce_busbw_gbytes_per_s_min=None,  # azure-nhc runs no NCCL check here
            nccl_allreduce_message_bytes=1 << 30,
            ib_write_gbits_per_s_per_hca_min=None,
            gemm_fraction_of_peak_min=0.6,
            source=_NHC,
        ),
        price=Price(13.464, "eastus", "2024", "azure-retail (not re-verified since; NC v3 is being retired)"),
        notes="seed004's InfiniBand cluster in the scaling comparison.",
    ),
    Sku(
        name="Standard_NC24s_v3",
        series="NCv3",
        quota_family="standardNCSv3Family",
        vcpus=24,
        memory_gib=448,
        temp_disk_gib=2948,
        gpus=4,
        gpu_model="V100-PCIE-16GB",
        gpu_memory_gib=16,
        gpu_peak_dense_tflops=112.0,
        gpu_gemm_dtype="fp16",
        gpu_memory_gbytes_per_s=900.0,
        ib_hcas=0,
        ib_gbits_per_s_per_hca=0,
        ib_generation=None,
        nvme_devices=0,
        nvme_total_gib=0,
        storage_nic_gbits_per_s=5.5,
        health=HealthThresholds(
            h2d_gbytes_per_s_min=None,
            d2h_gbytes_per_s_min=None,
            nccl_allreduce_busbw_gbytes_per_s_min=None,
            nccl_allreduce_message_bytes=1 << 30,
            ib_write_gbits_per_s_per_hca_min=None,
            gemm_fraction_of_peak_min=0.6,
            source=_NHC,
        ),
        price=Price(12.24, "eastus", "2026-08", "azure-retail"),
        notes="No InfiniBand: seed004's TCP comparison, which scales badly across nodes.",
    ),
    Sku(
        name="Standard_NC24ads_A100_v4",
        series="NC A100 v4",
        quota_family="StandardNCADSA100v4Family",
        vcpus=24,
        memory_gib=220,
        temp_disk_gib=64,
        gpus=1,
        gpu_model="A100-PCIE-80GB",
        gpu_memory_gib=80,
        gpu_peak_dense_tflops=312.0,
        gpu_gemm_dtype="bf16",
        gpu_memory_gbytes_per_s=1935.0,
        ib_hcas=0,
        ib_gbits_per_s_per_hca=0,
        ib_generation=None,
        nvme_devices=1,
        nvme_total_gib=894,
        storage_nic_gbits_per_s=20.0,
        health=HealthThresholds(
            h2d_gbytes_per_s_min=None,
            d2h_gbytes_per_s_min=None,
            nccl_allreduce_busbw_gbytes_per_s_min=None,
            nccl_allreduce_message_bytes=1 << 30,
            ib_write_gbits_per_s_per_hca_min=None,
            gemm_fraction_of_peak_min=0.6,
            source=_NHC,
        ),
        price=Price(3.673, "eastus", "2026-08", "azure-retail"),
        notes="Single-GPU, no InfiniBand: development and single-node jobs.",
    ),
    Sku(
        name="Standard_NC96ads_A100_v4",
        series="NC A100 v4",
        quota_family="StandardNCADSA100v4Family",
        vcpus=96,
        memory_gib=880,
        temp_disk_gib=256,
        gpus=4,
        gpu_model="A100-PCIE-80GB",
        gpu_memory_gib=80,
        gpu_peak_dense_tflops=312.0,
        gpu_gemm_dtype="bf16",
        gpu_memory_gbytes_per_s=1935.0,
        ib_hcas=0,
        ib_gbits_per_s_per_hca=0,
        ib_generation=None,
        nvme_devices=4,
        nvme_total_gib=3576,
        storage_nic_gbits_per_s=24.0,
        health=HealthThresholds(
            h2d_gbytes_per_s_min=None,
            d2h_gbytes_per_s_min=None,
            nccl_allreduce_busbw_gbytes_per_s_min=None,
            nccl_allreduce_message_bytes=1 << 30,
            ib_write_gbits_per_s_per_hca_min=None,
            gemm_fraction_of_peak_min=0.6,
            source=_NHC,
        ),
        price=Price(14.692, "eastus", "2026-08", "azure-retail"),
        notes="Four A100s over NVLink pairs, no InfiniBand: single-node multi-GPU.",
    ),
)

CATALOG: MappingProxyType[str, Sku] = MappingProxyType({s.name: s for s in _CATALOG})
"""Every supported size by its exact Azure name."""

LOW_PRIORITY_QUOTA = "lowPriorityCores"
"""Low-priority (spot) vCPUs share one regional bucket across families."""

# Standard general-purpose v2 account limits (Azure storage scalability targets). The
# larger figures hold only in Azure's largest regions, so configs default to the smaller.
STORAGE_ACCOUNT_EGRESS_GBITS_PER_S_DEFAULT = 50.0
STORAGE_ACCOUNT_EGRESS_GBITS_PER_S_LARGE_REGION = 200.0
STORAGE_ACCOUNT_INGRESS_GBITS_PER_S_DEFAULT = 25.0
STORAGE_ACCOUNT_INGRESS_GBITS_PER_S_LARGE_REGION = 60.0


class UnknownSkuError(KeyError):
    """An unknown VM size; carries near matches for the message."""

    def __init__(self, name: str, suggestions: list[str]):
        super().__init__(name)
        self.name = name
        self.suggestions = suggestions

    def __str__(self) -> str:
        hint = f" (did you mean {' or '.join(self.suggestions)}?)" if self.suggestions else ""
        return f"unknown VM size {self.name!r}{hint}"


def names() -> list[str]:
    """All supported size names, sorted."""
    return sorted(CATALOG)


def suggest(name: str, n: int = 2) -> list[str]:
    """Near matches for a mistyped size name, case-insensitively."""
    lowered = {k.lower(): k for k in CATALOG}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.6)
    return [lowered[h] for h in hits]


def get(name: str) -> Sku:
    """The size called `name` (exact Azure spelling; case-insensitive fallback)."""
    sku = CATALOG.get(name)
    if sku is None:
        for key, value in CATALOG.items():
            if key.lower() == name.lower():
                return value
        raise UnknownSkuError(name, suggest(name))
    return sku
