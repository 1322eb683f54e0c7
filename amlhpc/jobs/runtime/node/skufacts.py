"""The VM size's facts inside the job, read from AMLHPC_SKU_JSON.

Shape: the job builder serialises the catalog record as it is,
`json.dumps(dataclasses.asdict(amlhpc.core.skus.get(name)))`, so every key keeps its
`amlhpc/core/skus.py` name and unit. The runtime reads this subset (others are ignored, so the
catalog can grow without breaking running images):

    {"name": "Standard_ND96asr_v4",            required, str
     "gpus": 8,                                 required, int >= 0
     "vcpus": 96, "gpu_model": "A100-SXM4-40GB",
     "gpu_vendor": "nvidia" | "amd", "gpu_arch": "sm_80" | "gfx942", "host_arch": "x86_64" | "aarch64",
     "gpu_gemm_dtype": "bf16" | "fp16",         GEMM health check dtype
     "peak_tflops_bf16": 312.0 | null,          per GPU, dense (also _fp16, _fp8)
     "gpu_memory_gib": 40,                      per GPU
     "gpu_memory_gbytes_per_s": 1555.0,
     "ib_hcas": 8, "ib_gbits_per_s_per_hca": 200, "ib_generation": "HDR" | null,
     "nvme_devices": 8, "storage_nic_gbits_per_s": 24.0,
     "numa": [{"node": 0, "cpulist": "0-23", "gpu_ids": [2, 3]}, ...] | null,
     "health": {"h2d_gbytes_per_s_min": 21.0 | null, "d2h_gbytes_per_s_min": 21.0 | null,
                "nccl_allreduce_busbw_gbytes_per_s_min": 228.0 | null,
                "nccl_allreduce_message_bytes": 8589934592,
                "p2p_gbytes_per_s_min": 235.0 | null,
                "ib_write_gbits_per_s_per_hca_min": 180.0 | null,
                "ib_write_gpudirect": true, "ib_write_message_bytes": 8388608,
                "nvme_count": 8 | null, "nvlink_check": true,
                "gemm_tflops": [271.2, 261.7, 252.2] | null,     expected, warn below, fail below
                "gemm_shape": [1024, 10240, 5120] | null,
                "gemm_method": "burst" | "sustained", "gemm_seconds": 60.0 | null,
                "gemm_tool": "torch" | "ubergemm",               what measured gemm_tflops
                "gemm_torch_tflops": [681.3, 657.5, 633.6] | null, torch's mark beside ubergemm's
                "ecc_dram_limit": 20000000 | null, "ecc_sram_correctable_limit": 10000 | null,
                "gemm_measured_on": "" | "Standard_ND96isr_H100_v5",   where a borrowed mark was measured
                "gemm_torch_measured_on": "" | "...",
                "multinode": [{"scope": "nvlink-domain" | "infiniband",
                               "busbw_gbytes_per_s": [937.0, 800.0, 600.0], expected, warn below, fail below
                               "sharp": false, "message_bytes": 17179869184, "source": "..."}, ...]},
     "nvlink": true,
     "nvlink_domain": {"gpus": 72, "vms": 18, "imex": true} | null}

A missing optional key means "unknown" (no threshold, no catalog map); a present key with
the wrong type is an error naming the key. A job built before the bands existed carries
"nccl_multinode_busbw_gbytes_per_s": [e, w, f]: read as one band for any topology, without SHARP.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from amlhpc.jobs.runtime.base.contract import SKU_JSON
from amlhpc.jobs.runtime.base.errors import RuntimeInputError, RuntimeProblem, load_json_object

_FIX = "the job builder sets it from amlhpc/core/catalog/skus.toml: json.dumps(dataclasses.asdict(sku)); resubmit the job, or correct the value by hand"


@dataclass(frozen=True)
class NumaFacts:
    node: int
    cpulist: str
    gpu_ids: tuple[int, ...]


BAND_SCOPES = ("nvlink-domain", "infiniband")
"""What a job-wide all-reduce crosses: one multi-node NVLink domain, or InfiniBand."""
ANY_SCOPE = "any"
"""The scope of a band read from a job built before bands had one: it applies to every topology."""


@dataclass(frozen=True)
class MultinodeBand:
    """A job-wide all-reduce baseline for one topology (see amlhpc/core/skus.py MultinodeBand)."""

    scope: str
    busbw_gbytes_per_s: tuple[float, float, float]
    """(expected, warn below, fail below), GB/s."""
    sharp: bool = False
    """Measured with SHARP (NCCL_COLLNET_ENABLE=1): applies only to jobs that turn it on."""
    message_bytes: int = 16 << 30


@dataclass(frozen=True)
class HealthFacts:
    """Pass marks (measured >= value passes); None: no published figure, report only."""

    h2d_gbytes_per_s_min: float | None = None
    d2h_gbytes_per_s_min: float | None = None
    p2p_gbytes_per_s_min: float | None = None
    nccl_allreduce_busbw_gbytes_per_s_min: float | None = None
    nccl_allreduce_message_bytes: int = 1 << 30
    ib_write_gbits_per_s_per_hca_min: float | None = None
    ib_write_gpudirect: bool = True
    ib_write_message_bytes: int = 8 << 20
    nvme_count: int | None = None
    nvlink_check: bool = False
    gemm_tflops: tuple[float, float, float] | None = None
    """(expected, warn below, fail below), TFLOP/s per GPU."""
    gemm_shape: tuple[int, int, int] | None = None
    gemm_method: str = "burst"
    """"burst" (median of the fastest iterations) or "sustained" (mean over gemm_seconds)."""
    gemm_seconds: float | None = None
    gemm_tool: str = "torch"
    """What measured `gemm_tflops`: "torch" (torch.matmul) or "ubergemm" (DCGM's workload)."""
    gemm_torch_tflops: tuple[float, float, float] | None = None
    """A torch.matmul mark beside an ubergemm one, for nodes without ubergemm."""
    ecc_dram_limit: int | None = None
    """More corrected or uncorrected DRAM ECC errors than this fail the GPU (azure_gpu_ecc.nhc)."""
    ecc_sram_correctable_limit: int | None = None
    """More correctable SRAM errors than this fail the GPU."""
    gemm_measured_on: str = ""
    """Where `gemm_tflops` was measured when not on this size: the gate then only warns below it."""
    gemm_torch_measured_on: str = ""
    """The same for `gemm_torch_tflops`."""
    multinode: tuple[MultinodeBand, ...] = ()
    """Job-wide all-reduce baselines, one per topology (and SHARP or not)."""


@dataclass(frozen=True)
class SkuFacts:
    name: str
    gpus: int
    vcpus: int | None = None
    gpu_model: str | None = None
    gpu_vendor: str = "nvidia"
    gpu_arch: str | None = None
    host_arch: str | None = None
    gpu_gemm_dtype: str = "bf16"
    peak_tflops_bf16: float | None = None
    peak_tflops_fp16: float | None = None
    peak_tflops_fp8: float | None = None
    gpu_memory_gib: float | None = None
    gpu_memory_gbytes_per_s: float | None = None
    ib_hcas: int = 0
    ib_gbits_per_s_per_hca: int = 0
    ib_generation: str | None = None
    nvme_devices: int = 0
    storage_nic_gbits_per_s: float | None = None
    numa: tuple[NumaFacts, ...] | None = None
    nvlink: bool = False
    nvlink_domain_vms: int | None = None
    """VMs that share one multi-node NVLink domain (GB200/GB300: 18), None without one."""
    health: HealthFacts = HealthFacts()

    @property
    def infiniband(self) -> bool:
        return self.ib_hcas > 0

    @property
    def gpu_peak_dense_tflops(self) -> float | None:
        """Peak dense rate per GPU in `gpu_gemm_dtype`, TFLOP/s (None when unknown)."""
        return getattr(self, f"peak_tflops_{self.gpu_gemm_dtype}", None)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Reader:
    """Typed getters that collect a problem per bad key instead of stopping at the first."""

    def __init__(self, reference: str):
        self.reference = reference
        self.problems: list[RuntimeProblem] = []

    def bad(self, path: str, message: str) -> None:
        self.problems.append(RuntimeProblem(self.reference, path, message, _FIX))

    def number(self, data: Mapping, key: str, path: str, *, default=None, integer=False, minimum=0.0):
        if key not in data or data[key] is None:
            return default
        value = data[key]
        kind = "an integer" if integer else "a number"
        if not _is_number(value) or (integer and not isinstance(value, int)):
            self.bad(path, f"must be {kind}, got {value!r}")
            return default
        if value < minimum:
            self.bad(path, f"must be >= {minimum:g}, got {value!r}")
            return default
        return value

    def text(self, data: Mapping, key: str, path: str, *, default=None, allowed: tuple[str, ...] = ()):
        if key not in data or data[key] is None:
            return default
        value = data[key]
        if not isinstance(value, str) or not value:
            self.bad(path, f"must be a non-empty string, got {value!r}")
            return default
        if allowed and value not in allowed:
            self.bad(path, f"must be one of {', '.join(allowed)}, got {value!r}")
            return default
        return value


def _parse_numa(reader: _Reader, raw: Any) -> tuple[NumaFacts, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        reader.bad("numa", f"must be a list of {{node, cpulist, gpu_ids}} or null, got {type(raw).__name__}")
        return None
    domains = []
    for i, item in enumerate(raw):
        path = f"numa[{i}]"
        if not isinstance(item, Mapping):
            reader.bad(path, f"must be an object, got {item!r}")
            continue
        node = reader.number(item, "node", f"{path}.node", integer=True)
        cpulist = reader.text(item, "cpulist", f"{path}.cpulist")
        gpu_ids = item.get("gpu_ids")
        if not isinstance(gpu_ids, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in gpu_ids):
            reader.bad(f"{path}.gpu_ids", f"must be a list of integers, got {gpu_ids!r}")
            continue
        if node is None or cpulist is None:
            if "node" not in item or "cpulist" not in item:
                reader.bad(path, "needs both 'node' and 'cpulist'")
            continue
        domains.append(NumaFacts(node, cpulist, tuple(gpu_ids)))
    return tuple(domains)


def _triple(reader: _Reader, raw: Mapping, key: str, what: str, integer: bool = False, falling: bool = True,
            path: str = ""):
    value = raw.get(key)
    path = path or f"health.{key}"
    if value is None:
        return None
    ok = isinstance(value, list) and len(value) == 3 and all(
        (isinstance(v, int) and not isinstance(v, bool)) if integer else _is_number(v) for v in value)
    if not ok:
        reader.bad(path, f"must be {what} (3 {'integers' if integer else 'numbers'}) or null, got {value!r}")
        return None
    if falling and not value[0] >= value[1] >= value[2]:
        reader.bad(path, f"must be {what} in falling order, got {value!r}")
        return None
    return tuple(int(v) if integer else float(v) for v in value)


def _domain_vms(reader: _Reader, raw: Any) -> int | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        reader.bad("nvlink_domain", f"must be an object or null, got {type(raw).__name__}")
        return None
    return reader.number(raw, "vms", "nvlink_domain.vms", integer=True, minimum=1)


def _parse_health(reader: _Reader, raw: Any) -> HealthFacts:
    if raw is None:
        return HealthFacts()
    if not isinstance(raw, Mapping):
        reader.bad("health", f"must be an object, got {type(raw).__name__}")
        return HealthFacts()
    values: dict[str, Any] = {}
    for key in ("h2d_gbytes_per_s_min", "d2h_gbytes_per_s_min", "p2p_gbytes_per_s_min",
                "nccl_allreduce_busbw_gbytes_per_s_min", "ib_write_gbits_per_s_per_hca_min"):
        values[key] = reader.number(raw, key, f"health.{key}")
    for key in ("nccl_allreduce_message_bytes", "ib_write_message_bytes"):
        number = reader.number(raw, key, f"health.{key}", integer=True, minimum=1)
        if number is not None:
            values[key] = number
    values["nvme_count"] = reader.number(raw, "nvme_count", "health.nvme_count", integer=True)
    for key in ("ecc_dram_limit", "ecc_sram_correctable_limit"):
        values[key] = reader.number(raw, key, f"health.{key}", integer=True)
    values["gemm_seconds"] = reader.number(raw, "gemm_seconds", "health.gemm_seconds")
    values["gemm_method"] = reader.text(raw, "gemm_method", "health.gemm_method", default="burst",
                                        allowed=("burst", "sustained"))
    # A job built before gemm_tool existed: Azure's baselines were the ubergemm ones.
    legacy_tool = "ubergemm" if raw.get("gemm_source") == "azure-sku-baseline" else "torch"
    values["gemm_tool"] = reader.text(raw, "gemm_tool", "health.gemm_tool", default=legacy_tool,
                                      allowed=("torch", "ubergemm"))
    for key in ("ib_write_gpudirect", "nvlink_check"):
        if key in raw and raw[key] is not None:
            if isinstance(raw[key], bool):
                values[key] = raw[key]
            else:
                reader.bad(f"health.{key}", f"must be true or false, got {raw[key]!r}")
    values["gemm_tflops"] = _triple(reader, raw, "gemm_tflops", "[expected, warn below, fail below]")
    values["gemm_torch_tflops"] = _triple(reader, raw, "gemm_torch_tflops", "[expected, warn below, fail below]")
    values["gemm_shape"] = _triple(reader, raw, "gemm_shape", "[M, N, K]", integer=True, falling=False)
    for key in ("gemm_measured_on", "gemm_torch_measured_on"):
        values[key] = reader.text(raw, key, f"health.{key}", default="") if raw.get(key) else ""
    values["multinode"] = _bands(reader, raw)
    return HealthFacts(**values)


def _bands(reader: _Reader, raw: Mapping) -> tuple[MultinodeBand, ...]:
    legacy = _triple(reader, raw, "nccl_multinode_busbw_gbytes_per_s", "[expected, warn below, fail below]")
    if "multinode" not in raw:
        return (MultinodeBand(ANY_SCOPE, legacy),) if legacy else ()
    items = raw["multinode"]
    if not isinstance(items, list):
        reader.bad("health.multinode", f"must be a list of bands, got {type(items).__name__}")
        return ()
    bands = []
    for i, item in enumerate(items):
        path = f"health.multinode[{i}]"
        if not isinstance(item, Mapping):
            reader.bad(path, f"must be an object, got {item!r}")
            continue
        scope = reader.text(item, "scope", f"{path}.scope", allowed=BAND_SCOPES)
        figures = _triple(reader, item, "busbw_gbytes_per_s", "[expected, warn below, fail below]", path=f"{path}.busbw_gbytes_per_s")
        sharp = item.get("sharp", False)
        if not isinstance(sharp, bool):
            reader.bad(f"{path}.sharp", f"must be true or false, got {sharp!r}")
            continue
        size = reader.number(item, "message_bytes", f"{path}.message_bytes", default=16 << 30, integer=True, minimum=1)
        if scope and figures:
            bands.append(MultinodeBand(scope, figures, sharp, size))
        elif not scope and "scope" not in item:
            reader.bad(f"{path}.scope", "is missing (nvlink-domain or infiniband)")
    return tuple(bands)


def parse_sku_facts(text: str, reference: str = SKU_JSON) -> SkuFacts:
    """Parse the JSON document; raises RuntimeInputError naming every bad key."""
    data = load_json_object(text, reference, _FIX)
    reader = _Reader(reference)
    name = reader.text(data, "name", "name")
    if "name" not in data:
        reader.bad("name", "is missing (the VM size, e.g. Standard_ND96asr_v4)")
    gpus = reader.number(data, "gpus", "gpus", integer=True)
    if "gpus" not in data:
        reader.bad("gpus", "is missing (GPUs per node)")
    facts = dict(
        vcpus=reader.number(data, "vcpus", "vcpus", integer=True),
        gpu_model=reader.text(data, "gpu_model", "gpu_model"),
        gpu_vendor=reader.text(data, "gpu_vendor", "gpu_vendor", default="nvidia", allowed=("nvidia", "amd")),
        gpu_arch=reader.text(data, "gpu_arch", "gpu_arch"),
        host_arch=reader.text(data, "host_arch", "host_arch", allowed=("x86_64", "aarch64")),
        gpu_gemm_dtype=reader.text(data, "gpu_gemm_dtype", "gpu_gemm_dtype", default="bf16", allowed=("bf16", "fp16")),
        peak_tflops_bf16=reader.number(data, "peak_tflops_bf16", "peak_tflops_bf16"),
        peak_tflops_fp16=reader.number(data, "peak_tflops_fp16", "peak_tflops_fp16"),
        peak_tflops_fp8=reader.number(data, "peak_tflops_fp8", "peak_tflops_fp8"),
        gpu_memory_gib=reader.number(data, "gpu_memory_gib", "gpu_memory_gib"),
        gpu_memory_gbytes_per_s=reader.number(data, "gpu_memory_gbytes_per_s", "gpu_memory_gbytes_per_s"),
        ib_hcas=reader.number(data, "ib_hcas", "ib_hcas", default=0, integer=True),
        ib_gbits_per_s_per_hca=reader.number(data, "ib_gbits_per_s_per_hca", "ib_gbits_per_s_per_hca", default=0, integer=True),
        ib_generation=reader.text(data, "ib_generation", "ib_generation"),
        nvme_devices=reader.number(data, "nvme_devices", "nvme_devices", default=0, integer=True),
        storage_nic_gbits_per_s=reader.number(data, "storage_nic_gbits_per_s", "storage_nic_gbits_per_s"),
        numa=_parse_numa(reader, data.get("numa")),
        nvlink=bool(data.get("nvlink", False)),
        nvlink_domain_vms=_domain_vms(reader, data.get("nvlink_domain")),
        health=_parse_health(reader, data.get("health")),
    )
    if reader.problems:
        raise RuntimeInputError(reader.problems, title=f"{reference} is not a usable SKU description")
    return SkuFacts(name=name, gpus=gpus, **facts)


def load_sku_facts(environ: Mapping[str, str] | None = None) -> SkuFacts | None:
    """The facts from AMLHPC_SKU_JSON, or None when it is unset (thresholds unknown)."""
    environ = os.environ if environ is None else environ
    text = environ.get(SKU_JSON, "").strip()
    return parse_sku_facts(text) if text else None
