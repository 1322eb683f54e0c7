"""The coordination defects, each shown by one fixed run (amlhpc.sim.known).

Remaining defects (`known.CASES`): expected failures, strict, so that the fix of a defect
turns its test into an unexpected pass; then its case moves to `known.FIXED`.
Fixed defects (`known.FIXED`): the run that showed each must now keep its invariant, with
its fault fired."""

from __future__ import annotations

import pytest

from amlhpc.sim import known
from amlhpc.sim.explore import run


def _run(case: known.Case):
    return run(case.scenario, case.seed, settings=case.settings, faults=case.faults() if case.faults else None,
               keep_trace=False)


# A remaining defect (known.CASES) gets these two tests; none remains today (each found so far is
# in known.FIXED), and an empty parameter set would only show up as a skip.
if known.CASES:
    @pytest.mark.parametrize("case", [pytest.param(case, id=f"{case.scenario}-{case.seed}-{case.kind}",
                                                   marks=pytest.mark.xfail(strict=True, reason=case.defect))
                                      for case in known.CASES])
    def test_the_invariant_holds_despite_a_remaining_defect(case):
        outcome = _run(case)
        assert case.kind not in outcome.kinds(), outcome.report(trace=False)
        assert outcome.ok, outcome.report(trace=False)


    @pytest.mark.parametrize("case", known.CASES, ids=lambda case: f"{case.scenario}-{case.seed}")
    def test_each_remaining_case_shows_its_defect_and_the_sweep_rule_names_it(case):
        outcome = _run(case)
        assert case.kind in outcome.kinds(), outcome.report(trace=False)
        assert known.cause(outcome) == case.defect


@pytest.mark.parametrize("case", known.FIXED, ids=lambda case: f"{case.scenario}-{case.seed}-{case.kind}")
def test_a_fixed_defect_keeps_its_invariant(case):
    outcome = _run(case)
    assert outcome.ok, outcome.report(trace=False)
    if case.faults is not None:
        assert outcome.faults_fired >= 1, f"the fault of {case.defect!r} never fired: the run proves nothing"
    if "drop_lost" in case.settings:
        assert outcome.metrics["store_drops"], f"the store drop of {case.defect!r} never fired: the run proves nothing"
    if case.settings.get("cut_node") is not None:
        assert outcome.metrics["store_cut"], f"the partition of {case.defect!r} never fired: the run proves nothing"


def test_the_sweep_rules_name_no_fixed_defect():
    remaining = {case.defect for case in known.CASES}
    assert not {case.defect for case in known.FIXED} & remaining


@pytest.mark.parametrize("lost", ["request", "reply"])
def test_a_dropped_store_connection_never_splits_the_restart_decision(lost):
    """One node's store connection drops once while node 0 lives (before the store applied the
    call, or after: its reply lost), at a different call and node every seed, seed 19 included:
    every node adopts the same decision and no node ends alone."""
    fired = 0
    for seed in [19, *range(30)]:
        outcome = run("restart-agreement", seed, size=3, keep_trace=False,
                      settings={"drop_node": seed % 3, "drop_call": 1 + (seed * 7) % 40, "drop_lost": lost})
        assert "split-decision" not in outcome.kinds(), outcome.report(trace=False)
        assert outcome.ok, outcome.report(trace=False)
        fired += bool(outcome.metrics["store_drops"])
    assert fired >= 20, f"the drop fired in only {fired} of 31 runs: the sweep proves little"


@pytest.mark.parametrize("long", [True, False], ids=["past-the-grace", "within-the-grace"])
def test_a_node_cut_off_from_the_store_never_splits_the_job(long):
    """One node is cut off from node 0's store while node 0 lives, at a different moment every
    seed, for longer than kvstore.RECONNECT_GRACE_S (it takes node 0 for lost and ends with exit
    10: then no node restarts) or shorter (it rides it out, or misses agree_s and every node ends):
    one decision for every node."""
    from amlhpc.jobs.runtime.base.exit_codes import ExitCode

    cut = lost = 0
    for seed in range(12):
        outcome = run("restart-agreement", seed, size=3, keep_trace=False,
                      settings={"cut_node": 1 + seed % 2, "cut_at_s": (seed * 0.7) % 11,
                                "cut_s": 35.0 + 5 * seed if long else 3.0 + seed, "kill_node": None,
                                "apply_fails": None, "report_fails": None, "drop_node": None})
        assert outcome.ok, outcome.report(trace=False)
        decisions = set(outcome.metrics["decisions"].values())
        assert len(decisions - {"none"}) <= 1, outcome.report(trace=False)
        cut += bool(outcome.metrics["store_cut"])
        lost += outcome.metrics["exit_codes"].get(1 + seed % 2) == ExitCode.NODE_LOST
    assert cut >= 8, f"the partition cut a node off in only {cut} of 12 runs: the test proves little"
    if long:
        assert lost >= 4, f"the cut-off node took node 0 for lost in only {lost} of 12 runs: the test proves little"
