"""Repeated measurements as a benchmark publishes them: the median of the runs and their
spread (lowest to highest), each run with the machine's load when it was taken, and the
commit the code was at.

A figure is published with at least MIN_RUNS runs; a later rerun on the same machine
reproduces it when its median falls inside the published spread (`reproduces`).

That rule misses by chance alone, and how often is known exactly: when nothing changed, every
ordering of the two runs' values together is equally likely, so the chance that the rerun's
median lies outside the published lowest-highest depends only on the two run counts
(`chance_outside`): 1 in 6 for 5 runs against 5, 3 % for 9 against 9. A table of 29 figures
at 5 runs therefore shows about 5 "outside" with nothing changed. Whether a figure *moved*
is asked of both runs' values with an exact rank test (Mann-Whitney U, `shift_p`): below
SHIFT_P the rerun's values sit apart from the published ones more than chance would place
them (at 5 against 5 that means every rerun value above, or below, every published one).
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
from dataclasses import dataclass, field
from math import comb
from pathlib import Path

from bench.machine import ROOT, loadavg

MIN_RUNS = 5
SHIFT_P = 0.01
"""Below this exact rank-test p-value a rerun's figure moved; above it, it did not show a move."""


@dataclass
class Series:
    """One figure's runs, in seconds (or any unit), with the load average (1, 5, 15 min) at each."""

    name: str
    runs: list[float] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)

    def add(self, value: float, load: str | None = None) -> None:
        self.runs.append(float(value))
        self.loads.append(load if load is not None else loadavg())

    @property
    def median(self) -> float | None:
        return statistics.median(self.runs) if self.runs else None

    @property
    def low(self) -> float | None:
        return min(self.runs) if self.runs else None

    @property
    def high(self) -> float | None:
        return max(self.runs) if self.runs else None

    @property
    def enough(self) -> bool:
        return len(self.runs) >= MIN_RUNS

    def to_json(self) -> dict:
        return {"name": self.name, "runs": [round(x, 3) for x in self.runs], "loads": self.loads,
                "median": None if self.median is None else round(self.median, 3),
                "low": None if self.low is None else round(self.low, 3),
                "high": None if self.high is None else round(self.high, 3)}

    @classmethod
    def from_json(cls, data: dict) -> Series:
        return cls(data["name"], list(data.get("runs") or []), list(data.get("loads") or []))


def text(series: Series, digits: int = 1) -> str:
    """`median (low-high, n runs)`; `-` when there is no run."""
    if series.median is None:
        return "-"
    return f"{series.median:.{digits}f} ({series.low:.{digits}f}-{series.high:.{digits}f}, n={len(series.runs)})"


def reproduces(published_low: float, published_high: float, rerun_median: float) -> bool:
    """Whether a rerun's median falls inside a published spread."""
    return published_low <= rerun_median <= published_high


def chance_outside(published_runs: int, rerun_runs: int) -> float:
    """The chance that a rerun's median falls outside the published lowest-highest when nothing
    changed (both runs' values exchangeable, no ties): twice the chance that the rerun's k
    lowest values all lie below every published value, k the median's rank (the lower of two
    middle ranks for an even count, which makes it an upper bound there)."""
    n, m = published_runs, rerun_runs
    if n < 1 or m < 1:
        raise ValueError("both runs need at least one value")
    k = (m + 1) // 2 if m % 2 else m // 2
    return min(1.0, 2 * comb(n + m - k, n) / comb(n + m, n))


def _midranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def shift_p(published: list[float], rerun: list[float]) -> float:
    """Exact two-sided Mann-Whitney p-value that the rerun's values come from the published
    ones' distribution: the share of all ways to split the pooled values (mid-ranks for ties)
    into two groups of these sizes whose rank sum is at least as far from its mean as the
    rerun's. Exact by enumeration (at most C(20, 10) splits for 10 runs each)."""
    n, m = len(published), len(rerun)
    if n < 1 or m < 1:
        raise ValueError("both runs need at least one value")
    if comb(n + m, m) > 200_000:
        raise ValueError(f"{n} and {m} runs: too many splits to enumerate; compare at most 10 runs each")
    ranks = _midranks([*published, *rerun])
    mean = m * (n + m + 1) / 2
    seen = abs(sum(ranks[n:]) - mean)
    splits = list(itertools.combinations(ranks, m))
    extreme = sum(1 for group in splits if abs(sum(group) - mean) >= seen - 1e-9)
    return extreme / len(splits)


def check_rerun(published: dict[str, list[float]], rerun: dict[str, list[float]]) -> list[dict]:
    """For each figure both runs have (name -> its runs): both series, whether the rerun's
    median falls inside the published spread, the chance it would not with nothing changed,
    and the exact rank test of a move."""
    rows = []
    for name, runs in published.items():
        again = rerun.get(name)
        if not runs or not again:
            continue
        first, second = Series(name, list(runs)), Series(name, list(again))
        assert first.low is not None and first.high is not None and second.median is not None
        p = shift_p(first.runs, second.runs)
        rows.append({"figure": name, "published": first.to_json(), "rerun": second.to_json(),
                     "inside": reproduces(first.low, first.high, second.median),
                     "chance_outside": round(chance_outside(len(first.runs), len(second.runs)), 4),
                     "shift_p": round(p, 4), "moved": p < SHIFT_P})
    return rows


def rerun_summary(rows: list[dict]) -> str:
    held = sum(r["inside"] for r in rows)
    chance = sum(r.get("chance_outside", 0.0) for r in rows)
    moved = [r["figure"] for r in rows if r.get("moved")]
    return (f"A figure holds when the rerun's median falls inside the published spread: {held} of {len(rows)} hold; "
            f"with nothing changed, {chance:.1f} would fall outside by chance alone (bench/spread.py "
            f"`chance_outside`). Moved beyond chance (exact rank test, p < {SHIFT_P}): "
            f"{len(moved)}{': ' + ', '.join(moved) if moved else ''}.")


def rerun_table(rows: list[dict], digits: int = 2) -> list[str]:
    lines = ["| figure | published median (lowest-highest, n) | rerun median (lowest-highest, n) | inside | rank test p |",
             "|---|---:|---:|---|---:|"]
    for r in rows:
        p = r.get("shift_p")
        shown = "-" if p is None else (f"**{p:.3f}**" if r.get("moved") else f"{p:.3f}")
        lines.append(f"| {r['figure']} | {text(Series.from_json(r['published']), digits)} | "
                     f"{text(Series.from_json(r['rerun']), digits)} | {'yes' if r['inside'] else '**no**'} | {shown} |")
    return lines


def commit(root: Path = ROOT) -> str:
    """The code's commit, `+dirty` when the working tree differs from it; `unknown` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
