"""Pass, warn or fail for one measured figure (pure functions, no I/O).

Published pass marks (Azure's node health checks, Azure/azurehpc-health-checks) say "pass if measured >= expected", so the
published figure is the fail line. A value within `WARN_MARGIN` (3.5 %) above it passes
but is flagged: it is one bad day away from failing. Where a size publishes three figures
(H100 v5 multi-node all-reduce: expected 450, warn below 400, fail below 300 GB/s) those
are used as given.
"""

from __future__ import annotations

PASS, WARN, FAIL, SKIP, INFO = "pass", "warn", "fail", "skip", "info"
"""Statuses. `skip`: not measured, and nothing expected it here (a CPU rehearsal, a check that
does not apply to the size), with the reason. `info`: measured, no pass mark."""
NOT_CHECKED = "not-checked"
"""The size expects the check but its tool is missing or broken (nvidia-smi, ibstat,
ib_write_bw, all_reduce_perf, NVML, PyTorch): nothing vouches for that part of the node, so it
counts as a failure in the node's verdict (never a silent pass), with the tool to install."""

WARN_MARGIN = 0.035
"""Warn when a figure is less than 3.5 % above its fail line (the fleet rule of Azure's node health checks)."""

_SEVERITY = {FAIL: 3, NOT_CHECKED: 3, WARN: 2, PASS: 1, INFO: 0, SKIP: 0}


def grade_minimum(value: float, minimum: float | None, warn_margin: float = WARN_MARGIN) -> str:
    """fail below `minimum`, warn below minimum x (1 + margin), else pass; info without a minimum."""
    if minimum is None:
        return INFO
    if value < minimum:
        return FAIL
    if value < minimum * (1 + warn_margin):
        return WARN
    return PASS


def grade_band(value: float, warn_below: float, fail_below: float) -> str:
    """Explicit thresholds: fail below `fail_below`, warn below `warn_below`."""
    if value < fail_below:
        return FAIL
    if value < warn_below:
        return WARN
    return PASS


def warn_only(status: str, borrowed_from: str) -> str:
    """A fail against a mark measured elsewhere (another size, one GPU outside a node of the size)
    is a warning: the mark is a guide until it is measured on the size itself."""
    return WARN if borrowed_from and status == FAIL else status


def worst(statuses) -> str:
    """The most severe status (fail and not-checked > warn > pass, fail first of the two); pass
    when nothing was graded."""
    result = PASS
    for status in statuses:
        if _SEVERITY[status] > _SEVERITY[result] or (status == FAIL and result == NOT_CHECKED):
            result = status
    return result


def verdict(status: str) -> str:
    """A check's status as the node's verdict counts it: not-checked is a failure."""
    return FAIL if status == NOT_CHECKED else status


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """NCCL all-reduce bus bandwidth: algbw x 2(n-1)/n (NVIDIA nccl-tests' documentation of its bandwidth figures).

    An all-reduce moves 2(n-1)/n of the buffer over each rank's busiest link, so busbw is
    comparable with the hardware's link speed whatever the rank count.
    """
    if ranks < 1:
        raise ValueError(f"an all-reduce needs at least one rank, got {ranks}")
    return algbw * 2 * (ranks - 1) / ranks
