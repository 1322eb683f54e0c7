"""Helpers every training script here shares: process group, metrics, checkpoints, profiler.

- `init_distributed()`: torch.distributed from the launcher's environment (RANK /
  WORLD_SIZE / MASTER_ADDR, or OpenMPI's variables under MPI), NCCL on GPUs, gloo on CPU;
  the group is destroyed at exit, with its worker threads, before the interpreter finalizes
  (see `_leave_process_group`).
- `Metrics`: one JSON line per log step on stdout (rank 0), MLflow when the image has it
  (Azure ML picks MLflow metrics up), and a summary file under outputs/ for `jobs scale report`.
- checkpoints: `save_state` / `load_state` / `finish_checkpoints` (amlhpc/jobs/workloads/resume.py):
  torch.distributed.checkpoint versions of model, optimizer, data order and RNG in the node's
  tier under AMLHPC_CHECKPOINT_DIR, written in the background, resumed from the version the
  launcher names (AMLHPC_RESUME_VERSION); `latest_checkpoint` for whole-file checkpoints.
- progress: every rank reports its step to the launcher's hang watchdog
  (amlhpc.jobs.runtime.base.progress) each time it logs, and the step it resumed from;
  `OwnWork` times each step's own work (before its collective) on the device, from which
  the managed run's controller names a straggler.
- `profiler()`: torch.profiler writing TensorBoard traces when AMLHPC_PROFILE_DIR is set.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import logging
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import contract, progress
from amlhpc.jobs.workloads import env as workload_env

log = logging.getLogger("amlhpc.workloads")

MODULES_THAT_CAPTURE_THE_GROUP = ("torch.distributed.nn.functional",)
"""torch modules whose functions take `group=group.WORLD` as a default argument, evaluated when
the module is imported: imported after init_process_group, they hold the live default group
until the interpreter tears its modules down, and destroy_process_group() can then neither free
the group nor stop its threads. DistributedDataParallel imports this one lazily, at its first
construction (torch 2.13: DDP -> torch.distributed._shard -> sharded_tensor.reshard ->
torch.distributed.nn.functional). Imported before the group exists, they capture None."""

GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")
"""The names (Linux `comm`) of a gloo group's worker threads and its TCP event loop."""


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world: int
    device: Any
    node: int = 0
    """This process's node (NODE_RANK, GROUP_RANK or OMPI_COMM_WORLD_NODE_RANK)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _first(*names: str, default: str) -> str:
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    return default


def init_distributed(backend: str | None = None) -> Dist:
    """Join the job's process group (a world of 1 needs no group)."""
    import torch
    import torch.distributed as dist

    rank = int(_first("RANK", "OMPI_COMM_WORLD_RANK", default="0"))
    world = int(_first("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", default="1"))
    local_rank = int(_first("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", default="0"))
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    os.environ.setdefault("LOCAL_RANK", str(local_rank))
    if "MASTER_ADDR" not in os.environ:
        # Azure ML's MPI jobs name the head node as AZ_BATCH_MASTER_NODE=ip:port
        master = _first("AZ_BATCH_MASTER_NODE", "AZ_BATCHAI_MPI_MASTER_NODE", default="127.0.0.1:29500")
        addr, _, port = master.partition(":")
        os.environ["MASTER_ADDR"] = addr
        os.environ.setdefault("MASTER_PORT", port or "29500")
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        import importlib

        for module in MODULES_THAT_CAPTURE_THE_GROUP:
            importlib.import_module(module)
        dist.init_process_group(backend or ("nccl" if device.type == "cuda" else "gloo"), init_method="env://")
        atexit.register(_leave_process_group)
    node = int(_first("NODE_RANK", "GROUP_RANK", "OMPI_COMM_WORLD_NODE_RANK", default="0"))
    return Dist(rank, local_rank, world, device, node)


def _leave_process_group() -> None:
    """Destroy the group, and with it its worker threads, while the interpreter is whole.

    A gloo group's threads (GLOO_THREADS) stop only when the group object is freed, not when
    destroy_process_group() returns. Freed during interpreter finalization instead (the last
    reference held by a module's default argument, see MODULES_THAT_CAPTURE_THE_GROUP), a
    rank that finished its training could die there with SIGABRT: "terminate called without
    an active exception", exit 134. A gloo worker that needs the GIL then (to run a work's
    Python callback, or to free a tensor Python made) is ended by CPython with pthread_exit,
    whose unwinding through a noexcept C++ frame calls std::terminate (python/cpython
    gh-87135 and PR 105805, read 2026-11-25: CPython 3.14 makes such threads hang instead).
    Here: destroy, let device meshes drop the group, collect the reference cycles a
    DDP-wrapped model leaves (its reducer holds the group), and check that the threads are
    gone (tests/test_exit_teardown.py makes the abort happen without this). A training that
    destroyed the group itself (`dist.destroy_process_group()` at its end, a common habit) still
    gets the rest: a destroyed group lives on in its meshes all the same."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _release_device_meshes()
    gc.collect()
    left = gloo_threads()
    if left:
        holders = group_holders()
        log.warning("the process group's threads (%s) are still running after destroy_process_group: %s holds the "
                    "group; this process may abort (SIGABRT) as the interpreter finalizes", ", ".join(left),
                    ", ".join(holders) or "an object still alive (a DDP-wrapped model in a module global?)")


def _release_device_meshes() -> None:
    """A DeviceMesh (FSDP2, DTensor) keeps its process groups in `_pg_registry`, and DTensor's
    sharding-propagation and redistribution caches keep the meshes alive for the life of the
    process (torch 2.13 torch/distributed/device_mesh.py): once the groups are destroyed, the
    meshes let go of them, so the groups can be freed now and not in finalization."""
    import sys

    if "torch.distributed.device_mesh" not in sys.modules:
        return
    from torch.distributed.device_mesh import DeviceMesh

    for obj in gc.get_objects():
        if isinstance(obj, DeviceMesh) and isinstance(getattr(obj, "_pg_registry", None), dict):
            obj._pg_registry.clear()


def gloo_threads(task_dir: Path = Path("/proc/self/task")) -> list[str]:
    """The gloo threads of this process, by name (Linux; elsewhere none can be seen)."""
    found = []
    try:
        tasks = os.listdir(task_dir)
    except OSError:
        return []
    for task in tasks:
        try:
            name = (task_dir / task / "comm").read_text().strip()
        except OSError:
            continue
        if name in GLOO_THREADS:
            found.append(name)
    return sorted(found)


def group_holders() -> list[str]:
    """Functions whose default arguments hold a process group (what keeps one alive)."""
    import types

    from torch.distributed import ProcessGroup

    found = []
    with warnings.catch_warnings():  # isinstance on torch's deprecated aliases warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, types.FunctionType):
                defaults = (*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values())
                if any(isinstance(value, ProcessGroup) for value in defaults):
                    found.append(f"{obj.__module__}.{obj.__qualname__}")
    return sorted(found)


def barrier(d: Dist) -> None:
    import torch.distributed as dist

    if d.world > 1 and dist.is_initialized():
        dist.barrier()


def all_reduce_min(d: Dist, value: int) -> int:
    import torch
    import torch.distributed as dist

    if d.world == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.long, device=d.device if d.device.type == "cuda" else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def all_reduce_mean(d: Dist, value: float) -> float:
    import torch
    import torch.distributed as dist

    if d.world == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=d.device if d.device.type == "cuda" else "cpu")
    dist.all_reduce(tensor)
    return float(tensor.item()) / d.world


class Metrics:
    """Step metrics on rank 0: JSON lines, MLflow if present, and a final summary file."""

    def __init__(self, d: Dist, output_dir: str | Path = workload_env.OUTPUT_DIR_DEFAULT):
        self.d = d
        self.output_dir = Path(output_dir)
        self._mlflow = None
        if d.is_main:
            try:
                import mlflow

                self._mlflow = mlflow if os.environ.get("MLFLOW_TRACKING_URI") else None
            except ImportError:
                self._mlflow = None

    def log(self, step: int, **values: float) -> None:
        progress.report(step)  # every rank: the watchdog judges each one
        if not self.d.is_main:
            return
        print(json.dumps({"step": step, **values}), flush=True)  # floats exactly: resumed runs are compared bit for bit
        if self._mlflow is not None:
            self._mlflow.log_metrics({k: float(v) for k, v in values.items()}, step=step)

    def node_step(self, step: int, step_time_s: float) -> None:
        """A step's seconds from the first process of every other node (rank 0's own line
        carries its node's): the report's per-node step time, where a straggler shows."""
        if self.d.local_rank == 0 and not self.d.is_main:
            print(json.dumps({"step": step, "node": self.d.node, "step_time_s": step_time_s}), flush=True)

    def summary(self, **values: Any) -> Path | None:
        """The workload's last word, on every rank: tells the launcher the training completed
        (its last step, and the final checkpoint this rank wrote); rank 0 writes the summary file."""
        final = values.get("steps") if isinstance(values.get("steps"), int) else progress.last_step()
        progress.report_completed(final or 0, last_checkpoint())
        if not self.d.is_main:
            return None
        path = self.output_dir / workload_env.METRICS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=2, sort_keys=True))
        return path


def checkpoint_dir(default: str | Path = "outputs/checkpoints") -> Path:
    path = Path(os.environ.get(contract.CHECKPOINT_DIR) or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def latest_checkpoint(pattern: str = "ckpt-*.pt") -> Path | None:
    """The newest whole-file checkpoint the launcher restored (AMLHPC_RESUME_DIR), else one left
    locally. Workloads that checkpoint with save_state resume with load_state instead."""
    for folder in (os.environ.get(contract.RESUME_DIR), os.environ.get(contract.CHECKPOINT_DIR)):
        if folder and Path(folder).is_dir():
            found = sorted(Path(folder).glob(pattern), key=_step_of)
            if found:
                progress.note_resumed(_step_of(found[-1]))
                return found[-1]
    progress.report(0)  # a fresh start: the watchdog watches from here
    return None


def _step_of(path: Path) -> int:
    """The step a checkpoint file name carries (ckpt-000001234.pt -> 1234)."""
    return int("".join(c for c in path.stem if c.isdigit()) or 0)


def data_parallel(model, d: Dist, deterministic: bool = False):
    """(the module to call, a function to call after the last backward of a step).

    Normally DistributedDataParallel, whose gradient all-reduce overlaps the backward. With
    `deterministic` on several ranks: the model itself, and gradients averaged parameter by
    parameter in a fixed order after the backward. DDP's buckets are rebuilt after the first
    iteration of every process, so a resumed process sums a gradient's elements in another
    order than an uninterrupted one on more than 2 ranks (ring all-reduce chunks follow the
    bucket layout): bit-identical resumes need the fixed order, at the cost of the overlap."""
    import torch
    import torch.distributed as dist

    if d.world == 1:
        return model, lambda: None
    if not deterministic:
        device_ids = [d.device.index] if d.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids), lambda: None
    with torch.no_grad():
        for parameter in model.parameters():  # what DDP does at construction: every rank starts from rank 0's
            dist.broadcast(parameter.data, 0)

    def average() -> None:
        for parameter in model.parameters():
            if parameter.grad is not None:
                dist.all_reduce(parameter.grad)
                parameter.grad.div_(d.world)

    return model, average


# --- versioned checkpoints and exact resume (amlhpc/jobs/workloads/resume.py) --------------------
# save_state / load_state / finish_checkpoints: the checkpoint API of every workload here.
from amlhpc.jobs.workloads.resume import (  # noqa: E402 - grouped with the helpers they belong to
    GlobalBatchSampler,
    LoaderSeeds,
    SeededSamples,
    ShardSampler,
    TrainState,
    finish_checkpoints,
    inject_fault,
    last_checkpoint,
    load_state,
    record_checkpoint,
    save_state,
)

__all__ = ["Dist", "GlobalBatchSampler", "LoaderSeeds", "Metrics", "OwnWork", "SeededSamples", "ShardSampler", "Timer", "TrainState",
           "all_reduce_mean",
           "all_reduce_min", "barrier", "checkpoint_dir", "data_parallel", "finish_checkpoints", "init_distributed",
           "inject_fault",
           "latest_checkpoint", "load_state", "profiler", "record_checkpoint", "save_state"]


@contextlib.contextmanager
def profiler(d: Dist, enabled_dir: str | None = None):
    """torch.profiler into AMLHPC_PROFILE_DIR (TensorBoard trace handler); a no-op when unset."""
    folder = enabled_dir or os.environ.get(workload_env.PROFILE_DIR)
    if not folder:
        yield None
        return
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(Path(folder) / f"rank{d.rank}")),
                 record_shapes=True, profile_memory=True) as prof:
        yield prof


class OwnWork:
    """A step's own work (its compute before it waits for its peers), timed on the device.

    Every recipe here calls `start()` when a step begins, `done(step)` right before the
    step's collective (the last backward, whose gradient all-reduce waits for the peers) and
    `settle()` after the step's natural sync point (a loss read back, a synchronize). On a
    GPU, two CUDA events on the current stream bracket the work and their `elapsed_time` is
    read in `settle()`, once the end event completed: the GPU's time, not the host's enqueue
    time, and no extra synchronisation. Work on the device that waits for a collective on
    another stream inside the bracket (FSDP's parameter gathers, prefetched for the next
    layer) counts as the time it held the stream. On CPU the step's wall time is the device's.
    NVIDIA's Resiliency Extension times sections with CUDA events the same way
    (https://nvidia.github.io/nvidia-resiliency-ext/, straggler detection, read 2026-11)."""

    def __init__(self, device: Any = None) -> None:
        self.cuda = getattr(device, "type", None) == "cuda"
        self._started: Any = None
        self._pending: tuple[int, Any, Any] | None = None

    def start(self) -> None:
        if self.cuda:
            import torch

            self._started = torch.cuda.Event(enable_timing=True)
            self._started.record()
        else:
            self._started = time.perf_counter()

    def done(self, step: int) -> None:
        """The step's own work is enqueued (GPU) or done (CPU); its collective comes next."""
        if self._started is None:
            self.start()  # a step without start(): time from here (no own work is counted twice)
        if not self.cuda:
            progress.compute_done(step, busy_s=time.perf_counter() - self._started)
            self._started = None
            return
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending, self._started = (step, self._started, end), None
        progress.compute_done(step, device_time_follows=True)

    def settle(self) -> None:
        """After the step's sync point: pass the device's time on (nothing to do on CPU)."""
        if self._pending is None:
            return
        step, started, end = self._pending
        if not end.query():
            return  # not reached on the device yet: read at the next settle, never waited for
        self._pending = None
        progress.own_work(step, started.elapsed_time(end) / 1000.0)


class Timer:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
