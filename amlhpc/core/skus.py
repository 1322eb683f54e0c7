"""The hardware catalog: the Azure GPU VM sizes aml-hpc supports, as frozen records.

The facts live as data in `amlhpc/core/catalog/skus.toml`, each figure with its source; this
module reads that file once and offers pure lookups. infra uses it for validation, quota
and cost; jobs for processes per node, pinning and health thresholds (the NCCL environment
per size is amlhpc/core/catalog/nccl.toml, read by amlhpc/core/nccl.py). No Pulumi, no Azure SDK. Field names carry their unit.

A catalog entry with a key this module does not know, a missing key or a source id that
is not in `[sources]` fails at load with the entry and key named: a typo in the data
never passes silently.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, get_args

CATALOG_FILE = Path(__file__).resolve().parent / "catalog" / "skus.toml"

InfinibandGeneration = Literal["FDR", "EDR", "HDR", "NDR"]
GpuVendor = Literal["nvidia", "amd"]
HostArch = Literal["x86_64", "aarch64"]
GemmMethod = Literal["sustained", "burst"]
GemmTool = Literal["torch", "ubergemm"]
BandScope = Literal["nvlink-domain", "infiniband"]
PEAK_DTYPES = ("bf16", "fp16", "fp8")
"""The dtypes a size's peak dense tensor rate is recorded for (`peak_tflops_<dtype>`)."""


@dataclass(frozen=True)
class Source:
    """Where a figure comes from: a public document and the date it was read or published."""

    id: str
    title: str
    url: str
    as_of: str

    def cite(self) -> str:
        return f"{self.title} ({self.as_of})"


@dataclass(frozen=True)
class NumaDomain:
    """One NUMA domain: its CPUs (a Linux cpulist, e.g. "0-23") and the GPUs attached to it."""

    node: int
    cpulist: str
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True)
class MultinodeBand:
    """A job-wide all-reduce baseline (expected, warn below, fail below, GB/s) for one topology.

    `scope` says what the all-reduce crosses: "nvlink-domain" when every node of the job sits in
    one multi-node NVLink domain (GB200/GB300: one NVL72 rack of 18 VMs), "infiniband" when it
    crosses InfiniBand (nodes of sizes without such a domain, or in several racks). `sharp`: the
    figure was measured with SHARP in-network reduction (NCCL_COLLNET_ENABLE=1), so it applies
    only to jobs that turn SHARP on; a figure measured without SHARP is a floor either way."""

    scope: BandScope
    busbw_gbytes_per_s: tuple[float, float, float]
    source: str
    sharp: bool = False
    message_bytes: int = 16 << 30
    """The message size the figure was published for."""


@dataclass(frozen=True)
class Conflict:
    """Two of Microsoft's sources disagree on a fact: the catalog keeps one (`value`, with its
    `source`) and records the other here, with why it keeps the one it keeps."""

    fact: str
    """The Sku key the sources disagree on."""
    value: Any
    source: str
    other: Any
    other_source: str
    why: str


@dataclass(frozen=True)
class HealthThresholds:
    """Pass marks for node health checks; a check passes when measured >= the value.

    None means no published figure: the check still runs and reports, but cannot fail
    on that size. The figures are Azure's node health checks for the size (`source`, one
    conf file per size); the GEMM and multi-node figures are measured baselines with their
    own sources.
    """

    h2d_gbytes_per_s_min: float | None = None
    """Host-to-device copy from pinned memory, per GPU, GB/s (check_gpu_bw's first figure)."""
    d2h_gbytes_per_s_min: float | None = None
    """Device-to-host copy into pinned memory, per GPU, GB/s."""
    p2p_gbytes_per_s_min: float | None = None
    """Device-to-device copy over NVLink, per GPU pair, GB/s (check_gpu_bw's second figure)."""
    nccl_allreduce_busbw_gbytes_per_s_min: float | None = None
    """Single-node NCCL all-reduce bus bandwidth (algbw x 2(n-1)/n), GB/s."""
    nccl_allreduce_message_bytes: int = 1 << 30
    """Message size the all-reduce figure was published for."""
    ib_write_gbits_per_s_per_hca_min: float | None = None
    """RDMA write loopback bandwidth per HCA (ib_write_bw), Gb/s."""
    ib_write_gpudirect: bool = True
    """Whether the IB write test runs from GPU memory (GPUDirect RDMA) or host memory."""
    ib_write_message_bytes: int = 8 << 20
    """Message size of the IB write test (Azure's: 8 MiB with GPUDirect)."""
    nvme_count: int | None = None
    """NVMe namespaces (/dev/nvme<N>n1) the node must show, where Azure checks it."""
    nvlink_check: bool = False
    """Every NVLink of every GPU must be active (Azure runs check_nvlink_status on the size)."""
    gemm_tflops: tuple[float, float, float] | None = None
    """Dense GEMM per GPU in `Sku.gpu_gemm_dtype`: (expected, warn below, fail below), TFLOP/s."""
    gemm_shape: tuple[int, int, int] | None = None
    """(M, N, K) the GEMM baseline was measured at; the health check measures the same shape."""
    gemm_source: str = ""
    """Source id of the GEMM baseline."""
    gemm_method: GemmMethod = "burst"
    """How the baseline was measured, so the check measures the same way: "sustained" (the mean
    rate over `gemm_seconds` of back-to-back GEMMs on every GPU at once, as Azure's 60-second
    ubergemm runs) or "burst" (the median of the fastest iterations after warm-up, as mamf-finder
    reports its maximum achievable rate)."""
    gemm_seconds: float | None = None
    """For "sustained": how long the baseline's run lasted; the check runs as long."""
    gemm_tool: GemmTool = "torch"
    """What measured `gemm_tflops`: "torch" (torch.matmul, as mamf-finder and the gate's own
    measurer do) or "ubergemm" (DCGM's GEMM workload, Azure's baselines). The gate grades a
    figure only against a mark its own tool measured: the two differ on the same GPU."""
    gemm_torch_tflops: tuple[float, float, float] | None = None
    """Where `gemm_tool` is "ubergemm": a torch.matmul mark at the same shape, method and
    duration (expected, warn below, fail below), for nodes without ubergemm; None: there is none."""
    gemm_torch_source: str = ""
    """Source id of `gemm_torch_tflops`."""
    ecc_dram_limit: int | None = None
    """check_gpu_ecc's first argument: more corrected or uncorrected DRAM ECC errors than this
    (volatile or aggregate) fail the GPU (azure_gpu_ecc.nhc)."""
    ecc_sram_correctable_limit: int | None = None
    """check_gpu_ecc's second argument: more correctable SRAM errors than this fail the GPU."""
    gemm_measured_on: str = ""
    """Where `gemm_tflops` was measured when not on this size (another size's name, or the
    machine): the mark is borrowed, so the gate warns below it and never fails a node on it."""
    gemm_torch_measured_on: str = ""
    """The same for `gemm_torch_tflops`."""
    multinode: tuple[MultinodeBand, ...] = ()
    """Job-wide all-reduce baselines, one per topology (and SHARP or not) Azure publishes."""
    source: str = ""
    """Source id (catalog [sources]) of these pass marks."""

    def sources(self) -> list[str]:
        """Every source id these pass marks cite."""
        return [s for s in (self.source, self.gemm_source, self.gemm_torch_source, *(b.source for b in self.multinode))
                if s]


@dataclass(frozen=True)
class AzureMlSupport:
    """Where Azure Machine Learning can run the size, with its source.

    `amlcompute`: an AmlCompute cluster (what this project's stacks create) can use the size;
    `serverless`: Azure ML's serverless compute can. Where neither holds, `elsewhere` says how
    the size is run instead (VMs, CycleCloud/Slurm, AKS) and `reason` why Azure ML cannot:
    infra refuses a cluster of the size with that reason."""

    amlcompute: bool
    serverless: bool
    source: str
    """Source id (catalog [sources])."""
    reason: str = ""
    elsewhere: str = ""


@dataclass(frozen=True)
class NvlinkDomain:
    """A multi-node NVLink domain (GB200/GB300 NVL72): GPUs of several VMs on one NVLink fabric."""

    gpus: int
    vms: int
    imex: bool
    """The domain's memory is shared through IMEX channels (nvidia-imex on the hosts)."""
    source: str


@dataclass(frozen=True)
class Price:
    """A reference on-demand price. Real bills differ: negotiated rates, low priority."""

    usd_per_hour: float
    region: str
    as_of: str
    source: str
    """Source id (catalog [sources]), or a free text for prices that come from a stack."""


@dataclass(frozen=True)
class Sku:
    """One Azure VM size. Immutable; look it up with `get()`."""

    name: str
    series: str
    quota_family: str
    """Compute usage name that bounds dedicated vCPUs (low priority uses `lowPriorityCores`)."""
    facts_source: str
    """Source id of the size's hardware description."""
    vcpus: int
    memory_gib: int
    gpus: int
    gpu_model: str
    gpu_memory_gib: int
    gpu_vendor: GpuVendor
    gpu_arch: str
    """The GPU's instruction set: CUDA compute capability as sm_XY (sm_90 = 9.0) or AMD gfx target
    (gfx942); images declare the ones they are built for."""
    host_arch: HostArch
    """The VM's CPU architecture (Grace hosts are aarch64); images declare theirs."""
    peak_source: str
    """Source id of the three peak figures (the vendor's datasheet)."""
    gpu_gemm_dtype: Literal["bf16", "fp16"]
    """The fastest 16-bit type the GPU has tensor cores for (V100 has no bf16)."""
    gpu_memory_gbytes_per_s: float
    ib_hcas: int
    """InfiniBand host channel adapters per node; 0 when the size has no InfiniBand."""
    ib_gbits_per_s_per_hca: int
    nvme_devices: int
    """Local NVMe devices that can be striped into one RAID0 scratch volume."""
    nvme_total_gib: int
    storage_nic_gbits_per_s: float
    """What one node pulls from Blob in practice (not the NIC's nominal rate)."""
    health: HealthThresholds
    azureml: AzureMlSupport
    temp_disk_gib: int | None = None
    """The size table's temporary (resource) disk; None where Azure publishes none for the size."""
    peak_tflops_bf16: float | None = None
    """Per GPU, peak dense (no sparsity) tensor rate in bf16, TFLOP/s; None: no bf16 tensor cores."""
    peak_tflops_fp16: float | None = None
    """Per GPU, peak dense fp16 tensor rate, TFLOP/s."""
    peak_tflops_fp8: float | None = None
    """Per GPU, peak dense fp8 tensor rate, TFLOP/s; None: no fp8 tensor cores (V100, A100)."""
    price: Price | None = None
    nvlink_domain: NvlinkDomain | None = None
    """The multi-node NVLink domain the VM belongs to, where it has one."""
    ib_generation: InfinibandGeneration | None = None
    numa: tuple[NumaDomain, ...] | None = None
    """GPU-to-NUMA layout where it is published; runtime derives it from sysfs first."""
    nvlink: bool = False
    """The GPUs are connected by NVLink (NVSwitch or bridges), not only PCIe."""
    retired: str | None = None
    """ISO date Azure retired the size (no new VMs from then on); None while it is offered."""
    retired_source: str | None = None
    """Source id of the retirement notice."""
    numa_source: str | None = None
    """Source id of the NUMA map."""
    fact_sources: tuple[tuple[str, str], ...] = ()
    """(key, source id) for the size's figures that come from another source than `facts_source`."""
    conflicts: tuple[Conflict, ...] = ()
    """Facts Microsoft's sources disagree on: the catalog's choice and the other figure, both cited."""
    notes: str = ""

    @property
    def infiniband(self) -> bool:
        return self.ib_hcas > 0

    def fact_source(self, key: str) -> str:
        """The source id of one of the size's own figures (`vcpus`, `peak_tflops_bf16`, ...)."""
        overrides = dict(self.fact_sources)
        if key in overrides:
            return overrides[key]
        if key.startswith("peak_tflops_"):
            return self.peak_source
        if key == "retired":
            return self.retired_source or ""
        if key == "numa":
            return self.numa_source or ""
        return self.facts_source

    @property
    def gpu_peak_dense_tflops(self) -> float:
        """Peak dense rate per GPU in `gpu_gemm_dtype`, TFLOP/s."""
        return self.peak_tflops(self.gpu_gemm_dtype) or 0.0

    def peak_tflops(self, dtype: str) -> float | None:
        """Peak dense tensor rate per GPU for bf16, fp16 or fp8 (None: no tensor cores for it)."""
        if dtype not in PEAK_DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {', '.join(PEAK_DTYPES)}")
        peak: float | None = getattr(self, f"peak_tflops_{dtype}")
        return peak

    @property
    def azureml_problem(self) -> str:
        """"" where an AmlCompute cluster can use the size, else why not and what runs it instead."""
        if self.azureml.amlcompute:
            return ""
        where = f"; {self.azureml.elsewhere}" if self.azureml.elsewhere else ""
        return (f"Azure Machine Learning cannot run {self.name} on AmlCompute: {self.azureml.reason} "
                f"({cite(self.azureml.source)}){where}")

    @property
    def retirement(self) -> str:
        """"" while the size is offered, else a sentence for warnings: when and where it says so."""
        if not self.retired:
            return ""
        return (f"{self.name} was retired by Azure on {self.retired} ({cite(self.retired_source or '')}): "
                "clusters of it can no longer be created or scaled, and its price is the last one published")

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


FACT_KEYS = ("series", "quota_family", "vcpus", "memory_gib", "temp_disk_gib", "gpus", "gpu_model", "gpu_memory_gib",
             "gpu_vendor", "gpu_arch", "host_arch", "gpu_gemm_dtype", "gpu_memory_gbytes_per_s", "ib_hcas",
             "ib_gbits_per_s_per_hca", "ib_generation", "nvme_devices", "nvme_total_gib", "storage_nic_gbits_per_s",
             "nvlink", *(f"peak_tflops_{d}" for d in PEAK_DTYPES), "retired", "numa")
"""The size's own figures: each is cited by `Sku.fact_source` (the `facts_source`, unless the
size's [sku.fact_sources] names another)."""


@dataclass(frozen=True)
class StorageAccountLimits:
    """Standard general-purpose v2 account throughput limits, Gb/s."""

    egress_gbits_per_s_default: float
    egress_gbits_per_s_large_region: float
    ingress_gbits_per_s_default: float
    ingress_gbits_per_s_large_region: float
    requests_per_s: float
    source: str


@dataclass(frozen=True)
class Limit:
    """A service limit the plan and `jobs submit` check (skus.toml [[limit]])."""

    subject: str
    """What it limits: azureml, container_registry."""
    key: str
    value: int
    source: str
    what: str
    """What the source counts, in its words, and how the limit is raised where it can be."""


class CatalogError(ValueError):
    """The catalog data file is malformed: names the entry and the key."""


def _record(cls: type, data: dict[str, Any], where: str, **nested: Any) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise CatalogError(f"{CATALOG_FILE.name}: {where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    values.update(nested)
    try:
        return cls(**values)
    except TypeError as exc:  # a required key is missing
        raise CatalogError(f"{CATALOG_FILE.name}: {where}: {exc}") from None


def _band(data: dict[str, Any], where: str) -> MultinodeBand:
    band: MultinodeBand = _record(MultinodeBand, dict(data), where)
    if band.scope not in get_args(BandScope):
        raise CatalogError(f"{CATALOG_FILE.name}: {where}: scope {band.scope!r} is not one of {', '.join(get_args(BandScope))}")
    figures = band.busbw_gbytes_per_s
    if len(figures) != 3 or not figures[0] >= figures[1] >= figures[2] > 0:
        raise CatalogError(f"{CATALOG_FILE.name}: {where}: busbw_gbytes_per_s must be [expected, warn below, fail below] "
                           f"in falling order, got {list(figures)}")
    return band


def _check_conflict(sku: Sku, conflict: Conflict, where: str) -> None:
    """A recorded conflict is about a figure of the size, and the catalog holds the value it says it keeps."""
    if conflict.fact not in FACT_KEYS:
        raise CatalogError(f"{where}: fact {conflict.fact!r} is not one of the size's figures")
    if getattr(sku, conflict.fact) != conflict.value:
        raise CatalogError(f"{where}: the catalog holds {conflict.fact} = {getattr(sku, conflict.fact)!r}, "
                           f"but the conflict says it keeps {conflict.value!r}")
    if sku.fact_source(conflict.fact) != conflict.source:
        raise CatalogError(f"{where}: {conflict.fact} is cited to {sku.fact_source(conflict.fact)!r}, "
                           f"but the conflict says its value comes from {conflict.source!r}")
    if conflict.value == conflict.other:
        raise CatalogError(f"{where}: both sources give {conflict.value!r}: that is no conflict")


_GPU_ARCH = re.compile(r"^(sm_[0-9]{2,3}|gfx[0-9a-f]{3,4})$")


def _value_problem(sku: Sku) -> str:
    """What is wrong with a record's enumerated values ("" when nothing is)."""
    allowed = {"gpu_vendor": get_args(GpuVendor), "host_arch": get_args(HostArch)}
    for key, values in allowed.items():
        if getattr(sku, key) not in values:
            return f"{key} {getattr(sku, key)!r} is not one of {', '.join(values)}"
    if not _GPU_ARCH.match(sku.gpu_arch):
        return f"gpu_arch {sku.gpu_arch!r} is neither sm_XY (CUDA compute capability) nor gfxNNN (AMD)"
    if sku.gpu_arch.startswith("gfx") != (sku.gpu_vendor == "amd"):
        return f"gpu_arch {sku.gpu_arch!r} does not belong to the size's {sku.gpu_vendor} GPU"
    if sku.peak_tflops(sku.gpu_gemm_dtype) is None:
        return f"peak_tflops_{sku.gpu_gemm_dtype} is missing, but gpu_gemm_dtype is {sku.gpu_gemm_dtype}"
    health = sku.health
    if health.gemm_method not in get_args(GemmMethod):
        return f"health.gemm_method {health.gemm_method!r} is not one of {', '.join(get_args(GemmMethod))}"
    if health.gemm_tflops and health.gemm_method == "sustained" and not health.gemm_seconds:
        return "health.gemm_seconds is missing: a sustained GEMM baseline says how long it ran"
    return _gemm_tool_problem(health)


def _gemm_tool_problem(health: HealthThresholds) -> str:
    """What is wrong with the GEMM mark's tool and its torch counterpart ("" when nothing is)."""
    if health.gemm_tool not in get_args(GemmTool):
        return f"health.gemm_tool {health.gemm_tool!r} is not one of {', '.join(get_args(GemmTool))}"
    if health.gemm_tool == "ubergemm" and health.gemm_tflops and health.gemm_method != "sustained":
        return "health.gemm_tool 'ubergemm' needs gemm_method 'sustained' (ubergemm runs for a set time)"
    torch = health.gemm_torch_tflops
    if torch is None:
        return ""
    if health.gemm_tool != "ubergemm":
        return "health.gemm_torch_tflops is only for an ubergemm mark (gemm_tflops is already torch's)"
    if len(torch) != 3 or not torch[0] >= torch[1] >= torch[2]:
        return f"health.gemm_torch_tflops must be [expected, warn below, fail below] in falling order, got {list(torch)}"
    if not health.gemm_torch_source:
        return "health.gemm_torch_source is missing: a torch mark names where it was measured"
    return ""


def _load(path: Path) -> tuple[dict[str, Sku], dict[str, Source], StorageAccountLimits, dict[tuple[str, str], Limit]]:
    document = tomllib.loads(path.read_text())
    sources = {key: _record(Source, {"id": key, **value}, f"sources.{key}")
               for key, value in document.get("sources", {}).items()}

    def cited(source_id: str, where: str) -> str:
        if source_id not in sources:
            raise CatalogError(f"{path.name}: {where}: source {source_id!r} is not in [sources] ({', '.join(sorted(sources))})")
        return source_id

    catalog: dict[str, Sku] = {}
    for i, entry in enumerate(document.get("sku", [])):
        entry = dict(entry)
        where = f"sku[{i}] ({entry.get('name', '?')})"
        health_entry = dict(entry.pop("health", {}))
        bands = tuple(_band(b, f"{where}.health.multinode[{j}]") for j, b in enumerate(health_entry.pop("multinode", [])))
        health = _record(HealthThresholds, health_entry, f"{where}.health", multinode=bands)
        for source_id in health.sources():
            cited(source_id, f"{where}.health")
        if not health.source:
            raise CatalogError(f"{path.name}: {where}.health: source is missing (the conf file the pass marks come from)")
        price = entry.pop("price", None)
        if price is not None:
            price = _record(Price, price, f"{where}.price")
            cited(price.source, f"{where}.price.source")
        numa = entry.pop("numa", None)
        numa_domains = tuple(_record(NumaDomain, d, f"{where}.numa[{j}]") for j, d in enumerate(numa)) if numa else None
        azureml = _record(AzureMlSupport, entry.pop("azureml", {}), f"{where}.azureml")
        cited(azureml.source, f"{where}.azureml.source")
        if not azureml.amlcompute and not azureml.reason:
            raise CatalogError(f"{path.name}: {where}.azureml: reason is missing (why Azure ML cannot run the size)")
        domain = entry.pop("nvlink_domain", None)
        if domain is not None:
            domain = _record(NvlinkDomain, domain, f"{where}.nvlink_domain")
            cited(domain.source, f"{where}.nvlink_domain.source")
        overrides = entry.pop("fact_sources", {})
        conflicts = tuple(_record(Conflict, c, f"{where}.conflicts[{j}]") for j, c in enumerate(entry.pop("conflicts", [])))
        sku = _record(Sku, entry, where, health=health, price=price, numa=numa_domains, azureml=azureml,
                      nvlink_domain=domain, fact_sources=tuple(sorted(overrides.items())), conflicts=conflicts)
        for key, source_id in sku.fact_sources:
            if key not in FACT_KEYS:
                raise CatalogError(f"{path.name}: {where}.fact_sources: {key!r} is not one of the size's figures "
                                   f"({', '.join(FACT_KEYS)})")
            cited(source_id, f"{where}.fact_sources.{key}")
        for j, conflict in enumerate(sku.conflicts):
            _check_conflict(sku, conflict, f"{path.name}: {where}.conflicts[{j}]")
            cited(conflict.source, f"{where}.conflicts[{j}].source")
            cited(conflict.other_source, f"{where}.conflicts[{j}].other_source")
        if sku.numa is not None and not sku.numa_source:
            raise CatalogError(f"{path.name}: {where}: numa_source is missing (where the NUMA map comes from)")
        if sku.numa_source:
            cited(sku.numa_source, f"{where}.numa_source")
        problem = _value_problem(sku)
        if problem:
            raise CatalogError(f"{path.name}: {where}: {problem}")
        cited(sku.facts_source, f"{where}.facts_source")
        cited(sku.peak_source, f"{where}.peak_source")
        if bool(sku.retired) != bool(sku.retired_source):
            raise CatalogError(f"{path.name}: {where}: retired and retired_source go together (the date and the notice)")
        if sku.retired:
            cited(sku.retired_source, f"{where}.retired_source")
        if sku.name in catalog:
            raise CatalogError(f"{path.name}: {where}: duplicate size {sku.name}")
        catalog[sku.name] = sku
    storage = _record(StorageAccountLimits, document.get("storage_account", {}), "storage_account")
    cited(storage.source, "storage_account.source")
    limits: dict[tuple[str, str], Limit] = {}
    for i, entry in enumerate(document.get("limit", [])):
        found = _record(Limit, dict(entry), f"limit[{i}]")
        cited(found.source, f"limit[{i}].source")
        if (found.subject, found.key) in limits:
            raise CatalogError(f"{path.name}: limit[{i}]: duplicate {found.subject}.{found.key}")
        limits[(found.subject, found.key)] = found
    return catalog, sources, storage, limits


_catalog, _sources, STORAGE_ACCOUNT, _limits = _load(CATALOG_FILE)

LIMITS: MappingProxyType[tuple[str, str], Limit] = MappingProxyType(_limits)
"""Service limits by (subject, key)."""


def limit(subject: str, key: str) -> Limit:
    """A service limit of the catalog (KeyError names it when the catalog lacks it)."""
    return LIMITS[(subject, key)]

CATALOG: MappingProxyType[str, Sku] = MappingProxyType(_catalog)
"""Every supported size by its exact Azure name."""

SOURCES: MappingProxyType[str, Source] = MappingProxyType(_sources)
"""Every source the catalog cites, by id."""


def cite(source_id: str) -> str:
    """A readable citation for a catalog source id (the id itself when it is free text)."""
    source = SOURCES.get(source_id)
    return source.cite() if source else source_id


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
