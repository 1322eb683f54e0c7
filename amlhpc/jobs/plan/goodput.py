"""Goodput planning for a planned job: the model of amlhpc/core/goodput.py (the system as built:
two checkpoint tiers, failure classes from Meta's Llama 3 report, the measured stall and
recovery figures) fed with what the recipe and the stack say, and the lines `jobs submit`
(plain and --managed), `jobs estimate` and its --json show.

Where each input comes from:

- the state's size: the model's parameters x BYTES_PER_PARAMETER (DeepSpeed's plan, or
  llm-pretrain's `--model NAME`, or the shape `--model auto` picks for the job's GPUs), else
  `--checkpoint-gb`, else DEFAULT_CHECKPOINT_GB (said);
- the upload rate: writers x the per-writer cap the job builder sets, at most the account's
  ingress (amlhpc/jobs/plan/build.py); the restore rate: the account's egress;
- the Blob interval: checkpoint.interval_s; the watchdog's hang_s; the controller's backoff;
  checkpoint.local_restarts and local_keep;
- failure rates: core's Llama 3 breakdown per GPU-hour (`--failure-rate` scales it), and the
  recipe's or `--preemption-rate`'s low-priority preemptions per node-hour.

Pure apart from reading the plan: no Azure SDK.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from amlhpc.core import goodput as model
from amlhpc.core.goodput import FAILURES_PER_GPU_HOUR, LLAMA3_SOURCE

DEFAULT_CHECKPOINT_GB = 1.0
BYTES_PER_PARAMETER = 16
"""Mixed-precision Adam state per parameter: fp16/bf16 weights and gradients, fp32 master
weights, momentum and variance (ZeRO, arXiv 1910.02054, 2019: 2 + 2 + 12 bytes)."""
MATERIAL_POINTS = 0.01
"""Warn when the recipe's Blob interval costs at least this much goodput against the advised one."""
NO_USEFUL_WORK = 0.01
"""Below this goodput (wall time over 100x the useful hours) a run does no useful work to speak of:
it is said never to finish, with no wall time or cost per useful hour (the renewal model's goodput
reaches 0 only in the limit)."""


def checkpoint_gb(parameters: int | None, given: float | None) -> tuple[float, str]:
    """The state's size and where it comes from."""
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


def llm_parameters(command: str, gpu_memory_gib: float, world: int) -> int | None:
    """The parameters of llm-pretrain's model: `--model NAME` (a preset), or the shape `--model
    auto` picks for `world` GPUs of `gpu_memory_gib`; None for another command."""
    if "amlhpc.jobs.workloads.llm.train" not in command:
        return None
    from amlhpc.jobs.workloads.llm import sizing

    def arg(name: str, default: str) -> str:
        found = re.search(rf"--{name}[= ](\S+)", command)
        return found.group(1) if found else default

    name = arg("model", "auto")
    if name in sizing.PRESETS:
        return sizing.PRESETS[name].param_count()
    if name != "auto" or gpu_memory_gib <= 0:
        return None
    try:
        chosen, _ = sizing.choose(gpu_memory_gib=gpu_memory_gib, world=world, micro_batch=int(arg("micro-batch", "1")),
                                  seq_len=int(arg("seq-len", "4096")))
    except ValueError:
        return None
    return chosen.param_count()


def inputs_for(plan, recipe, outputs, *, preemption_rate: float | None = None, checkpoint_size_gb: float | None = None,
               failure_rate: float | None = None, managed: bool = True) -> tuple[model.Inputs, str]:
    """The model's inputs for a planned job (amlhpc.jobs.plan.build.JobPlan) and where the state's size comes from."""
    from amlhpc.core import skus
    from amlhpc.jobs.runtime.base import contract

    sku = skus.get(plan.sku)
    gpus_per_node = max(1, sku.gpus)
    checkpoint = json.loads(plan.environment_variables.get(contract.CHECKPOINT_JSON, "{}") or "{}")
    parameters = plan.deepspeed.params if plan.deepspeed else llm_parameters(
        plan.training_command, float(getattr(sku, "gpu_memory_gib", 0) or 0), plan.instance_count * plan.processes_per_node)
    size, source = checkpoint_gb(parameters, checkpoint_size_gb)
    rate = preemption_rate if preemption_rate is not None else recipe.cost.preemptions_per_node_hour
    interval = float(recipe.checkpoint.interval_s)
    figures = model.Figures(verified_versions=recipe.checkpoint.local_keep)
    return model.Inputs(
        nodes=plan.instance_count, gpus_per_node=gpus_per_node, state_gb=size,
        upload_gbps=upload_gbps(checkpoint, plan.instance_count, plan.processes_per_node),
        restore_gbps=outputs.storage.egress_gbps, blob_interval_s=interval,
        writers=str(checkpoint.get("writers") or "rank0"),
        hang_s=float(recipe.watchdog.hang_seconds(recipe.checkpoint.interval_s)),
        backoff_s=float(recipe.managed.backoff_s), local_restarts=recipe.checkpoint.local_restarts, managed=managed,
        preemptions_per_node_hour=(rate or 0.0) if plan.priority == "LowPriority" else 0.0,
        failures_per_gpu_hour=FAILURES_PER_GPU_HOUR if failure_rate is None else failure_rate, figures=figures), source


@dataclass(frozen=True)
class Outlook:
    """What the plan means for a run of `useful_hours`: whether it finishes, and in how long. At
    goodput below NO_USEFUL_WORK the run does no useful work to speak of: it never finishes in
    practice and its wall time and cost per useful hour are unbounded (None)."""

    useful_hours: float | None
    finishes: bool
    wall_hours: float | None
    failures: float | None
    """Expected failures over the wall time."""
    usd_per_useful_hour: float | None


def outlook(p: model.Plan, hours: float | None, usd_per_node_hour: float | None) -> Outlook:
    """At the advised node-tier interval and the recipe's Blob interval (what the job runs at)."""
    useful = p.goodput_recipe
    if useful < NO_USEFUL_WORK:
        return Outlook(hours, False, None, None, None)
    wall = hours / useful if hours else None
    return Outlook(hours, True, wall, wall * p.per_hour if wall is not None else None,
                   p.inputs.nodes * usd_per_node_hour / useful if usd_per_node_hour is not None else None)


def _every(hours: float) -> str:
    """`1 every 3.1 h`; `none expected` where nothing fails (no infinity in words)."""
    if not math.isfinite(hours):
        return "none expected"
    return f"1 every {hours:,.0f} h" if hours >= 100 else f"1 every {hours:,.1f} h"


def _at(gbps: float) -> str:
    return f"at {gbps:,.1f} Gb/s" if math.isfinite(gbps) else "at a rate the stack does not limit (not modelled)"


def describe(p: model.Plan, *, size_source: str, priority: str, hours: float | None = None,
             usd_per_node_hour: float | None = None) -> list[str]:
    """What `estimate` and `submit` print: every figure finite (nothing expected to fail reads
    `none expected`; a run that does no useful work says so instead of printing infinities)."""
    i, f = p.inputs, p.inputs.figures
    scaled = "" if i.failures_per_gpu_hour == FAILURES_PER_GPU_HOUR else f" (scaled to {i.failures_per_gpu_hour:.2e} per GPU-hour)"
    by_class = (f": process faults {_every(p.of(model.PROCESS).mtbf_h)}, GPU faults {_every(p.of(model.DEVICE).mtbf_h)}, "
                f"host losses {_every(p.of(model.HOST).mtbf_h)}" if i.failures_per_gpu_hour > 0 else "")
    lines = [
        f"failures on {i.nodes} x {i.gpus_per_node} GPUs: {_every(p.mtbi_h)}{by_class}{scaled} "
        f"({model.FAILURES_PER_GPU_HOUR:.2e} per GPU-hour, by cause: {LLAMA3_SOURCE})"
        + (f"; low-priority preemption {i.preemptions_per_node_hour:g} per node-hour (assumed)"
           if i.preemptions_per_node_hour else (" (no preemption: Dedicated)" if priority == "Dedicated" else
                                                "; low-priority preemption rate not given: --preemption-rate")),
        f"state: {i.state_gb:,.1f} GB ({size_source}); a node-tier save holds the training {p.stall_s:,.2f} s "
        f"({i.state_gb / max(i.gpus, 1):,.2f} GB per GPU at the measured {f.stall_gbps_per_gpu:,.2f} GB/s) and writes "
        f"for {p.write_s:,.0f} s behind it; a Blob upload takes {p.upload_s:,.0f} s {_at(i.upload_gbps)} and "
        "holds no training",
        f"recovery: a process fault {p.of(model.PROCESS).recovery_s:,.0f} s (in-job restart from the node tier); a GPU "
        f"fault {p.of(model.DEVICE).recovery_s:,.0f} s ({i.local_restarts} in-job restarts on the bad GPU, then a new "
        f"job and a Blob restore); a host loss {p.of(model.HOST).recovery_s:,.0f} s (found after hang_s "
        f"{i.hang_s:,.0f} s, then a new job: {f.new_job_s:,.0f} s assumed, and a Blob restore "
        f"{_at(i.restore_gbps)})",
        _intervals(p),
    ]
    ahead = outlook(p, hours, usd_per_node_hour)
    if not ahead.finishes:
        lines.append(f"expected: no useful work - a failure {_every(p.mtbi_h)} against recoveries of up to "
                     f"{max(c.recovery_s for c in p.classes):,.0f} s and the work since the last checkpoint, so the job "
                     f"never finishes{f' its {hours:g} useful hours' if hours else ''} (goodput "
                     f"{p.goodput_recipe:.1%} at the recipe's Blob interval, {p.goodput:.1%} at the advised ones); fix: "
                     "check --preemption-rate/--failure-rate (per node-hour and per GPU-hour), use fewer nodes or "
                     "Dedicated")
    else:
        useful = f"goodput {p.goodput:.1%} at these intervals, {p.goodput_recipe:.1%} at the recipe's Blob interval"
        if ahead.wall_hours is not None and ahead.failures is not None:
            useful += (f"; {hours:g} useful hours take {ahead.wall_hours:,.1f} h of wall time with "
                       f"{ahead.failures:,.2f} failure(s) expected")
        if ahead.usd_per_useful_hour is not None:
            useful += f", ${ahead.usd_per_useful_hour:,.2f} per useful hour"
        lines.append(useful)
    if p.goodput - p.goodput_recipe >= MATERIAL_POINTS:
        lines.append(f"warning: checkpoint.interval_s {i.blob_interval_s:,.0f} s costs "
                     f"{(p.goodput - p.goodput_recipe) * 100:.1f} points of goodput: set it near "
                     f"{p.blob_interval_s:,.0f} s")
    if not i.managed:
        ends = p.of(model.DEVICE).per_hour + p.of(model.HOST).per_hour + p.of("preemption").per_hour
        expected = f" (about {ends * hours:,.2f} over the run)" if hours and ends else ""
        lines.append(f"not managed: a GPU fault or a host loss ends this job ({_every(1 / ends if ends else math.inf)}"
                     f"{expected}) and nothing resubmits it; the figures above assume a resubmission as a managed "
                     "run's (submit --managed)")
    return lines


def _intervals(p: model.Plan) -> str:
    i = p.inputs
    recipe = f"recipe checkpoint.interval_s {i.blob_interval_s:,.0f} s"
    if not math.isfinite(p.node_interval_s):
        return (f"checkpoint intervals: with no failure expected any interval loses only its stall: save to the node "
                f"tier as seldom as you like (at least the write's {p.write_s:,.0f} s apart); {recipe}")
    node = (f"checkpoint intervals of least loss: node tier every {p.node_interval_s:,.0f} s (Daly "
            f"{p.node_daly_s:,.0f} s, Young {p.node_young_s:,.0f} s, at least the write's {p.write_s:,.0f} s: set the "
            "training's --checkpoint-every to about that many seconds of steps)")
    if not math.isfinite(p.blob_interval_s):
        return f"{node}; Blob: no failure expected needs its periodic version, any interval loses nothing ({recipe})"
    return (f"{node}; Blob every {p.blob_interval_s:,.0f} s (an upload stalls nothing: as often as one completes; "
            f"{recipe})")


def document(p: model.Plan, *, size_source: str, hours: float | None = None,
             usd_per_node_hour: float | None = None) -> dict[str, Any]:
    """The plan as data (`estimate --json`'s goodput): every number finite, null where it is
    unbounded (nothing fails, or the run never finishes); `finishes` says which."""
    ahead = outlook(p, hours, usd_per_node_hour)
    return {**p.to_json(), "finishes": ahead.finishes, "usefulHours": ahead.useful_hours,
            "wallHours": model.finite(ahead.wall_hours), "expectedFailures": model.finite(ahead.failures),
            "usdPerUsefulHour": model.finite(ahead.usd_per_useful_hour), "noUsefulWorkBelow": NO_USEFUL_WORK,
            "sizeSource": size_source, "failureSource": LLAMA3_SOURCE,
            "figureSources": {model.camel(k): v for k, v in model.FIGURE_SOURCES.items()}}


def plan_for(plan, recipe, outputs, **given) -> tuple[model.Plan, str]:
    inputs, source = inputs_for(plan, recipe, outputs, **given)
    return model.make(inputs), source


def report(plan, recipe, outputs, **given) -> list[str]:
    """The goodput lines for a planned job."""
    p, source = plan_for(plan, recipe, outputs, **given)
    return describe(p, size_source=source, priority=plan.priority, hours=plan.estimate.hours,
                    usd_per_node_hour=plan.estimate.usd_per_node_hour)


def report_document(plan, recipe, outputs, **given) -> dict[str, Any]:
    """The goodput of a planned job as `estimate --json` gives it."""
    p, source = plan_for(plan, recipe, outputs, **given)
    return document(p, size_source=source, hours=plan.estimate.hours, usd_per_node_hour=plan.estimate.usd_per_node_hour)
