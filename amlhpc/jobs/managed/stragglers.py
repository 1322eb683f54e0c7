"""Stragglers: a node of a running attempt that is persistently slower than its peers.

Every rank of a data-parallel job finishes a step at the same time (the all-reduce waits
for the slowest), so the time per step cannot tell which node is slow. The time a node
spends in its own work before it waits for its peers can: the launchers' heartbeats carry
it (amlhpc.jobs.runtime.launch.watchdog: the slowest local rank's median over its latest steps, from
amlhpc.jobs.runtime.base.progress.compute_done). A node whose time is at least `straggler_factor`
times the median of the other nodes', at `straggler_looks` consecutive fresh heartbeats
(one that shows no new step since the last look does not count twice), is named: in the attempt's record, in
`jobs status` and in the next attempt's report. Naming is a report, never an order: Azure
ML cannot exclude a node from a job (docs/managed-jobs.md, "Nodes to distrust").
The same idea as NVIDIA's Resiliency Extension straggler detection (per-rank section
timings compared with the peers'), at node level.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from amlhpc.jobs.managed.record import Attempt, iso
from amlhpc.jobs.runtime.coord.nodestatus import Heartbeat


def ratios(beats: Mapping[int, Heartbeat]) -> dict[int, float]:
    """node -> its own-work time per step over the median of the other nodes' (training nodes that say)."""
    times = {n: b.busy_s for n, b in beats.items() if b.state == "training" and b.busy_s}
    if len(times) < 2:
        return {}
    out = {}
    for node, busy in times.items():
        reference = statistics.median(v for m, v in times.items() if m != node)
        if reference > 0:
            out[node] = busy / reference
    return out


def look(attempt: Attempt, beats: Mapping[int, Heartbeat], factor: float | None, looks: int,
         now: datetime) -> list[dict[str, Any]]:
    """Count this look's fresh heartbeats into the attempt's evidence; the nodes newly named."""
    if not factor:
        return []
    named = {s["node"] for s in attempt.stragglers}
    found = []
    for node, ratio in sorted(ratios(beats).items()):
        key = str(node)
        count, seen = attempt.slow_looks.get(key, [0, None])
        beat = beats[node]
        fresh = str(beat.step) if beat.step is not None else iso(beat.written)
        if fresh == seen:
            continue  # nothing new from this node since the last look
        count = count + 1 if ratio >= factor else 0
        attempt.slow_looks[key] = [count, fresh]
        if count >= looks and node not in named:
            entry = {"node": node, "host": beats[node].host, "factor": round(ratio, 2), "at": iso(now),
                     "step": beats[node].step}
            attempt.stragglers.append(entry)
            found.append(entry)
    return found


def describe(entry: Mapping[str, Any]) -> str:
    where = entry.get("host") or f"node {entry.get('node')}"
    return f"{where} (node {entry.get('node')}) is a straggler: {entry.get('factor')}x its peers' step time"
