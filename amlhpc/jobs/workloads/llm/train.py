"""LLM pretraining: a Llama-style decoder, FSDP2, bf16 on GPU, versioned checkpoints, tokens/s and MFU every step.

    python -m amlhpc.jobs.workloads.llm.train --model auto --steps 1000 --seq-len 4096

- model: `--model auto` takes the shape with the most parameters that fits the GPUs' memory
  (amlhpc/jobs/workloads/llm/sizing.py: the catalog's `gpu_memory_gib` from AMLHPC_SKU_JSON, else
  what the device reports, and the job's world size), or a named shape (`tiny` on CPU);
- sharding: every block and then the root wrapped in `fully_shard` (FSDP2) over all ranks,
  built on the meta device and initialised shard by shard; on GPU the blocks compute in bf16
  with fp32 master weights and fp32 gradient reduction (MixedPrecisionPolicy), and keep only
  their inputs for the backward (activation checkpointing) unless --no-activation-checkpointing;
  on CPU (the rehearsal, gloo) everything is fp32;
- data: synthetic token sequences indexed by the samples trained on so far and the rank
  (amlhpc/jobs/workloads/llm/data.py `Position`);
- every `--log-every` steps (default: every step) rank 0 logs loss, tokens/s (job and per
  device), achieved TFLOP/s per device and MFU against the catalog's peak
  (amlhpc/jobs/workloads/llm/throughput.py) through common.Metrics: a JSON line, MLflow when the
  image has it; the summary has the medians;
- checkpoints every `--checkpoint-every` steps and at the end with common.save_state: FSDP2's
  sharded model and optimizer state (each rank its own DTensor shards, no gather), the data
  position and every RNG, a version of the node's tier under AMLHPC_CHECKPOINT_DIR written in
  the background (`--sync-checkpoints`: in the loop); resumed by common.load_state from the
  version the launcher names (AMLHPC_RESUME_VERSION), resharded when the world size changed,
  read without unpickling anything (amlhpc/jobs/runtime/checkpoint/safeload.py); `--global-batch`
  keeps the sequences per step when the job goes on with fewer ranks (gradient accumulation);
- `common.inject_fault(step)` after every step: the fault point where tests and rehearsals inject
  a crash, an NCCL error or a stall (`jobs run --fault crash@step=5,rank=1`).

Exit: 0 done; 2 bad input (unknown model, nothing fits, a checkpoint that cannot be resumed from).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError
from amlhpc.jobs.runtime.node import skufacts
from amlhpc.jobs.workloads import common
from amlhpc.jobs.workloads.llm import data, sizing, throughput
from amlhpc.jobs.workloads.llm.model import ModelConfig, Transformer


def parse(argv):
    p = argparse.ArgumentParser(description="Llama-style LLM pretraining with FSDP2")
    p.add_argument("--model", default="auto", help=f"auto, or one of {', '.join(sizing.PRESETS)}")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per rank per micro-step")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=0,
                   help="sequences per optimizer step over all ranks (a multiple of micro-batch x world): sets "
                        "--grad-accum, so a job resumed on fewer ranks trains on as many tokens per step; 0: off")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0: at the end only")
    p.add_argument("--sync-checkpoints", action="store_true", help="write checkpoints in the training loop (no background)")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels (bit-identical losses after a resume on the same world size)")
    p.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                   help="recompute each block in the backward (default: on GPU)")
    p.add_argument("--output-dir", default="outputs")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def lr_at(step: int, args) -> float:
    """Linear warmup, then cosine decay to a tenth of --lr at --steps."""
    if step <= args.warmup_steps:
        return args.lr * step / max(args.warmup_steps, 1)
    progress = (step - args.warmup_steps) / max(args.steps - args.warmup_steps, 1)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def pick_model(args, d, facts) -> tuple[ModelConfig, dict]:
    if args.model != "auto":
        if args.model not in sizing.PRESETS:
            raise ValueError(f"--model {args.model!r} is not a known shape: use auto or one of {', '.join(sizing.PRESETS)}")
        return sizing.PRESETS[args.model], {"chosen_by": "--model"}
    if facts is not None and facts.gpu_memory_gib:
        memory, source = float(facts.gpu_memory_gib), f"catalog: {facts.name} gpu_memory_gib"
    elif d.device.type == "cuda":
        memory, source = torch.cuda.get_device_properties(d.device).total_memory / sizing.GIB, "the device's total memory"
    else:
        raise ValueError("--model auto sizes the model by GPU memory and this rank has no GPU: name a shape, e.g. --model tiny")
    cfg, estimates = sizing.choose(gpu_memory_gib=memory, world=d.world, micro_batch=args.micro_batch, seq_len=args.seq_len)
    return cfg, {"chosen_by": f"auto: {memory:g} GiB per GPU ({source}), {d.world} GPUs",
                 "estimates": [e.to_json() for e in estimates]}


def build(cfg: ModelConfig, d, args) -> tuple[torch.nn.Module, str]:
    """The model, sharded over every rank when there are several, on this rank's device."""
    gpu = d.device.type == "cuda"
    checkpointed = gpu if args.activation_checkpointing is None else args.activation_checkpointing
    with torch.device("meta"):
        model = Transformer(cfg, args.seq_len, activation_checkpointing=checkpointed)
    dtype = "bf16" if gpu else "fp32"
    if d.world > 1:
        mesh = init_device_mesh(d.device.type, (d.world,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if gpu else MixedPrecisionPolicy()
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=d.device)
    torch.manual_seed(args.seed)
    model.init_weights()
    return model, dtype


def optimizer_for(model: torch.nn.Module, d, args) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                             fused=d.device.type == "cuda" and d.world == 1)  # sharded (DTensor): foreach


def position_for(cfg: ModelConfig, d, args) -> data.Position:
    return data.Position(rank=d.rank, world=d.world, micro_batch=args.micro_batch, grad_accum=args.grad_accum,
                         seq_len=args.seq_len, vocab=cfg.vocab_size, seed=args.seed)


def main(argv=None) -> int:
    args = parse(argv)
    try:
        facts = skufacts.load_sku_facts()
    except RuntimeInputError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    d = common.init_distributed()
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    if args.global_batch:
        if args.global_batch % (args.micro_batch * d.world):
            print(f"llm-pretrain: --global-batch {args.global_batch} is not a multiple of --micro-batch "
                  f"{args.micro_batch} x world {d.world}", file=sys.stderr)
            return 2
        args.grad_accum = args.global_batch // (args.micro_batch * d.world)
    try:
        cfg, sizing_note = pick_model(args, d, facts)
    except ValueError as exc:
        print(f"llm-pretrain: {exc}", file=sys.stderr)
        return 2
    model, dtype = build(cfg, d, args)
    peak: throughput.Peak | None = None
    optimizer = optimizer_for(model, d, args)
    position = position_for(cfg, d, args)
    state = common.TrainState(model, optimizer, sampler=position, extra=lambda: throughput.to_extra(peak))
    try:
        start = common.load_state(state)
    except CheckpointError as exc:
        print(f"llm-pretrain: cannot resume: {exc}", file=sys.stderr)
        return 2
    # after the restore: a resumed run keeps the peak its first attempt measured (one MFU denominator per run)
    peak, no_peak = (throughput.catalog_peak(facts, dtype) if d.device.type == "cuda"
                     else (throughput.kept(throughput.measured_cpu_peak, state.resumed_extra), ""))
    flops_per_token = cfg.flops_per_token(args.seq_len)
    tokens_per_step = d.world * args.grad_accum * args.micro_batch * args.seq_len
    metrics = common.Metrics(d, args.output_dir)
    if d.is_main:
        print(json.dumps({"model": cfg.to_json(), "sizing": sizing_note, "world": d.world, "device": d.device.type,
                          "dtype": dtype, "fsdp": d.world > 1, "flops_per_token": flops_per_token,
                          "tokens_per_step": tokens_per_step, "peak_tflops": peak.tflops if peak else None,
                          "peak_source": peak.source if peak else f"none: {no_peak}", "resumed_from": start}), flush=True)

    rates, loss_value = [], float("nan")
    stalls: list[float] = []  # seconds the training was held by each checkpoint
    own = common.OwnWork(d.device)  # each step's own work on the device: where a straggler shows
    for step in range(start + 1, args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        timer = common.Timer()
        own.start()
        step_loss = torch.zeros((), device=d.device)  # the mean over the step's micro-batches
        for micro in range(args.grad_accum):
            if d.world > 1:
                model.set_requires_gradient_sync(micro == args.grad_accum - 1)
            inputs, targets = position.batch(micro)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=d.device.type == "cuda" and d.world == 1):
                loss = model(inputs.to(d.device), targets.to(d.device)) / args.grad_accum
            if micro == args.grad_accum - 1:  # the last backward reduces the gradients over the ranks
                own.done(step)
            loss.backward()
            step_loss += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        position.step_done()
        if d.device.type == "cuda":
            torch.cuda.synchronize()
        own.settle()
        seconds = timer.elapsed()
        rate = throughput.step_rate(tokens_per_step, seconds, d.world, flops_per_token, peak)
        rates.append(rate)
        if step % args.log_every == 0 or step in (start + 1, args.steps):
            loss_value = common.all_reduce_mean(d, float(step_loss.item()))
            norm_value = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
            metrics.log(step, loss=loss_value, tokens_per_s=rate.tokens_per_s,
                        tokens_per_s_per_device=rate.tokens_per_s_per_device, tflops_per_device=rate.tflops_per_device,
                        **({"mfu": rate.mfu} if rate.mfu is not None else {}), step_time_s=seconds,
                        lr=lr_at(step, args), grad_norm=norm_value)
            metrics.node_step(step, seconds)
        if step == args.steps or (args.checkpoint_every and step % args.checkpoint_every == 0):
            stall = common.save_state(state, step, background=not args.sync_checkpoints)
            stalls.append(stall)
            if d.is_main:  # not a step line: the training's step log stays one line per step
                print(json.dumps({"checkpoint_step": step, "stall_s": stall}), flush=True)
        common.inject_fault(step)
    common.finish_checkpoints()
    steady = rates[1:] or rates  # the first step includes warm-up
    metrics.summary(checkpoint_stalls_s=stalls, workload="llm-pretrain", model=cfg.name, params=cfg.param_count(), world_size=d.world, dtype=dtype,
                    steps=args.steps, resumed_from=start, final_loss=loss_value,
                    throughput=statistics.median(r.tokens_per_s for r in steady) if steady else None,
                    throughput_unit="tokens/s",
                    tflops_per_device=statistics.median(r.tflops_per_device for r in steady) if steady else None,
                    mfu=statistics.median(r.mfu for r in steady if r.mfu is not None) if steady and peak else None,
                    peak_source=peak.source if peak else f"none: {no_peak}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
