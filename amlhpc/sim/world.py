"""A simulated Azure in one process: the scheduler, Blob, Resource Manager, faults, nodes.

    with World(seed=7) as world:
        container = world.container("checkpoints")          # a ContainerClient on the simulated account
        node = world.node("node-0")
        world.spawn("uploader", lambda: ..., node=node)     # the real code, on the node's clock
        world.run(until=600)                                # virtual seconds

Determinism: while a World is open, `secrets.token_hex` / `token_bytes` / `token_urlsafe`
(upload sessions, version names, lease ids) draw from a generator seeded by the world's
seed, so does the `random` module's own (the pacing's jitter draws from it: unseeded, a
watchdog's looks fell at other virtual times on each run of one seed), and every request's latency, every tie between events and every retry's jitter
from the scheduler's: a seed replays the same run, names included. One world is open at
a time in a process (the patch and the fault points are process-wide).

The product's log lines (the `amlhpc` loggers) go into the trace, not to stderr, while the
world is open.

Point faults (amlhpc.sim.faults.PointFault) are armed on the runtime's named fault points
(amlhpc.jobs.runtime.base.faultpoints) for the world's life and act only in its tasks.
"""

from __future__ import annotations

import http.client
import logging
import random
import secrets
from collections.abc import Callable
from typing import Any, cast

from amlhpc.jobs.runtime.base import faultpoints
from amlhpc.jobs.runtime.blob import blobio
from amlhpc.jobs.runtime.blob.blobhttp import Reader
from amlhpc.jobs.runtime.blob.blobio import RetrySettings
from amlhpc.sim.arm import ArmService
from amlhpc.sim.blobclient import ContainerClient
from amlhpc.sim.blobservice import BlobService
from amlhpc.sim.faults import FaultPlan
from amlhpc.sim.limits import ArmLimits, BlobLimits
from amlhpc.sim.network import Network
from amlhpc.sim.scheduler import EPOCH, Node, Simulation, Task
from amlhpc.sim.store import StoreServer
from amlhpc.sim.wire import Anonymous, Connection

ACCOUNT = "simaccount"

_open: list[World] = []


class _TraceHandler(logging.Handler):
    """The product's log lines, into the world's trace under the task that logged them."""

    def __init__(self, sim: Simulation):
        super().__init__()
        self.sim = sim

    def emit(self, record: logging.LogRecord) -> None:
        task = self.sim.current()
        self.sim.note(task if task is not None and task.sim is self.sim else "world", "log",
                      f"{record.levelname.lower()} {record.getMessage()}")


class World:
    def __init__(self, seed: int, *, limits: BlobLimits | None = None, arm_limits: ArmLimits | None = None,
                 faults: FaultPlan | None = None, latency_s: tuple[float, float] = (0.004, 0.012),
                 trace_limit: int = 200_000, trace_requests: bool = True, log_level: int = logging.INFO):
        self.seed = seed
        self.sim = Simulation(seed, trace_limit)
        self.faults = faults or FaultPlan()
        self.blob = BlobService(lambda: self.sim.now, EPOCH, limits)
        self.network = Network(self.sim, self.blob, self.faults, latency_s)
        self.arm = ArmService(self.sim, arm_limits or ArmLimits())
        self.blob.account(ACCOUNT)
        self.sim.task_contexts.append(lambda task: blobio.use(self._client_for))
        self.trace_requests = trace_requests
        if not trace_requests:
            self.sim.trace.enabled = False
        self._names = random.Random(seed * 7919 + 1)
        self.log_level = log_level
        self._logger_state: tuple[int, bool] | None = None
        self._handler = _TraceHandler(self.sim)
        self._patched: dict[str, Any] = {}
        self._random_state: Any = None
        self._armed: list[str] = []
        self.closed = False

    # --- life ---------------------------------------------------------------------------
    def __enter__(self) -> World:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        if _open:
            raise RuntimeError("another simulated world is open in this process; close it first")
        _open.append(self)
        names = self._names
        self._patched = {"token_hex": secrets.token_hex, "token_bytes": secrets.token_bytes,
                         "token_urlsafe": secrets.token_urlsafe}
        secrets.token_hex = lambda n=32: names.randbytes(n if n is not None else 32).hex()  # type: ignore[assignment]
        secrets.token_bytes = lambda n=32: names.randbytes(n if n is not None else 32)  # type: ignore[assignment]
        secrets.token_urlsafe = lambda n=32: names.randbytes(n if n is not None else 32).hex()  # type: ignore[assignment]
        self._random_state = random.getstate()
        random.seed(self._names.getrandbits(64))
        logger = logging.getLogger("amlhpc")
        self._logger_state = (logger.level, logger.propagate)
        logger.setLevel(self.log_level)
        logger.propagate = False
        logger.addHandler(self._handler)
        for name in sorted({f.point for f in self.faults.points}):
            faultpoints.arm(name, self._point_action(name), times=0)
            self._armed.append(name)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.sim.close()
        finally:
            for name in self._armed:
                faultpoints.disarm(name)
            logger = logging.getLogger("amlhpc")
            logger.removeHandler(self._handler)
            if self._logger_state is not None:
                logger.setLevel(self._logger_state[0])
                logger.propagate = self._logger_state[1]
            for attr, original in self._patched.items():
                setattr(secrets, attr, original)
            if self._random_state is not None:
                random.setstate(self._random_state)
            if self in _open:
                _open.remove(self)

    # --- building -----------------------------------------------------------------------
    def node(self, name: str, *, principal: str = "job-identity", offset_s: float = 0.0) -> Node:
        return self.sim.node(name, principal=principal, offset_s=offset_s)

    def container(self, name: str, *, account: str = ACCOUNT, retry: RetrySettings | None = None,
                  create: bool = True) -> ContainerClient:
        self.blob.account(account)
        if create and name not in self.blob.accounts[account].containers:
            self.blob.create_container(account, name)
        return ContainerClient(self.network, account, name, retry)

    def _client_for(self, container: str, account_url: str | None) -> ContainerClient:
        """What blobio.container_client gives the code under test in a task: the simulated account's
        container (an account URL names its account; none is the world's)."""
        account = ACCOUNT
        if account_url:
            host = account_url.split("//", 1)[-1].split(".", 1)[0]
            account = host or ACCOUNT
        return self.container(container, account=account)

    def reader(self, container: str, *, account: str = ACCOUNT, retry: RetrySettings | None = None) -> Reader:
        """Staging's stdlib Blob reader (amlhpc.jobs.runtime.blob.blobhttp.Reader) on the simulated account."""
        retry = retry or RetrySettings()
        self.container(container, account=account)
        return Reader(f"https://{account}.blob.core.windows.net/{container}", Anonymous(), retry,
                      connect=lambda: cast(http.client.HTTPConnection, Connection(self.network, account, retry)))

    def jobstore(self, host: Node | None = None, *, ops_per_s: float = 100_000.0) -> StoreServer:
        """A job's rendezvous store hosted by `host` (node 0's launcher: the store is lost with it),
        for the job's nodes to coordinate through (amlhpc.jobs.runtime.coord.agree.Channel over
        `server.client()`)."""
        return StoreServer(self.sim, host=host, ops_per_s=ops_per_s)

    def spawn(self, name: str, fn: Callable[[], Any], *, node: Node | None = None, delay_s: float = 0.0) -> Task:
        return self.sim.spawn(name, fn, node=node, delay_s=delay_s)

    def run(self, until: float = float("inf")) -> None:
        self.sim.run(until)

    @property
    def now(self) -> float:
        return self.sim.now

    def call(self, fn: Callable[[], Any], *, node: Node | None = None, limit_s: float = 3600.0) -> Any:
        """Run `fn` as a task to its end (other tasks run meanwhile); its result, or its error raised."""
        task = self.spawn(getattr(fn, "__name__", "call"), fn, node=node)
        self.sim.run_until(lambda: task.finished, limit_s=limit_s)
        if task.error is not None:
            raise task.error
        if not task.finished:
            raise TimeoutError(f"{task.name} did not finish within {limit_s:g} virtual seconds")
        return task.result

    # --- faults at named points ---------------------------------------------------------
    def _point_action(self, point: str) -> Callable[..., None]:
        def action(**_context: Any) -> None:
            task = self.sim.current()
            if task is None or task.sim is not self.sim or task.node is None:
                return
            node = task.node
            for fault in self.faults.points:
                if fault.point != point or (fault.node is not None and fault.node != node.name):
                    continue
                fault.seen[node.name] = fault.seen.get(node.name, 0) + 1
                if fault.seen[node.name] != fault.nth:
                    continue
                fault.fired += 1
                self.sim.note(task, "fault", f"{fault.describe()} fired")
                if fault.kind == "clock-step":
                    node.clock.step(fault.step_s)
                elif fault.kind == "freeze":
                    self._thaw_later(node, fault.duration_s)
                    self.sim.freeze(node)
                elif fault.kind == "kill":
                    self.sim.kill(node)
        return action

    def _thaw_later(self, node: Node, duration_s: float) -> None:
        def thaw() -> None:
            self.sim.sleep(duration_s)
            self.sim.thaw(node)
        self.spawn(f"thaw-{node.name}", thaw)
