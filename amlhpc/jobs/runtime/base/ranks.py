"""Who am I in the job: global rank, local rank, world size, processes per node, node index.

Read from the launcher's environment, in this order (the first complete set wins):

1. torch.distributed / torchrun: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE
2. OpenMPI (mpirun, and Horovod launched through it): OMPI_COMM_WORLD_RANK,
   OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE
3. Horovod's own launcher (horovodrun with gloo): HOROVOD_RANK, HOROVOD_LOCAL_RANK,
   HOROVOD_SIZE, HOROVOD_LOCAL_SIZE
4. MPICH / Intel MPI (Hydra): PMI_RANK, MPI_LOCALRANKID, PMI_SIZE, MPI_LOCALNRANKS

A launcher that sets none of them means one process: rank 0 of 1. A launcher that sets
some but not all of a set is an error naming the missing variables, because guessing a
local rank wrong makes two processes stage into the same directory. One gap is filled:
Azure ML's `distribution: pytorch` sets RANK, LOCAL_RANK and WORLD_SIZE but not
LOCAL_WORLD_SIZE, so the local size is then WORLD_SIZE / AZUREML_NODE_COUNT (when that
divides exactly); amlhpc/jobs/plan/build.py may also set LOCAL_WORLD_SIZE on the job directly.

node index = rank // local size, computed with integers. That holds for the block
placement every launcher above uses by default (ranks 0..L-1 on the first node, L..2L-1
on the second, ...) and requires every node to run the same number of processes, which
is what Azure ML's `process_count_per_instance` gives. A world size that is not a
multiple of the local size is rejected for that reason.

The job identity (`run_id`) scopes node-local barriers and markers so a previous job's
leftovers on a reused node are never mistaken for this job's.

Standard library only: this module ships into the training image.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from amlhpc.jobs.runtime.base import jobid
from amlhpc.jobs.runtime.base.errors import RuntimeInputError

RANK_SOURCES: tuple[tuple[str, tuple[str, str, str, str]], ...] = (
    ("torch", ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")),
    ("openmpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ("horovod", ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE")),
    ("pmi", ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS")),
)
"""(source name, (rank, local rank, world size, local size) variable names), in priority order."""

class RankError(RuntimeInputError):
    """The launcher's rank variables are incomplete or inconsistent (exit 2 at entry points)."""

    @classmethod
    def about(cls, variable: str, message: str, hint: str) -> RankError:
        return cls.single(variable, "", message, hint)


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_size: int
    """Processes on this node (every node runs the same number)."""
    source: str
    """Which launcher's variables were read: torch, openmpi, horovod, pmi or single."""
    run_id: str = "default"
    """Identity of the job, shared by all its processes; scopes node-local markers."""

    @property
    def node_index(self) -> int:
        """0-based index of this node: rank // local size (block placement)."""
        return self.rank // self.local_size

    @property
    def node_count(self) -> int:
        return self.world_size // self.local_size

    @property
    def is_node_leader(self) -> bool:
        """Local rank 0: the one process per node that stages while the others wait."""
        return self.local_rank == 0

    def ranks_on_node(self, node: int) -> range:
        """Global ranks placed on `node`."""
        return range(node * self.local_size, (node + 1) * self.local_size)

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "node_index": self.node_index, "node_count": self.node_count}


def _parse_int(env: Mapping[str, str], name: str) -> int:
    text = env[name].strip()
    try:
        return int(text)
    except ValueError:
        raise RankError.about(name, f"{text!r} is not an integer",
                              "the launcher sets it: check how the job was started, or unset it to run as one process") from None


def run_id_from(env: Mapping[str, str]) -> str:
    """The job identity (amlhpc/jobs/runtime/base/jobid.py decides which variable: Azure ML's first),
    'default' when none is set."""
    return jobid.identify(env).job_id


def _local_size_from_node_count(env: Mapping[str, str]) -> int | None:
    """WORLD_SIZE / AZUREML_NODE_COUNT when both are integers and divide exactly."""
    try:
        world, nodes = int(env["WORLD_SIZE"]), int(env.get("AZUREML_NODE_COUNT", ""))
    except (KeyError, ValueError):
        return None
    return world // nodes if nodes > 0 and world % nodes == 0 else None


def from_env(env: Mapping[str, str] | None = None) -> Ranks:
    """Ranks from the launcher's variables (see the module docstring), or rank 0 of 1."""
    env = os.environ if env is None else env
    run_id = run_id_from(env)
    for source, names in RANK_SOURCES:
        present = [n for n in names if env.get(n, "").strip() != ""]
        if not present:
            continue
        missing = [n for n in names if n not in present]
        if source == "torch" and missing == ["LOCAL_WORLD_SIZE"]:
            derived = _local_size_from_node_count(env)
            if derived is not None:
                env = {**env, "LOCAL_WORLD_SIZE": str(derived)}
                missing = []
        if missing:
            raise RankError.about(
                ", ".join(missing), f"missing while {', '.join(present)} {'is' if len(present) == 1 else 'are'} set "
                f"({source} launcher variables are incomplete)", f"set all four of {', '.join(names)}, or none")
        rank, local_rank, world, local = (_parse_int(env, n) for n in names)
        return validated(rank, local_rank, world, local, source, run_id, names)
    return Ranks(0, 0, 1, 1, "single", run_id)


def validated(rank: int, local_rank: int, world_size: int, local_size: int, source: str = "explicit",
              run_id: str = "default", names: tuple[str, str, str, str] = ("rank", "local rank", "world size", "local size")) -> Ranks:
    """A Ranks after checking the numbers are consistent; RankError names the variable that is not."""
    r, lr, w, ls = names
    if world_size < 1:
        raise RankError.about(w, f"{world_size}: the world size must be at least 1", "check how the job was launched")
    if local_size < 1:
        raise RankError.about(ls, f"{local_size}: the local size must be at least 1", "check how the job was launched")
    if not 0 <= rank < world_size:
        raise RankError.about(r, f"{rank} is outside 0..{world_size - 1} ({w}={world_size})",
                              "check how the job was launched")
    if not 0 <= local_rank < local_size:
        raise RankError.about(lr, f"{local_rank} is outside 0..{local_size - 1} ({ls}={local_size})",
                              "check how the job was launched")
    if world_size % local_size:
        raise RankError.about(
            w, f"{world_size} is not a multiple of {ls}={local_size}: nodes run different numbers of processes",
            "run the same number of processes on every node (process_count_per_instance / mpirun -npernode)")
    if rank % local_size != local_rank:
        raise RankError.about(
            lr, f"{local_rank} with {r}={rank} is not block placement (rank % local size = {rank % local_size})",
            "fill nodes one after another: mpirun --map-by ppr:N:node (or slot), torchrun's default")
    return Ranks(rank, local_rank, world_size, local_size, source, run_id)
