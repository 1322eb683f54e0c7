"""Model FLOPs utilisation (MFU) for any workload: the device's peak, and the FLOPs a model needs.

MFU = the FLOPs the model needs per step / the step's seconds / the device's peak FLOP/s
(PaLM, arXiv:2204.02311 appendix B: the model's FLOPs, not what the hardware ran, so
activation recomputation does not count). The peak comes from:

- the catalog, on a GPU: the size's `peak_tflops_<dtype>` for the dtype the step computes in
  (dense tensor-core TFLOP/s per GPU, without sparsity; amlhpc/core/catalog/skus.toml with its
  source); where the catalog has no figure for that dtype, MFU is not reported;
- a measurement, on a CPU rehearsal: the best of a few fp32 GEMMs on this process's threads,
  so the figure says "of what a GEMM reaches here", and says so (`Peak.source`). It is
  measured once per run: the checkpoint carries it (`to_extra`), and an attempt that resumes
  uses the recorded figure (`kept`), so every attempt's MFU has the same denominator - a
  GEMM timed again on a busier machine would make MFU jump at each resume while the step
  time says nothing changed.

A model's FLOPs are counted by PyTorch's own counter (torch.utils.flop_counter) over one
forward and backward on the meta device: shapes only, nothing is computed or allocated.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Peak:
    tflops: float
    """Per device (GPU, or this process's CPU threads)."""
    source: str


def catalog_peak(facts, dtype: str) -> tuple[Peak | None, str]:
    """The catalog's peak for `dtype` ("bf16", "fp16") from the size's facts
    (amlhpc.jobs.runtime.node.skufacts.SkuFacts), or None and why not."""
    if facts is None:
        return None, "no SKU facts (AMLHPC_SKU_JSON) in this job"
    peak = getattr(facts, f"peak_tflops_{dtype}", None)
    if not peak:
        return None, f"the catalog has no peak {dtype} TFLOP/s for {facts.name}"
    return Peak(float(peak), f"catalog: {facts.name} peak_tflops_{dtype} (dense, per GPU)"), ""


def measured_cpu_peak(size: int = 384, repeats: int = 12) -> Peak:
    """The best fp32 GEMM rate of `repeats` size x size x size products on this process's threads
    (the best, so that a burst of load from elsewhere during some of them does not lower it)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # warm up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return Peak(2.0 * size**3 / best / 1e12,
                f"measured: best fp32 {size}^3 GEMM on {torch.get_num_threads()} CPU thread(s) of this process")


KEPT = "; measured when the run started, kept for every attempt (the checkpoint carries it)"


def to_extra(peak: Peak | None) -> dict:
    """The peak as a checkpoint's `extra` carries it (resume.TrainState.extra)."""
    return {"peak": {"tflops": peak.tflops, "source": peak.source.removesuffix(KEPT)}} if peak is not None else {}


def kept(measure, resumed_extra: dict) -> Peak:
    """The run's measured peak: the one the checkpoint recorded when resuming, else `measure()`."""
    recorded = resumed_extra.get("peak") if isinstance(resumed_extra, dict) else None
    if isinstance(recorded, dict) and isinstance(recorded.get("tflops"), int | float) and recorded["tflops"] > 0:
        return Peak(float(recorded["tflops"]), str(recorded.get("source") or "measured") + KEPT)
    return measure()


def train_flops(model: torch.nn.Module, example: torch.Tensor) -> float:
    """FLOPs of one forward and backward of `model` on `example` (its batch as given), counted
    on a meta-device copy of the model."""
    from torch.utils.flop_counter import FlopCounterMode

    meta = copy.deepcopy(model).to("meta")
    with FlopCounterMode(display=False) as counter:
        meta(example.to("meta")).float().sum().backward()
    return float(counter.get_total_flops())
