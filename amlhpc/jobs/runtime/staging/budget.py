"""What a node's staging may pull and how long it may take, from the bytes and the account's egress.

The nodes of a job share one storage account's egress (the stack output storage.egressGbps:
Azure's scalability target for a standard general-purpose v2 account, 50 to 120 Gb/s by
region, learn.microsoft.com/azure/storage/common/scalability-targets-standard-account, read
2026-11-28). So, per input that names its account's egress:

- the per-node cap is egress / N (unless the caller set one): N nodes at their full NIC rate
  would exceed the account's target and meet 503 ServerBusy instead of a fair share;
- the expected time is this node's stored bytes at the per-node rate (egress / N, the NIC or
  the cap, whichever is lowest): in `local` and `shared` mode a node holds 1/N of the data, so
  the job takes bytes / egress; in `replica` mode every node pulls everything, N times that;
- the timeout, unless one was given (AMLHPC_STAGE_TIMEOUT_S, --timeout-s), is twice the
  expected time of every input, and never below the default: a petabyte at 60 Gb/s needs
  ~37 h, and a fixed 3 h would fail it for certain;
- `replica` mode is refused when it cannot finish within the staging time it has (the
  timeout given, else the default), naming the modes that can.

Standard library only: ships into the training image.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from amlhpc.jobs.runtime.base.errors import RuntimeProblem

MARGIN = 2.0
"""The derived timeout is this many times the expected time: retries, 503s, a slow node."""


@dataclass(frozen=True)
class InputLoad:
    name: str
    mode: str
    egress_gbps: float | None
    node_bytes: int
    """Stored bytes this node pulls (the largest node share: the job waits for the slowest node)."""


@dataclass
class Budget:
    cap_mbps: float | None
    timeout_s: float
    expected_s: float | None
    """None when no input names its account's egress (nothing to derive from)."""
    lines: list[str] = field(default_factory=list)
    """What was derived, for the log."""
    refusals: list[RuntimeProblem] = field(default_factory=list)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def derive(inputs: list[InputLoad], node_count: int, *, node_gbits: float | None, cap_mbps: float | None,
           timeout_s: float, timeout_given: bool) -> Budget:
    """The cap, the timeout and the refusals for this node (see the module docstring)."""
    sized = [i for i in inputs if i.egress_gbps]
    if not sized:
        return Budget(cap_mbps, timeout_s, None)
    derived_cap = min(i.egress_gbps * 1000 / node_count for i in sized)  # type: ignore[operator]
    cap = cap_mbps if cap_mbps is not None else derived_cap
    budget = Budget(cap, timeout_s, 0.0)
    if cap_mbps is None:
        budget.lines.append(f"per-node cap {cap:,.0f} Mb/s = the account's egress / {node_count} node(s) "
                            "(--cap-mbps overrides)")
    for item in sized:
        share = item.egress_gbps / node_count  # type: ignore[operator]
        rate = min(share, cap / 1000, node_gbits or share)
        seconds = item.node_bytes * 8 / (rate * 1e9) if rate > 0 else 0.0
        budget.expected_s = (budget.expected_s or 0.0) + seconds
        budget.lines.append(f"input {item.name} ({item.mode}): {item.node_bytes / 1e12:,.3f} TB on this node at "
                            f"{rate * 1000:,.0f} Mb/s (egress {item.egress_gbps:g} Gb/s / {node_count} nodes) takes "
                            f"~{_hours(seconds)}")
        if item.mode == "replica" and seconds > timeout_s:
            budget.refusals.append(RuntimeProblem(
                f"input {item.name!r}", "mode", f"replica mode pulls the whole dataset on each of {node_count} nodes: "
                f"~{_hours(seconds)} at the account's egress of {item.egress_gbps:g} Gb/s, more than the "
                f"{_hours(timeout_s)} staging may take",
                "use mode 'local' (each node stages the share its ranks read) or 'shared' (the nodes fill one shared "
                "directory), or raise AMLHPC_STAGE_TIMEOUT_S if the job really has that long"))
    if not timeout_given and budget.expected_s and MARGIN * budget.expected_s > timeout_s:
        budget.timeout_s = MARGIN * budget.expected_s
        budget.lines.append(f"staging timeout {_hours(budget.timeout_s)} ({MARGIN:g}x the expected "
                            f"{_hours(budget.expected_s)}; AMLHPC_STAGE_TIMEOUT_S overrides)")
    return budget
