"""Seeded exploration, in the manner of FoundationDB's simulation testing and TigerBeetle's VOPR.

A scenario (amlhpc/sim/scenarios) runs the real code of several simulated nodes in a World.
A seed draws everything that varies: the scenario's size and timings and its fault plan
(from `random.Random(f"{scenario}:{seed}")`), and the interleaving (the World's scheduler is
seeded with it too). After the run the scenario's invariants are checked; a run that breaks
one is a `Violation`, named by the invariant (`kind`) and saying what happened.

    outcome = run("checkpoint-commit", seed=17)     # one run: violations, the fault plan, the trace
    outcomes = sweep("checkpoint-commit", range(200))

A failing seed replays exactly (`python -m amlhpc.sim explore SCENARIO --seed N` prints
its fault plan, its violations and its trace), because nothing in a run depends on the wall
clock, on thread timing or on unseeded randomness (amlhpc.sim.world says how).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from amlhpc.sim.faults import FaultPlan
from amlhpc.sim.scenario import Outcome, Scenario, Violation
from amlhpc.sim.scenarios import SCENARIOS

__all__ = ["Outcome", "Scenario", "Violation", "run", "scenarios", "sweep"]


def local_disk_root() -> str | None:
    """Where the simulated nodes' local disks go: memory (/dev/shm) when the host has it, as the
    nodes' files are small and many (a run makes and removes hundreds), else the temp dir."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def scenarios() -> dict[str, type[Scenario]]:
    return SCENARIOS


def run(name: str, seed: int, *, size: int | None = None, faults: FaultPlan | None = None,
        settings: dict[str, Any] | None = None, keep_trace: bool = True) -> Outcome:
    """One run of scenario `name` under `seed` (see the module docstring); `faults` replaces the
    drawn plan and `settings` the drawn values it names (a defect's fixed schedule)."""
    known = scenarios()
    if name not in known:
        raise KeyError(f"no scenario {name!r}; the scenarios are: {', '.join(sorted(known))}")
    scenario = known[name]()
    rng = random.Random(f"{name}:{seed}")
    plan = scenario.plan(rng, size)
    if faults is not None:
        plan = faults
    unknown = set(settings or {}) - set(scenario.settings)
    if unknown:
        raise KeyError(f"scenario {name} has no setting(s) {', '.join(sorted(unknown))}; it has: "
                       f"{', '.join(sorted(scenario.settings))}")
    scenario.settings.update(settings or {})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="amlhpc-sim-", dir=local_disk_root()) as tmp, \
            scenario.world(seed, plan, keep_trace) as world:
        scenario.start(world, Path(tmp))
        scenario.finish(world)
        violations = scenario.check(world)
        virtual = world.now
        requests = world.blob.accounting.total()
        trace = list(world.sim.trace.lines()) if keep_trace else []
    return Outcome(name, seed, violations, plan.describe(), dict(scenario.settings), virtual,
                   time.perf_counter() - started, requests, trace, dict(scenario.metrics), plan.fired())


def sweep(name: str, seeds: Iterable[int], *, size: int | None = None) -> list[Outcome]:
    """`run` for every seed, without traces (replay a failing one to see its trace)."""
    return [run(name, seed, size=size, keep_trace=False) for seed in seeds]
