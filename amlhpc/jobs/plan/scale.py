"""Scaling studies (the InfiniBand comparison of Azure's large-scale training guide): one recipe on 1, 2, 4 ... nodes.

`node_counts(max)` gives the doubling series up to the cluster's maximum (the maximum
itself included). Each job of a study carries the tags `study` and `study_nodes`;
`report()` turns the finished jobs' throughput into speedup and scaling efficiency
(throughput(n) / (throughput(base) x n / base)); linear scaling is 100 %.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from amlhpc.core.errors import Problem, UserError


def node_counts(max_nodes: int, start: int = 1) -> list[int]:
    if max_nodes < start or start < 1:
        raise UserError([Problem("scale", "--max-nodes", f"max nodes {max_nodes} is below the start {start}",
                                 "pass --max-nodes 2 or more (at most the cluster's maxNodes)")], "invalid scaling study")
    counts, n = [], start
    while n < max_nodes:
        counts.append(n)
        n *= 2
    counts.append(max_nodes)
    return counts


def study_id(recipe: str, now: datetime | None = None) -> str:
    return f"{recipe}-scale-{(now or datetime.now(UTC)).strftime('%Y%m%d-%H%M')}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class ScalingRow:
    nodes: int
    job: str
    status: str
    throughput: float | None
    unit: str
    speedup: float | None = None
    efficiency: float | None = None


def report(rows: list[ScalingRow]) -> list[ScalingRow]:
    """Fill speedup and efficiency relative to the smallest finished run."""
    done = sorted(((r.nodes, r.throughput) for r in rows if r.throughput), key=lambda pair: pair[0])
    if not done:
        return sorted(rows, key=lambda r: r.nodes)
    base_nodes, base_throughput = done[0]
    out = []
    for row in sorted(rows, key=lambda r: r.nodes):
        if not row.throughput:
            out.append(row)
            continue
        speedup = row.throughput / base_throughput
        ideal = row.nodes / base_nodes
        out.append(ScalingRow(row.nodes, row.job, row.status, row.throughput, row.unit, speedup, speedup / ideal))
    return out
