"""Tokens per second and model FLOPs utilisation (MFU) of a training step; the peak and its
source come from amlhpc/jobs/workloads/peak.py (the catalog's on a GPU, a measured GEMM on a CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from amlhpc.jobs.workloads.peak import Peak, catalog_peak, kept, measured_cpu_peak, to_extra

__all__ = ["Peak", "StepRate", "catalog_peak", "kept", "measured_cpu_peak", "step_rate", "to_extra"]


@dataclass(frozen=True)
class StepRate:
    tokens_per_s: float
    tokens_per_s_per_device: float
    tflops_per_device: float
    mfu: float | None


def step_rate(tokens: int, seconds: float, devices: int, flops_per_token: float, peak: Peak | None) -> StepRate:
    """`tokens` trained by `devices` in `seconds` (one optimizer step)."""
    per_second = tokens / max(seconds, 1e-9)
    per_device = per_second / max(devices, 1)
    tflops = flops_per_token * per_device / 1e12
    return StepRate(per_second, per_device, tflops, tflops / peak.tflops if peak else None)
