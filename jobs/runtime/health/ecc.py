"""GPU memory health from NVML: ECC mode, row remapping, uncorrectable SRAM errors.

Per GPU (Azure's node health checks: fail on pending/failed row remaps or any uncorrectable SRAM error):
- row remapping (A100 and later): a *pending* remap needs a GPU reset before the spare row
  is used, a remap *failure* means the spares ran out; both fail.
- uncorrectable SRAM errors since the driver loaded (volatile) fail: SRAM has no spare
  rows, the GPU must be reset or replaced. Lifetime (aggregate) ones only warn: the GPU
  was reset since, but it has a history worth knowing.
- retired pages pending (V100, which retires pages instead of remapping rows) fail.
- ECC switched off on a data-centre GPU warns: errors would go unnoticed.
A query the GPU does not support (row remapping on V100) is left out, not failed.
"""

from __future__ import annotations

from typing import Any

from jobs.runtime.health.grading import FAIL, PASS, SKIP, WARN
from jobs.runtime.health.results import CheckResult
from jobs.runtime.nvml import NvmlSession, bus_id, error_text, is_error

# NVML enum values (nvml.h), used when the bindings do not define the name.
_MEMORY_ERROR_TYPE_UNCORRECTED = 1
_VOLATILE_ECC, _AGGREGATE_ECC = 0, 1
_MEMORY_LOCATION_SRAM = 7
_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT = 1


def _const(lib: Any, name: str, default: int) -> int:
    return getattr(lib, name, default)


class _Unsupported(Exception):
    pass


def _query(lib: Any, fn, *args):
    """Call an NVML query; NOT_SUPPORTED becomes _Unsupported, other errors propagate."""
    try:
        return fn(*args)
    except lib.NVMLError as exc:
        if is_error(lib, exc, "NVML_ERROR_NOT_SUPPORTED"):
            raise _Unsupported from None
        raise


def _gpu_memory_findings(lib: Any, handle: Any) -> tuple[str, list[str], dict[str, int]]:
    """(status, problems, counters) for one GPU."""
    problems: list[str] = []
    status = PASS
    counters: dict[str, int] = {}
    try:
        current, _pending = _query(lib, lib.nvmlDeviceGetEccMode, handle)
        if not current:
            status = WARN
            problems.append("ECC is disabled")
    except _Unsupported:
        pass
    try:
        corrected, uncorrected, pending, failure = _query(lib, lib.nvmlDeviceGetRemappedRows, handle)
        counters.update(remapped_rows_correctable=int(corrected), remapped_rows_uncorrectable=int(uncorrected))
        if pending:
            status = FAIL
            problems.append("row remapping pending (reset the GPU)")
        if failure:
            status = FAIL
            problems.append("row remapping failed (spare rows exhausted)")
    except _Unsupported:
        pass
    uncorrected_type = _const(lib, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", _MEMORY_ERROR_TYPE_UNCORRECTED)
    sram = _const(lib, "NVML_MEMORY_LOCATION_SRAM", _MEMORY_LOCATION_SRAM)
    for counter_type, key in ((_const(lib, "NVML_VOLATILE_ECC", _VOLATILE_ECC), "sram_uncorrectable_volatile"),
                              (_const(lib, "NVML_AGGREGATE_ECC", _AGGREGATE_ECC), "sram_uncorrectable_aggregate")):
        try:
            count = int(_query(lib, lib.nvmlDeviceGetMemoryErrorCounter, handle, uncorrected_type, counter_type, sram))
        except _Unsupported:
            continue
        counters[key] = count
        if count and key.endswith("volatile"):
            status = FAIL
            problems.append(f"{count} uncorrectable SRAM error(s) since the driver loaded")
        elif count and status != FAIL:
            status = WARN
            problems.append(f"{count} uncorrectable SRAM error(s) in the GPU's lifetime")
    try:
        cause = _const(lib, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", _PAGE_RETIREMENT_CAUSE_DOUBLE_BIT)
        retired = _query(lib, lib.nvmlDeviceGetRetiredPages, handle, cause)
        counters["retired_pages_double_bit"] = len(retired)
        if _query(lib, lib.nvmlDeviceGetRetiredPagesPendingStatus, handle):
            status = FAIL
            problems.append("page retirement pending (reset the GPU)")
    except _Unsupported:
        pass
    return status, problems, counters


def check_ecc(session: NvmlSession, expected_gpus: int) -> list[CheckResult]:
    """One `ecc` result per GPU NVML sees (skip when NVML is unavailable)."""
    if session.lib is None:
        return [CheckResult("ecc", "node", SKIP, detail=session.reason)]
    lib = session.lib
    results = []
    for index in range(lib.nvmlDeviceGetCount()):
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        subject = f"gpu{index} {bus_id(lib, handle)}"
        try:
            status, problems, counters = _gpu_memory_findings(lib, handle)
        except lib.NVMLError as exc:
            results.append(CheckResult("ecc", subject, FAIL, detail=f"NVML query failed: {error_text(lib, exc)}"))
            continue
        detail = "; ".join(problems) or "no pending or failed remaps, no uncorrectable SRAM errors"
        if counters:
            detail += " [" + ", ".join(f"{k}={v}" for k, v in sorted(counters.items())) + "]"
        results.append(CheckResult("ecc", subject, status, detail=detail))
    if not results and expected_gpus:
        results.append(CheckResult("ecc", "node", FAIL, 0.0, "GPUs", float(expected_gpus),
                                   "NVML sees no GPU"))
    return results
