"""Shrink-and-continue: after a lost node, an attempt that cannot get its nodes (the cluster's
capacity answer, or the queue timeout) is followed by one on fewer nodes - never fewer than
managed.min_nodes - before the run moves to the next cluster; the attempt's job asks for that
many instances with the command's global batch unchanged, its cost is that many nodes', the
record and `status` say why it shrank, and a later restart asks for the full count again.
A recipe without min_nodes never shrinks. On the fake Azure ML built from azure-ai-ml's own
entities (tests/managed_fakes.py), the record and the evidence in Azurite; the submit side
(render.py, shrink.py) on the dev stack's outputs."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from amlhpc.core.errors import UserError
from amlhpc.jobs import recipes
from amlhpc.jobs.cli import main as cli
from amlhpc.jobs.managed import render, shrink
from amlhpc.jobs.managed.policy import Policy, Target
from amlhpc.jobs.managed.record import RecordStore
from amlhpc.jobs.managed.report import summary_lines
from amlhpc.jobs.plan import build
from amlhpc.jobs.runtime.base import faultpoints
from tests.jobs_helpers import outputs_file, stack_outputs
from tests.managed_fakes import PREEMPTION, T0, Step, end
from tests.managed_harness import Harness, running, write_template

pytestmark = pytest.mark.azurite

COMMAND = "python -m amlhpc.jobs.workloads.cosmoflow.train --input cosmoflow --epochs 48 --batch-size 4"
"""cosmoflow's command: 4 samples per rank and pass, 8 ranks per ND96asr_v4 node."""


def plan(*sets: str):
    recipe = recipes.load("cosmoflow", recipes.parse_overrides(list(sets)))
    outputs = stack_outputs("dev")
    return render.plan_managed(recipe, outputs, build.plan_job(recipe, outputs, name=f"cosmoflow-s{uuid.uuid4().hex[:6]}"))


@pytest.fixture(scope="module")
def shrinking():
    """cosmoflow on dev's nd-a100 (2 x ND96asr_v4, maxNodes 2) with managed.min_nodes 1 and a global batch of 64."""
    return plan(f"command={COMMAND} --global-batch 64", "managed.min_nodes=1")


@pytest.fixture
def template(tmp_path, shrinking):
    return write_template(tmp_path, shrinking)


def rules(mplan, **changes) -> Policy:
    return replace(mplan.policy, poll_s=30, backoff_s=60, backoff_max_s=900, **changes)


def lost(node_count: int, gone: int, ended_h: float = 1.0) -> Step:
    """Node `gone` of the attempt vanished (no end record); the others failed on their collectives."""
    return Step("Failed", error=("UserError", "Execution failed. User process exited with status code 1"),
                ends={n: end(1, node=n, first=0, last=40) for n in range(node_count) if n != gone},
                started_h=0.0, ended_h=ended_h)


def done(node_count: int, ended_h: float = 3.0) -> Step:
    return Step("Completed", ends={n: end(0, node=n, first=40, last=100) for n in range(node_count)}, started_h=0.0,
                ended_h=ended_h)


def queued_scripts() -> dict[int, list[Step]]:
    """Attempt 1 loses node 1; attempt 2 (2 nodes) waits in the queue; attempt 3 (1 node) completes."""
    return {1: [running(commit=True), lost(2, gone=1)], 2: [Step("Queued")], 3: [running(), done(1)]}


def lose_capacity_at(h: Harness, attempt: int):
    """From the claim of `attempt` on, the cluster lists one node unusable (a named step, not a time)."""
    return faultpoints.armed("controller.claim", lambda **ctx: setattr(h.azure, "unusable_nodes", 1),
                             when=lambda **ctx: ctx["attempt"] == attempt)


class TestShrink:
    def test_a_lost_node_and_a_short_cluster_shrink_the_next_attempt(self, container, template, shrinking):
        """Node 1's host is lost and stays unusable: the cluster (maxNodes 2) can give one
        node, so attempt 2 asks for one - with the same command, its --global-batch kept."""
        h = Harness(container, template, shrinking, {1: [running(commit=True), lost(2, gone=1)], 2: [running(), done(1)]},
                    rules(shrinking))
        h.azure.unusable_nodes = 1
        record = h.supervisor.run()

        assert record.state == "succeeded", h.lines[-10:]
        first, small = record.attempts
        assert [(a.cause, a.nodes, a.full_nodes) for a in record.attempts] == [("node_failure", 2, 2), ("completed", 1, 2)]
        assert first.capacity == 1 and first.shrunk is None
        assert small.shrunk.startswith("after attempt 1 lost a node (node_failure: node(s) 1 left no end record")
        assert "nd-a100 could give at most 1 node(s) at attempt 1's last look" in small.shrunk
        # the job: one instance, the same command (its --global-batch) and checkpoint prefix, from the same template
        jobs = {job.name: job for job in h.azure.created}
        assert [jobs[a.job].resources.instance_count for a in record.attempts] == [2, 1]
        assert jobs[small.job].command == jobs[first.job].command and "--global-batch 64" in jobs[small.job].command
        assert jobs[small.job].environment_variables["AMLHPC_CHECKPOINT_JSON"] == \
            jobs[first.job].environment_variables["AMLHPC_CHECKPOINT_JSON"]
        assert jobs[small.job].tags["nodes"] == "1" and "1 of 2 nodes" in jobs[small.job].display_name
        assert small.resumed_version is not None, "it restores (and reshards) the checkpoint attempt 1 committed"
        # what it cost: one node's price, from its submission to its end
        price = shrinking.policy.targets[0].usd_per_node_hour
        assert small.usd_per_hour == price
        submitted = datetime.fromisoformat(small.submitted_at)
        assert small.usd == round(price * (T0 + timedelta(hours=3) - submitted).total_seconds() / 3600, 2)
        text = "\n".join(summary_lines(record, T0))
        assert "| 1 of 2 |" in text and "attempt 2 shrank to 1 of 2 nodes (the same global batch" in text
        assert any("shrink-and-continue: the next attempt runs on 1 of 2 nodes" in line for line in h.lines)

    def test_a_queued_attempt_the_cluster_cannot_serve_is_replaced_by_a_smaller_one(self, container, template,
                                                                                     shrinking):
        """The host is seen unusable only once attempt 2 waits: its capacity answer stops it at
        once (no queue timeout is set), and attempt 3 runs on one node."""
        h = Harness(container, template, shrinking, queued_scripts(), rules(shrinking))
        with lose_capacity_at(h, 2) as point:
            record = h.supervisor.run()
        assert point.fired == 1 and record.state == "succeeded"
        queued = record.attempts[1]
        assert [(a.cause, a.nodes) for a in record.attempts] == [("node_failure", 2), ("queue_timeout", 2),
                                                                 ("completed", 1)]
        assert "can give at most 1 node(s) now" in queued.detail and "2 asked" in queued.detail
        assert h.azure.canceled == [queued.job], "not left waiting for nodes that are not there"
        assert "attempt 2 could not get 2 node(s) on nd-a100" in record.attempts[2].shrunk

    def test_step_by_step_never_below_min_nodes_then_the_next_cluster(self, container, template, shrinking):
        """4 nodes, min_nodes 2, no capacity answer: each queue timeout after the lost node
        shrinks by one allowed count (4 -> 3 -> 2); at 2 the next timeout moves to the
        fallback cluster, on its full count."""
        fallback = template.parent / "training-job-nd-a100-dedicated.yml"
        document = yaml.safe_load(template.read_text())
        document["compute"] = "azureml:nd-a100-dedicated"
        fallback.write_text(yaml.safe_dump(document))
        targets = (Target("nd-a100", 4, 10.0, "LowPriority", render.TEMPLATE_PATH),
                   Target("nd-a100-dedicated", 4, 27.197, "Dedicated", "managed/training-job-nd-a100-dedicated.yml"))
        policy = rules(shrinking, nodes=4, targets=targets, shrink_nodes=(3, 2), queue_timeout_s=120, max_restarts=6,
                       limit_usd=None)
        h = Harness(container, template, shrinking, {1: [running(commit=True), lost(4, gone=3)], 5: [running(), done(4)]},
                    policy)
        record = h.supervisor.run()

        assert record.state == "succeeded", h.lines[-10:]
        assert [(a.cause, a.cluster, a.nodes) for a in record.attempts] == [
            ("node_failure", "nd-a100", 4), ("queue_timeout", "nd-a100", 4), ("queue_timeout", "nd-a100", 3),
            ("queue_timeout", "nd-a100", 2), ("completed", "nd-a100-dedicated", 4)]
        assert min(job.resources.instance_count for job in h.azure.created) == 2, "never below managed.min_nodes"
        assert [a.usd_per_hour for a in record.attempts] == [40.0, 40.0, 30.0, 20.0, 4 * 27.197]
        assert record.attempts[4].shrunk is None and record.attempts[4].full_nodes == 4

    def test_a_recipe_without_min_nodes_never_shrinks(self, container, tmp_path):
        mplan = plan()
        assert mplan.policy.shrink_nodes == () and render.describe_shrink(mplan) == []
        h = Harness(container, write_template(tmp_path, mplan), mplan, {**queued_scripts(), 3: [running(), done(2)]},
                    rules(mplan, queue_timeout_s=120))
        h.azure.unusable_nodes = 1
        record = h.supervisor.run()
        assert [(a.cause, a.nodes) for a in record.attempts] == [("node_failure", 2), ("queue_timeout", 2),
                                                                 ("completed", 2)]
        assert record.attempts[1].detail.startswith("queued "), "it waited for the queue timeout: no capacity shortcut"
        assert all(job.resources.instance_count == 2 for job in h.azure.created)
        assert "shrank" not in "\n".join(summary_lines(record, T0))

    def test_no_lost_node_no_shrink(self, container, template, shrinking):
        """A short cluster and a queue timeout, but no node was lost: the run does not shrink."""
        h = Harness(container, template, shrinking, {1: [Step("Queued")], 2: [running(), done(2)]},
                    rules(shrinking, queue_timeout_s=120))
        h.azure.unusable_nodes = 1
        record = h.supervisor.run()
        assert [(a.cause, a.nodes) for a in record.attempts] == [("queue_timeout", 2), ("completed", 2)]

    def test_a_requeue_after_a_preempted_node_counts_as_a_lost_node(self, container, template, shrinking):
        """Azure ML requeued the job after one of its nodes was preempted, and it then waits in the queue."""
        scripts = {1: [running(), Step("Running", node_states=("running", "preempted"), started_h=0.0), Step("Queued")],
                   2: [running(), done(1)]}
        record = Harness(container, template, shrinking, scripts, rules(shrinking, queue_timeout_s=120)).supervisor.run()
        assert [(a.cause, a.nodes) for a in record.attempts] == [("queue_timeout", 2), ("completed", 1)]
        assert "Azure ML requeued the job" in record.attempts[1].shrunk

    def test_it_stays_small_while_the_cluster_is_short(self, container, template, shrinking):
        """The shrunk attempt is preempted while the lost host still holds its slot: the next
        one runs on one node again, without a full-size try that could not start."""
        scripts = {1: [running(commit=True), lost(2, gone=1)],
                   2: [running(), Step("Failed", error=PREEMPTION, started_h=0, ended_h=1.5)], 3: [running(), done(1)]}
        h = Harness(container, template, shrinking, scripts, rules(shrinking))
        h.azure.unusable_nodes = 1
        record = h.supervisor.run()
        assert [(a.cause, a.nodes) for a in record.attempts] == [("node_failure", 2), ("preempted", 1), ("completed", 1)]

    def test_it_grows_back_when_the_capacity_returns(self, container, template, shrinking):
        """While the shrunk attempt runs, the lost host leaves the cluster; it then hangs, and
        the next attempt asks for both nodes again."""
        hang = Step("Failed", error=("UserError", "exit 7"), started_h=0, ended_h=1.5, ends={0: end(7, node=0, last=60)})
        scripts = {1: [running(commit=True), lost(2, gone=1)], 2: [running(), running(), hang],
                   3: [running(), done(2, ended_h=5.0)]}
        h = Harness(container, template, shrinking, scripts, rules(shrinking))
        h.azure.unusable_nodes = 1
        with faultpoints.armed("controller.watch", lambda **ctx: setattr(h.azure, "unusable_nodes", 0),
                               when=lambda **ctx: ctx["attempt"] == 2) as point:
            record = h.supervisor.run()
        assert point.fired == 1
        assert [(a.cause, a.nodes) for a in record.attempts] == [("node_failure", 2), ("hang", 1), ("completed", 2)]
        assert record.node_lost is None, "an attempt ran on the full count: the lost node no longer allows shrinking"
        assert "attempt 3 grew back to 2 nodes" in "\n".join(summary_lines(record, T0))
        assert any("attempt 3 asks for all 2 nodes again (attempt 2 ran on 1)" in line for line in h.lines)

    def test_repeated_preemption_moves_on_before_it_shrinks(self, container, template, shrinking):
        """Preemptions are the cluster's priority, not its size: after managed.fallback_after_preemptions
        the run goes to the next cluster, whatever its capacity answer."""
        fallback = template.parent / "training-job-nd-a100-dedicated.yml"
        document = yaml.safe_load(template.read_text())
        document["compute"] = "azureml:nd-a100-dedicated"
        fallback.write_text(yaml.safe_dump(document))
        targets = (replace(shrinking.policy.targets[0]),
                   Target("nd-a100-dedicated", 2, 27.197, "Dedicated", "managed/training-job-nd-a100-dedicated.yml", 2))
        preempted = [running(), Step("Failed", error=PREEMPTION, started_h=0, ended_h=0.5)]
        h = Harness(container, template, shrinking, {1: preempted, 2: [running(), done(2)]},
                    rules(shrinking, targets=targets, fallback_after_preemptions=1))
        h.azure.unusable_nodes = 1
        record = h.supervisor.run()
        assert [(a.cause, a.cluster, a.nodes) for a in record.attempts] == [("preempted", "nd-a100", 2),
                                                                           ("completed", "nd-a100-dedicated", 2)]


POINTS = (("controller.watch", 1), ("controller.ended", 1), ("controller.backoff", 1), ("controller.claim", 2),
          ("controller.claimed", 2), ("controller.submitted", 2))


@pytest.mark.parametrize("point, attempt", POINTS)
def test_a_controller_killed_during_a_shrink_is_replaced_and_shrinks_once(container, template, shrinking, point, attempt):
    """Killed at each step from the lost node's attempt to the shrunk attempt's submit: the
    next controller goes on from the record - one job per attempt, the second on one node."""
    faultpoints.reset()
    h = Harness(container, template, shrinking, {1: [running(commit=True), running(), lost(2, gone=1)],
                                                 2: [running(), done(1)]}, rules(shrinking))
    h.azure.unusable_nodes = 1
    armed = faultpoints.arm(point, faultpoints.crash, when=lambda **ctx: ctx.get("attempt") == attempt)
    try:
        with pytest.raises(faultpoints.Crash):
            h.supervisor.run()
    finally:
        faultpoints.reset()
    assert armed.fired == 1
    h.supervisor.store.lease.break_lease(lease_break_period=0)  # what the lease's expiry does
    record = h.new_supervisor("ctl-2").run()
    assert record.state == "succeeded" and [a.nodes for a in record.attempts] == [2, 1]
    assert [job.name for job in h.azure.created] == [a.job for a in record.attempts], "each job created once"
    assert h.azure.created[1].resources.instance_count == 1


class TestSubmitSide:
    def test_min_nodes_needs_the_global_batch_in_the_command(self):
        with pytest.raises(UserError) as caught:
            plan(f"command={COMMAND}", "managed.min_nodes=1")
        problem = caught.value.problems[0]
        assert problem.path == "command" and "does not name its global batch" in problem.message
        assert "--global-batch N" in problem.hint and "= 64" in problem.hint, "the batch it trains with now"

    def test_the_policy_and_the_dry_run_carry_the_counts(self, shrinking):
        assert shrinking.policy.shrink_nodes == (1,) and shrinking.policy.targets[0].max_nodes == 2
        assert Policy.from_json(shrinking.policy.to_json()) == shrinking.policy
        assert "# shrink-and-continue: after a lost node, an attempt that cannot get 2 nodes is followed by one on 1" \
            in render.to_yaml(shrinking, "code")

    def test_a_global_batch_the_full_count_cannot_split_is_refused(self):
        with pytest.raises(UserError) as caught:
            plan(f"command={COMMAND} --global-batch 48", "managed.min_nodes=1")
        problem = caught.value.problems[0]
        assert "--global-batch 48 does not split over 2 nodes x 8 ranks x micro batch 4" in problem.message
        assert problem.hint == "use a multiple of 64"

    def test_counts_keep_only_what_the_global_batch_splits_over(self):
        batch = shrink.batch_of("train.py --global-batch 96 --batch-size 4", ranks_per_node=8)
        assert (batch.global_batch, batch.micro_batch) == (96, 4)
        assert shrink.counts(4, 2, batch) == ((3,), (2,)), "96 = 4 x 8 x 3; not 4 x 8 x 2 = 64"
        assert shrink.counts(4, None, batch) == ((), ()), "no min_nodes: never"
        deepspeed = shrink.batch_of("train.py --steps 9 --global-batch=48", 1, {"train_micro_batch_size_per_gpu": 4,
                                                                               "gradient_accumulation_steps": 2})
        assert (deepspeed.global_batch, deepspeed.micro_batch, deepspeed.accumulation) == (48, 4, 2)
        assert shrink.flag("train.py --global-batch many", "--global-batch") is None

    def test_the_budget_for_the_rest_is_node_hours(self):
        policy = Policy(nodes=4, usd_per_node_hour=10.0, expected_hours=10)
        full = policy.next_attempt_usd(node_hours_run=4 * 5)
        assert full == 10.0 * 4 * 5, "half the node-hours left"
        assert policy.next_attempt_usd(node_hours_run=4 * 2 + 3 * 4) == full, "2 h on 4 nodes + 4 h on 3: as much work"
        assert Policy(nodes=4, usd_per_node_hour=1, expected_hours=1, shrink_nodes=(3, 2)).smaller(4, capacity=2) == 2


def test_status_names_the_shrink(mocker, container):
    """`jobs status` of a run whose third attempt shrank: its nodes as "1 of 2", and why."""
    from amlhpc.jobs.managed.record import Attempt, Record

    run = "cosmoflow-20261123-100000-abcd"
    prefix = f"cosmoflow/{run}"
    why = "after attempt 1 lost a node (node_failure: node 1 left no end record), attempt 2 could not get 2 node(s)"
    record = Record(run=run, recipe="cosmoflow", policy=Policy(nodes=2, usd_per_node_hour=10.0, expected_hours=4,
                                                                shrink_nodes=(1,)).to_json(), attempts=[
        Attempt(1, f"{run}-a1", state="ended", status="Failed", cause="node_failure", retryable=True, nodes=2,
                full_nodes=2, usd=20.0),
        Attempt(2, f"{run}-a2", state="ended", status="Canceled", cause="queue_timeout", retryable=True, nodes=2,
                full_nodes=2, usd=1.0),
        Attempt(3, f"{run}-a3", state="running", status="Running", nodes=1, full_nodes=2, shrunk=why, usd_per_hour=10.0,
                started_at="2026-11-23T12:00:00+00:00")])
    RecordStore(container, prefix).create(record)
    tags = {"managed_run": run, "record": f"{container.container_name}/{prefix}/supervision.json"}
    fake = mocker.MagicMock(name="MLClient")
    fake.jobs.get.side_effect = lambda name: SimpleNamespace(
        name=name, status="Running", tags=tags, display_name=name, experiment_name="cosmoflow", compute="nd-a100",
        creation_context=None, studio_url=None)
    mocker.patch("amlhpc.jobs.azure.submit.connect", return_value=fake)
    mocker.patch("amlhpc.jobs.managed.client.store_for", lambda outputs, place: RecordStore(container, place.prefix))
    result = CliRunner().invoke(cli.app, ["status", f"{run}-a3", "--stack", "dev", "--outputs", str(outputs_file("dev"))],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "1 of 2" in result.output and f"attempt 3 shrank to 1 of 2 nodes (the same global batch; a versioned " \
        f"checkpoint reshards): {why}" in " ".join(result.output.split())
