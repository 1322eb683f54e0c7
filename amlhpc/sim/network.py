"""The path from a simulated node to the simulated Blob service: latency, faults, retries.

`Network.send` carries one request: it waits the request's latency (virtual time, drawn
from the seed), applies the request faults of the world's plan, and hands the request to
the service, which applies it at that instant. A lost reply or a dropped request makes the
client wait its timeout and raises what azure-core raises (ServiceResponseError: the
request may have been applied; ServiceRequestError: it was not sent, as a refused or
timed-out connection during a partition).

`Network.retrying` is the storage SDK's retry loop as the product configures it
(amlhpc.jobs.runtime.blob.blobio.RetrySettings through its `StagingRetry`, an
azure-storage-blob `ExponentialRetry`): retried are connection errors (`connect` budget),
errors after the request was sent (`read` budget), 408 and every 5xx but 501 and 505
(`status` budget), all within `total`; exhausted when any budget goes below zero. The
wait before retry k is `RetrySettings.backoff_s(k)` with k counted from 1 as the SDK does,
jittered from the seed, and at least the server's Retry-After. When the status budget is
spent the last answer is returned (the client raises it), as the SDK does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from amlhpc.jobs.runtime.blob.blobio import RetrySettings, parse_retry_after
from amlhpc.sim.blobservice import BlobService, Reply, request_target
from amlhpc.sim.faults import FaultPlan, RequestFault
from amlhpc.sim.scheduler import Node, Simulation


class Dropped(Exception):
    """A request or its answer never arrived (`applied`: whether the service applied it)."""

    def __init__(self, applied: bool, reason: str):
        super().__init__(reason)
        self.applied = applied


class Unreachable(Exception):
    """The connection could not be made (a partition)."""


def retryable(status: int) -> bool:
    """azure-storage-blob's `is_retry` for the primary location."""
    if status == 408:
        return True
    return status >= 500 and status not in (501, 505)


class Network:
    def __init__(self, sim: Simulation, service: BlobService, faults: FaultPlan | None = None,
                 latency_s: tuple[float, float] = (0.004, 0.012)):
        self.sim = sim
        self.service = service
        self.faults = faults or FaultPlan()
        self.latency_s = latency_s
        self.partitions: dict[str, float] = {}
        """node name -> virtual time its partition ends."""
        self.on_clock_step: Callable[[Node, float], None] | None = None

    def latency(self) -> float:
        lo, hi = self.latency_s
        return self.sim.rng.uniform(lo, hi)

    def _node(self) -> Node | None:
        task = self.sim.current()
        return task.node if task is not None else None

    def send(self, account: str, op: str, *, container: str = "", blob: str = "", retry: RetrySettings,
             **kwargs: Any) -> Reply:
        """One attempt (see the module docstring); raises Dropped or Unreachable."""
        sim = self.sim
        node = self._node()
        who = node.name if node is not None else "world"
        principal = node.principal if node is not None else "world"
        target = request_target(op, container, blob, kwargs)
        fault = self._fault(op, target, node)
        if node is not None and (node.partitioned or self.partitions.get(node.name, -1.0) > sim.now):
            sim.sleep(retry.connection_timeout_s)
            sim.note(who, "unreach", f"{op} {target}")
            raise Unreachable(f"no route to the storage account (partition) after {retry.connection_timeout_s:g}s")
        sim.sleep(self.latency() + (fault.delay_s if fault is not None and fault.kind == "delay" else 0.0))
        if fault is not None and fault.kind == "lost-request":
            sim.note(who, "fault", f"lost request: {op} {target}")
            self._wait_timeout(fault, retry)
            raise Dropped(False, "the request was lost on the way (a reset or a timeout)")
        if fault is not None and fault.kind == "busy":
            sim.note(who, "fault", f"503 storm: {op} {target}")
            headers = {"Retry-After": str(int(self.service.limits.retry_after_s or 1))} \
                if self.service.limits.retry_after_s is not None else {}
            return Reply(503, "ServerBusy", "The server is busy.", headers)
        reply = self.service.call(account, op, principal, container=container, blob=blob, **kwargs)
        sim.note(who, "request", f"{op} {target} -> {reply.status}{' ' + reply.code if reply.code else ''}")
        if fault is not None and fault.kind == "lost-reply":
            sim.note(who, "fault", f"lost reply (applied: {reply.status}): {op} {target}")
            self._wait_timeout(fault, retry)
            raise Dropped(True, "the connection was reset before the answer arrived")
        return reply

    def _wait_timeout(self, fault: RequestFault, retry: RetrySettings) -> None:
        self.sim.sleep(fault.reset_s if fault.reset_s is not None else retry.read_timeout_s)

    def _fault(self, op: str, target: str, node: Node | None) -> RequestFault | None:
        name = node.name if node is not None else None
        chosen = None
        for fault in self.faults.requests:
            if fault.hits(op, target, name, self.sim.now) and chosen is None:
                chosen = fault
        if chosen is not None and chosen.kind == "partition" and node is not None:
            self.partitions[node.name] = self.sim.now + chosen.duration_s
            self.sim.note(node.name, "fault", f"partitioned from storage for {chosen.duration_s:g}s")
        if chosen is not None and chosen.kind == "clock-step" and node is not None:
            node.clock.step(chosen.step_s)
            self.sim.note(node.name, "fault", f"wall clock stepped {chosen.step_s:+g}s")
        return chosen

    def retrying(self, account: str, op: str, *, retry: RetrySettings, rng: random.Random | None = None,
                 **kwargs: Any) -> Reply:
        """`send` under the storage SDK's retry loop (see the module docstring)."""
        budget = {"total": retry.total, "connect": retry.connect, "read": retry.read, "status": retry.status}
        count = 0
        while True:
            retry_after = None
            try:
                reply = self.send(account, op, retry=retry, **kwargs)
            except Unreachable as exc:
                kind, error = "connect", exc
            except Dropped as exc:
                kind, error = "read", exc  # type: ignore[assignment]
            else:
                if not retryable(reply.status):
                    return reply
                kind, error = "status", None  # type: ignore[assignment]
                retry_after = parse_retry_after(reply.headers.get("Retry-After"))
            budget["total"] -= 1
            budget[kind] -= 1
            remaining = [v for v in budget.values() if v]
            if remaining and min(remaining) < 0:
                if error is not None:
                    raise error
                return reply
            count += 1
            self.sim.sleep(retry.backoff_s(count, rng or self.sim.rng, retry_after))
