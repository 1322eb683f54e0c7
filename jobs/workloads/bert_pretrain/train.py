"""BERT masked-LM pretraining: Hugging Face BertForMaskedLM on synthetic tokens, DeepSpeed on GPUs.

    python -m jobs.workloads.bert_pretrain.train --steps 2000

The model shape and ds_config come from AMLHPC_DEEPSPEED_JSON (planned by jobs/deepspeed.py
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
import copy
import json
import os
import sys
from pathlib import Path

import torch

from jobs.workloads import common
from jobs.workloads import env as workload_env

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
    return BertConfig(vocab_size=args.vocab or shape.get("vocab_size", 1024), hidden_size=hidden,
                      num_hidden_layers=args.layers or shape.get("num_layers", 2),
                      num_attention_heads=args.heads or shape.get("num_heads", 2),
                      intermediate_size=shape.get("intermediate_size") or 4 * hidden,
                      max_position_embeddings=shape.get("max_position", 512))


def batch(generator: torch.Generator, size: int, seq_len: int, vocab: int):
    """Sequences of a repeated random n-gram; 15 % masked (80 % [MASK], 10 % random, 10 % kept)."""
    period = 8
    gram = torch.randint(SPECIAL, vocab, (size, period), generator=generator)
    ids = gram.repeat(1, seq_len // period + 1)[:, :seq_len].clone()
    ids[:, 0], ids[:, -1] = 1, 2
    labels = torch.full_like(ids, -100)
    chosen = (torch.rand(ids.shape, generator=generator) < MASK_PROB)
    chosen[:, 0] = chosen[:, -1] = False
    labels[chosen] = ids[chosen]
    action = torch.rand(ids.shape, generator=generator)
    ids[chosen & (action < 0.8)] = 3
    randomised = chosen & (action >= 0.8) & (action < 0.9)
    ids[randomised] = torch.randint(SPECIAL, vocab, (int(randomised.sum()),), generator=generator)
    return ids, labels


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
    """Train `steps` optimizer steps; returns (samples/s, last loss)."""
    torch.manual_seed(args.seed)
    model = build_model(config, use_ort)
    mbs, gas = ds_config["train_micro_batch_size_per_gpu"], ds_config["gradient_accumulation_steps"]
    if use_ds:
        import deepspeed

        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        device = engine.device
    else:
        model = model.to(d.device)
        engine = torch.nn.parallel.DistributedDataParallel(model) if d.world > 1 else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        device = d.device
    generator = torch.Generator().manual_seed(args.seed + d.rank)
    start_step = 0
    resume = common.latest_checkpoint() if save and not use_ds else None
    if resume is not None:
        state = torch.load(resume, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step = state["step"]
        if d.is_main:
            print(f"resumed from {resume} (step {start_step})", flush=True)
    timer, loss_value = common.Timer(), float("nan")
    for step in range(start_step + 1, steps + 1):
        for _ in range(gas):
            ids, labels = batch(generator, mbs, seq_len, config.vocab_size)
            out = engine(input_ids=ids.to(device), labels=labels.to(device))
            if use_ds:
                engine.backward(out.loss)
                engine.step()
            else:
                (out.loss / gas).backward()
        if not use_ds:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        loss_value = float(out.loss.item())
        if metrics and (step % args.log_every == 0 or step == start_step + 1):
            metrics.log(step, loss=loss_value)
        if save and args.checkpoint_every and step % args.checkpoint_every == 0:
            _checkpoint(d, engine, model, None if use_ds else optimizer, step, use_ds)
    done = steps - start_step
    throughput = done * gas * mbs * d.world / max(timer.elapsed(), 1e-9)
    if save and done > 0:
        _checkpoint(d, engine, model, None if use_ds else optimizer, steps, use_ds)
    return throughput, loss_value


def _checkpoint(d, engine, model, optimizer, step, use_ds):
    if use_ds:
        engine.save_checkpoint(str(common.checkpoint_dir()), tag=f"step{step}")  # every rank writes its shard
    elif d.is_main:
        common.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, step)


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
                    steps=args.steps, deepspeed=use_ds, workload="bert-pretrain")
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
