"""A tiny synchronous training without a framework, for rehearsing the platform itself
(the managed rehearsal in `make test`): ranks step in lockstep as in data-parallel
training, rank 0 checkpoints every few steps, a restart resumes from the restored
checkpoint, and every rank reports its step to the launcher's watchdog.

    python -m amlhpc.jobs.workloads.synthetic --steps 30 --step-s 0.1 --checkpoint-every 5

Lockstep stands in for the all-reduce of a data-parallel step, without its arithmetic:
rank 0 listens on MASTER_ADDR:MASTER_PORT, every other rank connects, and each step
every rank tells rank 0 it finished and waits for rank 0's go, sent once all have. A rank
that dies breaks its connection and the others fail (exit 1), as NCCL or gloo would; a
rank that freezes leaves the others waiting, as a hung collective does. Each rank says when
its own work on a step is done and it waits for the others (amlhpc.jobs.runtime.base.progress.compute_done),
so the watchdog can tell a slow node and the node a hang started on. `--global-batch N` is
the samples of a step over all ranks, as the real workloads take it: each rank's share is N
divided by the ranks (refused when it does not divide), so a run resumed on fewer nodes
(shrink-and-continue) keeps N and says so in its summary. Standard library and
amlhpc.jobs.workloads.common only (no torch): it starts in a fraction of a second.
Exit codes: 0 done, 1 a peer went away, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import TextIO

from amlhpc.jobs.workloads import common

CONNECT_S = 120.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Synthetic lockstep training (no framework)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-s", type=float, default=0.1, help="seconds of 'compute' per step")
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=0, help="samples per step over all ranks (0: one per rank)")
    p.add_argument("--output-dir", default="outputs")
    args = p.parse_args(argv)
    if args.steps < 1 or args.step_s < 0 or args.checkpoint_every < 1 or args.global_batch < 0:
        p.error("--steps and --checkpoint-every must be >= 1, --step-s and --global-batch >= 0")
    return args


class Lockstep:
    """Rank 0 is the hub; `step()` returns once every rank finished the step."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.peers: list[TextIO] = []
        self.hub: TextIO | None = None  # every rank but 0, when the world is larger than one
        if world == 1:
            return
        address = (os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500")))
        if rank == 0:
            server = socket.create_server(address, backlog=world)
            server.settimeout(CONNECT_S)
            self.peers = [server.accept()[0].makefile("rw") for _ in range(world - 1)]
            server.close()
        else:
            deadline = time.monotonic() + CONNECT_S
            while True:
                try:
                    self.hub = socket.create_connection(address, timeout=CONNECT_S).makefile("rw")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def step(self, step: int) -> None:
        if self.world == 1:
            return
        # A rank that goes away shows as end of file or, when its socket is reset, as an OSError.
        if self.rank == 0:
            try:
                answers = [peer.readline().strip() for peer in self.peers]
            except OSError as exc:
                raise ConnectionError(f"a rank left before step {step} ({exc})") from exc
            if any(answer != str(step) for answer in answers):
                raise ConnectionError(f"a rank left before step {step}")
            try:
                for peer in self.peers:
                    peer.write("go\n")
                    peer.flush()
            except OSError as exc:
                raise ConnectionError(f"a rank left before step {step} ({exc})") from exc
        else:
            assert self.hub is not None, "__init__ connects every rank but 0 to the hub"
            try:
                self.hub.write(f"{step}\n")
                self.hub.flush()
                answer = self.hub.readline().strip()
            except OSError as exc:
                raise ConnectionError(f"rank 0 left before step {step} ({exc})") from exc
            if answer != "go":
                raise ConnectionError(f"rank 0 left before step {step}")


def _save(step: int, keep: int = 2) -> None:
    folder = common.checkpoint_dir()
    tmp = folder / f".ckpt-{step:09d}.json.tmp"
    tmp.write_text(json.dumps({"step": step}))
    os.replace(tmp, folder / f"ckpt-{step:09d}.json")
    for old in sorted(folder.glob("ckpt-*.json"))[:-keep]:
        old.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    rank = int(os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
    world = int(os.environ.get("WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
    local_rank = int(os.environ.get("LOCAL_RANK") or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK") or 0)
    d = common.Dist(rank, local_rank, world, device=None)
    global_batch = args.global_batch or world
    if global_batch % world:
        print(f"--global-batch {global_batch} is not a multiple of the world size {world}", file=sys.stderr)
        return 2
    resume = common.latest_checkpoint("ckpt-*.json")
    step = json.loads(Path(resume).read_text())["step"] if resume else 0
    if d.is_main and resume:
        print(f"resumed from {resume} (step {step})", flush=True)
    metrics = common.Metrics(d, args.output_dir)
    try:
        lockstep = Lockstep(rank, world)
        own = common.OwnWork()  # no device: the step's wall time is its own work
        while step < args.steps:
            own.start()
            time.sleep(args.step_s)
            own.done(step + 1)  # its own work is done: now it waits for its peers
            lockstep.step(step + 1)
            step += 1
            metrics.log(step, loss=1.0 / step)
            if d.is_main and step % args.checkpoint_every == 0:
                _save(step)
    except (OSError, ConnectionError) as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    metrics.summary(steps=step, world_size=world, global_batch=global_batch, per_rank=global_batch // world,
                    workload="synthetic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
