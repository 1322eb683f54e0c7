"""The managed rehearsal end to end: real processes on two simulated nodes, Azurite as Blob,
the supervision that runs in Azure. A node is preempted (SIGTERM, then SIGKILL) or its
training freezes; the supervision classifies it, resubmits, the next attempt resumes from
the checkpoint in Blob, and the run ends with as many steps as an undisturbed run."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from jobs import build, recipes
from jobs.local import managed, rehearsal
from jobs.managed import render
from jobs.managed.report import summary_lines
from tests.jobs_helpers import stack_outputs

pytestmark = [pytest.mark.slow, pytest.mark.azurite]

TRAIN = ("python -m jobs.workloads.cosmoflow.train --input cosmoflow --batch-size 2 --conv-size 4 "
         "--n-conv-layers 3 --fc1 16 --fc2 8 --workers 0 --log-every 1 --epochs 4")
NODES, PROCS = 2, 1


def plan(name: str, *sets: str):
    recipe = recipes.load("cosmoflow", recipes.parse_overrides([f"command={TRAIN}", "health=off", *sets]))
    outputs = stack_outputs("dev")
    return recipe, outputs, build.plan_job(recipe, outputs, nodes=NODES, processes_per_node=PROCS, name=name)


@pytest.fixture(scope="module")
def world(azurite, tmp_path_factory):
    """The dataset in Azurite's datasets container, once for the module."""
    from jobs.data import upload
    from jobs.runtime import blobio
    from jobs.workloads.cosmoflow import generate

    data = tmp_path_factory.mktemp("cosmo")
    generate.generate(data, universes=1, volume=16, subvolumes=8, validation_universes=1, seed=3)
    _, outputs, base = plan("staging")
    containers = list(outputs.storage.containers.values())
    rehearsal.ensure_containers(containers, azurite.connection_string)
    spec = base.staged_inputs[0]
    upload.upload_directory(blobio.container_client(spec["container"], connection_string=azurite.connection_string),
                            data, spec["prefix"])
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


def supervise(world, fault: managed.Fault, *sets: str):
    name = f"m-{fault.kind}-{uuid.uuid4().hex[:6]}"
    recipe, outputs, job = plan(name, *sets)
    lines: list[str] = []
    done = managed.rehearse_managed(render.plan_managed(recipe, outputs, job), echo=lines.append, faults=[fault],
                                    **common(world, world["root"] / name, lines))
    return done, lines, world["root"] / name


def test_a_preempted_node_resumes_from_the_checkpoint(world, undisturbed):
    fault = managed.Fault("preempt", after_s=0.5, node=1, grace_s=5, after_checkpoint=True)
    done, lines, workdir = supervise(world, fault)
    record = done.record
    assert record.state == "succeeded", "\n".join(lines[-40:])
    first, second = record.attempts
    assert (first.cause, first.node_events, first.retryable) == ("preempted", ["preempted"], True)
    assert any("preempting node 1" in line and "SIGKILL after 5s" in line for line in lines)
    assert second.resumed_version is not None and second.first_step > 0, "attempt 2 restored a committed checkpoint"
    assert any(f"resuming from checkpoint {second.resumed_version}" in line for line in lines)
    assert steps_in(workdir) == second.last_step == undisturbed, "as many steps as the undisturbed run"
    text = "\n".join(summary_lines(record))
    assert f"{second.resumed_version} (step {second.first_step})" in text and "preempted (retried)" in text


def test_a_hang_is_stopped_by_the_watchdog_and_resumed(world, undisturbed):
    fault = managed.Fault("hang", after_s=0.5, node=1, after_checkpoint=True)
    done, lines, workdir = supervise(world, fault, "watchdog.hang_s=10")
    record = done.record
    assert record.state == "succeeded", "\n".join(lines[-40:])
    first, second = record.attempts
    assert (first.cause, first.exit_code, first.retryable) == ("hang", 8, True)
    assert "progressed for" in first.detail
    assert second.first_step > 0 and steps_in(workdir) == second.last_step == undisturbed
