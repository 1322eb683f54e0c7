"""BERT masked-LM pretraining: Hugging Face BertForMaskedLM on synthetic tokens, DeepSpeed on GPUs.

    python -m amlhpc.jobs.workloads.bert_pretrain.train --steps 2000

The model shape and ds_config come from AMLHPC_DEEPSPEED_JSON (planned by amlhpc/jobs/plan/deepspeed.py
at submit time); flags override them for small runs. Tokens are generated (repeating
n-grams, so masked tokens are predictable and the loss falls): no hub download, no
tokenizer. Paths:
- DeepSpeed (GPU, deepspeed importable): deepspeed.initialize with the planned config,
  launched by torch.distributed (Azure ML distribution: pytorch) - no ssh hostfile.
- CPU / no DeepSpeed: DistributedDataParallel + AdamW over gloo (tests, rehearsal).
- --ort / planned ort: wrap in ONNX Runtime's ORTModule first, then DeepSpeed (the NDv4 performance article).
- autotuning (planned `autotune` candidates or --autotune): a few steps per (ZeRO stage,
  micro batch, grad accum), throughput recorded, fastest ds_config written to
  outputs/autotuning/. Exit codes: 0 done, 2 bad input or missing library.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
from pathlib import Path

import torch

from amlhpc.jobs.workloads import common
from amlhpc.jobs.workloads import env as workload_env

MASK_PROB = 0.15
SPECIAL = 4  # 0 pad, 1 cls, 2 sep, 3 mask


def parse(argv):
    p = argparse.ArgumentParser(description="BERT MLM pretraining")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--micro-batch", type=int)
    p.add_argument("--grad-accum", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--no-deepspeed", action="store_true", help="force the DDP path")
    p.add_argument("--autotune", action="store_true")
    p.add_argument("--autotune-steps", type=int, default=5)
    p.add_argument("--ort", action="store_true")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0: at the end only")
    p.add_argument("--global-batch", type=int, default=0,
                   help="samples per optimizer step over all ranks; sets the gradient accumulation for the world size "
                        "(kept when a job resumes on fewer ranks); 0: micro batch x accumulation x world")
    p.add_argument("--dropout", type=float, help="hidden and attention dropout (default: the model's, 0.1)")
    p.add_argument("--samples", type=int, default=1 << 16, help="samples in one epoch of the synthetic corpus")
    p.add_argument("--deterministic", action="store_true", help="deterministic kernels and a fixed gradient-reduction order (bit-exact resumes; common.data_parallel)")
    p.add_argument("--sync-checkpoints", action="store_true", help="write checkpoints in the training loop (no background)")
    p.add_argument("--output-dir", default="outputs")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def planned() -> dict:
    raw = os.environ.get(workload_env.DEEPSPEED_JSON)
    return json.loads(raw) if raw else {}


def model_config(args, plan):
    from transformers import BertConfig

    shape = plan.get("model", {})
    hidden = args.hidden or shape.get("hidden_size", 128)
    dropout = {} if args.dropout is None else {"hidden_dropout_prob": args.dropout,
                                                "attention_probs_dropout_prob": args.dropout}
    return BertConfig(**dropout, vocab_size=args.vocab or shape.get("vocab_size", 1024), hidden_size=hidden,
                      num_hidden_layers=args.layers or shape.get("num_layers", 2),
                      num_attention_heads=args.heads or shape.get("num_heads", 2),
                      intermediate_size=shape.get("intermediate_size") or 4 * hidden,
                      max_position_embeddings=shape.get("max_position", 512))


def sample(index: int, seq_len: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence `index` of the corpus: a repeated random n-gram; 15 % masked (80 % [MASK],
    10 % random, 10 % kept). A function of (seed, index) only."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    period = 8
    gram = torch.randint(SPECIAL, vocab, (period,), generator=generator)
    ids = gram.repeat(seq_len // period + 1)[:seq_len].clone()
    ids[0], ids[-1] = 1, 2
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(ids.shape, generator=generator) < MASK_PROB
    chosen[0] = chosen[-1] = False
    if not chosen.any():  # a sequence with nothing to predict has no loss (NaN): mask one token
        chosen[1 + index % (seq_len - 2)] = True
    labels[chosen] = ids[chosen]
    action = torch.rand(ids.shape, generator=generator)
    ids[chosen & (action < 0.8)] = 3
    randomised = chosen & (action >= 0.8) & (action < 0.9)
    ids[randomised] = torch.randint(SPECIAL, vocab, (int(randomised.sum()),), generator=generator)
    return ids, labels


def batch(indices: list[int], seq_len: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [sample(i, seq_len, vocab, seed) for i in indices]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def build_model(config, use_ort: bool):
    from transformers import BertForMaskedLM

    model = BertForMaskedLM(config)
    if use_ort:
        try:
            from onnxruntime.training.ortmodule import ORTModule
        except ImportError:
            raise SystemExit("--ort needs onnxruntime-training in the image (ORTModule); use an ACPT image or drop deepspeed.ort") from None
        model = ORTModule(model)
    return model


def run_steps(d, args, config, ds_config, steps, metrics, use_ds, seq_len, use_ort, save=True) -> tuple[float, float]:
    """Train up to step `steps`; returns (samples/s, last loss: the global batch's mean)."""
    torch.manual_seed(args.seed)
    model = build_model(config, use_ort)
    mbs, gas = ds_config["train_micro_batch_size_per_gpu"], ds_config["gradient_accumulation_steps"]
    sampler = common.GlobalBatchSampler(args.samples, mbs * gas * d.world, mbs, d.rank, d.world, args.seed)
    if use_ds:
        import deepspeed

        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        device = engine.device
    else:
        model = model.to(d.device)
        engine, sync_gradients = common.data_parallel(model, d, args.deterministic)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        device = d.device
    state = common.TrainState(model, optimizer, sampler=sampler) if save and not use_ds else None
    start_step = common.load_state(state) if state is not None else 0
    timer, loss_value = common.Timer(), float("nan")
    own = common.OwnWork(device)  # each step's own work on the device: where a straggler shows
    for step in range(start_step + 1, steps + 1):
        if sampler.step_in_epoch >= sampler.steps_per_epoch:
            sampler.set_epoch(sampler.epoch + 1)
        total = torch.zeros((), dtype=torch.float64)
        own.start()
        micro_batches = sampler.indices_of_step(sampler.step_in_epoch)
        for pass_index, indices in enumerate(micro_batches):
            ids, labels = batch(indices, seq_len, config.vocab_size, args.seed)
            last = pass_index == len(micro_batches) - 1
            with (contextlib.nullcontext() if use_ds or last or engine is model else engine.no_sync()):
                out = engine(input_ids=ids.to(device), labels=labels.to(device))
                if last:  # its backward reduces the gradients over the ranks
                    own.done(step)
                if use_ds:
                    engine.backward(out.loss)
                    engine.step()
                else:
                    (out.loss / gas).backward()
            total += out.loss.detach().double().cpu()
        if not use_ds:
            sync_gradients()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        sampler.step_done()
        loss_value = common.all_reduce_mean(d, float(total) / gas)
        own.settle()  # the loss was read back: the step's work is done on the device
        if metrics and (step % args.log_every == 0 or step == start_step + 1):
            metrics.log(step, loss=loss_value)
        if state is not None and args.checkpoint_every and step % args.checkpoint_every == 0:
            common.save_state(state, step, background=not args.sync_checkpoints)
        elif use_ds and save and args.checkpoint_every and step % args.checkpoint_every == 0:
            engine.save_checkpoint(str(common.checkpoint_dir()), tag=f"step{step}")  # every rank writes its shard
        if save:
            common.inject_fault(step)
    done = steps - start_step
    throughput = done * gas * mbs * d.world / max(timer.elapsed(), 1e-9)
    if state is not None and done > 0 and not (args.checkpoint_every and steps % args.checkpoint_every == 0):
        common.save_state(state, steps, background=not args.sync_checkpoints)
    elif use_ds and save and done > 0:
        engine.save_checkpoint(str(common.checkpoint_dir()), tag=f"step{steps}")
    common.finish_checkpoints()
    return throughput, loss_value


def main(argv=None) -> int:
    args = parse(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed in this image", file=sys.stderr)
        return 2
    plan = planned()
    d = common.init_distributed()
    config = model_config(args, plan)
    seq_len = args.seq_len or plan.get("model", {}).get("seq_len", 64)
    ds_config = copy.deepcopy(plan.get("config") or {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1})
    if args.micro_batch:
        ds_config["train_micro_batch_size_per_gpu"] = args.micro_batch
    if args.grad_accum:
        ds_config["gradient_accumulation_steps"] = args.grad_accum
    if args.global_batch:
        per_pass = ds_config["train_micro_batch_size_per_gpu"] * d.world
        if args.global_batch % per_pass:
            print(f"--global-batch {args.global_batch} is not a multiple of the micro batch x world ({per_pass})",
                  file=sys.stderr)
            return 2
        ds_config["gradient_accumulation_steps"] = args.global_batch // per_pass
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    ds_config["train_batch_size"] = ds_config["train_micro_batch_size_per_gpu"] * ds_config["gradient_accumulation_steps"] * d.world
    use_ds = not args.no_deepspeed and d.device.type == "cuda" and bool(plan.get("config"))
    if use_ds:  # importing DeepSpeed is slow and pointless on the CPU path
        try:
            import deepspeed  # noqa: F401
        except ImportError:
            use_ds = False
            print("deepspeed is not installed: training with plain DDP", file=sys.stderr)
    use_ort = args.ort or bool(plan.get("ort"))
    metrics = common.Metrics(d, args.output_dir)
    if d.is_main:
        params = sum(p.numel() for p in build_model(config, False).parameters())
        print(json.dumps({"params": params, "deepspeed": use_ds, "ort": use_ort, "world": d.world,
                          "zero_stage": ds_config.get("zero_optimization", {}).get("stage")}), flush=True)

    candidates = plan.get("autotune") or ([{"stage": 0, "micro_batch": m, "grad_accum": g} for m in (1, 2, 4) for g in (1, 2)]
                                          if args.autotune else None)
    if candidates:
        return autotune(d, args, config, ds_config, candidates, use_ds, seq_len, use_ort)
    throughput, loss = run_steps(d, args, config, ds_config, args.steps, metrics, use_ds, seq_len, use_ort)
    metrics.summary(throughput=throughput, throughput_unit="samples/s", final_loss=loss, world_size=d.world,
                    steps=args.steps, deepspeed=use_ds, workload="bert-pretrain", global_batch=ds_config["train_batch_size"])
    return 0


def autotune(d, args, config, base, candidates, use_ds, seq_len, use_ort) -> int:
    results = []
    for cand in candidates:
        trial = copy.deepcopy(base)
        trial["train_micro_batch_size_per_gpu"], trial["gradient_accumulation_steps"] = cand["micro_batch"], cand["grad_accum"]
        trial["train_batch_size"] = cand["micro_batch"] * cand["grad_accum"] * d.world
        trial.setdefault("zero_optimization", {})["stage"] = cand["stage"]
        try:
            throughput, _ = run_steps(d, args, config, trial, args.autotune_steps, None, use_ds, seq_len, use_ort, save=False)
            results.append({**cand, "samples_per_s": throughput, "ok": True})
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            results.append({**cand, "samples_per_s": 0.0, "ok": False, "error": "out of memory"})
        if d.is_main:
            print(json.dumps({"autotune": results[-1]}), flush=True)
    best = max((r for r in results if r["ok"]), key=lambda r: r["samples_per_s"], default=None)
    if d.is_main:
        folder = Path(args.output_dir) / "autotuning"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps({"results": results, "best": best, "deepspeed": use_ds}, indent=2))
        if best:
            cfg = copy.deepcopy(base)
            cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"] = best["micro_batch"], best["grad_accum"]
            cfg["train_batch_size"] = best["micro_batch"] * best["grad_accum"] * d.world
            cfg.setdefault("zero_optimization", {})["stage"] = best["stage"]
            (folder / "best_ds_config.json").write_text(json.dumps(cfg, indent=2))
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main())
