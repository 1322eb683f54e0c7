"""The GEMM check with DCGM's ubergemm, the tool Azure's GEMM marks were measured with.

Azure's baselines (Azure/ai-infrastructure-on-azure skills/ai-infra/references/sku_baselines.md
and gpu_validation.md, read 2026-11-26) are "GPU GEMM (ubergemm, 60 s)" per GPU: one process per
GPU, every GPU of the node at once, `CUDA_VISIBLE_DEVICES=<gpu> ubergemm -t 60`. ubergemm prints
lines like `GFlops:1.85620e+06 GFlops` (GFLOP/s); Azure's batch script
(infrastructure_validations/slurm/gpu_test/gpu_test.slurm) averages the lines after ubergemm's
"starting" line, its steady state, leaving out zeros. This module does the same and grades
each GPU against the size's mark.

The binary comes with DCGM's proprietary CUDA plugins (datacenter-gpu-manager-4-proprietary-cuda<N>;
from DCGM 4.7 also its own package, datacenter-gpu-manager-4-cuda<N>-ubergemm2) at
/usr/libexec/datacenter-gpu-manager-4/plugins/cuda<N>/updated/ubergemm, not on PATH; the
aml-hpc images link it as `ubergemm` (amlhpc/images/common/bin/install_health_tools.sh).
"""

from __future__ import annotations

import re
import statistics
import threading
from collections.abc import Mapping
from pathlib import Path

from amlhpc.jobs.runtime.health.grading import FAIL, grade_band, warn_only
from amlhpc.jobs.runtime.health.results import CheckResult
from amlhpc.jobs.runtime.health.tools import Tools

PLUGIN_PATHS = tuple(Path(f"/usr/libexec/datacenter-gpu-manager-4/plugins/cuda{major}/{sub}ubergemm")
                     for major in (13, 12) for sub in ("updated/", ""))
"""Where DCGM installs ubergemm; "updated" is the build Azure's scripts run."""
TIMEOUT_MARGIN_S = 180.0
"""Time beyond the run's own for start-up and tuning before a stuck ubergemm counts as failed."""
_GFLOPS = re.compile(r"GFlops:\s*([0-9][0-9.]*(?:[eE][+-]?[0-9]+)?)")


def find_ubergemm(tools: Tools) -> str | None:
    """ubergemm on PATH, else at one of DCGM's plugin paths, else None."""
    on_path = tools.which("ubergemm")
    if on_path:
        return on_path
    return next((str(path) for path in PLUGIN_PATHS if tools.executable(path)), None)


def parse_gflops(text: str) -> float | None:
    """Mean GFLOP/s of ubergemm's steady state (the GFlops lines after "starting", or all of
    them when it printed no such line), zeros left out; None when there is no figure."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "starting" in line.lower()), -1)
    figures = [float(m.group(1)) for line in lines[start + 1:] for m in _GFLOPS.finditer(line)]
    figures = [f for f in figures if f > 0]
    return statistics.fmean(figures) if figures else None


def _devices(environ: Mapping[str, str], count: int) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value that shows ubergemm only the gate's GPU i."""
    visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return [visible[i] if i < len(visible) else str(i) for i in range(count)]


def run_all(tools: Tools, binary: str, devices: list[str], seconds: float) -> list[tuple[int, str]]:
    """(exit code, output) per device, every device at once, as Azure's script runs them."""
    answers: list[tuple[int, str]] = [(1, "not run")] * len(devices)

    def one(i: int) -> None:
        command = ["env", f"CUDA_VISIBLE_DEVICES={devices[i]}", binary, "-t", f"{seconds:g}"]
        answers[i] = tools.run(command, seconds + TIMEOUT_MARGIN_S)

    threads = [threading.Thread(target=one, args=(i,), name=f"ubergemm-gpu{i}") for i in range(len(devices))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def ubergemm_results(tools: Tools, binary: str, band: tuple[float, float, float], seconds: float,
                     subjects: list[str], environ: Mapping[str, str], measured_on: str = "") -> list[CheckResult]:
    """One gemm result per GPU from ubergemm, graded against the size's (ubergemm) mark; a mark
    measured on another size (`measured_on`) only warns."""
    expected, warn, fail = band
    how = (f"DCGM ubergemm -t {seconds:g} on every GPU at once ({binary}), steady-state mean, Azure's "
           f"ubergemm baseline ~{expected:g} TFLOP/s (warn below {warn:g}, fail below {fail:g})")
    if measured_on:
        how += f"; the mark was measured on {measured_on}, not this size: below it warns, never fails"
    results = []
    for subject, (code, text) in zip(subjects, run_all(tools, binary, _devices(environ, len(subjects)), seconds),
                                     strict=True):
        gflops = parse_gflops(text) if code == 0 else None
        if gflops is None:
            why = f"exit {code}" if code != 0 else "no GFlops line"
            tail = " ".join(text.strip().splitlines()[-4:])[-300:] or "no output"
            results.append(CheckResult("gemm", subject, FAIL, detail=f"ubergemm failed ({why}): {tail}"))
            continue
        tflops = gflops / 1000.0
        status = warn_only(grade_band(tflops, warn, fail), measured_on)
        results.append(CheckResult("gemm", subject, status, tflops, "TFLOP/s", fail, how))
    return results
