"""The scheduler: one thread at a time on virtual time, a seed is an interleaving, node clocks
step without bending monotonic time, and frozen or killed nodes stop where they are."""

from __future__ import annotations

import threading
import time

import pytest

from amlhpc.jobs.runtime.base import clock, workers
from amlhpc.sim.scheduler import Simulation


def _interleaving(seed: int) -> list[tuple[str, int, float]]:
    sim = Simulation(seed)
    order: list[tuple[str, int, float]] = []
    for name in "abc":
        def body(name: str = name) -> None:
            for step in range(4):
                clock.sleep(1.0)  # the three are due at the same instants: the seed orders them
                order.append((name, step, clock.monotonic()))
        sim.spawn(name, body, node=sim.node(name))
    with sim.running():
        sim.run()
    return order


def test_a_seed_is_an_interleaving_and_replays_exactly():
    assert _interleaving(7) == _interleaving(7)
    assert any(_interleaving(7) != _interleaving(seed) for seed in range(8, 12))
    assert [t for _, _, t in _interleaving(7)] == sorted(t for _, _, t in _interleaving(7))


def test_virtual_time_passes_without_waiting_and_only_one_task_runs_at_once():
    sim = Simulation(1)
    running, overlap = [0], [False]

    def body() -> None:
        for _ in range(50):
            running[0] += 1
            overlap[0] |= running[0] > 1
            running[0] -= 1
            clock.sleep(3600.0)
    for k in range(5):
        sim.spawn(f"t{k}", body, node=sim.node(f"n{k}"))
    started = time.perf_counter()
    with sim.running():
        sim.run()
    assert sim.now == pytest.approx(50 * 3600.0)
    assert not overlap[0]
    assert time.perf_counter() - started < 30


def test_a_node_clock_steps_its_wall_time_and_never_its_monotonic_time():
    sim = Simulation(2)
    node = sim.node("n", offset_s=0.0)
    seen: list[tuple[float, float]] = []

    def body() -> None:
        seen.append((clock.time(), clock.monotonic()))
        node.clock.step(-300.0)
        clock.sleep(1.0)
        seen.append((clock.time(), clock.monotonic()))
    sim.spawn("t", body, node=node)
    with sim.running():
        sim.run()
    (wall0, mono0), (wall1, mono1) = seen
    assert wall1 == pytest.approx(wall0 - 299.0)
    assert mono1 == pytest.approx(mono0 + 1.0)


def test_a_frozen_node_waits_until_it_thaws_and_a_killed_one_never_runs_again():
    sim = Simulation(3)
    frozen, killed = sim.node("frozen"), sim.node("killed")
    ticks = {"frozen": [], "killed": []}

    def ticking(name: str):
        def body() -> None:
            while True:
                clock.sleep(1.0)
                ticks[name].append(sim.now)
        return body

    def faults() -> None:
        sim.sleep(5.5)
        sim.freeze(frozen)
        sim.kill(killed)
        sim.sleep(10.0)
        sim.thaw(frozen)
    sim.spawn("f", ticking("frozen"), node=frozen)
    sim.spawn("k", ticking("killed"), node=killed)
    sim.spawn("faults", faults)
    with sim.running():
        sim.run(30.0)
    assert max(ticks["killed"]) < 5.5
    assert not [t for t in ticks["frozen"] if 5.5 < t < 15.5]
    assert max(ticks["frozen"]) > 25


def test_pools_run_inline_in_the_task_and_threads_outside_a_task_are_refused():
    sim = Simulation(4)
    where: list[str] = []

    def body() -> None:
        with workers.pool(8, "x") as pool:
            list(pool.map(lambda _: where.append(threading.current_thread().name), range(3)))
    sim.spawn("t", body, node=sim.node("n"))
    with sim.running():
        sim.run()
    assert where == ["sim-t"] * 3
    with pytest.raises(Exception, match="outside a simulation task"):
        sim.sleep(1.0)
