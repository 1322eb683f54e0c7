"""The checks one node runs on itself: GPU count, GEMM, H2D, D2H, D2D per GPU, InfiniBand
ports, ECC / row remapping. (The all-reduce needs every rank: see collective.py.)

Thresholds come from the size's facts (AMLHPC_SKU_JSON): GEMM is graded against the size's
measured baseline `gemm_tflops` (expected, warn below, fail below) at the baseline's shape,
measured the baseline's way (`gemm_method`: a burst per GPU, or every GPU at once for the
mark's `gemm_seconds`; --quick cannot afford the latter and reports its burst as info) and with
the baseline's tool (`gemm_tool`): Azure's marks are DCGM ubergemm's, run where the node has it
(ubergemm.py); without it torch.matmul's figure is graded only against a torch mark
(`gemm_torch_tflops`), else reported and compared with the fleet. Copies
against `h2d/d2h_gbytes_per_s_min` and peer reads against `p2p_gbytes_per_s_min` (Azure's
check_gpu_bw); D2D has no published pass mark and is judged against the fleet only. Sizes
without a measured GEMM baseline (V100) report the figure and compare it with the fleet. A machine with no
GPU on its PCI bus is not the size's hardware (a CPU rehearsal): the GPU checks say
so and are skipped, and so are InfiniBand and ECC, whose expectations belong to that
hardware. GPUs on the bus that CUDA cannot use are a failure, not a skip; GPUs on the bus
with no PyTorch to measure them are not-checked (a failure of the verdict too).

Copies run with this process pinned to the GPU's local CPUs (from sysfs), so the pinned
buffer lives on the GPU's NUMA node, as the NDv4 performance article's `numactl --cpunodebind` does.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from amlhpc.jobs.runtime.health.ecc import EccLimits, check_ecc
from amlhpc.jobs.runtime.health.grading import (
    FAIL,
    INFO,
    NOT_CHECKED,
    PASS,
    SKIP,
    grade_band,
    grade_minimum,
    warn_only,
)
from amlhpc.jobs.runtime.health.infiniband import check_infiniband
from amlhpc.jobs.runtime.health.measure import MIB, GpuMeasurer
from amlhpc.jobs.runtime.health.results import CheckResult
from amlhpc.jobs.runtime.health.tools import Tools, skipped_on_cpu, tool_checks
from amlhpc.jobs.runtime.health.ubergemm import find_ubergemm, ubergemm_results
from amlhpc.jobs.runtime.node import topology
from amlhpc.jobs.runtime.node.nvml import NvmlSession
from amlhpc.jobs.runtime.node.skufacts import SkuFacts


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does."""

    gemm_n: int = 8192
    """Square GEMM for sizes without a baseline shape."""
    gemm_seconds: float = 1.0
    """How long the timed GEMM loop should last (iterations follow from the shape)."""
    gemm_tflops_guess: float = 300.0
    """A rate to turn gemm_seconds into iterations before anything is measured."""
    sustained: bool = True
    """Run a sustained GEMM mark's full duration (every GPU at once for `gemm_seconds`)."""
    settle_seconds: float = 5.0
    """Unmeasured work before a sustained window, so clocks and temperature reach steady state."""
    copy_bytes: int = 256 * MIB
    copy_iters: int = 20
    allreduce_iters: int = 10
    allreduce_warmup: int = 3
    cpu_allreduce_bytes: int = 64 * MIB
    """Message size over gloo on a CPU-only run (no pass mark there: GPU figures do not apply)."""


FULL = Sizes()
QUICK = Sizes(gemm_seconds=0.3, copy_iters=5, allreduce_iters=3, allreduce_warmup=1, cpu_allreduce_bytes=16 * MIB,
              sustained=False)
"""--quick: the same GPU sizes (pass marks hold for them), fewer repetitions, no minute-long
sustained GEMM (a sustained mark is then reported, not graded); a smaller gloo message on
CPU-only runs, which have no pass marks."""


@contextmanager
def _on_cpus(cpus: frozenset[int]):
    """Run the block on `cpus` (when some are usable), then restore the previous affinity."""
    before = os.sched_getaffinity(0)
    usable = set(cpus) & before
    if usable:
        os.sched_setaffinity(0, usable)
    try:
        yield bool(usable)
    finally:
        if usable:
            os.sched_setaffinity(0, before)


def _physical_gpus(environ: Mapping[str, str], pci: list[topology.GpuLocation]) -> list[topology.GpuLocation | None]:
    """The sysfs GPU behind each CUDA device number, when the numbering is known."""
    if environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return []  # FASTEST_FIRST numbering cannot be matched to PCI addresses
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(pci)
    try:
        return [pci[int(v)] if 0 <= int(v) < len(pci) else None for v in visible.split(",") if v.strip()]
    except ValueError:
        return []  # UUIDs


def _vendor(sku: SkuFacts | None) -> str:
    return "AMD" if sku and sku.gpu_vendor == "amd" else "NVIDIA"


def _gpu_count(sku: SkuFacts | None, pci_count: int | None, cuda_count: int, measurer: GpuMeasurer,
               environ: Mapping[str, str]) -> CheckResult:
    expected = sku.gpus if sku else None
    if cuda_count == 0 and pci_count:
        if measurer.software_missing:
            return CheckResult("gpu_count", "node", NOT_CHECKED, float(pci_count), "GPUs",
                               detail=f"{measurer.unavailable_reason}: {pci_count} GPU(s) on the PCI bus, none measured "
                                      "(use the aml-hpc image that fits the size)")
        return CheckResult("gpu_count", "node", FAIL, 0.0, "GPUs", float(pci_count),
                           f"{pci_count} {_vendor(sku)} GPU(s) on the PCI bus but CUDA sees none: {measurer.unavailable_reason}")
    if expected is not None and sku is not None and pci_count is not None and pci_count != expected:
        return CheckResult("gpu_count", "node", FAIL, float(pci_count), "GPUs", float(expected),
                           f"{pci_count} GPU(s) on the PCI bus, {sku.name} has {expected} (a GPU fell off the bus?)")
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    wanted = len([v for v in visible.split(",") if v.strip()]) if visible is not None else (pci_count or expected)
    if wanted is not None and cuda_count != wanted:
        return CheckResult("gpu_count", "node", FAIL, float(cuda_count), "GPUs", float(wanted),
                           f"CUDA sees {cuda_count} GPU(s), {wanted} expected")
    return CheckResult("gpu_count", "node", PASS, float(cuda_count), "GPUs", None if expected is None else float(expected),
                       f"{cuda_count} GPU(s) usable")


def _measure(check: str, subject: str, unit: str, minimum: float | None, detail: str, run,
             band: tuple[float, float, float] | None = None) -> CheckResult:
    """Run one measurement and grade it (against a minimum, or an (expected, warn, fail) band);
    a CUDA error is a failure of that GPU."""
    try:
        value = float(run())
    except Exception as exc:  # noqa: BLE001 - any error from the GPU is the finding
        return CheckResult(check, subject, FAIL, detail=f"measurement failed: {type(exc).__name__}: {exc}"[:400])
    if band is not None:
        return CheckResult(check, subject, grade_band(value, band[1], band[2]), value, unit, band[2], detail)
    return CheckResult(check, subject, grade_minimum(value, minimum), value, unit, minimum, detail)


def sustained_seconds(sku: SkuFacts | None) -> float | None:
    """How long the size's GEMM mark ran on every GPU at once, or None for a burst mark."""
    health = sku.health if sku else None
    if health and health.gemm_tflops and health.gemm_method == "sustained":
        return health.gemm_seconds
    return None


UBERGEMM_VS_TORCH = (
    "torch.matmul on random data measured below that mark on a healthy GPU, held by its power cap (one "
    "H200, 2026-11-26: 681.3 TFLOP/s over 60 s at 2048x2048x13312; sampled over 20 s: 692 W of 700 W, SM "
    "clock 1500 MHz, 'SW Power Cap', and 814.5 on zeros at 408 W), so it is not graded against ubergemm's mark")
"""Why a torch figure is not graded against an ubergemm mark (bench/device/h200-gemm-2026-11-26.json)."""


def torch_mark(sku: SkuFacts | None) -> tuple[float, float, float] | None:
    """The mark a torch.matmul figure may be graded against: the size's mark when torch measured
    it, else the torch mark beside ubergemm's (None when there is none)."""
    health = sku.health if sku else None
    if not health:
        return None
    return health.gemm_torch_tflops if health.gemm_tool == "ubergemm" else health.gemm_tflops


def torch_mark_measured_on(sku: SkuFacts | None) -> str:
    """Where the torch mark was measured when not on this size ("" when on it, or no mark)."""
    health = sku.health if sku else None
    if not health:
        return ""
    return health.gemm_torch_measured_on if health.gemm_tool == "ubergemm" else health.gemm_measured_on


def gemm_plan(sku: SkuFacts | None, sizes: Sizes) -> tuple[tuple[int, int, int], int, tuple[float, float, float] | None, str]:
    """(shape, iterations, band or None, detail) of the torch GEMM check for this size. The band
    is None where torch has no mark, or where the mark is sustained and `sizes` cannot run it."""
    health = sku.health if sku else None
    dtype = sku.gpu_gemm_dtype if sku else "bf16"
    shape = health.gemm_shape if health and health.gemm_shape else (sizes.gemm_n,) * 3
    band = torch_mark(sku)
    mark = health.gemm_tflops if health else None
    flops = 2 * shape[0] * shape[1] * shape[2]
    iters = max(10, int(sizes.gemm_seconds * ((band or mark or (sizes.gemm_tflops_guess,))[0]) * 1e12 / flops))
    seconds = sustained_seconds(sku)
    if seconds and sizes.sustained:
        detail = (f"{dtype} {shape[0]}x{shape[1]}x{shape[2]} matmul on every GPU at once for {seconds:g} s "
                  f"(after {sizes.settle_seconds:g} s settling), mean rate")
    else:
        detail = f"{dtype} {shape[0]}x{shape[1]}x{shape[2]} matmul, median of the 5 fastest of {iters}"
    ubergemm = health is not None and health.gemm_tool == "ubergemm" and mark is not None
    if mark and seconds and not sizes.sustained:
        detail += (f"; the mark (~{mark[0]:g} TFLOP/s) is a {seconds:g}-second sustained rate on every GPU at once, "
                   "which a burst overstates: not graded in a quick run")
        band = None
    elif band and ubergemm and mark is not None:
        detail += (f", torch.matmul mark ~{band[0]:g} TFLOP/s (warn below {band[1]:g}, fail below {band[2]:g}); "
                   f"the size's ubergemm mark (~{mark[0]:g}) is graded where the image has DCGM's ubergemm")
    elif band:
        detail += f", measured baseline ~{band[0]:g} TFLOP/s (warn below {band[1]:g}, fail below {band[2]:g})"
    if band and torch_mark_measured_on(sku):
        detail += f"; the mark was measured on {torch_mark_measured_on(sku)}: below it warns, never fails"
    elif ubergemm and mark is not None:
        detail += (f"; the size's mark (~{mark[0]:g} TFLOP/s) is DCGM ubergemm's, which this image lacks: "
                   f"{UBERGEMM_VS_TORCH}; compared with the fleet")
    else:
        detail += "; no measured baseline for this GPU: compared with the fleet"
    return shape, iters, band, detail


def _gemm_results(sku: SkuFacts | None, measurer: GpuMeasurer, sizes: Sizes, count: int,
                  subjects: list[str], tools: Tools, environ: Mapping[str, str]) -> list[CheckResult]:
    """One gemm result per GPU, measured the way the size's mark was: with ubergemm when the
    mark is ubergemm's and the node has it, else with torch.matmul."""
    dtype = sku.gpu_gemm_dtype if sku else "bf16"
    seconds = sustained_seconds(sku)
    health = sku.health if sku else None
    if seconds and sizes.sustained and health and health.gemm_tool == "ubergemm" and health.gemm_tflops:
        binary = find_ubergemm(tools)
        if binary:
            return ubergemm_results(tools, binary, health.gemm_tflops, seconds, subjects, environ,
                                    health.gemm_measured_on)
    shape, iters, band, detail = gemm_plan(sku, sizes)
    borrowed = torch_mark_measured_on(sku)
    if not (seconds and sizes.sustained):
        return [_warn_only(_measure("gemm", subjects[i], "TFLOP/s", None, detail,
                                    lambda i=i: measurer.gemm_tflops(i, dtype, shape, iters), band), borrowed)
                for i in range(count)]
    try:
        rates = measurer.gemm_sustained_tflops(list(range(count)), dtype, shape, seconds, sizes.settle_seconds)
    except Exception as exc:  # noqa: BLE001 - any error from the GPUs is the finding
        rates = {i: exc for i in range(count)}
    results = []
    for i in range(count):
        rate = rates.get(i)
        if isinstance(rate, threading.BrokenBarrierError):
            results.append(CheckResult("gemm", subjects[i], INFO, detail="not measured: another GPU's run failed first"))
        elif isinstance(rate, Exception) or rate is None:
            results.append(CheckResult("gemm", subjects[i], FAIL, detail=f"measurement failed: {type(rate).__name__}: {rate}"[:400]))
        elif band is None:
            results.append(CheckResult("gemm", subjects[i], INFO, rate, "TFLOP/s", None, detail))
        else:
            status = warn_only(grade_band(rate, band[1], band[2]), borrowed)
            results.append(CheckResult("gemm", subjects[i], status, rate, "TFLOP/s", band[2], detail))
    return results


def _warn_only(result: CheckResult, borrowed: str) -> CheckResult:
    """A measured figure below a borrowed mark warns (a failed measurement still fails)."""
    if borrowed and result.status == FAIL and result.value is not None:
        return CheckResult(result.check, result.subject, warn_only(result.status, borrowed), result.value, result.unit,
                           result.threshold, result.detail)
    return result


def gpu_checks(sku: SkuFacts | None, measurer: GpuMeasurer, sizes: Sizes, sysfs: Path,
               environ: Mapping[str, str], tools: Tools | None = None) -> list[CheckResult]:
    """GPU count, GEMM (per GPU, or all at once for a sustained mark), then H2D/D2H/D2D on
    every GPU in turn (so copies do not share PCIe), then peer reads."""
    pci = topology.sysfs_gpus(sysfs, sku.gpu_vendor if sku else None)
    pci_count = None if pci is None else len(pci)
    cuda_count = measurer.device_count()
    if not pci_count and cuda_count == 0:
        where = f" (a {sku.name} has {sku.gpus})" if sku and sku.gpus else ""
        return [CheckResult("gpu_count", "node", SKIP, 0.0, "GPUs",
                            detail=f"no {_vendor(sku)} GPU on this machine{where}: GPU checks skipped, not faked")]
    results = [_gpu_count(sku, pci_count, cuda_count, measurer, environ)]
    if cuda_count == 0:
        return results
    physical = _physical_gpus(environ, pci or [])
    health = sku.health if sku else None
    subjects = []
    for index in range(cuda_count):
        location = physical[index] if index < len(physical) else None
        subjects.append(f"gpu{index} {location.pci_address}" if location else f"gpu{index}")
    gemm = _gemm_results(sku, measurer, sizes, cuda_count, subjects, tools or Tools(), environ)
    copy_mib = sizes.copy_bytes // MIB
    for index in range(cuda_count):
        location = physical[index] if index < len(physical) else None
        subject = subjects[index]
        results.append(gemm[index])
        cpus = location.cpus if location else frozenset()
        with _on_cpus(cpus) as pinned:
            where = f"pinned {copy_mib} MiB from NUMA node {location.numa_node}" if pinned and location else f"pinned {copy_mib} MiB (NUMA placement unknown)"
            results.append(_measure("h2d", subject, "GB/s", health.h2d_gbytes_per_s_min if health else None, where,
                                    lambda i=index: measurer.h2d_gbytes_per_s(i, sizes.copy_bytes, sizes.copy_iters)))
            results.append(_measure("d2h", subject, "GB/s", health.d2h_gbytes_per_s_min if health else None, where,
                                    lambda i=index: measurer.d2h_gbytes_per_s(i, sizes.copy_bytes, sizes.copy_iters)))
        d2d = _measure("d2d", subject, "GB/s", None, f"{copy_mib} MiB on-device copy (read + write); no published pass mark, compared with the fleet",
                       lambda i=index: measurer.d2d_gbytes_per_s(i, sizes.copy_bytes, sizes.copy_iters))
        results.append(d2d)
    results.extend(_p2p(measurer, cuda_count, health, sizes, physical))
    return results


def _p2p(measurer: GpuMeasurer, count: int, health, sizes: Sizes, physical: list) -> list[CheckResult]:
    """Each GPU reads from every other; the slowest pair per GPU is graded (Azure's check_gpu_bw P2P)."""
    minimum = health.p2p_gbytes_per_s_min if health else None
    if count < 2:
        return []
    results = []
    for dst in range(count):
        location = physical[dst] if dst < len(physical) else None
        subject = f"gpu{dst} {location.pci_address}" if location else f"gpu{dst}"
        figures: list[tuple[float, int]] = []
        try:
            for src in range(count):
                if src != dst:
                    figures.append((float(measurer.p2p_gbytes_per_s(dst, src, sizes.copy_bytes, sizes.copy_iters)), src))
        except Exception as exc:  # noqa: BLE001 - a failing peer copy is the finding
            results.append(CheckResult("p2p", subject, FAIL, detail=f"peer copy failed: {type(exc).__name__}: {exc}"[:400]))
            continue
        slowest, peer = min(figures)
        detail = f"slowest of {len(figures)} peer reads: from gpu{peer}" + ("" if minimum else "; no published pass mark")
        results.append(CheckResult("p2p", subject, grade_minimum(slowest, minimum), slowest, "GB/s", minimum, detail))
    return results


def node_checks(sku: SkuFacts | None, measurer: GpuMeasurer, nvml: NvmlSession, sizes: Sizes,
                sysfs: Path = Path("/sys"), environ: Mapping[str, str] | None = None,
                tools: Tools | None = None) -> list[CheckResult]:
    """Everything one node checks about itself."""
    environ = os.environ if environ is None else environ
    tools = tools or Tools()
    results = gpu_checks(sku, measurer, sizes, sysfs, environ, tools)
    no_gpu_hardware = results[0].check == "gpu_count" and results[0].status == SKIP and results[0].value == 0.0
    if no_gpu_hardware:
        what = f"a {sku.name}" if sku else "a GPU node"
        reason = f"not {what} (no {_vendor(sku)} GPU): the size's InfiniBand, ECC and node-tool expectations do not apply here"
        results.append(CheckResult("infiniband", "node", SKIP, detail=reason))
        results.append(CheckResult("ecc", "node", SKIP, detail=reason))
        results.extend(skipped_on_cpu(reason))
        return results
    results.extend(check_infiniband(sysfs, sku))
    if sku and sku.gpu_vendor == "amd":
        results.append(CheckResult("ecc", "node", SKIP, detail=f"{sku.name} has AMD GPUs: Azure's MI300X health "
                                   "configuration has no ECC rule, and NVML does not read them"))
    else:
        health = sku.health if sku else None
        limits = EccLimits(health.ecc_dram_limit, health.ecc_sram_correctable_limit) if health else EccLimits()
        results.extend(check_ecc(nvml, sku.gpus if sku else 0, limits, tools))
    results.extend(tool_checks(sku, sysfs, measurer.device_count(), tools))
    return results
