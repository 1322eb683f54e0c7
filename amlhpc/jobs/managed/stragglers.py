"""Stragglers: a node of a running attempt that is persistently slower than its peers.

Every rank of a data-parallel job finishes a step at the same time (the all-reduce waits
for the slowest), so the time per step cannot tell which node is slow. The time a node
spends in its own work before it waits for its peers can: every recipe measures it on the
device (amlhpc.jobs.workloads.common.OwnWork: CUDA events on a GPU), and the launchers'
heartbeats carry it (amlhpc.jobs.runtime.launch.watchdog: the slowest local rank's median
over its latest `progress.OWN_WORK_WINDOW` steps).

The rule, robust to the noise of real steps (a step's time scatters; some steps stall):

- each look, a node's own-work time is compared in log with the median of the other nodes';
- it is slow at that look when it exceeds that median by `NAME_AT` of log(`straggler_factor`)
  (the geometric midpoint between a healthy node and one `straggler_factor` times slower) and,
  with at least `SPREAD_FROM_NODES` nodes, by `NOISE_MADS` times the others' spread (1.4826 x
  their median absolute deviation: a robust standard deviation); with fewer nodes there is no
  spread to measure, and the bar is `straggler_factor` itself;
- only a heartbeat at least a window of steps after the last one counted is counted (its
  median is of other steps: independent evidence), and a node is named after
  `straggler_looks` such windows in a row. One slow window, or a rank whose steps sometimes
  stall, is not a straggler.

tests/test_straggler_rule.py runs the rule over 100 seeded simulated runs per noise model
(lognormal sigma 0.5; 10 % of steps 3x) and bounds the healthy nodes named at 1 in 100, and
a node 1.5x or 2x slower named in nearly all. A named node is recorded in the attempt's
record, shown by `jobs status` and in the next attempt's report. Naming is a report, never
an order: Azure ML cannot exclude a node from a job (docs/managed-jobs.md, "Nodes to
distrust"). The same idea as NVIDIA's Resiliency Extension straggler detection (per-rank
section timings compared with the peers'), at node level.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from amlhpc.jobs.managed.record import Attempt, iso
from amlhpc.jobs.runtime.base import progress
from amlhpc.jobs.runtime.coord.nodestatus import Heartbeat

NAME_AT = 0.5
"""A look's bar, as a fraction of log(straggler_factor): halfway (in log) from a healthy node to one that slow."""
NOISE_MADS = 2.5
"""A look's bar at least this many robust standard deviations of the other nodes' times."""
SPREAD_FROM_NODES = 4
"""Nodes needed to measure the spread across them (the median absolute deviation of 2 says nothing)."""
MAD_TO_SIGMA = 1.4826
"""The median absolute deviation of a normal sample times this is its standard deviation."""
WINDOW_STEPS = progress.OWN_WORK_WINDOW


def bars(beats: Mapping[int, Heartbeat], factor: float) -> dict[int, tuple[float, float]]:
    """node -> (its own-work time over the other nodes' median, the ratio it must reach to be slow
    at this look), for the training nodes that say."""
    logs = {n: math.log(b.busy_s) for n, b in beats.items() if b.state == "training" and b.busy_s and b.busy_s > 0}
    if len(logs) < 2:
        return {}
    out = {}
    for node, mine in logs.items():
        others = [v for m, v in logs.items() if m != node]
        center = statistics.median(others)
        if len(logs) >= SPREAD_FROM_NODES:
            spread = MAD_TO_SIGMA * statistics.median(abs(v - center) for v in others)
            bar = max(NAME_AT * math.log(factor), NOISE_MADS * spread)
        else:
            bar = math.log(factor)
        out[node] = (math.exp(mine - center), math.exp(bar))
    return out


def _fresh(beat: Heartbeat, seen: Any) -> tuple[bool, Any]:
    """Whether the heartbeat is new evidence since the one counted last (`seen`), and what to remember."""
    if beat.step is None:
        marker = iso(beat.written)
        return marker != seen, marker
    if isinstance(seen, str) and seen.isdigit():
        seen = int(seen)  # a record from before the window rule
    if isinstance(seen, int) and beat.step - seen < WINDOW_STEPS:
        return False, seen  # its median is still mostly of steps already counted
    return True, beat.step


def look(attempt: Attempt, beats: Mapping[int, Heartbeat], factor: float | None, looks: int,
         now: datetime) -> list[dict[str, Any]]:
    """Count this look's fresh heartbeats into the attempt's evidence; the nodes newly named."""
    if not factor:
        return []
    named = {s["node"] for s in attempt.stragglers}
    found = []
    for node, (ratio, bar) in sorted(bars(beats, factor).items()):
        key = str(node)
        count, seen = attempt.slow_looks.get(key, [0, None])
        fresh, seen = _fresh(beats[node], seen)
        if not fresh:
            continue
        count = count + 1 if ratio >= bar else 0
        attempt.slow_looks[key] = [count, seen]
        if count >= looks and node not in named:
            entry = {"node": node, "host": beats[node].host, "factor": round(ratio, 2), "at": iso(now),
                     "step": beats[node].step}
            attempt.stragglers.append(entry)
            found.append(entry)
    return found


def describe(entry: Mapping[str, Any]) -> str:
    where = entry.get("host") or f"node {entry.get('node')}"
    return f"{where} (node {entry.get('node')}) is a straggler: {entry.get('factor')}x its peers' step time"
