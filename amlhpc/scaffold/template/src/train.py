"""The team's training: replace the model and the data with yours, keep the four hooks.

A small PyTorch model trained data-parallel (DistributedDataParallel) on synthetic data. It
runs as aml-hpc runs every job: `python -m amlhpc.jobs.runtime.launch -- python train.py
...` on every process of every node, in the job's working folder (this folder's contents),
with torch.distributed's variables set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT). The hooks that make it a good citizen of the platform:

1. progress: `progress.report(step)` after each step, so the launcher's watchdog can tell a
   hang from a slow step (docs/contracts.md, AMLHPC_PROGRESS_FILE);
2. checkpoints: written into AMLHPC_CHECKPOINT_DIR, which the launcher uploads in the
   background; a resubmitted or resumed run finds the latest in AMLHPC_RESUME_DIR;
3. metrics: one JSON line per step on rank 0 ({"step", "loss", "samples_per_s", ...}), which
   `jobs logs` shows and `jobs report` plots;
4. completion: `progress.report_completed(step)` once the work is done, and rank 0's summary
   in outputs/aml-hpc/metrics.json (`jobs list` and `jobs report` read it).

Outside a job (plain `python train.py`) it runs on one process and the hooks do nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist
from torch import nn

progress: ModuleType | None
try:  # aml-hpc's runtime travels beside this code in every job's snapshot
    from amlhpc.jobs.runtime.base import progress
except ImportError:  # run outside aml-hpc: no launcher to report to
    progress = None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The team's training (a template: replace the model and data)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64, help="samples per process and step")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 1 or args.batch < 1 or args.width < 1:
        parser.error("--steps, --checkpoint-every, --batch and --width must be at least 1")
    return args


def start() -> tuple[int, int, torch.device]:
    """(rank, world size, device); joins the process group when there are several processes."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world, device


def latest_checkpoint() -> Path | None:
    """The newest ckpt-<step>.pt the launcher restored (AMLHPC_RESUME_DIR) or this job wrote."""
    for folder in (os.environ.get("AMLHPC_RESUME_DIR"), os.environ.get("AMLHPC_CHECKPOINT_DIR")):
        found = sorted(Path(folder).glob("ckpt-*.pt")) if folder and Path(folder).is_dir() else []
        if found:
            return found[-1]
    return None


def save(step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    """Rank 0 writes the checkpoint whole under a temporary name, then renames it: the
    launcher's upload never sees half a file."""
    folder = Path(os.environ.get("AMLHPC_CHECKPOINT_DIR") or "outputs/checkpoints")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ckpt-{step:09d}.pt"
    partial = path.with_suffix(".partial")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, partial)
    partial.replace(path)
    return path


def batch(step: int, rank: int, size: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data: the same samples for a (step, rank) on every run, so a resumed run
    continues where the checkpoint left off."""
    generator = torch.Generator().manual_seed(step * 100_003 + rank)
    x = torch.randn(size, width, generator=generator)
    return x, x[:, :1] * 3.0 - x[:, 1:2] + 0.1 * torch.randn(size, 1, generator=generator)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    rank, world, device = start()
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 1)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    first = 0
    found = latest_checkpoint()
    if found is not None:
        state = torch.load(found, map_location=device, weights_only=True)  # tensors only: nothing is unpickled
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = int(state["step"])
        if progress is not None:
            progress.note_resumed(first)
        if rank == 0:
            print(f"resumed from {found.name} (step {first})", flush=True)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if progress is not None:
        progress.report(first)  # the watchdog watches from here
    step, saved, loss = first, None, torch.zeros(())
    for step in range(first + 1, args.steps + 1):
        began = time.perf_counter()
        x, y = (t.to(device) for t in batch(step, rank, args.batch, args.width))
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        seconds = time.perf_counter() - began
        if progress is not None:
            progress.report(step)
        if rank == 0:
            print(json.dumps({"step": step, "loss": round(loss.item(), 6), "step_time_s": round(seconds, 4),
                              "samples_per_s": round(args.batch * world / seconds, 1)}), flush=True)
            if step % args.checkpoint_every == 0 or step == args.steps:
                saved = save(step, model.module if world > 1 else model, optimizer)
    if progress is not None:
        progress.report_completed(step, saved)
    if rank == 0:
        summary = Path("outputs/aml-hpc/metrics.json")
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(json.dumps({"workload": "train", "steps": step, "world_size": world,
                                       "final_loss": round(loss.item(), 6) if step > first else None}, indent=2))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
