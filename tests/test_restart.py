"""In-job restart (amlhpc/jobs/runtime/launch/restart.py): the decision every node takes, and the protocol run by
real launchers of two simulated nodes against Azurite, with a small training in lockstep that
writes versioned checkpoints into the node-local tier (no torch: the subject is the launcher).
Faults are injected at steps; the figures the tests rely on do not depend on timing."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from amlhpc.jobs.local import faults
from amlhpc.jobs.runtime.base import exit_codes
from amlhpc.jobs.runtime.launch import restart
from amlhpc.jobs.runtime.launch.restart import decide
from tests.launcher_nodes import node_env, start_launchers


def v(step: int, tag: str = "t0") -> dict:
    return {"name": f"step-{step:09d}", "step": step, "tag": tag}


class TestDecide:
    def test_the_newest_version_every_node_holds(self):
        reports = {0: {"versions": [v(6), v(4)]}, 1: {"versions": [v(4), v(2)]}}
        decision = decide(0, 3, 2, reports, {}, False)
        assert (decision.result, decision.source, decision.version, decision.step) == ("restart", "local", "step-000000004", 4)

    def test_blob_when_it_is_newer_than_what_every_node_holds(self):
        """Node 1's copy of step 6 failed its check: step 6 comes from Blob, not step 4 from the nodes."""
        blob = {"version": "000000006-t0", "step": 6, "tag": "t0", "local": "step-000000006"}
        reports = {0: {"versions": [v(6), v(4)], "blob_latest": blob}, 1: {"versions": []}}
        decision = decide(1, 3, 2, reports, {}, False)
        assert (decision.source, decision.blob_version, decision.version, decision.step) == (
            "blob", "000000006-t0", "step-000000006", 6)

    def test_another_timeline_is_not_the_same_version(self):
        reports = {0: {"versions": [v(4, "t1")]}, 1: {"versions": [v(4, "t0")]}}
        assert decide(1, 3, 2, reports, {}, False).source == "none"

    def test_waits_for_every_node_then_names_the_lost_one(self):
        reports = {0: {"versions": [v(2)]}}
        assert decide(0, 3, 3, reports, {}, False) is None
        lost = decide(0, 3, 3, reports, {}, True)
        assert (lost.result, lost.exit_code) == ("end", exit_codes.ExitCode.NODE_LOST)
        assert "node(s) 1, 2 did not answer the restart: lost" in lost.reason

    def test_limit_and_ended_nodes(self):
        reports = {0: {"versions": [v(2)]}, 1: {"versions": [v(2)]}}
        spent = decide(3, 3, 2, reports, {}, False)
        assert (spent.result, spent.exit_code) == ("end", exit_codes.ExitCode.RESTARTS_EXHAUSTED)
        ended = decide(0, 3, 2, reports, {1: {"reason": "the launcher was told to stop"}}, False)
        assert ended.result == "end" and "node 1 ended the job (the launcher was told to stop)" in ended.reason


# A training for the launcher: ranks in lockstep through files in a shared folder (no rank
# starts step s before every rank finished s-1), a versioned checkpoint every 2 steps (tier
# markers), resumed from AMLHPC_RESUME_VERSION; faults at a step in generation 0. (With
# after_standby the fault hook's barrier needs a process group: this one has none, and each
# rank waits for its own standby only.)
TRAIN = r"""
import json, os, sys, time
from pathlib import Path
from amlhpc.jobs.runtime.base import progress
from amlhpc.jobs.runtime.checkpoint import tier
from amlhpc.jobs.workloads import resume as resume_api
shared, total = Path(sys.argv[1]), int(sys.argv[2])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
gen = int(os.environ["AMLHPC_RESTART_GENERATION"])
ckpt, tag = Path(os.environ["AMLHPC_CHECKPOINT_DIR"]), os.environ["AMLHPC_CHECKPOINT_TAG"]
resume = os.environ.get("AMLHPC_RESUME_VERSION")
start = json.loads((Path(resume) / f"rank-{rank}" / "state.json").read_text())["step"] if resume else 0
(progress.note_resumed if resume else progress.report)(start)
mine = shared / f"g{gen}-rank{rank}"
def reached(r):
    try:
        return int((shared / f"g{gen}-rank{r}").read_text())
    except (OSError, ValueError):
        return -1
mine.write_text(str(start))
for step in range(start + 1, total + 1):
    while min(reached(r) for r in range(world)) < step - 1:
        time.sleep(0.02)
    with open(shared / f"steps-rank{rank}.jsonl", "a") as log:
        log.write(json.dumps({"generation": gen, "step": step, "resumed": resume and Path(resume).name}) + "\n")
    if step % 2 == 0:
        version = tier.versions_dir(ckpt) / tier.version_name(step)
        folder = tier.rank_dir(version, rank)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "state.json").write_text(json.dumps({"step": step}))
        tier.write_marker(version, rank, step=step, world=world, tag=tag)
    progress.report(step)
    resume_api.inject_fault(step)
    mine.write_text(str(step))
"""


@pytest.fixture
def train_script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def run_job(tmp_path: Path, train_script: Path, azurite, container, total: int, settings: dict | None = None,
            nodes: int = 2, **extra: str) -> tuple[list[int], list[str], list[dict]]:
    run_id, prefix = f"r-{uuid.uuid4().hex[:6]}", f"restart/{uuid.uuid4().hex[:6]}"
    shared = tmp_path / "shared"
    shared.mkdir()

    def env_of(node: int) -> dict[str, str]:
        env = node_env(tmp_path, node, run_id, prefix, azurite, container, WORLD_SIZE=str(nodes), **extra)
        if settings:
            env["AMLHPC_CHECKPOINT_JSON"] = json.dumps({**json.loads(env["AMLHPC_CHECKPOINT_JSON"]), **settings})
        return env

    procs = start_launchers(nodes, env_of, [sys.executable, str(train_script), str(shared), str(total)])
    outs = [p.communicate(timeout=240)[0] for p in procs]
    reports = [json.loads((tmp_path / f"node{n}" / "reports" / f"launch-node{n:03d}.json").read_text())
               for n in range(nodes)]
    return [p.returncode for p in procs], outs, reports


def steps(tmp_path: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "shared" / f"steps-rank{rank}.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.azurite
class TestInJobRestart:
    def test_a_crashed_rank_restarts_from_the_local_copies(self, tmp_path, train_script, azurite, container):
        codes, outs, reports = run_job(tmp_path, train_script, azurite, container, 8,
                                       **faults.env_for("crash@step=5,rank=1"))
        assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
        for report in reports:
            (again,) = report["restarts"]
            assert (again["generation"], again["cause"], again["failed_node"]) == (1, "exit", 1)
            assert (again["source"], again["version"]) == ("local", "step-000000004")
        ran = steps(tmp_path, 1)
        assert [s["step"] for s in ran if s["generation"] == 0] == [1, 2, 3, 4, 5]
        assert [(s["step"], s["resumed"]) for s in ran if s["generation"] == 1][0] == (5, "step-000000004")
        assert ran[-1] == {"generation": 1, "step": 8, "resumed": "step-000000004"}
        assert "injected fault: crash on rank 1 at step 5" in outs[1]

    def test_the_warm_standby_runs_the_restarted_command(self, tmp_path, train_script, azurite, container):
        """With a standby ready (its interpreter up, torch imported), the restart runs in it."""
        codes, outs, reports = run_job(tmp_path, train_script, azurite, container, 8,
                                       **faults.env_for("crash@step=5,rank=1,after-standby=yes"), AMLHPC_STANDBY="on")
        assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
        for out in outs:
            assert "warm standby (pid" in out and "runs the command: its interpreter and torch are loaded" in out
        assert steps(tmp_path, 1)[-1] == {"generation": 1, "step": 8, "resumed": "step-000000004"}

    def test_a_hang_restarts_from_the_local_copies(self, tmp_path, train_script, azurite, container):
        codes, outs, reports = run_job(tmp_path, train_script, azurite, container, 8,
                                       **faults.env_for("stall@step=5,rank=1"),
                                       AMLHPC_WATCHDOG_JSON='{"hang_s": 3, "check_s": 0.5}')
        assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
        for report in reports:
            (again,) = report["restarts"]
            assert (again["cause"], again["source"], again["version"]) == ("hang", "local", "step-000000004")
        assert steps(tmp_path, 0)[-1] == {"generation": 1, "step": 8, "resumed": "step-000000004"}

    def test_a_corrupt_local_copy_falls_back_to_blob(self, tmp_path, train_script, azurite, container):
        """Rank 1 waits until step 4 is committed in Blob, corrupts its local copies, crashes:
        node 1 offers no intact version, so every node resumes from Blob's."""
        codes, outs, reports = run_job(tmp_path, train_script, azurite, container, 8, {"interval_s": 1},
                                       **faults.env_for("crash@step=5,rank=1,after-commit=4,corrupt=yes"))
        assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
        assert "not intact, not offered for the restart" in outs[1] and "does not match its marker" in outs[1], outs[1]
        for report in reports:
            (again,) = report["restarts"]
            assert again["source"] == "blob" and again["step"] >= 4
        resumed = [s for s in steps(tmp_path, 1) if s["generation"] == 1][0]
        assert resumed["resumed"] == reports[0]["restarts"][0]["version"]

    def test_the_limit_ends_the_job_for_a_new_attempt(self, tmp_path, train_script, azurite, container):
        """local_restarts 1: the second failure ends the job on every node with exit 11."""
        codes, outs, reports = run_job(tmp_path, train_script, azurite, container, 8, {"local_restarts": 1},
                                       **faults.env_for("crash@step=3,rank=0", "crash@step=5,rank=0,gen=1"))
        assert codes == [exit_codes.ExitCode.RESTARTS_EXHAUSTED] * 2, "\n".join(o[-3000:] for o in outs)
        assert [len(r["restarts"]) for r in reports] == [1, 1]
        assert "1 in-job restart(s) spent (checkpoint.local_restarts)" in reports[1]["error"]


def test_records_are_per_generation(tmp_path):
    records = restart.NodeRecords(tmp_path, 3)
    records.record_exit(1, 137, "restart")
    assert records.exits(2) == {1: {**records.exits(2)[1], "status": 137, "cause": "restart"}}
    assert restart.NodeRecords(tmp_path, 4).exits(2) == {}
