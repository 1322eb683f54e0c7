"""The plan's reachability section as text (amlhpc/infra/plan/reachability.py derives it)."""

from __future__ import annotations

from typing import Any

from amlhpc.infra.plan.reachability import ORIGINS
from amlhpc.infra.plan.text import DETAIL, INDENT, pair, wrap


def reachability_lines(plan: Any) -> list[str]:
    """`Who can reach what, from where`: the ways in, then each target with one line per origin."""
    found = plan.reachability()
    lines = ["Who can reach what, from where (derived from the declared resources)"]
    for way in found.ways_in:
        lines += wrap(f"way in: {way}", INDENT, DETAIL)
    for reach in found.reaches:
        lines += pair(reach.target, reach.name)
        for origin in ORIGINS:
            path = reach.paths.get(origin)
            if path is not None:
                lines += wrap(f"from {origin}: {path.how}", DETAIL, DETAIL + "  ")
    return lines
