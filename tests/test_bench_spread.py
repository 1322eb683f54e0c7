"""bench/spread.py's statistics of a rerun: the chance that the spread rule misses with nothing
changed, held against a seeded simulation of exchangeable runs (not the formula again), and
the exact rank test against values a textbook table gives (Mann-Whitney U for 5 and 5: U = 0
is 2 of the C(10, 5) = 252 splits, two-sided)."""

from __future__ import annotations

import random
import statistics

import pytest

from bench.spread import chance_outside, shift_p


@pytest.mark.parametrize("n, m", [(5, 5), (9, 9), (5, 7)])
def test_the_chance_outside_is_what_exchangeable_runs_give(n, m):
    rng = random.Random(20261129)
    trials = 40_000
    outside = 0
    for _ in range(trials):
        published = [rng.gauss(0, 1) for _ in range(n)]
        median = statistics.median(rng.gauss(0, 1) for _ in range(m))
        outside += not (min(published) <= median <= max(published))
    simulated = outside / trials
    assert abs(simulated - chance_outside(n, m)) < 0.01, (simulated, chance_outside(n, m))


def test_five_runs_miss_one_time_in_six_nine_three_in_a_hundred():
    assert chance_outside(5, 5) == pytest.approx(1 / 6)
    assert chance_outside(9, 9) == pytest.approx(0.0294, abs=1e-4)


def test_the_rank_test_at_its_extremes():
    assert shift_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert shift_p([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(2 / 252)
    assert shift_p([1, 3, 5, 7, 9], [2, 4, 6, 8, 10]) > 0.5
    assert shift_p([4.0] * 5, [4.0] * 5) == 1.0  # ties everywhere: nothing moved


def test_one_value_out_of_order_is_not_a_move_at_five_runs():
    # every rerun value above the published ones but one: U = 1, p = 4/252 (above 0.01)
    assert shift_p([1, 2, 3, 4, 6], [5, 7, 8, 9, 10]) == pytest.approx(4 / 252)


def test_too_many_runs_to_enumerate_is_refused():
    with pytest.raises(ValueError, match="too many splits"):
        shift_p(list(range(15)), list(range(15)))


def test_the_checkpoint_bench_checks_an_earlier_runs_figures():
    from bench import checkpoint

    def run(ratio: list[float], local: list[float]) -> dict:
        spread = {"median": sorted(ratio)[2], "min": min(ratio), "max": max(ratio), "runs": ratio}
        return {"command": "c", "date": "d", "commit": "x",
                "stall": [{"state_mib": 256, "writers": 2, "ratio": spread, "cold_s": 1.0}],
                "restore": {"runs_s": {"local": local, "blob": [2 * t for t in local]}}}

    earlier = run([0.05, 0.06, 0.07, 0.08, 0.09], [1.0, 1.1, 1.2, 1.3, 1.4])
    assert sorted(checkpoint.figures(earlier)) == ["restore: Blob / node tier, x", "restore: Blob s",
                                                   "restore: node tier s", "stall 256 MiB: ratio"]
    text, held = checkpoint.render_rerun(earlier, run([0.055, 0.065, 0.075, 0.085, 0.095], [1.05, 1.15, 1.25, 1.35, 1.45]))
    assert held and "4 of 4 hold" in text
    text, held = checkpoint.render_rerun(earlier, run([0.2, 0.21, 0.22, 0.23, 0.24], [1.0, 1.1, 1.2, 1.3, 1.4]))
    assert not held and "Moved beyond chance (exact rank test, p < 0.01): 1: stall 256 MiB: ratio." in text
