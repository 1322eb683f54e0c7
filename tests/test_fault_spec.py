"""`jobs run --fault SPEC` (amlhpc/jobs/local/faults.py): one grammar, parsed in one place, with
an error naming the bad key or value; the faults it asks for arm named fault points, chosen
by step, rank and restart generation (amlhpc/jobs/runtime/base/faultpoints.py)."""

from __future__ import annotations

import json

import pytest

from amlhpc.core.errors import UserError
from amlhpc.jobs.local import faults
from amlhpc.jobs.local.managed import Fault
from amlhpc.jobs.runtime.base import contract, faultpoints


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv(faultpoints.ENV_POINTS, raising=False)
    monkeypatch.delenv(contract.RESTART_GENERATION, raising=False)
    faultpoints.reset()
    monkeypatch.setattr(faultpoints, "_env_loaded", False)
    yield
    faultpoints.reset()


def problems(text: str, **size) -> str:
    with pytest.raises(UserError) as caught:
        if size:
            faults.plan([text], **size)
        else:
            faults.parse(text)
    return caught.value.render()


def test_every_documented_example_parses():
    hang, preempt, lost, slow, killer, error = (faults.parse(text) for text in faults.EXAMPLES)
    assert (hang.kind, hang.step, hang.node, hang.gen, hang.attempt) == ("hang", 6, 1, 0, None)
    assert (preempt.step, preempt.node, preempt.grace_s) == (4, 0, 30.0)
    assert (lost.kind, lost.step, lost.node, lost.replace) == ("kill-host", 5, 1, False)
    assert (slow.node, slow.factor) == (1, 3.0)
    assert (killer.phase, killer.attempt) == ("watch", None)
    assert (error.kind, error.step, error.rank) == ("error", 3, 1)
    again = faults.parse("crash@step=5,rank=3,gen=1,attempt=2,after-commit=4,after-standby=yes,corrupt=yes")
    assert (again.gen, again.attempt, again.after_commit, again.after_standby, again.corrupt) == (1, 2, 4, True, True)


@pytest.mark.parametrize("text, message", [
    ("lunch@step=3", "'lunch' is not a fault kind"),
    ("hang@stp=6", "hang takes no key 'stp'"),
    ("hang@step=six", "step=six: not a whole number >= 1"),
    ("hang@step=", "step has no value"),
    ("hang", "hang needs step"),
    ("preempt@step=3,grace=9999", "grace=9999: not seconds from 0 to 3600"),
    ("kill-host@step=3,replace=maybe", "replace=maybe: not yes or no"),
    ("slow@node=1,factor=1", "factor=1: not a factor > 1"),
    ("kill-controller@phase=lunch", "phase=lunch: not one of claim, claimed"),
    ("kill-controller@phase=watch,gen=1", "kill-controller takes no key 'gen'"),
    ("error@step=3,step=4", "step is given twice"),
])
def test_a_bad_spec_names_the_key_or_value_and_what_is_accepted(text, message):
    rendered = problems(text)
    assert f"--fault: {text}" in rendered and message in rendered, rendered
    assert "fix:" in rendered


def test_the_plan_checks_the_faults_together():
    assert "add --managed" in problems("hang@step=6,node=1", nodes=2, ranks=4, managed=False)
    assert "node 2 does not exist (2 simulated node(s))" in problems("hang@step=6,node=2", nodes=2, ranks=4, managed=True)
    assert "rank 4 does not exist (4 rank(s))" in problems("stall@step=6,rank=4", nodes=2, ranks=4, managed=False)
    with pytest.raises(UserError, match="one node fault at a step per attempt and generation"):
        faults.plan(["hang@step=6,node=1", "preempt@step=8"], nodes=2, ranks=2, managed=True)
    both = faults.plan(["hang@step=6,node=1", "hang@step=5,node=1,gen=1", "error@step=3,rank=1,attempt=2"],
                       nodes=2, ranks=2, managed=True)
    assert [f.gen for f in both.on_node()] == [0, 1] and both.in_rank(1) == [] and len(both.in_rank(2)) == 1


def test_a_node_fault_becomes_the_rehearsals_fault_with_its_generation():
    fault = Fault.of(faults.parse("kill-host@step=5,node=1,replace=no,gen=1,attempt=2"))
    assert (fault.kind, fault.node, fault.at_step, fault.stays_lost, fault.gen, fault.attempt) == (
        "host_loss", 1, 5, True, 1, 2)
    assert fault.describe() == ("host_loss on node 1 at step 5 (no replacement) (attempt 2, generation 1) "
                                "[--fault kill-host@step=5,node=1,replace=no,gen=1,attempt=2]")


def arm_from(env: dict[str, str], monkeypatch) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(faultpoints, "_env_loaded", False)


def test_a_rank_fault_acts_once_in_its_generation_and_rank(monkeypatch):
    """error@step=3,rank=1,gen=1: nothing in generation 0 or on another rank; in generation 1
    the NCCL error, once (the process would end with it)."""
    arm_from(faults.env_for("error@step=3,rank=1,gen=1"), monkeypatch)
    faultpoints.reach("training.fault", step=3, rank=1)
    assert faultpoints.planned("training.fault", step=3) == []
    monkeypatch.setenv(contract.RESTART_GENERATION, "1")
    assert [p["spec"] for p in faultpoints.planned("training.fault", step=3)] == ["error@step=3,rank=1,gen=1"]
    assert faultpoints.planned("training.fault", step=3, rank=0) == [] == faultpoints.planned("training.fault", step=4)
    faultpoints.reach("training.fault", step=3, rank=0)
    with pytest.raises(faultpoints.FaultInjected, match="NCCL error: unhandled system error"):
        faultpoints.reach("training.fault", step=3, rank=1)
    faultpoints.reach("training.fault", step=3, rank=1)  # once
    assert faultpoints.planned("training.fault", step=3) == []


def test_a_step_gate_fires_in_the_restarted_generation_it_names(tmp_path, monkeypatch):
    """The gate of hang@step=5,node=1,gen=1 lets generation 0 through and holds generation 1 at
    its first step >= 5 (before, a gate held only the first generation that reached it)."""
    gates = {gen: tmp_path / f"gate-{gen}" for gen in (0, 1)}
    for folder in gates.values():
        folder.mkdir()
        (folder / "release").touch()  # released already: the reach records itself and goes on
    arm_from(faultpoints.env_for({"training.step": [{"action": "gate", "at_step": 6, "dir": str(gates[0]), "gen": 0},
                                                    {"action": "gate", "at_step": 5, "dir": str(gates[1]), "gen": 1}]}),
             monkeypatch)
    for step in range(1, 8):
        faultpoints.reach("training.step", step=step)
    assert [json.loads(p.read_text())["step"] for p in gates[0].glob("reached-*.json")] == [6]
    assert not list(gates[1].glob("reached-*.json")), "generation 1's gate held generation 0"
    monkeypatch.setenv(contract.RESTART_GENERATION, "1")
    for step in range(5, 8):
        faultpoints.reach("training.step", step=step)
    (reached,) = [json.loads(p.read_text()) for p in gates[1].glob("reached-*.json")]
    assert (reached["step"], reached["gen"]) == (5, 1)


def test_a_json_firing_is_logged_for_the_rehearsal(tmp_path, monkeypatch):
    log = tmp_path / "fired.log"
    arm_from({**faults.env_for("error@step=2,rank=0"), faultpoints.ENV_LOG: str(log)}, monkeypatch)
    with pytest.raises(faultpoints.FaultInjected):
        faultpoints.reach("training.fault", step=2, rank=0)
    (fired,) = faultpoints.fired_settings(log)
    assert (fired["spec"], fired["kind"], fired["step"], fired["gen"]) == ("error@step=2,rank=0", "error", 2, 0)
    assert faultpoints.fired_in_log(log) == ["training.fault"]
