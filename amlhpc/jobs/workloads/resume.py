"""Exact resume: what a checkpoint holds besides the weights - the step, the data order, every
RNG - and the API the workloads call (amlhpc/jobs/workloads/common.py re-exports it).

    state = TrainState(model, optimizer, sampler=sampler, generators={"dropout": g}, extra=lambda: {...})
    step = load_state(state)          # 0 on a fresh start; else everything restored, step to go on from
    for ...:                          # after each optimizer step:
        state.sampler.step_done()
        if due: save_state(state, step)   # background write into the node's tier (async by default)
        inject_fault(step)                # the fault point training.fault (jobs run --fault)
    finish_checkpoints()              # the last write is on disk before the process exits

A checkpoint is a version of the node-local tier (amlhpc/jobs/runtime/checkpoint/tier.py) written with
torch.distributed.checkpoint by every rank (versioned.py); the launcher uploads it, agrees on it
after a crash and names the one to resume from in AMLHPC_RESUME_VERSION.

Data order: `ShardSampler` (each rank reads its own files, as staging's `local` placement gives
them) and `GlobalBatchSampler` (every rank indexes one dataset; each step takes the next
`global_batch` samples of the epoch's permutation and splits them into micro-batches over ranks
and gradient-accumulation passes, so the same samples make each step at any world size). Both
keep their position in samples of completed steps; a resumed loader starts exactly there.

RNG: Python's `random`, NumPy's global generator, torch's CPU generator, every CUDA device's,
any named torch.Generator the workload uses, and the seeding of its DataLoader's workers
(`LoaderSeeds`, with `SeededSamples` for random draws inside the workers). With the same world size and deterministic
kernels (torch.use_deterministic_algorithms) a resumed run's per-step losses are bit-identical to
an uninterrupted one's on CPU. On another world size (shrink-and-continue) the weights reshard,
the global sampler goes on where it was, and per-rank RNG starts afresh from the seed.
"""

from __future__ import annotations

import base64
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import contract, faultpoints, progress

RESUME_VERSION = contract.RESUME_VERSION
RESTART_GENERATION = contract.RESTART_GENERATION
CHECKPOINT_TAG = contract.CHECKPOINT_TAG
EXIT_INJECTED_CRASH = 86

_last_saved: Path | None = None
"""The checkpoint this process wrote last (named in its completion report)."""


def record_checkpoint(path: Path) -> None:
    """Note a checkpoint this process writes (save_state does; a workload with its own
    format calls it, as common.record_checkpoint), so the completion report names the final one."""
    global _last_saved
    _last_saved = Path(path)


def last_checkpoint() -> Path | None:
    return _last_saved


# --- data order -------------------------------------------------------------------------


def _permutation(length: int, seed: int, epoch: int) -> list[int]:
    import torch

    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(length, generator=generator).tolist()


class ShardSampler:
    """This rank's own samples, shuffled per epoch from (seed, epoch); `batch` samples per step.
    `limit` caps the steps of an epoch (the training sets it: every rank runs as many)."""

    def __init__(self, length: int, batch: int, seed: int):
        self.length, self.batch, self.seed = length, batch, seed
        self.epoch, self.position = 0, 0
        self.limit: int | None = None

    @property
    def steps_per_epoch(self) -> int:
        steps = self.length // self.batch
        return min(steps, self.limit) if self.limit else steps

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def step_done(self) -> None:
        self.position += self.batch

    def __iter__(self) -> Iterator[int]:
        return iter(_permutation(self.length, self.seed, self.epoch)[self.position:self.steps_per_epoch * self.batch])

    def __len__(self) -> int:
        return self.steps_per_epoch * self.batch - self.position

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "steps_in_epoch": self.position // self.batch,
                "steps_per_epoch": self.steps_per_epoch}

    def load_state_dict(self, state: dict[str, Any], same_world: bool = True) -> None:
        self.epoch = int(state["epoch"])
        if same_world:
            self.position = int(state["position"])
            return
        # On another world size the shards differ: go on from the same fraction of the epoch.
        done, total = int(state["steps_in_epoch"]), max(int(state["steps_per_epoch"]), 1)
        steps = self.steps_per_epoch if done >= total else done * self.steps_per_epoch // total
        self.position = steps * self.batch


class GlobalBatchSampler:
    """One order for the job: step s of an epoch is samples [s*G, (s+1)*G) of the epoch's
    permutation, cut into micro-batches of `micro_batch`; micro-batch m goes to rank m % world,
    accumulation pass m // world. Yields this rank's indices, pass by pass."""

    def __init__(self, length: int, global_batch: int, micro_batch: int, rank: int, world: int, seed: int):
        if global_batch % (micro_batch * world):
            raise ValueError(f"global batch {global_batch} is not a multiple of micro batch {micro_batch} x world {world}: "
                             "choose a global batch every world size you run on divides (e.g. 12 for 4 and 3 ranks)")
        self.length, self.global_batch, self.micro_batch, self.rank, self.world, self.seed = (
            length, global_batch, micro_batch, rank, world, seed)
        self.epoch, self.step_in_epoch = 0, 0

    @property
    def accumulation(self) -> int:
        return self.global_batch // (self.micro_batch * self.world)

    @property
    def steps_per_epoch(self) -> int:
        return self.length // self.global_batch

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.step_in_epoch = epoch, 0

    def step_done(self) -> None:
        self.step_in_epoch += 1

    def indices_of_step(self, step_in_epoch: int, order: list[int] | None = None) -> list[list[int]]:
        """This rank's micro-batches of one step."""
        order = order or _permutation(self.length, self.seed, self.epoch)
        base = step_in_epoch * self.global_batch
        return [order[base + m * self.micro_batch: base + (m + 1) * self.micro_batch]
                for m in range(self.rank, self.global_batch // self.micro_batch, self.world)]

    def __iter__(self) -> Iterator[int]:
        order = _permutation(self.length, self.seed, self.epoch)
        for step in range(self.step_in_epoch, self.steps_per_epoch):
            for micro in self.indices_of_step(step, order):
                yield from micro

    def __len__(self) -> int:
        return (self.steps_per_epoch - self.step_in_epoch) * self.accumulation * self.micro_batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_batch": self.global_batch}

    def load_state_dict(self, state: dict[str, Any], same_world: bool = True) -> None:
        if int(state.get("global_batch", self.global_batch)) != self.global_batch:
            raise ValueError(f"the checkpoint was trained with global batch {state['global_batch']}, this run uses "
                             f"{self.global_batch}: keep --global-batch when resuming")
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])


# --- DataLoader workers ------------------------------------------------------------------


def _mix(*parts: int) -> int:
    """A 63-bit seed from integers (a resumed run computes the same one)."""
    value = 0
    for part in parts:
        value = (value * 1_000_003 + int(part)) % (1 << 63)
    return value


class LoaderSeeds:
    """The seeding of a DataLoader's workers, a function of (seed, epoch) and kept in the checkpoint.

    A DataLoader draws its workers' base seed from its `generator` each time it starts an
    iterator (each epoch; once, with persistent workers), and each worker seeds `random`, torch
    and NumPy from it plus its id (PyTorch's documentation, "Randomness in multi-process data
    loading", pytorch.org/docs/stable/data.html, read 2026-11-28). A resumed run's loader is new:
    its first draw was the uninterrupted run's first, not the current epoch's. Here the
    generator is set from (seed, epoch) before every iterator starts, and the epoch whose seed
    persistent workers got is saved (`state_dict`, in save_state), so a resumed run's workers
    get the seeds an uninterrupted run's had:

        seeds = LoaderSeeds(args.seed + rank)
        loader = DataLoader(SeededSamples(dataset, seeds), sampler=sampler, generator=seeds.generator, ...)
        state = TrainState(model, optimizer, sampler=sampler, loader_seeds=seeds)
        for epoch in ...:
            batches = seeds.iterate(loader, epoch)

    Random draws inside the workers (augmentation) are exact at any resumed step only when each
    sample's draws derive from the sample itself: `SeededSamples` seeds every RNG from (the
    epoch's seed, the sample's index) before each sample (a worker's own stream depends on which
    batches it was dealt, which a resume in mid-epoch changes)."""

    def __init__(self, seed: int):
        import torch

        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.seeded_epoch: int | None = None
        """The epoch whose seed the loader's current workers got (None: no iterator yet)."""
        self.epoch_seed = self.seed
        """That epoch's seed (SeededSamples in the main process, without workers)."""
        self._persistent_from: int | None = None
        """A resumed run with persistent workers: the epoch whose seed they got in the saved run."""

    def iterate(self, loader, epoch: int):
        """iter(loader) for `epoch`, its workers seeded from (seed, epoch)."""
        persistent = bool(getattr(loader, "persistent_workers", False))
        if persistent and isinstance(getattr(loader, "dataset", None), SeededSamples):
            raise ValueError("SeededSamples needs each epoch's seed in the workers: persistent workers never get it; "
                             "create the DataLoader with persistent_workers=False")
        if not persistent or self.seeded_epoch is None:
            seeded = self._persistent_from if persistent and self._persistent_from is not None else epoch
            self.seeded_epoch, self.epoch_seed = seeded, _mix(self.seed, seeded)
            self.generator.manual_seed(self.epoch_seed)
        return iter(loader)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "seeded_epoch": self.seeded_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seeded_epoch") is not None:
            self._persistent_from = int(state["seeded_epoch"])


class SeededSamples:
    """A map-style dataset whose every sample is drawn with `random`, torch and NumPy seeded from
    (the epoch's loader seed, the sample's index): the same draws for the same sample in any run,
    resumed or not, whichever worker loads it (see LoaderSeeds)."""

    def __init__(self, dataset, seeds: LoaderSeeds):
        self.dataset, self.seeds = dataset, seeds

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        import torch
        from torch.utils.data import get_worker_info

        worker = get_worker_info()
        base = worker.seed - worker.id if worker is not None else self.seeds.epoch_seed
        seed = _mix(base, index)
        random.seed(seed)
        torch.manual_seed(seed)
        if "numpy" in sys.modules:
            import numpy as np

            np.random.seed(seed % (1 << 32))
        return self.dataset[index]


# --- RNG --------------------------------------------------------------------------------


def _b64(tensor) -> str:
    return base64.b64encode(bytes(tensor.numpy().tobytes())).decode()


def _tensor(text: str):
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def rng_state(generators: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every RNG this process draws from, as JSON."""
    import torch

    version, state, gauss = random.getstate()
    out: dict[str, Any] = {"python": [version, list(state), gauss], "torch": _b64(torch.get_rng_state()),
                           "generators": {k: _b64(g.get_state()) for k, g in (generators or {}).items()}}
    if "numpy" in sys.modules:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # the tuple form
        out["numpy"] = [kind, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available():
        out["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return out


def set_rng_state(state: dict[str, Any], generators: dict[str, Any] | None = None) -> None:
    import torch

    version, python_state, gauss = state["python"]
    random.setstate((version, tuple(python_state), gauss))
    torch.set_rng_state(_tensor(state["torch"]))
    for name, generator in (generators or {}).items():
        if name in state.get("generators", {}):
            generator.set_state(_tensor(state["generators"][name]))
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_tensor(s) for s in state["cuda"]])


# --- the state and the API ------------------------------------------------------------


@dataclass
class TrainState:
    """What a workload checkpoints: model and optimizer (any DDP/FSDP layout), the sampler,
    named generators, and `extra()` (JSON: epoch, scaler, ...) handed back by `load_state`."""

    model: Any
    optimizer: Any
    sampler: Any = None
    generators: dict[str, Any] = field(default_factory=dict)
    extra: Callable[[], dict[str, Any]] = dict
    loader_seeds: LoaderSeeds | None = None
    """The DataLoader's worker seeding (saved and restored with the rank's RNG)."""
    resumed_extra: dict[str, Any] = field(default_factory=dict)
    """After load_state: the `extra` the checkpoint held."""
    resumed_from: str | None = None


_checkpointer = None


def _dist() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def checkpointer(background: bool | None = None):
    """This process's Checkpointer into AMLHPC_CHECKPOINT_DIR (default outputs/checkpoints)."""
    global _checkpointer
    if _checkpointer is None:
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

        rank, world = _dist()
        folder = Path(os.environ.get(contract.CHECKPOINT_DIR) or "outputs/checkpoints")
        _checkpointer = Checkpointer(folder, rank, world, os.environ.get(CHECKPOINT_TAG) or "local",
                                     background=True if background is None else background)
    elif background is not None:
        _checkpointer.background = background
    return _checkpointer


def _model_and_optim(state: TrainState):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(state.model, state.optimizer)


def save_state(state: TrainState, step: int, background: bool = True) -> float:
    """Checkpoint everything at `step` (a version of the node's tier). Returns the seconds the
    training was held; the write goes on in the background unless `background` is False."""
    model_sd, optim_sd = _model_and_optim(state)
    trainer = {"step": step, "sampler": state.sampler.state_dict() if state.sampler is not None else None,
               "rng": rng_state(state.generators), "extra": state.extra(), "written": time.time(),
               "loader": state.loader_seeds.state_dict() if state.loader_seeds is not None else None}
    writer = checkpointer(background)
    stall = writer.save(step, {"model": model_sd, "optim": optim_sd}, trainer)
    _record(writer, step)
    return stall


def _record(writer, step: int) -> None:
    """Name this rank's part of the version in the completion report (common.Metrics.summary):
    its marker, which exists only once the part is written whole (finish_checkpoints waits)."""
    from amlhpc.jobs.runtime.checkpoint import tier

    record_checkpoint(tier.marker_path(tier.versions_dir(writer.checkpoint_dir) / tier.version_name(step),
                                              writer.rank))


def finish_checkpoints() -> None:
    """Wait until the last checkpoint is written (call before a normal exit)."""
    if _checkpointer is not None:
        _checkpointer.close()


def resume_version() -> Path | None:
    value = os.environ.get(RESUME_VERSION, "").strip()
    return Path(value) if value else None


def load_state(state: TrainState, version: Path | None = None) -> int:
    """Restore everything from the version the launcher named (AMLHPC_RESUME_VERSION) or `version`;
    returns the step to go on from (0: a fresh start)."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from amlhpc.jobs.runtime.checkpoint.versioned import load_version

    version = version or resume_version()
    if version is None:
        progress.report(0)  # a fresh start: the watchdog watches from here
        return 0
    rank, world = _dist()
    model_sd, optim_sd = _model_and_optim(state)
    loaded = {"model": model_sd, "optim": optim_sd}
    trainer = load_version(version, loaded, rank, world)
    set_state_dict(state.model, state.optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    if state.sampler is not None and trainer.get("sampler") is not None:
        state.sampler.load_state_dict(trainer["sampler"], same_world=trainer["same_world"])
    if trainer["same_world"]:
        set_rng_state(trainer["rng"], state.generators)
        if state.loader_seeds is not None and trainer.get("loader"):
            state.loader_seeds.load_state_dict(trainer["loader"])
    state.resumed_extra = trainer.get("extra") or {}
    state.resumed_from = Path(version).name
    step = int(trainer["step"])
    progress.note_resumed(step)
    if rank == 0:
        world_note = "" if trainer["same_world"] else f", resharded from world size {trainer['saved_world']}"
        print(f"resumed from {Path(version).name} (step {step}{world_note})", flush=True)
    return step


# --- fault injection for tests and rehearsals -----------------------------------------

FAULT_POINT = "training.fault"
"""The named fault point (amlhpc/jobs/runtime/base/faultpoints.py) `inject_fault` reaches after every
step; `jobs run --fault crash|error|stall@step=N,rank=R,...` arms it (amlhpc/jobs/local/faults.py)."""


def _wait_for(what: str, done: Callable[[], bool], step: int, limit_s: float = 300.0) -> None:
    """Wait for a state of the job; the rank keeps telling the watchdog it is alive meanwhile."""
    deadline = time.monotonic() + limit_s
    beat = 0.0
    while time.monotonic() < deadline:
        if done():
            return
        if time.monotonic() >= beat:
            progress.report(step)
            beat = time.monotonic() + 1.0
        time.sleep(0.1)
    print(f"injected fault: {what} did not happen within {limit_s:.0f}s", file=sys.stderr)


def _all_ranks(mine: bool) -> bool:
    """Whether `mine` holds on every rank (a collective: every rank calls it in the same loop)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return mine
    flag = torch.tensor([1 if mine else 0], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _committed_at_least(step: int) -> bool:
    import json

    from amlhpc.jobs.runtime.checkpoint import tier
    from amlhpc.jobs.runtime.checkpoint.uploader import COMMITTED_FILE

    path = tier.versions_dir(Path(os.environ.get(contract.CHECKPOINT_DIR) or "outputs/checkpoints")) / COMMITTED_FILE
    try:
        return json.loads(path.read_text()).get("step", -1) >= step
    except (OSError, ValueError):
        return False


def _corrupt_local_copies(rank: int, keep_mtime: bool = False) -> list[str]:
    """Flip a byte in the middle of each of the rank's local checkpoint files; `keep_mtime`: put
    each file's mtime back (the medium's corruption: only hashing the bytes finds it)."""
    from amlhpc.jobs.runtime.checkpoint import tier

    corrupted = []
    for version in tier.scan_versions(Path(os.environ.get(contract.CHECKPOINT_DIR) or "outputs/checkpoints")):
        for path in sorted(p for p in tier.rank_dir(version.path, rank).rglob("*") if p.is_file()):
            before = path.stat()
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
            if keep_mtime:
                os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
            corrupted.append(f"{version.name}/{path.name}")
    return corrupted


def inject_fault(step: int) -> None:
    """The fault point `training.fault` after every step: act when a fault is armed there for
    this step, rank and restart generation (AMLHPC_FAULTPOINTS, once per process: a restarted
    run is another generation). Every rank first finishes its checkpoint writes at that step,
    so the versions a restart can choose from are the same on every run of a test; a setting
    may first wait for every rank's warm standby (`after_standby`, a collective: every rank
    takes part) or for a commit of a step (`after_commit`), or corrupt this rank's local
    copies (`corrupt`; `rot`: keeping their mtimes)."""
    due = faultpoints.planned(FAULT_POINT, step=step)
    if not due:
        return
    finish_checkpoints()
    if any(spec.get("after_standby") for spec in due):  # every rank's, since the slowest rank's restart is everyone's
        ready = Path(os.environ.get("AMLHPC_STANDBY_READY") or "/nonexistent")
        _wait_for("every rank's warm standby", lambda: _all_ranks(ready.exists()), step)
    rank, _ = _dist()
    mine = faultpoints.planned(FAULT_POINT, step=step, rank=rank)
    if not mine:
        return
    spec = mine[0]
    if (after := spec.get("after_commit")) is not None:
        _wait_for(f"a commit of step {after}", lambda: _committed_at_least(int(after)), step)
    if spec.get("corrupt") or spec.get("rot"):
        corrupted = _corrupt_local_copies(rank, keep_mtime=bool(spec.get("rot")))
        print(f"injected fault: corrupted {', '.join(corrupted) or 'nothing'}", file=sys.stderr, flush=True)
    print(f"injected fault: {spec.get('kind') or spec['action']} on rank {rank} at step {step} ({spec.get('spec')})",
          file=sys.stderr, flush=True)
    faultpoints.reach(FAULT_POINT, step=step, rank=rank)
