"""Faults, each fired at a step of the simulated world, never at a wall-clock time.

A request fault (`RequestFault`) fires on the k-th request (and the `times - 1` after it)
that matches its filter - a node, an operation, a blob name pattern, a principal:

- `lost-reply`: the service applied the request, its answer never arrived: the client sees
  a connection reset (`reset_s` later) or waits out its read timeout, and its retry policy
  sends the request again (what a write then meets: 409 or 412);
- `lost-request`: dropped on the way, never applied; the client times out the same way;
- `busy`: answered 503 ServerBusy (with Retry-After) without being applied: `times`
  matching requests, or every matching request for `duration_s` from the first (a storm);
- `delay`: arrives `delay_s` late (a slow path, a congested switch);
- `partition`: from this request on, the node reaches no storage for `duration_s`.

A point fault (`PointFault`) fires at a named fault point
(amlhpc/jobs/runtime/base/faultpoints.py) reached by a given node, the k-th time: `kill`
(the node is gone at once), `freeze` (for `duration_s`, its clock running on), or
`clock-step` (its wall clock jumps by `step_s`). Request faults can carry a clock step too
(`step_s`), for a step at the k-th request of a node.

A `FaultPlan` is the list a seed draws (amlhpc.sim.explore) or a test writes by hand; its
`describe()` is what a trace prints.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

REQUEST_KINDS = ("lost-reply", "lost-request", "busy", "delay", "partition", "clock-step")
POINT_KINDS = ("kill", "freeze", "clock-step")


@dataclass
class RequestFault:
    kind: str
    op: str | None = None
    """Operation name (put_blob, get_blob, list_blobs, put_block_list, ...; None: any)."""
    blob: str | None = None
    """fnmatch pattern on `container/blob`, or `container?list=prefix` for a listing (None: any)."""
    node: str | None = None
    """Node name (None: any)."""
    nth: int = 1
    """The first matching request that it hits (1-based)."""
    times: int = 1
    delay_s: float = 0.0
    reset_s: float | None = None
    """lost-reply/lost-request: the client learns after this long (a reset) instead of its read timeout."""
    duration_s: float = 0.0
    step_s: float = 0.0
    seen: int = 0
    fired: int = 0
    started: float | None = None
    """When a storm (busy with duration_s) began."""

    def __post_init__(self) -> None:
        if self.kind not in REQUEST_KINDS:
            raise ValueError(f"request fault {self.kind!r}: one of {', '.join(REQUEST_KINDS)}")

    def hits(self, op: str, target: str, node: str | None, now: float = 0.0) -> bool:
        if self.op is not None and self.op != op:
            return False
        if self.blob is not None and not fnmatch.fnmatchcase(target, self.blob):
            return False
        if self.node is not None and self.node != node:
            return False
        self.seen += 1
        if self.kind == "busy" and self.duration_s > 0:
            if self.seen < self.nth or (self.started is not None and now >= self.started + self.duration_s):
                return False
            if self.started is None:
                self.started = now
            self.fired += 1
            return True
        if self.seen < self.nth or self.seen >= self.nth + self.times:
            return False
        self.fired += 1
        return True

    def describe(self) -> str:
        where = ", ".join(f"{k}={v}" for k, v in (("op", self.op), ("blob", self.blob), ("node", self.node)) if v)
        extra = {"delay": f" +{self.delay_s:.3g}s", "partition": f" for {self.duration_s:.3g}s",
                 "busy": f" for {self.duration_s:.3g}s" if self.duration_s else "",
                 "clock-step": f" {self.step_s:+g}s"}.get(self.kind, "")
        times = f" x{self.times}" if self.times > 1 and not (self.kind == "busy" and self.duration_s) else ""
        return f"{self.kind}{extra} from request #{self.nth}{times} ({where or 'any'})"


@dataclass
class PointFault:
    kind: str
    point: str
    node: str | None = None
    nth: int = 1
    duration_s: float = 0.0
    step_s: float = 0.0
    seen: dict[str, int] = field(default_factory=dict)
    fired: int = 0

    def __post_init__(self) -> None:
        if self.kind not in POINT_KINDS:
            raise ValueError(f"point fault {self.kind!r}: one of {', '.join(POINT_KINDS)}")

    def describe(self) -> str:
        extra = {"freeze": f" for {self.duration_s:g}s", "clock-step": f" {self.step_s:+g}s"}.get(self.kind, "")
        return f"{self.kind}{extra} at {self.point} #{self.nth} ({f'node={self.node}' if self.node else 'any node'})"


@dataclass
class FaultPlan:
    requests: list[RequestFault] = field(default_factory=list)
    points: list[PointFault] = field(default_factory=list)

    def add(self, fault: RequestFault | PointFault) -> FaultPlan:
        (self.requests if isinstance(fault, RequestFault) else self.points).append(fault)  # type: ignore[arg-type]
        return self

    def all(self) -> list[RequestFault | PointFault]:
        return [*self.requests, *self.points]

    def describe(self) -> list[str]:
        return [f.describe() for f in self.all()]

    def fired(self) -> int:
        return sum(f.fired for f in self.all())
