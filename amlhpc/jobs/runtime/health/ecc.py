"""GPU memory health with the rules of Azure's node health check azure_gpu_ecc.nhc
(Azure/azurehpc-health-checks customTests, last changed 2025-07-16 in 0c5f89e), read from NVML,
or from `nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT` where the NVML bindings are absent.

A100 and later (`check_gpu_ecc DRAM_LIMIT SRAM_LIMIT`; every such Azure size passes
20000000 10000, the catalog's `ecc_dram_limit` and `ecc_sram_correctable_limit`), per GPU:
- row remapping pending fails (reset the GPU so the spare row is used);
- row remapping failure fails (the spare rows ran out);
- more than 512 rows remapped for uncorrectable errors fails. Azure's script means this rule
  but reads a fourth field of its three-field `--query-remapped-rows` line, so in Azure's own
  run it never fires; it is applied here as the script states it;
- correctable SRAM errors above SRAM_LIMIT, volatile or aggregate, fail;
- any uncorrectable SRAM error fails, volatile *or aggregate* (lifetime): SRAM has no spare
  rows, so a GPU that ever had one is suspect even after a reset;
- corrected or uncorrected DRAM errors above DRAM_LIMIT, volatile or aggregate, fail.

V100 (`check_SDBE_ecc`, run instead on V100 sizes): retired pages (single- plus double-bit)
at 62 or more with a retirement still pending fail: the retirement table is full. A pending
retirement alone warns here (a reset applies it); Azure passes it.

ECC switched off warns (not in Azure's check: errors would go unnoticed). A counter the GPU
does not report (row remapping on V100, SRAM counters before Ampere) is left out, not failed.
The pure rules (`grade_memory`) are shared by both readers, so NVML and nvidia-smi grade alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from amlhpc.jobs.runtime.health.grading import FAIL, NOT_CHECKED, PASS, WARN
from amlhpc.jobs.runtime.health.results import CheckResult
from amlhpc.jobs.runtime.node.nvml import NvmlSession, bus_id, error_text, is_error

REMAP_UNCORRECTABLE_LIMIT = 512
"""azure_gpu_ecc.nhc: "Row remap uncorrectable error count is too high" above 512."""
RETIREMENT_TABLE_PAGES = 62
"""azure_gpu_ecc.nhc check_SDBE_ecc: single + double bit retired pages >= 62 is a full table."""
SMI_QUERY = ["nvidia-smi", "-q", "-d", "ECC,ROW_REMAPPER,PAGE_RETIREMENT"]

# NVML enum values (nvml.h), used when the bindings do not define the name.
_CORRECTED, _UNCORRECTED = 0, 1
_VOLATILE_ECC, _AGGREGATE_ECC = 0, 1
_LOCATION_DRAM, _LOCATION_SRAM = 2, 7
_CAUSE_SINGLE_BIT, _CAUSE_DOUBLE_BIT = 0, 1


@dataclass(frozen=True)
class EccLimits:
    """The two arguments of Azure's check_gpu_ecc for the size (None: not given)."""

    dram: int | None = None
    sram_correctable: int | None = None


@dataclass
class MemoryCounters:
    """What one GPU reports about its memory (None: not reported)."""

    ecc_enabled: bool | None = None
    remap_correctable: int | None = None
    remap_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    sram_corrected_volatile: int | None = None
    sram_corrected_aggregate: int | None = None
    sram_uncorrected_volatile: int | None = None
    sram_uncorrected_aggregate: int | None = None
    dram_corrected_volatile: int | None = None
    dram_corrected_aggregate: int | None = None
    dram_uncorrected_volatile: int | None = None
    dram_uncorrected_aggregate: int | None = None
    retired_single_bit: int | None = None
    retired_double_bit: int | None = None
    retirement_pending: bool | None = None

    def reported(self) -> dict[str, int]:
        """The counters that have a value, for the report's detail."""
        return {f.name: int(getattr(self, f.name)) for f in fields(self)
                if getattr(self, f.name) is not None and f.name != "ecc_enabled"}


def _over(limit: int | None, *values: int | None) -> list[int]:
    return [v for v in values if v is not None and limit is not None and v > limit]


def grade_memory(c: MemoryCounters, limits: EccLimits) -> tuple[str, list[str]]:
    """(status, problems) of one GPU under azure_gpu_ecc.nhc's rules (module docstring)."""
    failures: list[str] = []
    warnings: list[str] = []
    if c.ecc_enabled is False:
        warnings.append("ECC is disabled")
    if c.remap_pending:
        failures.append("row remapping pending (reset the GPU to use the spare row)")
    if c.remap_failure:
        failures.append("row remapping failed (spare rows exhausted: replace the GPU)")
    if c.remap_uncorrectable is not None and c.remap_uncorrectable > REMAP_UNCORRECTABLE_LIMIT:
        failures.append(f"{c.remap_uncorrectable} rows remapped for uncorrectable errors (more than {REMAP_UNCORRECTABLE_LIMIT})")
    if _over(limits.sram_correctable, c.sram_corrected_volatile, c.sram_corrected_aggregate):
        failures.append(f"correctable SRAM errors {c.sram_corrected_volatile} volatile / {c.sram_corrected_aggregate} "
                        f"aggregate, above {limits.sram_correctable}")
    if c.sram_uncorrected_volatile:
        failures.append(f"{c.sram_uncorrected_volatile} uncorrectable SRAM error(s) since the driver loaded")
    elif c.sram_uncorrected_aggregate:
        failures.append(f"{c.sram_uncorrected_aggregate} uncorrectable SRAM error(s) in the GPU's lifetime "
                        "(SRAM has no spare rows: a reset does not make it whole)")
    dram = (c.dram_uncorrected_volatile, c.dram_uncorrected_aggregate, c.dram_corrected_volatile, c.dram_corrected_aggregate)
    if _over(limits.dram, *dram):
        failures.append("DRAM ECC errors (uncorrected volatile/aggregate, corrected volatile/aggregate) "
                        f"{'/'.join(str(v) for v in dram)}, above {limits.dram}")
    retired = (c.retired_single_bit or 0) + (c.retired_double_bit or 0)
    if c.retirement_pending and retired >= RETIREMENT_TABLE_PAGES:
        failures.append(f"page retirement table full: {retired} retired pages with a retirement pending")
    elif c.retirement_pending:
        warnings.append(f"page retirement pending ({retired} retired pages): reset the GPU to apply it")
    if failures:
        return FAIL, failures + warnings
    return (WARN, warnings) if warnings else (PASS, [])


# --- NVML -------------------------------------------------------------------------------

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


def _const(lib: Any, name: str, default: int) -> int:
    return getattr(lib, name, default)


def nvml_counters(lib: Any, handle: Any) -> MemoryCounters:
    """One GPU's counters through NVML (a query the GPU does not support stays None)."""
    c = MemoryCounters()
    try:
        current, _pending = _query(lib, lib.nvmlDeviceGetEccMode, handle)
        c.ecc_enabled = bool(current)
    except _Unsupported:
        pass
    try:
        corrected, uncorrected, pending, failure = _query(lib, lib.nvmlDeviceGetRemappedRows, handle)
        c.remap_correctable, c.remap_uncorrectable = int(corrected), int(uncorrected)
        c.remap_pending, c.remap_failure = bool(pending), bool(failure)
    except _Unsupported:
        pass
    kinds = {"corrected": _const(lib, "NVML_MEMORY_ERROR_TYPE_CORRECTED", _CORRECTED),
             "uncorrected": _const(lib, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", _UNCORRECTED)}
    counters = {"volatile": _const(lib, "NVML_VOLATILE_ECC", _VOLATILE_ECC),
                "aggregate": _const(lib, "NVML_AGGREGATE_ECC", _AGGREGATE_ECC)}
    locations = {"sram": _const(lib, "NVML_MEMORY_LOCATION_SRAM", _LOCATION_SRAM),
                 "dram": _const(lib, "NVML_MEMORY_LOCATION_DRAM", _LOCATION_DRAM)}
    for location, location_id in locations.items():
        for kind, kind_id in kinds.items():
            for counter, counter_id in counters.items():
                try:
                    value = _query(lib, lib.nvmlDeviceGetMemoryErrorCounter, handle, kind_id, counter_id, location_id)
                except _Unsupported:
                    continue
                setattr(c, f"{location}_{kind}_{counter}", int(value))
    try:
        c.retired_single_bit = len(_query(lib, lib.nvmlDeviceGetRetiredPages, handle,
                                          _const(lib, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", _CAUSE_SINGLE_BIT)))
        c.retired_double_bit = len(_query(lib, lib.nvmlDeviceGetRetiredPages, handle,
                                          _const(lib, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", _CAUSE_DOUBLE_BIT)))
        c.retirement_pending = bool(_query(lib, lib.nvmlDeviceGetRetiredPagesPendingStatus, handle))
    except _Unsupported:
        pass
    return c


# --- nvidia-smi -q ----------------------------------------------------------------------

_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_VALUE = re.compile(r"^(\s+)(\S.*?)\s+:\s+(.*?)\s*$")
_HEADING = re.compile(r"^(\s+)(\S[^:]*?)\s*$")
_SMI_FIELDS = {
    ("ECC Errors", "Volatile", "SRAM Correctable"): "sram_corrected_volatile",
    ("ECC Errors", "Volatile", "SRAM Uncorrectable"): "sram_uncorrected_volatile",
    ("ECC Errors", "Volatile", "SRAM Uncorrectable Parity"): "sram_uncorrected_volatile",
    ("ECC Errors", "Volatile", "SRAM Uncorrectable SEC-DED"): "sram_uncorrected_volatile",
    ("ECC Errors", "Volatile", "DRAM Correctable"): "dram_corrected_volatile",
    ("ECC Errors", "Volatile", "DRAM Uncorrectable"): "dram_uncorrected_volatile",
    ("ECC Errors", "Aggregate", "SRAM Correctable"): "sram_corrected_aggregate",
    ("ECC Errors", "Aggregate", "SRAM Uncorrectable"): "sram_uncorrected_aggregate",
    ("ECC Errors", "Aggregate", "SRAM Uncorrectable Parity"): "sram_uncorrected_aggregate",
    ("ECC Errors", "Aggregate", "SRAM Uncorrectable SEC-DED"): "sram_uncorrected_aggregate",
    ("ECC Errors", "Aggregate", "DRAM Correctable"): "dram_corrected_aggregate",
    ("ECC Errors", "Aggregate", "DRAM Uncorrectable"): "dram_uncorrected_aggregate",
    ("Retired Pages", "Single Bit ECC"): "retired_single_bit",
    ("Retired Pages", "Double Bit ECC"): "retired_double_bit",
    ("Remapped Rows", "Correctable Error"): "remap_correctable",
    ("Remapped Rows", "Uncorrectable Error"): "remap_uncorrectable",
}
_SMI_FLAGS = {
    ("ECC Mode", "Current"): ("ecc_enabled", "Enabled"),
    ("Retired Pages", "Pending Page Blacklist"): ("retirement_pending", "Yes"),
    ("Remapped Rows", "Pending"): ("remap_pending", "Yes"),
    ("Remapped Rows", "Remapping Failure Occurred"): ("remap_failure", "Yes"),
}


def parse_smi_memory(text: str) -> dict[str, MemoryCounters]:
    """{GPU bus id: counters} from `nvidia-smi -q` (any of its ECC, ROW_REMAPPER and
    PAGE_RETIREMENT sections; both the older single "SRAM Uncorrectable" line and the newer
    Parity / SEC-DED pair, which are added up). "N/A" and elided lines are left out; lines
    before any GPU line (a quoted section) count as GPU "unknown"."""
    gpus: dict[str, MemoryCounters] = {}
    current: MemoryCounters | None = None
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        header = _GPU.match(line)
        if header:
            current = gpus.setdefault(header.group(1), MemoryCounters())
            stack = []
            continue
        value = _VALUE.match(line)
        heading = None if value else _HEADING.match(line)
        match = value or heading
        if not match:
            continue
        if current is None:  # a quoted section without its GPU line
            current = gpus.setdefault("unknown", MemoryCounters())
        indent = len(match.group(1).expandtabs(8))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if value is None:  # a heading (match is value or heading)
            assert heading is not None
            stack.append((indent, heading.group(2)))
            continue
        names = tuple(name for _, name in stack) + (value.group(2),)
        path = next((names[-n:] for n in (3, 2) if names[-n:] in _SMI_FIELDS or names[-n:] in _SMI_FLAGS), None)
        raw = value.group(3)
        if path in _SMI_FLAGS:
            name, true_text = _SMI_FLAGS[path]
            if raw in ("Yes", "No", "Enabled", "Disabled"):
                setattr(current, name, raw == true_text)
        elif path in _SMI_FIELDS and raw.isdigit():
            name = _SMI_FIELDS[path]
            setattr(current, name, (getattr(current, name) or 0) + int(raw))
    return {bus: counters for bus, counters in gpus.items() if counters != MemoryCounters()}


# --- the check ----------------------------------------------------------------------------

def _result(subject: str, counters: MemoryCounters, limits: EccLimits, source: str) -> CheckResult:
    status, problems = grade_memory(counters, limits)
    detail = "; ".join(problems) or "no pending or failed remaps, no uncorrectable SRAM errors, counters within Azure's limits"
    reported = counters.reported()
    if reported:
        detail += " [" + ", ".join(f"{k}={v}" for k, v in sorted(reported.items())) + f"] ({source})"
    return CheckResult("ecc", subject, status, detail=detail)


def _from_nvidia_smi(tools, limits: EccLimits, expected_gpus: int, why_not_nvml: str) -> list[CheckResult]:
    from amlhpc.jobs.runtime.health.tools import tool_problem

    if not tools.which("nvidia-smi"):
        return [CheckResult("ecc", "node", NOT_CHECKED, detail=f"{why_not_nvml}, and nvidia-smi is not on PATH: "
                            "GPU memory errors not read (install nvidia-ml-py in the image, or run with the NVIDIA "
                            "container runtime's utility capability)")]
    code, text = tools.run(SMI_QUERY, 60)
    missing = tool_problem("nvidia-smi", code, text)
    if missing:
        return [CheckResult("ecc", "node", NOT_CHECKED, detail=f"{why_not_nvml}; {missing}: GPU memory errors not read")]
    gpus = parse_smi_memory(text)
    if not gpus:
        return [CheckResult("ecc", "node", FAIL, 0.0, "GPUs", float(expected_gpus) if expected_gpus else None,
                            f"{' '.join(SMI_QUERY)} listed no GPU (exit {code}): {text.strip()[:200]}")]
    return [_result(f"gpu{index} {bus}", counters, limits, "nvidia-smi")
            for index, (bus, counters) in enumerate(gpus.items())]


def check_ecc(session: NvmlSession, expected_gpus: int, limits: EccLimits | None = None, tools=None) -> list[CheckResult]:
    """One `ecc` result per GPU: NVML where it is open, else nvidia-smi (through `tools`),
    else not-checked (the size has GPUs whose memory nothing read)."""
    limits = limits or EccLimits()
    if session.lib is None:
        if tools is None:
            return [CheckResult("ecc", "node", NOT_CHECKED, detail=f"{session.reason}: GPU memory errors not read")]
        return _from_nvidia_smi(tools, limits, expected_gpus, session.reason)
    lib = session.lib
    results = []
    for index in range(lib.nvmlDeviceGetCount()):
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        subject = f"gpu{index} {bus_id(lib, handle)}"
        try:
            counters = nvml_counters(lib, handle)
        except lib.NVMLError as exc:
            results.append(CheckResult("ecc", subject, FAIL, detail=f"NVML query failed: {error_text(lib, exc)}"))
            continue
        results.append(_result(subject, counters, limits, "NVML"))
    if not results and expected_gpus:
        results.append(CheckResult("ecc", "node", FAIL, 0.0, "GPUs", float(expected_gpus), "NVML sees no GPU"))
    return results
