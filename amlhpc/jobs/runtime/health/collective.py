"""All-reduce bus bandwidth across the job's ranks, through torch.distributed.

Every rank of the job takes part (NCCL on GPUs, gloo on a CPU-only machine). Two figures:

- per node: an all-reduce among the node's own ranks (NVLink inside the node), compared
  with the size's single-node pass mark (`nccl_allreduce_busbw_gbytes_per_s_min`, e.g.
  228 GB/s at 8 GiB on ND96asr_v4) when the node runs one rank per GPU;
- per job: an all-reduce across every rank, compared with the size's baseline for what the
  all-reduce crosses (one multi-node NVLink domain or InfiniBand) and for SHARP on or off
  (`health.multinode` bands, chosen by amlhpc/jobs/runtime/node/multinode.py), once every node's
  report is in: the NVLink domains come from the nodes' fabric checks.

Each is timed over several back-to-back all-reduces of one large buffer after warm-up; the
figure is the slowest rank's time (what a training step waits for). busbw = algbw x
2(n-1)/n with algbw = bytes / time per all-reduce. Before timing, one all-reduce of known
values is checked, so a link that corrupts data fails instead of looking fast.
Over gloo the GPU pass marks do not apply: the figures are reported as info.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from amlhpc.jobs.runtime.base.contract import COORD_PORT
from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.base.ranks import Ranks
from amlhpc.jobs.runtime.coord.jobstore import DEFAULT_MASTER_PORT, endpoint, rendezvous_address
from amlhpc.jobs.runtime.health.grading import FAIL, INFO, bus_bandwidth, grade_band, grade_minimum
from amlhpc.jobs.runtime.health.results import CheckResult, fmt
from amlhpc.jobs.runtime.node.multinode import Topology, choose_band
from amlhpc.jobs.runtime.node.skufacts import SkuFacts

DEFAULT_PORT = DEFAULT_MASTER_PORT
HEALTH_PREFIX = "amlhpc-health"
"""The gate's keys in the job's coordination store."""


class CollectiveError(RuntimeError):
    """The ranks could not form a group (no address, rendezvous timed out)."""


@dataclass(frozen=True)
class AllReduceFigure:
    ranks: int
    nbytes: int
    seconds: float
    """Per all-reduce, slowest rank."""
    algbw: float
    busbw: float
    backend: str
    correct: bool


class Collective:
    """This rank's membership in a process group for the health checks."""

    def __init__(self, torch: Any, dist: Any, ranks: Ranks, backend: str, device: Any):
        self.torch, self.dist, self.ranks, self.backend, self.device = torch, dist, ranks, backend, device
        self._node_groups: list[Any] | None = None

    @classmethod
    def open(cls, ranks: Ranks, environ: Mapping[str, str], timeout_s: float) -> Collective:
        import torch
        import torch.distributed as dist

        address = rendezvous_address(environ)
        if address is None:
            raise CollectiveError("no rendezvous address: set MASTER_ADDR and MASTER_PORT (Azure ML sets them "
                                  "for distribution: pytorch) or run the checks as a single process")
        use_nccl = torch.cuda.is_available() and torch.cuda.device_count() > 0 and dist.is_nccl_available()
        backend = "nccl" if use_nccl else "gloo"
        device = torch.device("cpu")
        if use_nccl:
            device = torch.device("cuda", ranks.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        host, port = address
        try:
            where = endpoint(environ) if environ.get(COORD_PORT) else None
        except RuntimeInputError as exc:
            raise CollectiveError(str(exc)) from None
        try:
            if where is not None:
                # The launcher's way: the job's coordination store on node 0, its port bound before
                # staging; the gate has no port of its own to lose to an outgoing connection.
                host, port = where.host, where.port
                store = dist.PrefixStore(HEALTH_PREFIX, dist.TCPStore(host, port, None, False,
                                                                      timeout=timedelta(seconds=timeout_s)))
                dist.init_process_group(backend, store=store, rank=ranks.rank, world_size=ranks.world_size,
                                        timeout=timedelta(seconds=timeout_s))
            else:
                dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=ranks.rank,
                                        world_size=ranks.world_size, timeout=timedelta(seconds=timeout_s))
        except Exception as exc:  # noqa: BLE001 - rendezvous errors come in many types
            raise CollectiveError(f"rendezvous at {host}:{port} failed: {type(exc).__name__}: {exc}") from exc
        return cls(torch, dist, ranks, backend, device)

    def node_group(self) -> Any:
        """This node's ranks as a group (every rank creates every node's group, in order)."""
        if self._node_groups is None:
            self._node_groups = [self.dist.new_group(list(self.ranks.ranks_on_node(node)))
                                 for node in range(self.ranks.node_count)]
        return self._node_groups[self.ranks.node_index]

    def _sync(self) -> None:
        if self.backend == "nccl":
            self.torch.cuda.synchronize(self.device)

    def allreduce(self, group: Any, group_rank: int, group_size: int, nbytes: int, iters: int, warmup: int) -> AllReduceFigure:
        torch, dist = self.torch, self.dist
        numel = max(nbytes // 4, 1)
        buffer = torch.empty(numel, dtype=torch.float32, device=self.device)
        buffer.fill_(group_rank + 1)
        dist.all_reduce(buffer, group=group)
        expected = group_size * (group_size + 1) / 2
        # In place: a comparison tensor of a multi-GiB buffer would need GiBs more memory.
        correct = float(buffer.sub_(expected).abs_().max().item()) == 0.0
        buffer.zero_()  # timed sums stay 0: no overflow, no denormals
        for _ in range(warmup):
            dist.all_reduce(buffer, group=group)
        self._sync()
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buffer, group=group)
        self._sync()
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=self.device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        seconds = float(elapsed.item())
        del buffer
        algbw = numel * 4 / seconds / 1e9
        return AllReduceFigure(group_size, numel * 4, seconds, algbw, bus_bandwidth(algbw, group_size), self.backend, correct)

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.ranks.world_size
        self.dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        """Destroy every group and let go of them now: a gloo group's threads stop only when
        the group object is freed, and one freed as the interpreter finalizes can abort the
        process (amlhpc/jobs/workloads/common.py `_leave_process_group`)."""
        try:
            self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        self._node_groups = None
        gc.collect()


def message_bytes(collective: Collective, sku: SkuFacts | None, cpu_bytes: int) -> tuple[int, str]:
    """The all-reduce size: the size's published one on GPUs (capped to half the free GPU
    memory), a small one over gloo."""
    if collective.backend != "nccl":
        return cpu_bytes, f"{cpu_bytes >> 20} MiB over gloo (CPU): GPU pass marks do not apply"
    wanted = sku.health.nccl_allreduce_message_bytes if sku else 1 << 30
    free, _total = collective.torch.cuda.mem_get_info(collective.device)
    if wanted > free // 2:
        capped = (free // 2) & ~((1 << 20) - 1)
        return capped, f"{capped >> 20} MiB (the published {wanted >> 20} MiB does not fit in free GPU memory)"
    return wanted, f"{wanted >> 20} MiB"


def grade_node_allreduce(figure: AllReduceFigure, sku: SkuFacts | None, size_note: str) -> CheckResult:
    minimum = sku.health.nccl_allreduce_busbw_gbytes_per_s_min if sku else None
    note = f"{figure.ranks} ranks, {size_note}, algbw {fmt(figure.algbw)} GB/s"
    if figure.backend != "nccl" or (sku is not None and figure.ranks != sku.gpus):
        if minimum is not None and sku is not None and figure.backend == "nccl":
            note += f"; the pass mark is for {sku.gpus} ranks"
        minimum = None
    return _graded("allreduce_node", "node", figure, grade_minimum(figure.busbw, minimum) if minimum else INFO, minimum, note)


def grade_job_allreduce(figure: AllReduceFigure, sku: SkuFacts | None, nodes: int, size_note: str,
                        topology: Topology, sharp: bool) -> CheckResult:
    """The job-wide figure against the size's band for the job's topology and SHARP setting."""
    note = f"{nodes} nodes x {figure.ranks // max(nodes, 1)} ranks, {size_note}, algbw {fmt(figure.algbw)} GB/s"
    band, why = choose_band(sku.health.multinode if sku else (), topology, sharp)
    note += f"; {why}"
    if band is None or figure.backend != "nccl":
        return _graded("allreduce_job", "job", figure, INFO, None, note)
    expected, warn_below, fail_below = band.busbw_gbytes_per_s
    note += f"; expected ~{expected:g}, warn below {warn_below:g}"
    return _graded("allreduce_job", "job", figure, grade_band(figure.busbw, warn_below, fail_below), fail_below, note)


def _graded(check: str, subject: str, figure: AllReduceFigure, status: str, threshold: float | None, note: str) -> CheckResult:
    if not figure.correct:
        return CheckResult(check, subject, FAIL, figure.busbw, "GB/s", threshold,
                           f"all-reduce returned wrong sums ({figure.backend}): data corrupted in transit; {note}")
    return CheckResult(check, subject, status, figure.busbw, "GB/s", threshold, f"busbw over {figure.backend}, {note}")
