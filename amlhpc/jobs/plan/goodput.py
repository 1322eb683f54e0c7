"""Goodput planning: how much of a run's time is useful work, given how often it is
interrupted, what a checkpoint costs and how long a recovery takes - and the checkpoint
interval that loses least.

Figures and formulas, with their sources:

- Unexpected interruptions: Meta's Llama 3 report (arXiv 2407.21783, "The Llama 3 Herd of
  Models", 2024-07, section 3.3.4) counts 419 unexpected interruptions in 54 days of
  pre-training on 16,384 H100 GPUs: 419 / (16,384 x 54 x 24) = 1.97e-5 per GPU-hour
  (about 78 % of them hardware). Azure publishes no failure rate per size; the same rate
  per GPU is assumed for every size (`--failure-rate` to use yours).
- Low-priority preemption: Azure publishes no eviction rate for AmlCompute low-priority
  nodes; the rate is an assumption (`--preemption-rate`, per node-hour; 0 on Dedicated).
- Checkpoint write time: the checkpoint's size at the job's upload rate (writers x the
  per-writer cap the job builder sets, at most the account's ingress; amlhpc/jobs/plan/build.py);
  restore: the size at the account's egress; plus a restart overhead (detection, a new
  job's queue and start-up, staging), measured by `python -m bench.recovery` on the
  rehearsal and assumed at RESTART_S in Azure.
- The interval that loses least: Young's first-order optimum sqrt(2 x delta x M)
  (J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM
  17(9), 1974) and Daly's higher-order one for delta < 2M (J. T. Daly, "A higher order
  estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3), 2006),
  where delta is the checkpoint's cost and M the mean time between interruptions.
- Expected goodput, first order: 1 - delta/tau - (R + tau/2)/M for an interval tau and
  a recovery R: each checkpoint costs delta, each interruption loses the recovery and half
  an interval of work on average.

Pure: no I/O, no Azure SDK.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LLAMA3_INTERRUPTIONS = 419
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54
FAILURES_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_GPUS * LLAMA3_DAYS * 24)
FAILURE_SOURCE = ("Meta, The Llama 3 Herd of Models (arXiv 2407.21783, 2024): 419 unexpected interruptions in "
                  "54 days on 16,384 H100 GPUs")
RESTART_S = 600.0
"""Assumed recovery in Azure: detection (a poll), backoff, a new job's queue, node start,
image pull and staging. Measure yours; the rehearsal's is in bench/RESULTS.md."""
FAR_FROM_OPTIMUM = 2.0
"""Warn when the recipe's interval is this many times longer or shorter than the optimum."""
DEFAULT_CHECKPOINT_GB = 1.0
BYTES_PER_PARAMETER = 16
"""Mixed-precision Adam state per parameter: fp16/bf16 weights and gradients, fp32 master
weights, momentum and variance (ZeRO, arXiv 1910.02054, 2019: 2 + 2 + 12 bytes)."""


@dataclass(frozen=True)
class Inputs:
    nodes: int
    gpus_per_node: int
    hours: float
    """Useful hours of training (the recipe's expected hours)."""
    usd_per_node_hour: float
    interval_s: float
    """The recipe's checkpoint interval."""
    checkpoint_gb: float
    write_gbps: float
    restore_gbps: float
    preemptions_per_node_hour: float = 0.0
    failures_per_gpu_hour: float = FAILURES_PER_GPU_HOUR
    restart_s: float = RESTART_S


@dataclass(frozen=True)
class Plan:
    inputs: Inputs
    mtbi_h: float
    """Mean time between interruptions of the job, hours."""
    checkpoint_s: float
    """delta: writing one checkpoint."""
    recovery_s: float
    """R: restart overhead plus restoring the checkpoint."""
    young_s: float
    daly_s: float
    goodput: float
    """At the recipe's interval."""
    optimal_goodput: float
    """At Daly's interval."""
    wall_hours: float
    interruptions: float
    usd_per_useful_hour: float

    @property
    def far_from_optimum(self) -> bool:
        ratio = self.inputs.interval_s / self.daly_s if self.daly_s > 0 else 1.0
        return ratio > FAR_FROM_OPTIMUM or ratio < 1 / FAR_FROM_OPTIMUM


def young(delta_s: float, mtbi_s: float) -> float:
    return math.sqrt(2 * delta_s * mtbi_s)


def daly(delta_s: float, mtbi_s: float) -> float:
    """Daly's higher-order optimum (for delta < 2M; else the mean time between interruptions)."""
    if delta_s >= 2 * mtbi_s:
        return mtbi_s
    x = math.sqrt(delta_s / (2 * mtbi_s))
    return math.sqrt(2 * delta_s * mtbi_s) * (1 + x / 3 + x * x / 9) - delta_s


def goodput(interval_s: float, delta_s: float, recovery_s: float, mtbi_s: float) -> float:
    """Useful share of the wall time, first order (never below 0)."""
    if interval_s <= 0:
        return 0.0
    return max(0.0, 1 - delta_s / interval_s - (recovery_s + interval_s / 2) / mtbi_s)


def loss_per_interruption_s(interval_s: float, recovery_s: float) -> float:
    """Expected wall time one interruption costs: the recovery and half an interval of work."""
    return recovery_s + interval_s / 2


def make(i: Inputs) -> Plan:
    rate_h = i.failures_per_gpu_hour * i.nodes * i.gpus_per_node + i.preemptions_per_node_hour * i.nodes
    mtbi_h = 1 / rate_h if rate_h > 0 else math.inf
    delta = i.checkpoint_gb * 8 / i.write_gbps if i.write_gbps > 0 else 0.0
    recovery = i.restart_s + (i.checkpoint_gb * 8 / i.restore_gbps if i.restore_gbps > 0 else 0.0)
    mtbi_s = mtbi_h * 3600
    best_young = young(delta, mtbi_s) if math.isfinite(mtbi_s) else math.inf
    best_daly = daly(delta, mtbi_s) if math.isfinite(mtbi_s) else math.inf
    useful = goodput(i.interval_s, delta, recovery, mtbi_s)
    best = goodput(best_daly, delta, recovery, mtbi_s) if math.isfinite(best_daly) else 1.0
    wall = i.hours / useful if useful > 0 else math.inf
    return Plan(i, mtbi_h, delta, recovery, best_young, best_daly, useful, best, wall, wall * rate_h,
                i.nodes * i.usd_per_node_hour / useful if useful > 0 else math.inf)


def checkpoint_gb(parameters: int | None, given: float | None) -> tuple[float, str]:
    """The checkpoint's size and where it comes from."""
    if given is not None:
        return given, "--checkpoint-gb"
    if parameters:
        return parameters * BYTES_PER_PARAMETER / 1e9, f"{parameters / 1e6:,.0f}M parameters x {BYTES_PER_PARAMETER} bytes"
    return DEFAULT_CHECKPOINT_GB, "assumed: the model size is unknown, set --checkpoint-gb"


def upload_gbps(checkpoint: dict, nodes: int, processes_per_node: int) -> float:
    """The job's checkpoint upload rate: writers x per-writer cap, at most the account's ingress."""
    writers = {"rank0": 1, "per_node": nodes, "per_rank": nodes * processes_per_node}.get(str(checkpoint.get("writers")), 1)
    cap = checkpoint.get("cap_mbps")
    ingress = float(checkpoint.get("ingress_gbps") or 0) or math.inf
    rate = writers * cap / 1000 if cap else ingress
    return min(rate, ingress)


def finite(value: float) -> float | None:
    """A figure as JSON carries it: None where it is infinite (no interruption, or no useful work)."""
    return value if math.isfinite(value) else None


def to_json(p: Plan, *, size_source: str) -> dict:
    """`estimate --json`'s goodput: every figure finite or null (null: never, or unbounded)."""
    i = p.inputs
    return {"interruptionsPerHour": round(1 / p.mtbi_h, 9) if math.isfinite(p.mtbi_h) and p.mtbi_h > 0 else 0.0,
            "meanHoursBetweenInterruptions": finite(p.mtbi_h),
            "preemptionsPerNodeHour": i.preemptions_per_node_hour, "failuresPerGpuHour": i.failures_per_gpu_hour,
            "checkpointGb": i.checkpoint_gb, "checkpointSizeSource": size_source, "checkpointWriteS": p.checkpoint_s,
            "recoveryS": p.recovery_s, "intervalS": i.interval_s, "optimalIntervalS": finite(p.daly_s),
            "youngIntervalS": finite(p.young_s), "goodput": p.goodput, "optimalGoodput": p.optimal_goodput,
            "usefulHours": i.hours, "wallHours": finite(p.wall_hours), "expectedInterruptions": finite(p.interruptions),
            "usdPerUsefulHour": finite(p.usd_per_useful_hour), "finishes": p.goodput > 0,
            "farFromOptimum": p.far_from_optimum if math.isfinite(p.daly_s) else False}


def _every(mtbi_h: float) -> str:
    return f"1 every {mtbi_h:,.1f} h" if math.isfinite(mtbi_h) else "none expected"


def describe(p: Plan, *, size_source: str, priority: str) -> list[str]:
    """What `estimate` and `submit --managed --dry-run` print: every figure finite (a job that
    does no useful work says so instead of printing infinities)."""
    i = p.inputs
    lines = [
        f"interruptions: {_every(p.mtbi_h)} on {i.nodes} x {i.gpus_per_node} GPUs "
        f"({i.failures_per_gpu_hour:.2e} per GPU-hour: {FAILURE_SOURCE})"
        + (f" + low-priority preemption {i.preemptions_per_node_hour:g} per node-hour (assumed)"
           if i.preemptions_per_node_hour else (" (no preemption: Dedicated)" if priority == "Dedicated" else
                                                " (low-priority preemption rate not given: --preemption-rate)")),
        f"checkpoint: {i.checkpoint_gb:,.2f} GB ({size_source}); write {p.checkpoint_s:,.1f} s at {i.write_gbps:,.1f} Gb/s, "
        f"recovery {p.recovery_s:,.0f} s (restart {i.restart_s:,.0f} s assumed + restore at {i.restore_gbps:,.1f} Gb/s)",
        (f"checkpoint interval: recipe {i.interval_s:,.0f} s; least loss at {p.daly_s:,.0f} s (Daly; Young "
         f"{p.young_s:,.0f} s)" if math.isfinite(p.daly_s) else
         f"checkpoint interval: recipe {i.interval_s:,.0f} s; with no interruption expected, any interval loses nothing"),
    ]
    if p.goodput <= 0:
        lines.append(f"expected: no useful work - an interruption every {p.mtbi_h * 60:,.1f} min costs {p.recovery_s:,.0f} s "
                     f"of recovery plus half of the {i.interval_s:,.0f} s interval, so the job never finishes its "
                     f"{i.hours:g} useful hours (goodput 0%; at the optimum interval {p.optimal_goodput:.1%}); fix: "
                     "check --preemption-rate/--failure-rate (per node-hour and per GPU-hour), use fewer nodes or Dedicated")
        return lines
    lines.append(f"expected: {p.interruptions:,.2f} interruption(s) over {p.wall_hours:,.1f} h of wall time for {i.hours:g} "
                 f"useful hours; goodput {p.goodput:.1%} (at the optimum {p.optimal_goodput:.1%}); "
                 f"${p.usd_per_useful_hour:,.2f} per useful hour")
    if math.isfinite(p.daly_s) and p.far_from_optimum:
        lines.append(f"warning: the recipe's checkpoint interval ({i.interval_s:,.0f} s) is far from the optimum "
                     f"({p.daly_s:,.0f} s): set checkpoint.interval_s near it")
    return lines


def inputs_for(plan, recipe, outputs, *, preemption_rate: float | None = None, checkpoint_size_gb: float | None = None,
               failure_rate: float | None = None) -> tuple[Inputs, str]:
    """The planning inputs of a planned job (amlhpc.jobs.plan.build.JobPlan) and where its checkpoint size comes from."""
    import json

    from amlhpc.core import skus
    from amlhpc.jobs.runtime.base import contract

    checkpoint = json.loads(plan.environment_variables.get(contract.CHECKPOINT_JSON, "{}") or "{}")
    size, source = checkpoint_gb(plan.deepspeed.params if plan.deepspeed else None, checkpoint_size_gb)
    rate = preemption_rate if preemption_rate is not None else recipe.cost.preemptions_per_node_hour
    return Inputs(
        nodes=plan.instance_count, gpus_per_node=max(1, skus.get(plan.sku).gpus), hours=plan.estimate.hours,
        usd_per_node_hour=plan.estimate.usd_per_node_hour, interval_s=float(recipe.checkpoint.interval_s),
        checkpoint_gb=size, write_gbps=upload_gbps(checkpoint, plan.instance_count, plan.processes_per_node),
        restore_gbps=outputs.storage.egress_gbps,
        preemptions_per_node_hour=(rate or 0.0) if plan.priority == "LowPriority" else 0.0,
        failures_per_gpu_hour=FAILURES_PER_GPU_HOUR if failure_rate is None else failure_rate), source


def report(plan, recipe, outputs, **given) -> list[str]:
    """The goodput lines for a planned job."""
    inputs, source = inputs_for(plan, recipe, outputs, **given)
    return describe(make(inputs), size_source=source, priority=plan.priority)


def document(plan, recipe, outputs, **given) -> dict:
    """The goodput of a planned job as `estimate --json` gives it."""
    inputs, source = inputs_for(plan, recipe, outputs, **given)
    return to_json(make(inputs), size_source=source)
