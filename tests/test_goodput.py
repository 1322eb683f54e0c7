"""Goodput planning (amlhpc/core/goodput.py, amlhpc/jobs/plan/goodput.py): the cited failure
breakdown, Young's and Daly's intervals per tier, and the advice for a 16-node 70B-class run and
a Llama-3-scale run computed two ways - by the model's formulas and by simulating the system
(checkpoints on two tiers, failures by class, recoveries) event by event - and what `estimate`,
a plain `submit` and the offline plan show."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from amlhpc.core import goodput as model
from amlhpc.jobs.plan import goodput

REPO = Path(__file__).resolve().parents[1]


def test_the_llama3_breakdown_adds_up_and_gives_the_cited_rate():
    assert model.LLAMA3_INTERRUPTIONS == 419  # Table 5's 18 causes
    assert model.FAILURES_PER_GPU_HOUR == pytest.approx(419 / (16_384 * 54 * 24))
    assert {c.kind for c in model.CAUSES} == set(model.CLASSES)
    assert sum(model.SHARES.values()) == pytest.approx(1.0)
    assert model.SHARES[model.PROCESS] == pytest.approx(63 / 419)  # software bug, NCCL timeouts, dependency
    assert model.SHARES[model.DEVICE] == pytest.approx(268 / 419)  # the GPU and its memories: the host stays up
    every = model.at_scale(2048, 8)
    assert 1 / sum(1 / h for h in every.values()) == pytest.approx(54 * 24 / 419)  # 3.09 h at Llama 3's size


def test_young_and_daly():
    delta, m = 60.0, 3600.0 * 12
    assert model.young(delta, m) == pytest.approx(math.sqrt(2 * delta * m))
    x = math.sqrt(delta / (2 * m))
    assert model.daly(delta, m) == pytest.approx(math.sqrt(2 * delta * m) * (1 + x / 3 + x * x / 9) - delta)
    assert model.daly(2 * m, m) == m, "past delta = 2M Daly's optimum is M"
    assert model.young(delta, math.inf) == math.inf


# --- the two runs of the done-when -----------------------------------------------------------------

SEVENTY_B = model.Inputs(nodes=16, gpus_per_node=8, state_gb=70e9 * 16 / 1e9, upload_gbps=60.0, restore_gbps=120.0,
                         blob_interval_s=900.0, writers="per_rank", hang_s=1800.0)
LLAMA3_SCALE = model.Inputs(nodes=2048, gpus_per_node=8, state_gb=405e9 * 16 / 1e9, upload_gbps=60.0,
                            restore_gbps=120.0, blob_interval_s=900.0, writers="per_rank", hang_s=1800.0)


@pytest.mark.parametrize("inputs", [SEVENTY_B, LLAMA3_SCALE], ids=["70B-16-nodes", "llama3-scale"])
def test_the_advice_is_what_the_measured_stall_and_restart_imply(inputs):
    """By hand from the figures: the stall is the state per GPU at the measured copy rate (not
    the Blob upload); the node tier's interval is Daly's for that stall and every failure; Blob
    is uploaded as often as an upload completes; an in-job restart costs the measured restart
    plus the node tier's check of its kept versions."""
    f = inputs.figures
    plan = model.make(inputs)
    stall = inputs.state_gb / (inputs.nodes * inputs.gpus_per_node) / f.stall_gbps_per_gpu
    assert plan.stall_s == pytest.approx(stall)
    mtbi_s = 3600 / (model.LLAMA3_INTERRUPTIONS / (model.LLAMA3_GPUS * model.LLAMA3_DAYS * 24) * inputs.gpus)
    assert plan.node_interval_s == pytest.approx(max(model.daly(stall, mtbi_s), stall * f.stall_gbps_per_gpu /
                                                     f.write_gbps_per_gpu))
    upload = inputs.state_gb * 8 / inputs.upload_gbps
    assert plan.blob_interval_s == pytest.approx(max(upload, model.MIN_BLOB_INTERVAL_S))
    node_gb = inputs.state_gb / inputs.nodes
    assert plan.of(model.PROCESS).recovery_s == pytest.approx(f.in_job_restart_s + 2 * node_gb / f.verify_gbps_per_node)
    assert plan.of(model.HOST).recovery_s > inputs.hang_s + f.new_job_s  # found silent, then a new job and a restore


def test_the_two_runs_differ_as_scale_says():
    small, large = model.make(SEVENTY_B), model.make(LLAMA3_SCALE)
    assert small.stall_s == pytest.approx(70e9 * 16 / 1e9 / 128 / (14.8 / 12.5))  # 8.75 GB per GPU: 7.4 s
    assert small.node_interval_s > 3600 and small.goodput > 0.99  # a failure every ~400 h: checkpoint hourly or less
    assert large.mtbi_h == pytest.approx(3.09, abs=0.01)
    assert 60 < large.node_interval_s < 120  # a 0.33 s stall every ~1.5 min
    assert large.blob_interval_s == pytest.approx(6480 * 8 / 60)  # the account's ingress bounds Blob: 864 s
    assert 0.7 < large.goodput < 0.85  # GPU faults and host losses, restored from Blob, dominate at that scale


def simulate(inputs: model.Inputs, node_interval_s: float, blob_interval_s: float, work_h: float, seed: int) -> float:
    """The system event by event: node-tier saves every `node_interval_s` of wall time (each
    holding the training for the stall, written `write_s` after it), Blob uploads every
    `blob_interval_s` from a random phase (each taking the newest written version, complete one
    upload later), failures at exponential times by class; a failure restores the newest written
    node version (in-job) or, when the lost node held a part, the newest complete Blob version,
    after the class's recovery (a failure during a recovery starts it over). Returns useful work
    over wall time."""
    plan = model.make(inputs)
    rng = random.Random(seed)
    rate = sum(c.per_hour for c in plan.classes) / 3600
    weights = [c.per_hour for c in plan.classes]
    stall, write, upload = plan.stall_s, plan.write_s, plan.upload_s
    step = node_interval_s - stall  # work per node interval
    wall, work, target = 0.0, 0.0, work_h * 3600
    blob = [(0.0, 0.0)]  # (wall time it is complete, work it holds): the newest, and one still uploading
    while True:
        start_wall, start_work = wall, work
        span = rng.expovariate(rate)
        full, rest = divmod(span, node_interval_s)
        if start_work + full * step + max(0.0, rest - stall) >= target:
            return target / (wall + (target - start_work) / step * node_interval_s)
        end_wall = start_wall + span

        def written_by(t: float, start_wall: float = start_wall, start_work: float = start_work) -> float:
            """The work of the newest node version written by wall time t (the restored one before any)."""
            k = math.floor((t - start_wall - stall - write) / node_interval_s)
            return start_work + k * step if k >= 0 else start_work

        node_version = written_by(end_wall)
        phase = rng.uniform(0, blob_interval_s)
        last_start = start_wall + phase + math.floor((end_wall - upload - start_wall - phase) / blob_interval_s) * blob_interval_s
        if last_start >= start_wall + phase:
            blob.append((last_start + upload, written_by(last_start)))
        complete = [entry for entry in blob if entry[0] <= end_wall]
        newest_blob = max(complete, key=lambda e: e[1])
        blob = [newest_blob, *(e for e in blob if e[0] > end_wall)]
        cls = rng.choices(plan.classes, weights)[0]
        if cls.kind == model.PROCESS:
            restored, recovery = node_version, cls.recovery_s
        elif rng.random() < cls.needs_blob:
            restored, recovery = newest_blob[1], cls.recovery_s
        else:  # the lost node held no part: the others upload the newest version on the way out
            restored, recovery = node_version, cls.recovery_s + upload
            blob.append((end_wall + upload, node_version))
        wall = end_wall
        while True:  # failures during the recovery start it over
            again = rng.expovariate(rate)
            if again >= recovery:
                wall += recovery
                break
            wall += again
        work = restored


@pytest.mark.parametrize("inputs,work_h", [(SEVENTY_B, 400_000), (LLAMA3_SCALE, 20_000)], ids=["70B-16-nodes", "llama3-scale"])
def test_simulating_the_system_agrees_with_the_model(inputs, work_h):
    """The model's goodput at its advice is within a point of the simulated system's (failures
    during recoveries and stalls, which the first-order formula leaves out, make the rest), and
    the advised node-tier interval loses less than half or twice it."""
    plan = model.make(inputs)
    node, blob = plan.node_interval_s, plan.blob_interval_s
    simulated = simulate(inputs, node, blob, work_h, seed=7)
    assert simulated == pytest.approx(plan.goodput, abs=0.01)
    for factor in (0.5, 2.0):
        other = simulate(inputs, node * factor, blob, work_h, seed=7)
        assert other < simulated, f"{factor} x the advised node-tier interval did better: {other} >= {simulated}"
        assert model.goodput(inputs, plan.classes, plan.stall_s, node * factor, blob, plan.upload_s) < plan.goodput


def test_a_slower_blob_interval_costs_goodput_and_is_warned_about():
    slow = model.make(model.Inputs(**{**SEVENTY_B.__dict__, "nodes": 512, "blob_interval_s": 7200.0}))
    assert slow.goodput_recipe < slow.goodput - goodput.MATERIAL_POINTS
    lines = goodput.describe(slow, size_source="given", priority="Dedicated", hours=100, usd_per_node_hour=98.32)
    assert any(line.startswith("warning: checkpoint.interval_s 7,200 s costs") for line in lines)


def test_a_plain_job_is_told_what_ends_it():
    plain = model.make(model.Inputs(**{**SEVENTY_B.__dict__, "managed": False}))
    text = " ".join(goodput.describe(plain, size_source="given", priority="Dedicated", hours=1000, usd_per_node_hour=1.0))
    assert "not managed: a GPU fault or a host loss ends this job" in text and "submit --managed" in text


def test_preemption_adds_a_host_class_end():
    low = model.Inputs(**{**SEVENTY_B.__dict__, "preemptions_per_node_hour": 0.05})
    plan = model.make(low)
    assert plan.of("preemption").per_hour == pytest.approx(16 * 0.05)
    assert plan.goodput < model.make(SEVENTY_B).goodput


def test_preemption_alone_needs_no_blob_interval_and_still_costs_goodput():
    """Nothing fails but low-priority preemption, whose part uploads within the grace: no failure
    needs Blob's periodic version (its advised interval is unbounded, said in words, null in
    JSON), and the goodput is still computed, not taken as 1."""
    inputs = model.Inputs(**{**SEVENTY_B.__dict__, "failures_per_gpu_hour": 0.0, "state_gb": 10.0,
                             "preemptions_per_node_hour": 0.05})
    plan = model.make(inputs)
    assert plan.blob_interval_s == math.inf and math.isfinite(plan.node_interval_s)
    assert 0.8 < plan.goodput < 0.9 and plan.goodput_recipe == plan.goodput  # 0.8 an hour, each a ~12-min new job
    text = " ".join(goodput.describe(plan, size_source="given", priority="LowPriority", hours=10, usd_per_node_hour=1))
    assert "Blob: no failure expected needs its periodic version" in text and "inf" not in text
    document = goodput.document(plan, size_source="given", hours=10, usd_per_node_hour=1)
    assert document["blobIntervalS"] is None and document["finishes"] is True
    json.dumps(document, allow_nan=False)


def test_an_unlimited_upload_rate_is_said_not_printed_as_infinity():
    plan = model.make(model.Inputs(**{**SEVENTY_B.__dict__, "upload_gbps": math.inf}))
    text = " ".join(goodput.describe(plan, size_source="given", priority="Dedicated"))
    assert "at a rate the stack does not limit" in text and "inf" not in text
    assert goodput.document(plan, size_source="given")["inputs"]["uploadGbps"] is None


def test_llm_parameters_come_from_the_command():
    assert goodput.llm_parameters("python -m amlhpc.jobs.workloads.llm.train --model llama3.1-70b", 80, 128) > 70e9
    auto = goodput.llm_parameters("python -m amlhpc.jobs.workloads.llm.train --model auto --seq-len 4096", 80, 16)
    assert auto and auto > 1e9
    assert goodput.llm_parameters("python train.py", 80, 16) is None


def run_jobs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "amlhpc.jobs", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_estimate_shows_the_plan_and_its_json_carries_it():
    result = run_jobs("estimate", "bert-pretrain", "--stack", "dev", "--offline", "--preemption-rate", "0.05")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "goodput: failures on" in text and "419 unexpected interruptions in 54 days" in text
    assert "low-priority preemption 0.05 per node-hour (assumed)" in text
    assert "336M parameters x 16 bytes" in text and "node tier every" in text and "per useful hour" in text
    as_json = run_jobs("estimate", "bert-pretrain", "--stack", "dev", "--offline", "--json")
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)["goodput"]
    assert document["nodeIntervalS"] > 0 and document["blobIntervalS"] >= model.MIN_BLOB_INTERVAL_S
    assert {c["kind"] for c in document["classes"]} == {*model.CLASSES, "preemption"}
    assert "Llama 3" in document["failureSource"] and "stallGbpsPerGpu" in document["figureSources"]
    assert set(document["figures"]) == set(document["figureSources"])  # every figure has its source
    assert document["inputs"]["failuresPerGpuHour"] == pytest.approx(model.FAILURES_PER_GPU_HOUR, rel=1e-5)
    keys = [k for k in document if "_" in k] + [k for c in document["classes"] for k in c if "_" in k]
    assert not keys, f"estimate --json is camelCase: {keys}"


def test_a_plain_and_a_managed_dry_run_show_the_plan():
    plain = run_jobs("submit", "cosmoflow", "--stack", "dev", "--offline", "--dry-run")
    assert plain.returncode == 0, plain.stderr
    text = " ".join(plain.stderr.split())
    assert "goodput: checkpoint intervals of least loss: node tier every" in text and "not managed:" in text
    managed = run_jobs("submit", "cosmoflow", "--stack", "dev", "--offline", "--dry-run", "--managed")
    assert managed.returncode == 0, managed.stderr
    text = " ".join(managed.stderr.split())
    assert "goodput: checkpoint intervals of least loss" in text and "not managed:" not in text
