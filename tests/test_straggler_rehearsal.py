"""A slow node is named on llm-pretrain and bert rehearsals: the recipes' own training (torch,
2 simulated nodes of 1 process, Azurite as Blob) under the managed supervision, node 1's own
work per step 3x longer. The slowing is the `slow` action at the `training.compute` fault point
(amlhpc.jobs.runtime.base.faultpoints), armed on node 1 by the rehearsal's `slow` fault; the
recipes reach that point through amlhpc.jobs.workloads.common.OwnWork, so this also shows that
each recipe reports its own-work time. The named node is in the attempt's record and in the
summary `jobs status` prints; the healthy node is never named."""

from __future__ import annotations

import uuid

import pytest

from amlhpc.jobs import recipes
from amlhpc.jobs.local import managed, rehearsal
from amlhpc.jobs.managed import render
from amlhpc.jobs.managed.report import summary_lines
from amlhpc.jobs.plan import build
from amlhpc.jobs.runtime.base.progress import OWN_WORK_WINDOW
from tests.jobs_helpers import stack_outputs

pytestmark = [pytest.mark.slow, pytest.mark.azurite]

LOOKS = 2
"""managed.straggler_looks for these runs (the recipes' 3 needs a window of steps more: minutes of CPU)."""
STEPS = (LOOKS + 4) * OWN_WORK_WINDOW
"""Enough for LOOKS windows of steps a window apart after the first full window (the first
heartbeat with an own-work time), and a margin of three windows for the controller's looks,
which come at its own pace (a second apart here; a loaded machine's 80 steps of llm-pretrain
took ~4 s, a window a look)."""
COMMANDS = {
    "llm-pretrain": f"python -m amlhpc.jobs.workloads.llm.train --model tiny --steps {STEPS} --seq-len 32 "
                    f"--micro-batch 1 --lr 3e-3 --warmup-steps 2 --checkpoint-every {STEPS // 2} --log-every 10",
    "bert-pretrain": f"python -m amlhpc.jobs.workloads.bert_pretrain.train --steps {STEPS} --log-every 10 "
                     f"--checkpoint-every {STEPS // 2}",
}


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("recipe_name", sorted(COMMANDS))
def test_a_slow_node_is_named(recipe_name, azurite, tmp_path):
    name = f"slow-{recipe_name.split('-')[0]}-{uuid.uuid4().hex[:6]}"
    recipe = recipes.load(recipe_name, recipes.parse_overrides(
        [f"command={COMMANDS[recipe_name]}", "health=off", "inputs={}", "watchdog.hang_s=30", "watchdog.check_s=1",
         f"managed.straggler_looks={LOOKS}"]), local=True)
    outputs = stack_outputs("dev")
    job = build.plan_job(recipe, outputs, nodes=2, processes_per_node=1, name=name)
    containers = list(outputs.storage.containers.values())
    rehearsal.ensure_containers(containers, azurite.connection_string)
    lines: list[str] = []
    done = managed.rehearse_managed(
        render.plan_managed(recipe, outputs, job), echo=lines.append, faults=[managed.Fault("slow", node=1, factor=3)],
        snapshot=build.snapshot(job.code_dirs), workdir=tmp_path / name, procs_per_node=1,
        blob_endpoint=azurite.blob_endpoint, connection_string=azurite.connection_string, containers=containers,
        sink=lambda proc, line: lines.append(f"n{proc.node}: {line}"), timeout_s=900)
    record = done.record
    assert record.state == "succeeded" and not done.missing, "\n".join(lines[-40:])
    named = [s for a in record.attempts for s in a.stragglers]
    looks = {a.number: a.slow_looks for a in record.attempts}
    assert [s["node"] for s in named] == [1], f"looks counted per attempt: {looks}\n" + "\n".join(lines[-40:])
    assert named[0]["factor"] >= 1.5
    assert "(node 1) is a straggler" in "\n".join(summary_lines(record)), "shown by jobs status"
