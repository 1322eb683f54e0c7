"""The managed rehearsal end to end: real processes on two simulated nodes, Azurite as Blob,
the supervision that runs in Azure. A node is preempted (SIGTERM, then SIGKILL), then, in
the next attempt, a node's training freezes; the supervision classifies each end,
resubmits, every restart resumes from the checkpoint in Blob, and the run ends with as
many steps as an undisturbed run.

The training is amlhpc.jobs.workloads.synthetic (lockstep ranks, checkpoints, progress reports,
no framework): the subject is the platform's recovery, and without a torch import per
process the whole scenario fits in a few seconds of CPU per attempt."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from amlhpc.jobs import recipes
from amlhpc.jobs.local import managed, rehearsal
from amlhpc.jobs.managed import render
from amlhpc.jobs.managed.report import summary_lines
from amlhpc.jobs.plan import build
from tests.jobs_helpers import outputs_file, stack_outputs

pytestmark = [pytest.mark.slow, pytest.mark.azurite]

TRAIN = "python -m amlhpc.jobs.workloads.synthetic --steps 30 --step-s 0.15 --checkpoint-every 5"
NODES, PROCS = 2, 1


def plan(name: str, *sets: str):
    recipe = recipes.load("cosmoflow", recipes.parse_overrides([f"command={TRAIN}", "health=off", "inputs={}", *sets]))
    outputs = stack_outputs("dev")
    return recipe, outputs, build.plan_job(recipe, outputs, nodes=NODES, processes_per_node=PROCS, name=name)


@pytest.fixture(scope="module")
def world(azurite, tmp_path_factory):
    _, outputs, base = plan("snapshot")
    containers = list(outputs.storage.containers.values())
    rehearsal.ensure_containers(containers, azurite.connection_string)
    return {"azurite": azurite, "containers": containers, "snapshot": build.snapshot(base.code_dirs),
            "root": tmp_path_factory.mktemp("rehearsals")}


def steps_in(workdir: Path) -> int:
    """The steps the training itself counted (its summary, written by rank 0 on node 0)."""
    return json.loads((workdir / "node0" / "outputs" / "aml-hpc" / "metrics.json").read_text())["steps"]


def common(world, workdir: Path, lines: list[str]) -> dict:
    return {"snapshot": world["snapshot"], "workdir": workdir, "procs_per_node": PROCS,
            "blob_endpoint": world["azurite"].blob_endpoint, "connection_string": world["azurite"].connection_string,
            "containers": world["containers"], "sink": lambda proc, line: lines.append(f"n{proc.node}: {line}"),
            "timeout_s": 600}


@pytest.fixture(scope="module")
def undisturbed(world):
    name = f"base-{uuid.uuid4().hex[:6]}"
    _, _, job = plan(name)
    lines: list[str] = []
    kwargs = common(world, world["root"] / name, lines)
    kwargs.pop("blob_endpoint"), kwargs.pop("connection_string")
    result = rehearsal.rehearse(job, blob_endpoint=world["azurite"].blob_endpoint,
                                connection_string=world["azurite"].connection_string, **kwargs)
    assert result.ok, "\n".join(lines[-30:])
    return steps_in(world["root"] / name)


def test_cli_a_preempted_node_resumes_from_the_checkpoint(world, undisturbed, monkeypatch):
    """`python -m amlhpc.jobs run ... --local --managed --fault preempt@step=12,node=1,grace=5`, in process."""
    from typer.testing import CliRunner

    from amlhpc.jobs.cli import main as cli
    from amlhpc.jobs.managed.record import RecordStore
    from amlhpc.jobs.runtime.blob import blobio

    name = f"m-cli-{uuid.uuid4().hex[:6]}"
    azurite = world["azurite"]
    result = CliRunner().invoke(cli.app, [
        "run", "cosmoflow", "--local", "--managed", "--fault", "preempt@step=12,node=1,grace=5",
        "--nodes", str(NODES), "--procs-per-node", str(PROCS), "--name", name, "--workdir", str(world["root"] / name),
        "--outputs", str(outputs_file("dev")), "--quiet", "--set", f"command={TRAIN}", "--set", "health=off",
        "--set", "inputs={}"], env={"AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string, "COLUMNS": "250"})
    assert result.exit_code == 0, result.output[-4000:]
    store = RecordStore(blobio.container_client("supervision", connection_string=azurite.connection_string),
                        f"cosmoflow/{name}")
    record, _ = store.load()
    preempted, finished = record.attempts
    assert (preempted.cause, preempted.node_events) == ("preempted", ["preempted"])
    assert finished.resumed_version is not None and finished.first_step > 0, "resumed from the checkpoint in Blob"
    assert steps_in(world["root"] / name) == finished.last_step == undisturbed, "as many steps as undisturbed"
    out = result.output
    assert "preempting node 1 of" in out and "at step 12" in out and "preempted (retried)" in out
    assert "fault injected: preempt on node 1 at step 12 (attempt 1) [--fault preempt@step=12,node=1,grace=5]" in out
    assert preempted.last_step >= 12
    assert f"{finished.resumed_version} (step {finished.first_step})" in out, "the summary shows where it resumed"


def test_a_hang_is_stopped_by_the_watchdog_and_resumed(world, undisturbed):
    name = f"m-hang-{uuid.uuid4().hex[:6]}"
    recipe, outputs, job = plan(name, "watchdog.hang_s=10")
    lines: list[str] = []
    fault = managed.Fault("hang", node=1, at_step=12)
    done = managed.rehearse_managed(render.plan_managed(recipe, outputs, job), echo=lines.append, faults=[fault],
                                    **common(world, world["root"] / name, lines))
    record = done.record
    assert record.state == "succeeded", "\n".join(lines[-40:])
    hung, finished = record.attempts
    # The culprit's own watchdog ("progressed for") or a peer's ("made no progress for"): whichever
    # judged first, by the order of their looks.
    assert (hung.cause, hung.exit_code, hung.retryable) == ("hang", 7, True)
    assert re.search(r"progress(?:ed)? for \d+s", hung.detail), hung.detail
    assert "hang started on node 1" in hung.detail and [b["node"] for b in hung.bad_nodes] == [1], "the frozen node"
    assert not done.missing
    assert any("freezing the training on node 1" in line for line in lines)
    assert finished.resumed_version is not None and finished.first_step > 0
    assert any(f"resuming from checkpoint {finished.resumed_version}" in line for line in lines)
    assert steps_in(world["root"] / name) == finished.last_step == undisturbed
    assert "hang (retried)" in "\n".join(summary_lines(record))


def test_a_killed_controller_is_replaced_and_a_slow_node_named(world):
    """Node 1's own work per step takes 3x longer; the controller dies at its first look at the
    running attempt; the revival check replaces it once its lease lapsed, the new one names node
    1 a straggler, and the run ends with one job for its one attempt. 110 steps of ~0.45 s: the
    rule counts heartbeats a window of 20 steps apart, 3 in a row; the revived controller looks
    from ~17 s (step ~40) and names it by step ~85, which leaves ~11 s for a slower revival."""
    name = f"m-kill-{uuid.uuid4().hex[:6]}"
    recipe, outputs, job = plan(name, f"command={TRAIN.replace('--steps 30', '--steps 110')}", "watchdog.hang_s=10")
    lines: list[str] = []
    done = managed.rehearse_managed(render.plan_managed(recipe, outputs, job), echo=lines.append,
                                    faults=[managed.Fault("slow", node=1, factor=3)], kill_controller_at="watch",
                                    **common(world, world["root"] / name, lines))
    record = done.record
    assert record.state == "succeeded" and not done.missing, "\n".join(lines[-40:])
    assert [a.job for a in record.attempts] == [f"{name}-a1"] and list(done.service.jobs) == [f"{name}-a1"]
    first, revived = [c["job"] for c in record.controllers]
    assert first == name and revived.startswith(f"{name}-c") and done.controllers.outcome[first] == "Failed"
    assert any("controller " + name + " killed at controller.watch" in line for line in lines)
    assert [s["node"] for s in record.attempts[0].stragglers] == [1], "\n".join(lines[-40:])
    assert steps_in(world["root"] / name) == 110


def test_a_fault_that_did_not_happen_is_an_error(world):
    name = f"m-miss-{uuid.uuid4().hex[:6]}"
    recipe, outputs, job = plan(name)
    lines: list[str] = []
    done = managed.rehearse_managed(render.plan_managed(recipe, outputs, job), echo=lines.append,
                                    faults=[managed.Fault("preempt", node=1, at_step=99)],
                                    **common(world, world["root"] / name, lines))
    assert done.record.state == "succeeded" and done.missing == ["preempt on node 1 at step 99 (attempt 1)"]
    assert done.record.attempts[0].stragglers == [], "no node named on an undisturbed run"
    with pytest.raises(managed.RunNameInUse, match=f"run {name} exists"):
        managed.rehearse_managed(render.plan_managed(recipe, outputs, job), echo=lines.append, faults=[],
                                 **common(world, world["root"] / name, lines))



def test_a_lost_host_without_replacement_shrinks_two_nodes_to_one(world, undisturbed):
    """Node 1's host is lost at step 12 and the cluster gets no node in its place: the
    supervision sees the cluster one node short, runs the next attempt on one node with the
    same --global-batch (the one rank takes all of it), from the checkpoint in Blob, and the
    run ends with as many steps as an undisturbed one. (Losses on the smaller world are held
    by tests/test_exact_resume.py, 4 -> 3 ranks of the real BERT; a BERT rehearsal of this takes
    minutes on two cores: docs/managed-jobs.md, "Shrink-and-continue".)"""
    name = f"m-shrink-{uuid.uuid4().hex[:6]}"
    recipe, outputs, job = plan(name, f"command={TRAIN} --global-batch 4", "managed.min_nodes=1")
    mplan = render.plan_managed(recipe, outputs, job)
    assert mplan.policy.shrink_nodes == (1,)
    lines: list[str] = []
    fault = managed.Fault("host_loss", node=1, at_step=12, stays_lost=True)
    done = managed.rehearse_managed(mplan, echo=lines.append, faults=[fault], **common(world, world["root"] / name, lines))
    record = done.record
    assert record.state == "succeeded" and not done.missing, "\n".join(lines[-40:])
    lost, small = record.attempts
    assert (lost.cause, lost.nodes, lost.capacity) == ("node_failure", 2, 1)
    assert (small.nodes, small.full_nodes) == (1, 2) and "could give at most 1 node(s)" in small.shrunk
    assert done.service.jobs[small.job].nodes == 1 and small.first_step > 0, "one node, resumed from the checkpoint"
    summary = json.loads((world["root"] / name / "node0" / "outputs" / "aml-hpc" / "metrics.json").read_text())
    assert (summary["world_size"], summary["global_batch"], summary["per_rank"]) == (1, 4, 4), "the same global batch"
    assert summary["steps"] == small.last_step == undisturbed
    text = "\n".join(summary_lines(record))
    assert "| 1 of 2 |" in text and "attempt 2 shrank to 1 of 2 nodes" in text
