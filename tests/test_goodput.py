"""Goodput planning (amlhpc/jobs/plan/goodput.py): the cited failure rate, Young's and Daly's optimum
intervals, the expected goodput and cost per useful hour, and what `estimate` and
`submit --managed --dry-run` print."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from amlhpc.jobs.plan import goodput

REPO = Path(__file__).resolve().parent.parent


def test_the_failure_rate_is_llama_3s():
    assert goodput.FAILURES_PER_GPU_HOUR == pytest.approx(419 / (16_384 * 54 * 24))
    llama = goodput.make(goodput.Inputs(nodes=2048, gpus_per_node=8, hours=1, usd_per_node_hour=1, interval_s=600,
                                        checkpoint_gb=0, write_gbps=1, restore_gbps=1))
    assert llama.mtbi_h * 3600 == pytest.approx(54 * 24 * 3600 / 419), "16,384 GPUs: one interruption every 3.1 h"


def test_young_and_daly():
    delta, m = 300.0, 86_400.0
    assert goodput.young(delta, m) == pytest.approx(7200.0)
    x = math.sqrt(delta / (2 * m))
    assert goodput.daly(delta, m) == pytest.approx(7200 * (1 + x / 3 + x * x / 9) - delta)
    assert goodput.daly(2 * m, m) == m, "past delta = 2M Daly's optimum is M"


def test_the_optimum_loses_least():
    delta, recovery, m = 60.0, 600.0, 36_000.0
    best = goodput.daly(delta, m)
    at_best = goodput.goodput(best, delta, recovery, m)
    for other in (best / 4, best / 2, best * 2, best * 4):
        assert goodput.goodput(other, delta, recovery, m) < at_best


def test_a_plan_and_its_warning():
    inputs = goodput.Inputs(nodes=64, gpus_per_node=8, hours=240, usd_per_node_hour=98.32, interval_s=60,
                            checkpoint_gb=50, write_gbps=20, restore_gbps=40, preemptions_per_node_hour=0.0)
    plan = goodput.make(inputs)
    assert plan.checkpoint_s == pytest.approx(50 * 8 / 20) and plan.recovery_s == pytest.approx(600 + 10)
    assert plan.far_from_optimum and plan.goodput < plan.optimal_goodput
    assert plan.interruptions == pytest.approx(plan.wall_hours / plan.mtbi_h)
    assert plan.usd_per_useful_hour == pytest.approx(64 * 98.32 / plan.goodput)
    lines = goodput.describe(plan, size_source="given", priority="Dedicated")
    assert any(line.startswith("warning: the recipe's checkpoint interval (60 s) is far from the optimum") for line in lines)


def test_preemption_counts_only_on_low_priority():
    low = goodput.Inputs(nodes=4, gpus_per_node=8, hours=10, usd_per_node_hour=1, interval_s=600, checkpoint_gb=1,
                         write_gbps=10, restore_gbps=10, preemptions_per_node_hour=0.05)
    assert goodput.make(low).mtbi_h == pytest.approx(1 / (4 * 8 * goodput.FAILURES_PER_GPU_HOUR + 4 * 0.05))


def run_jobs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "amlhpc.jobs", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_estimate_shows_the_plan():
    result = run_jobs("estimate", "bert-pretrain", "--stack", "dev", "--offline", "--preemption-rate", "0.05")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "goodput: interruptions: 1 every" in text and "419 unexpected interruptions in 54 days" in text
    assert "low-priority preemption 0.05 per node-hour (assumed)" in text
    assert "336M parameters x 16 bytes" in text and "least loss at" in text and "per useful hour" in text


def test_a_managed_dry_run_shows_the_plan():
    result = run_jobs("submit", "cosmoflow", "--stack", "dev", "--offline", "--dry-run", "--managed")
    assert result.returncode == 0, result.stderr
    assert "goodput: checkpoint interval: recipe 600 s; least loss at" in " ".join(result.stderr.split())
