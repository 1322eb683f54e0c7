"""Train CosmoFlow with PyTorch DDP on the files the launcher staged (or any folder).

    python -m amlhpc.jobs.workloads.cosmoflow.train --input cosmoflow --epochs 48 --batch-size 4 --amp

Reads AMLHPC_DATA_DIR_<INPUT> / AMLHPC_FILE_LIST_<INPUT> (amlhpc/jobs/workloads/cosmoflow/data.py),
logs the loss, the step's seconds and MFU per step (JSON lines; MLflow in Azure ML; every
other node's first process logs its own step time), validates each epoch (MAE),
checkpoints model, optimizer, data order and RNG (common.save_state: in the background, into
the node's tier under AMLHPC_CHECKPOINT_DIR) every `--checkpoint-every` steps or after every
epoch, and resumes exactly from the version the launcher names (AMLHPC_RESUME_VERSION): the
same samples in the same order, the same dropout masks. `--global-batch` keeps the samples per
optimizer step fixed when the job resumes on fewer ranks (gradient accumulation).
`--from-memory` feeds the same model from RAM to measure the input pipeline:
throughput(files) / throughput(memory) is its efficiency. The PyTorch profiler runs when
AMLHPC_PROFILE_DIR is set (or --profile-dir). Exit codes: 0 done, 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.node import skufacts
from amlhpc.jobs.workloads import common, peak
from amlhpc.jobs.workloads.cosmoflow import data
from amlhpc.jobs.workloads.cosmoflow.model import CosmoFlow


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="CosmoFlow training (PyTorch DDP)")
    p.add_argument("--input", default="cosmoflow", help="input name: reads AMLHPC_DATA_DIR_<INPUT>")
    p.add_argument("--data-dir", help="folder of *.tfrecord files (default: from the launcher)")
    p.add_argument("--file-list", help="this rank's files, one relative path a line (default: from the launcher)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--max-steps-per-epoch", type=int, default=0, help="0: the whole epoch")
    p.add_argument("--batch-size", type=int, default=4, help="per rank and pass (micro batch)")
    p.add_argument("--global-batch", type=int, default=0,
                   help="samples per optimizer step over all ranks (a multiple of batch-size x world); "
                        "0: batch-size x world, no accumulation")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints; 0: after every epoch")
    p.add_argument("--sync-checkpoints", action="store_true", help="write checkpoints in the training loop (no background)")
    p.add_argument("--deterministic", action="store_true", help="deterministic kernels and a fixed gradient-reduction order (bit-exact resumes; common.data_parallel)")
    p.add_argument("--lr", type=float, default=0.001, help="per-rank base rate; scaled by the world size")
    p.add_argument("--warmup-epochs", type=int, default=0)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--conv-size", type=int, default=32)
    p.add_argument("--n-conv-layers", type=int, default=5)
    p.add_argument("--fc1", type=int, default=128)
    p.add_argument("--fc2", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--amp", action="store_true", help="mixed precision on GPUs (bf16 where supported, else fp16)")
    p.add_argument("--from-memory", action="store_true", help="preload the samples into RAM: no input I/O while training")
    p.add_argument("--workers", type=int, default=4, help="data loader workers per rank (0: in the main process)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--output-dir", default="outputs")
    p.add_argument("--profile-dir", help="force the PyTorch profiler on (default: AMLHPC_PROFILE_DIR)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _peak(d, use_amp: bool, amp_dtype, resumed: dict | None = None) -> tuple[peak.Peak | None, str]:
    """What MFU is measured against: the catalog's peak for the dtype the convolutions run
    in on a GPU (none for fp32/TF32: the catalog keeps tensor-core peaks), a measured GEMM on
    a CPU (measured once per run: a resumed attempt keeps the checkpoint's)."""
    if d.device.type != "cuda":
        return peak.kept(peak.measured_cpu_peak, resumed or {}), ""
    if not use_amp:
        return None, "fp32 steps (no --amp): the catalog has no TF32 peak to measure them against"
    return peak.catalog_peak(skufacts.load_sku_facts(), "bf16" if amp_dtype == torch.bfloat16 else "fp16")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        skufacts.load_sku_facts()  # a malformed AMLHPC_SKU_JSON is bad input before anything starts
    except RuntimeInputError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    d = common.init_distributed()
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    root = data.data_dir(args.input, args.data_dir)
    train_files, val_files = data.split(data.rank_files(root, args.input, d.rank, d.world, args.file_list))
    if common.all_reduce_min(d, len(train_files)) == 0:
        print(f"rank {d.rank}: no training files under {root} (need *.tfrecord; check the input's path and staging)", file=sys.stderr)
        return 2
    accumulation = 1
    if args.global_batch:
        if args.global_batch % (args.batch_size * d.world):
            print(f"--global-batch {args.global_batch} is not a multiple of --batch-size {args.batch_size} x world "
                  f"{d.world}", file=sys.stderr)
            return 2
        accumulation = args.global_batch // (args.batch_size * d.world)
    dataset = (data.InMemory if args.from_memory else data.CosmoFlowFiles)(train_files)
    x0, _ = dataset[0]
    volume = x0.shape[-1]
    model = CosmoFlow(volume, x0.shape[0], args.conv_size, args.n_conv_layers, args.fc1, args.fc2, dropout=args.dropout).to(d.device)
    ddp, sync_gradients = common.data_parallel(model, d, args.deterministic)
    lr = args.lr * d.world * accumulation
    optimizer = (torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9) if args.optimizer == "sgd"
                 else torch.optim.Adam(model.parameters(), lr=lr))
    amp_dtype = torch.bfloat16 if (d.device.type == "cuda" and torch.cuda.is_bf16_supported()) else torch.float16
    use_amp = args.amp and d.device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
    device_peak: peak.Peak | None = None
    no_peak = ""
    flops_per_step = peak.train_flops(model, x0.unsqueeze(0)) * args.batch_size * accumulation  # per rank

    sampler = common.ShardSampler(len(dataset), args.batch_size * accumulation, args.seed + d.rank)
    steps_per_epoch = common.all_reduce_min(d, sampler.steps_per_epoch)  # DDP needs equal step counts on every rank
    if args.max_steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, args.max_steps_per_epoch)
    if steps_per_epoch == 0:
        print(f"rank {d.rank}: fewer samples than --batch-size {args.batch_size}", file=sys.stderr)
        return 2
    sampler.limit = steps_per_epoch
    # The workers' seeds are a function of (seed, epoch), saved with the rank's RNG: a resumed
    # run's workers are seeded as an uninterrupted run's were (common.LoaderSeeds).
    seeds = common.LoaderSeeds(args.seed + d.rank)
    state = common.TrainState(model, optimizer, sampler=sampler, loader_seeds=seeds,
                              extra=lambda: {"scaler": scaler.state_dict(), **peak.to_extra(device_peak)})
    step = common.load_state(state)
    if state.resumed_extra.get("scaler"):
        scaler.load_state_dict(state.resumed_extra["scaler"])
    # after the restore: a resumed run keeps the peak its first attempt measured (one MFU denominator per run)
    device_peak, no_peak = _peak(d, use_amp, amp_dtype, state.resumed_extra)
    if d.is_main:
        print(json.dumps({"flops_per_sample": flops_per_step / (args.batch_size * accumulation),
                          "peak_tflops": device_peak.tflops if device_peak else None,
                          "peak_source": device_peak.source if device_peak else f"none: {no_peak}"}), flush=True)
    workers = 0 if args.from_memory else args.workers
    # The loader draws its workers' base seed from its own generator, not the global one the
    # dropout masks come from: a resumed run creates its loader at another point of that stream.
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True, num_workers=workers,
                        generator=seeds.generator,
                        pin_memory=d.device.type == "cuda", persistent_workers=workers > 0)
    start_epoch = sampler.epoch + (1 if sampler.position >= steps_per_epoch * sampler.batch else 0)
    # Validation draws nothing from the global RNG either: a run resumed after an epoch's last
    # checkpoint does not validate that epoch again.
    val_loader = (DataLoader(data.CosmoFlowFiles(val_files), batch_size=args.batch_size,
                             generator=torch.Generator().manual_seed(args.seed)) if val_files else None)
    metrics = common.Metrics(d, args.output_dir)
    own = common.OwnWork(d.device)  # each step's own work on the device: where a straggler shows
    samples, seconds, loss_value, val_mae, step_loss = 0, 0.0, math.nan, None, math.nan

    with common.profiler(d, args.profile_dir) as prof:
        for epoch in range(start_epoch, args.epochs):
            sampler.set_epoch(epoch)
            if args.warmup_epochs and epoch < args.warmup_epochs:
                for group in optimizer.param_groups:
                    group["lr"] = lr * (epoch + 1) / args.warmup_epochs
            model.train()
            timer = common.Timer()
            batches = seeds.iterate(loader, epoch)
            done = sampler.position // sampler.batch
            for i in range(done, steps_per_epoch):
                step_started = time.perf_counter()
                own.start()
                optimizer.zero_grad(set_to_none=True)
                step_loss = 0.0
                for micro in range(accumulation):
                    x, y = next(batches)
                    x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
                    syncing = micro == accumulation - 1 or ddp is model
                    with (contextlib.nullcontext() if syncing else ddp.no_sync()):
                        with torch.autocast(d.device.type, dtype=amp_dtype, enabled=use_amp):
                            loss = F.mse_loss(ddp(x).float(), y) / accumulation
                        if syncing:  # the last forward ends this rank's own work; its backward all-reduces
                            own.done(step + 1)
                        scaler.scale(loss).backward()
                    step_loss += float(loss.detach())
                sync_gradients()
                scaler.step(optimizer)
                scaler.update()
                sampler.step_done()
                step += 1
                step_s = time.perf_counter() - step_started  # the loss's float() above waited for the device
                own.settle()
                if prof is not None:
                    prof.step()
                if step % args.log_every == 0 or i == done:
                    loss_value = step_loss
                    mfu = flops_per_step / step_s / (device_peak.tflops * 1e12) if device_peak else None
                    metrics.log(step, loss=loss_value, epoch=epoch, step_time_s=step_s,
                                **({"mfu": mfu} if mfu is not None else {}))
                    metrics.node_step(step, step_s)
                if args.checkpoint_every and step % args.checkpoint_every == 0:
                    common.save_state(state, step, background=not args.sync_checkpoints)
                common.inject_fault(step)
            loss_value = common.all_reduce_mean(d, step_loss)
            epoch_s = timer.elapsed()
            seconds += epoch_s
            ran = steps_per_epoch - done
            samples += ran * sampler.batch * d.world
            val_mae = _validate(model, val_loader, d) if val_loader is not None else None
            metrics.log(step, epoch_loss=loss_value, epoch=epoch, samples_per_s=ran * sampler.batch * d.world / epoch_s,
                        **({"val_mae": val_mae} if val_mae is not None else {}))
            if not args.checkpoint_every:
                common.save_state(state, step, background=not args.sync_checkpoints)
    common.finish_checkpoints()
    metrics.summary(throughput=samples / seconds if seconds else None, throughput_unit="samples/s", final_loss=loss_value,
                    val_mae=val_mae, world_size=d.world, steps=step, epochs=args.epochs, from_memory=args.from_memory,
                    volume=volume, workload="cosmoflow", global_batch=sampler.batch * d.world)
    return 0


def _validate(model, loader, d) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            pred = model(x.to(d.device))
            total += float((pred.float() - y.to(d.device)).abs().sum())
            count += y.numel()
    return common.all_reduce_mean(d, total / max(count, 1))


if __name__ == "__main__":
    sys.exit(main())
