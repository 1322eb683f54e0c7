"""What every scenario of the exploration is (amlhpc/sim/scenarios), and what one run of it tells:
its violations (an invariant broken, and how), its fault plan, its settings, its trace."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.sim.faults import FaultPlan
from amlhpc.sim.world import World


@dataclass(frozen=True)
class Violation:
    kind: str
    """The invariant broken (e.g. split-decision, pointer-orphan)."""
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass
class Outcome:
    scenario: str
    seed: int
    violations: list[Violation]
    faults: list[str]
    settings: dict[str, Any]
    virtual_s: float
    wall_s: float
    requests: int
    trace: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    faults_fired: int = 0
    """How many of the plan's faults fired (a fixed run whose fault never fires proves nothing)."""

    @property
    def ok(self) -> bool:
        return not self.violations

    def kinds(self) -> set[str]:
        return {v.kind for v in self.violations}

    def report(self, trace: bool = True) -> str:
        lines = [f"scenario {self.scenario}, seed {self.seed}: "
                 f"{'ok' if self.ok else f'{len(self.violations)} violation(s)'} "
                 f"({self.virtual_s:.1f} virtual s, {self.requests} requests, {self.wall_s:.2f} s wall)",
                 "settings: " + ", ".join(f"{k}={v}" for k, v in self.settings.items()),
                 "faults: " + ("; ".join(self.faults) if self.faults else "none")]
        lines += [f"VIOLATION {v}" for v in self.violations]
        if self.metrics:
            lines.append("metrics: " + ", ".join(f"{k}={v}" for k, v in self.metrics.items()))
        if trace and self.trace:
            lines.append("trace:")
            lines += [f"  {line}" for line in self.trace]
        return "\n".join(lines)


class Scenario:
    """One kind of run (subclasses in amlhpc/sim/scenarios)."""

    name = ""
    summary = ""
    duration_s = 300.0
    trace_limit = 20_000

    def __init__(self) -> None:
        self.settings: dict[str, Any] = {}
        self.metrics: dict[str, Any] = {}

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        """Draw the settings (into self.settings) and the fault plan."""
        return FaultPlan()

    def world(self, seed: int, faults: FaultPlan, keep_trace: bool = True) -> World:
        return World(seed, faults=faults, trace_limit=self.trace_limit if keep_trace else 1,
                     log_level=logging.INFO if keep_trace else logging.ERROR)

    def start(self, world: World, root: Path) -> None:
        """Spawn the tasks (`root`: a folder for the nodes' local disks)."""
        raise NotImplementedError

    def finish(self, world: World) -> None:
        """Run the world to the end (default: for `duration_s` virtual seconds)."""
        world.run(self.duration_s)

    def check(self, world: World) -> list[Violation]:
        raise NotImplementedError
