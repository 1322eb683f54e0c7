"""DeepSpeed planning (Azure's large-scale training guide): memory estimate, ZeRO stage, ds_config, autotuning space.

Model states with fp16/bf16 mixed precision and Adam take 20 bytes per parameter (seed
004): 16-bit parameters 2 + 16-bit gradients 2 + fp32 momentum and variance 8 + fp32
master parameters 4 + fp32 gradients 4. ZeRO partitions them over the data-parallel
ranks: stage 1 the optimizer states and master parameters (12 B), stage 2 also the
gradients (2 + 4 B), stage 3 also the 16-bit parameters (2 B).

Activations of a transformer layer in 16-bit without recomputation are about
s*b*h*(34 + 5*a*s/h) bytes (Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", 2022); with activation checkpointing only each layer's input
(2*s*b*h) is kept, plus one layer's activations during its recomputation.

The stage starts from the model size (Azure's large-scale training guide: < 300M -> 0, < 1B -> 1, < 10B -> 2,
else 3) and is raised until the states fit the GPU; CPU offload is used only when even
stage 3 does not fit (Azure's large-scale training guide: "only use cpu_offload if not enough GPUs to fit").
Pure: no DeepSpeed import (it runs inside the job).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core import skus
from jobs.recipes.schema import DeepSpeedSpec, ModelShape

GIB = 1 << 30
BYTES_PER_PARAM_MIXED_ADAM = 20
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


def stage_by_size(params: int) -> int:
    for limit, stage in _STAGE_BY_SIZE:
        if params < limit:
            return stage
    return 3


def model_state_bytes_per_gpu(params: int, stage: int, world: int, offload: bool = False) -> float:
    """Bytes of parameters, gradients and optimizer states one GPU holds."""
    world = max(world, 1)
    fp16_params = 2 * params / (world if stage >= 3 else 1)
    grads = (2 + 4) * params / (world if stage >= 2 else 1)
    optimizer = 12 * params / (world if stage >= 1 else 1)
    if offload:
        optimizer = 0.0  # optimizer states and master weights live in host memory
    return fp16_params + grads + optimizer


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
    offload: bool
    model_state_gib: float
    activations_gib: float
    gpu_memory_gib: float
    usable_gib: float
    reasons: list[str] = field(default_factory=list)

    @property
    def total_gib(self) -> float:
        return self.model_state_gib + self.activations_gib

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.usable_gib

    def to_json(self) -> dict[str, Any]:
        return {"params": self.params, "world": self.world, "zeroStage": self.stage, "offload": self.offload,
                "modelStateGiB": round(self.model_state_gib, 2), "activationsGiB": round(self.activations_gib, 2),
                "gpuMemoryGiB": self.gpu_memory_gib, "fits": self.fits, "reasons": self.reasons}


def plan_memory(spec: DeepSpeedSpec, sku: skus.Sku, world: int, micro_batch: int | None = None) -> MemoryPlan:
    """ZeRO stage and offload for this model on `world` GPUs of `sku`."""
    params = param_count(spec.model)
    mbs = micro_batch or spec.micro_batch
    usable = sku.gpu_memory_gib * USABLE_GPU_MEMORY_FRACTION
    activations = activation_bytes_per_gpu(spec.model, mbs, spec.activation_checkpointing) / GIB
    reasons: list[str] = []

    def state(stage: int, offload: bool) -> float:
        return model_state_bytes_per_gpu(params, stage, world, offload) / GIB

    if spec.zero_stage != "auto":
        stage = int(spec.zero_stage)
        reasons.append(f"ZeRO stage {stage} set by the recipe")
        offload = state(stage, False) + activations > usable and stage == 3
        if offload:
            reasons.append("stage 3 without offload does not fit: optimizer offloaded to CPU")
        return MemoryPlan(params, world, stage, offload, state(stage, offload), activations, sku.gpu_memory_gib, usable, reasons)

    stage = stage_by_size(params)
    reasons.append(f"{params / 1e6:,.0f}M parameters -> stage {stage} by size (Azure's large-scale training guide)")
    while stage < 3 and state(stage, False) + activations > usable:
        stage += 1
        reasons.append(f"raised to stage {stage}: {state(stage - 1, False) + activations:,.1f} GiB would not fit in {usable:,.1f} GiB")
    offload = state(stage, False) + activations > usable
    if offload:
        reasons.append("even stage 3 does not fit: optimizer states offloaded to CPU memory")
    return MemoryPlan(params, world, stage, offload, state(stage, offload), activations, sku.gpu_memory_gib, usable, reasons)


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
    if memory.offload and zero_stage >= 1:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if zero_stage == 3:
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    if spec.activation_checkpointing:
        config["activation_checkpointing"] = {"partition_activations": zero_stage == 3, "contiguous_memory_optimization": False}
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
    usable = sku.gpu_memory_gib * USABLE_GPU_MEMORY_FRACTION
    stages = [int(spec.zero_stage)] if spec.zero_stage != "auto" else [s for s in (0, 1, 2, 3) if s >= stage_by_size(params) - 1]
    out = []
    for stage in stages:
        state = model_state_bytes_per_gpu(params, stage, world) / GIB
        mbs = 1
        while mbs <= max_micro_batch:
            act = activation_bytes_per_gpu(spec.model, mbs, spec.activation_checkpointing) / GIB
            if state + act > usable:
                break
            for gas in grad_accums:
                out.append({"stage": stage, "micro_batch": mbs, "grad_accum": gas})
            mbs *= 2
    return out
