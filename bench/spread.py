"""Repeated measurements as a benchmark publishes them: the median of the runs and their
spread (lowest to highest), each run with the machine's load when it was taken, and the
commit the code was at.

A figure is published with at least MIN_RUNS runs; a later rerun on the same machine
reproduces it when its median falls inside the published spread (`reproduces`).
"""

from __future__ import annotations

import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bench.machine import ROOT, loadavg

MIN_RUNS = 5


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
