"""DeepSpeed planning (Azure's large-scale training guide): memory estimate, ZeRO stage and
offload, ds_config, autotuning space.

Model states per GPU follow DeepSpeed's own estimators (deepspeedai/DeepSpeed
`estimate_zero2_model_states_mem_needs` in deepspeed/runtime/zero/stage_1_and_2.py and
`estimate_zero3_model_states_mem_needs` in deepspeed/runtime/zero/stage3.py, version 0.19.6,
commit edaa722 of 2026-08-22). With P parameters, N GPUs and L parameters in the largest layer:

- stage 2 (`estimate_zero2_model_states_mem_needs`): 2P bytes of 16-bit parameters + 18P/N of
  partitioned 16-bit and 32-bit gradients, 32-bit master parameters and Adam's two moments; with
  the optimizer offloaded to the CPU (ZeRO-Offload) only the 2P stay on the GPU;
- stage 1: DeepSpeed ships no estimator of its own, and stage 2's undercounts it. Stage 1 runs
  the same optimizer class with `partition_grads=(zero_stage == gradients)` false
  (deepspeed/runtime/engine.py, same commit), so every GPU keeps the whole 16-bit gradient (2P)
  and only the 32-bit gradients, master parameters and moments (16P) are partitioned:
  4P + 16P/N, i.e. 2P(1 - 1/N) more than stage 2; optimizer offloaded: 4P (parameters and
  gradients in 16 bits stay on the GPU);
- stage 3: 4L (the largest layer, gathered) + 18P/N; optimizer offloaded: 4L + 2P/N; optimizer
  and parameters offloaded: 4L;
- stage 0 (no ZeRO) is the stage 2 formula with nothing partitioned: 20P.

Host memory per node follows the same estimators' `cpu_mem` (with their 1.5 buffer factor, G
GPUs per node, n nodes): stages 0-2 without offload 4P*G*1.5 (every rank loads the model);
stages 1-2 with the optimizer offloaded P*max(4*N, 16)*1.5 (DeepSpeed has no stage 1 estimator:
its offloaded states are stage 2's); stage 3 (zero.Init) 4L*G*1.5 without offload, 16P/n*1.5
with the optimizer offloaded, 18P/n*1.5 with the parameters too. An offload the node's memory
(the catalog's `memory_gib`) cannot hold is not chosen: it would swap or be killed.

Activations of a transformer layer in 16-bit without recomputation are about
s*b*h*(34 + 5*a*s/h) bytes (Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", 2022); with activation checkpointing only each layer's input
(2*s*b*h) is kept, plus one layer's activations during its recomputation.

The stage starts from the model size (Azure's large-scale training guide: < 300M -> 0, < 1B ->
1, < 10B -> 2, else 3) and is raised until model states and activations fit the GPU; CPU
offload comes only after that (the guide: "only use cpu_offload if not enough GPUs to fit"):
first the optimizer at the chosen stage 1-2 (ZeRO-Offload) or stage 3, then the parameters at
stage 3. Pure: no DeepSpeed import (it runs inside the job).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amlhpc.core import skus
from amlhpc.jobs.recipes.schema import DeepSpeedSpec, ModelShape

GIB = 1 << 30
USABLE_GPU_MEMORY_FRACTION = 0.9
"""Leave 10 % for the CUDA context, NCCL buffers and allocator fragmentation."""

_STAGE_BY_SIZE = ((300e6, 0), (1e9, 1), (10e9, 2))


def param_count(shape: ModelShape) -> int:
    """Parameters of a BERT-style encoder with a masked-LM head (decoder tied to embeddings)."""
    h, vocab = shape.hidden_size, shape.vocab_size
    inter = shape.intermediate_size or 4 * h
    embeddings = vocab * h + shape.max_position * h + 2 * h + 2 * h  # word, position, type, LayerNorm
    layer = 4 * (h * h + h) + 2 * h + (h * inter + inter) + (inter * h + h) + 2 * h
    pooler = h * h + h
    mlm_head = (h * h + h) + 2 * h + vocab  # transform, LayerNorm, decoder bias
    return embeddings + shape.num_layers * layer + pooler + mlm_head


def largest_layer(shape: ModelShape) -> int:
    """Parameters of the largest single module (what DeepSpeed's model_to_params counts): the
    word embeddings, or a feed-forward projection when it is bigger."""
    h = shape.hidden_size
    inter = shape.intermediate_size or 4 * h
    return max(shape.vocab_size * h, h * inter + inter, inter * h + h, shape.max_position * h)


def stage_by_size(params: int) -> int:
    for limit, stage in _STAGE_BY_SIZE:
        if params < limit:
            return stage
    return 3


def model_state_bytes_per_gpu(params: int, stage: int, gpus: int, *, largest_layer_params: int = 0,
                              offload_optimizer: bool = False, offload_param: bool = False) -> float:
    """Bytes of parameters, gradients and optimizer states one GPU holds (DeepSpeed's estimators)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0-3, got {stage}")
    if offload_param and (stage != 3 or not offload_optimizer):
        raise ValueError("parameter offload needs ZeRO stage 3 with the optimizer offloaded too")
    if offload_optimizer and stage == 0:
        raise ValueError("optimizer offload needs ZeRO stage 1 or more")
    n = max(gpus, 1)
    if stage == 0:
        return 2 * params + 18 * params
    if stage == 1:  # 16-bit gradients whole on every GPU; the rest partitioned
        return 4 * params if offload_optimizer else 4 * params + 16 * params / n
    if stage == 2:
        return 2 * params if offload_optimizer else 2 * params + 18 * params / n
    gathered = 4 * largest_layer_params
    if offload_param:
        return gathered
    return gathered + (2 if offload_optimizer else 18) * params / n


HOST_BUFFER_FACTOR = 1.5
"""DeepSpeed's estimators' `additional_buffer_factor` for host memory."""


def host_bytes_per_node(params: int, stage: int, gpus_per_node: int, nodes: int, *, largest_layer_params: int = 0,
                        offload_optimizer: bool = False, offload_param: bool = False) -> float:
    """Bytes of host memory one node needs (DeepSpeed's estimators' cpu_mem, module docstring)."""
    g, n = max(gpus_per_node, 1), max(nodes, 1)
    if stage == 3:
        if offload_param:
            need = 18 * params / n
        elif offload_optimizer:
            need = 16 * params / n
        else:
            need = 4 * largest_layer_params * g
    elif offload_optimizer:
        need = params * max(4 * g * n, 16)
    else:
        need = 4 * params * g
    return need * HOST_BUFFER_FACTOR


@dataclass(frozen=True)
class Option:
    """One ZeRO stage and offload combination, with its model states per GPU and host memory per node."""

    stage: int
    offload_optimizer: bool
    offload_param: bool
    bytes_per_gpu: float
    host_bytes_per_node: float = 0.0

    @property
    def gib_per_gpu(self) -> float:
        return self.bytes_per_gpu / GIB

    @property
    def label(self) -> str:
        offload = [n for n, on in (("optimizer", self.offload_optimizer), ("parameters", self.offload_param)) if on]
        return f"ZeRO {self.stage}" + (f" + {' and '.join(offload)} offloaded to CPU" if offload else "")

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "offload_optimizer": self.offload_optimizer, "offload_param": self.offload_param,
                "gib_per_gpu": round(self.gib_per_gpu, 3)}


COMBINATIONS = ((0, False, False), (1, False, False), (1, True, False), (2, False, False), (2, True, False),
                (3, False, False), (3, True, False), (3, True, True))
"""Every stage and offload combination DeepSpeed's estimators price."""
PREFERENCE = ((0, False, False), (1, False, False), (2, False, False), (3, False, False),
              (2, True, False), (3, True, False), (3, True, True))
"""Fastest first: more partitioning before any offload, then the optimizer before the parameters.
ZeRO-Offload at stage 1 keeps the whole 16-bit gradient (4P on the GPU) and is used only when a recipe fixes stage 1."""


def options(params: int, largest_layer_params: int, gpus: int, gpus_per_node: int | None = None) -> list[Option]:
    """Model states per GPU and host memory per node for every combination, in COMBINATIONS order
    (`gpus_per_node` defaults to all GPUs on one node)."""
    per_node = gpus_per_node or gpus
    nodes = -(-max(gpus, 1) // max(per_node, 1))
    return [Option(stage, opt, par,
                   model_state_bytes_per_gpu(params, stage, gpus, largest_layer_params=largest_layer_params,
                                             offload_optimizer=opt, offload_param=par),
                   host_bytes_per_node(params, stage, min(per_node, gpus), nodes, largest_layer_params=largest_layer_params,
                                       offload_optimizer=opt, offload_param=par))
            for stage, opt, par in COMBINATIONS]


def choose(candidates: list[Option], usable_bytes: float, extra_bytes: float = 0.0, *, min_stage: int = 0,
           stage: int | None = None, host_bytes: float | None = None) -> tuple[Option | None, list[str]]:
    """The first option in PREFERENCE order (at `stage` if given, else from `min_stage` up) whose
    model states plus `extra_bytes` fit in `usable_bytes`, and whose host memory fits in
    `host_bytes` when given; None when none does. With reasons."""
    by_key = {(o.stage, o.offload_optimizer, o.offload_param): o for o in candidates}
    if stage is not None:
        order = [k for k in COMBINATIONS if k[0] == stage]  # no offload, then the optimizer, then the parameters
    else:
        order = [k for k in PREFERENCE if k[0] >= min_stage]
    reasons: list[str] = []
    for key in order:
        option = by_key[key]
        total = option.bytes_per_gpu + extra_bytes
        if total > usable_bytes:
            reasons.append(f"{option.label}: {total / GIB:,.1f} GiB would not fit in {usable_bytes / GIB:,.1f} GiB")
        elif host_bytes is not None and option.host_bytes_per_node > host_bytes:
            reasons.append(f"{option.label}: {option.host_bytes_per_node / GIB:,.1f} GiB of host memory per node would not "
                           f"fit in the node's {host_bytes / GIB:,.0f} GiB")
        else:
            return option, reasons
    return None, reasons


def activation_bytes_per_gpu(shape: ModelShape, micro_batch: int, checkpointing: bool) -> float:
    s, b, h, a = shape.seq_len, micro_batch, shape.hidden_size, shape.num_heads
    per_layer = s * b * h * (34 + 5 * a * s / h)
    if checkpointing:
        return shape.num_layers * 2 * s * b * h + per_layer
    return shape.num_layers * per_layer


@dataclass(frozen=True)
class MemoryPlan:
    params: int
    world: int
    stage: int
    offload_optimizer: bool
    offload_param: bool
    model_state_gib: float
    activations_gib: float
    gpu_memory_gib: float
    usable_gib: float
    reasons: list[str] = field(default_factory=list)
    host_gib_per_node: float = 0.0
    host_memory_gib: float | None = None

    @property
    def offload(self) -> bool:
        return self.offload_optimizer or self.offload_param

    @property
    def total_gib(self) -> float:
        return self.model_state_gib + self.activations_gib

    @property
    def fits(self) -> bool:
        host_ok = self.host_memory_gib is None or self.host_gib_per_node <= self.host_memory_gib
        return self.total_gib <= self.usable_gib and host_ok

    def to_json(self) -> dict[str, Any]:
        return {"params": self.params, "world": self.world, "zeroStage": self.stage,
                "offloadOptimizer": self.offload_optimizer, "offloadParam": self.offload_param,
                "modelStateGiB": round(self.model_state_gib, 2), "activationsGiB": round(self.activations_gib, 2),
                "gpuMemoryGiB": self.gpu_memory_gib, "hostGiBPerNode": round(self.host_gib_per_node, 2),
                "hostMemoryGiB": self.host_memory_gib, "fits": self.fits, "reasons": self.reasons}


def plan_memory(spec: DeepSpeedSpec, sku: skus.Sku, world: int, micro_batch: int | None = None) -> MemoryPlan:
    """ZeRO stage and offload for this model on `world` GPUs of `sku`."""
    params = param_count(spec.model)
    layer = largest_layer(spec.model)
    mbs = micro_batch or spec.micro_batch
    usable = sku.gpu_memory_gib * USABLE_GPU_MEMORY_FRACTION
    activations = activation_bytes_per_gpu(spec.model, mbs, spec.activation_checkpointing)
    candidates = options(params, layer, world, sku.gpus or world)
    host = sku.memory_gib * GIB
    reasons: list[str] = []
    if spec.zero_stage != "auto":
        fixed = int(spec.zero_stage)
        reasons.append(f"ZeRO stage {fixed} set by the recipe")
        chosen, why = choose(candidates, usable * GIB, activations, stage=fixed, host_bytes=host)
        if chosen is None:  # nothing at this stage fits: report its smallest, offloaded as far as it goes
            chosen = min((o for o in candidates if o.stage == fixed), key=lambda o: o.bytes_per_gpu)
    else:
        start = stage_by_size(params)
        reasons.append(f"{params / 1e6:,.0f}M parameters -> stage {start} by size (Azure's large-scale training guide)")
        chosen, why = choose(candidates, usable * GIB, activations, min_stage=start, host_bytes=host)
        if chosen is None:
            chosen = candidates[-1]  # everything offloaded: the least GPU memory there is
    reasons.extend(why)
    if chosen.offload_optimizer:
        reasons.append(f"{chosen.label}: model states {chosen.gib_per_gpu:,.1f} GiB per GPU")
    return MemoryPlan(params, world, chosen.stage, chosen.offload_optimizer, chosen.offload_param, chosen.gib_per_gpu,
                      activations / GIB, sku.gpu_memory_gib, usable, reasons,
                      chosen.host_bytes_per_node / GIB, float(sku.memory_gib))


def ds_config(spec: DeepSpeedSpec, sku: skus.Sku, memory: MemoryPlan, *, tensorboard_dir: str = "outputs/tensorboard",
              job_name: str = "train", micro_batch: int | None = None, grad_accum: int | None = None,
              stage: int | None = None) -> dict[str, Any]:
    """A complete ds_config (no "auto" values, so deepspeed.initialize can take it as is)."""
    mbs = micro_batch or spec.micro_batch
    gas = grad_accum or spec.grad_accum
    zero_stage = memory.stage if stage is None else stage
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": gas,
        "train_batch_size": mbs * gas * memory.world,
        "gradient_clipping": 1.0,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-4, "warmup_num_steps": 1000}},
        "zero_optimization": {"stage": zero_stage, "overlap_comm": True, "contiguous_gradients": True,
                              "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8},
    }
    # V100 has no bf16 tensor cores: fp16 with loss scaling there, bf16 elsewhere.
    if sku.gpu_gemm_dtype == "bf16":
        config["bf16"] = {"enabled": True}
    else:
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if memory.offload_optimizer and zero_stage >= 1:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if memory.offload_param and zero_stage == 3:
        config["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    if zero_stage == 3:
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    if spec.activation_checkpointing:
        # No partition_activations: it splits activations across model-parallel ranks, and
        # these jobs have none (pure data parallelism), so it would only add work.
        config["activation_checkpointing"] = {"contiguous_memory_optimization": False}
    if spec.tensorboard:
        # Azure's large-scale training guide: DeepSpeed's own metrics next to the job's TensorBoard logs
        config["tensorboard"] = {"enabled": True, "output_path": tensorboard_dir, "job_name": job_name}
    if spec.flops_profiler:
        config["flops_profiler"] = {"enabled": True, "profile_step": 10, "module_depth": -1, "top_modules": 3,
                                    "detailed": True, "output_file": "outputs/flops_profile.txt"}
    return config


def autotune_space(spec: DeepSpeedSpec, sku: skus.Sku, world: int, max_micro_batch: int = 512,
                   grad_accums: tuple[int, ...] = (1, 2)) -> list[dict[str, int]]:
    """Candidates (stage, micro batch, grad accum) the memory model says fit, smallest first.

    The autotuning of Azure's large-scale training guide tunes exactly these three. Per stage, micro batches double from
    1 up to the largest that fits; infeasible combinations are never tried on the GPU.
    """
    params = param_count(spec.model)
    layer = largest_layer(spec.model)
    usable = sku.gpu_memory_gib * USABLE_GPU_MEMORY_FRACTION
    stages = [int(spec.zero_stage)] if spec.zero_stage != "auto" else [s for s in (0, 1, 2, 3) if s >= stage_by_size(params) - 1]
    out = []
    for stage in stages:
        state = model_state_bytes_per_gpu(params, stage, world, largest_layer_params=layer) / GIB
        mbs = 1
        while mbs <= max_micro_batch:
            act = activation_bytes_per_gpu(spec.model, mbs, spec.activation_checkpointing) / GIB
            if state + act > usable:
                break
            for gas in grad_accums:
                out.append({"stage": stage, "micro_batch": mbs, "grad_accum": gas})
            mbs *= 2
    return out
