"""The coordination defects of the code as it is, each shown by one fixed run whose invariant
fails (amlhpc.sim.known.CASES): expected failures, strict, so that the fix of a defect turns
its test into an unexpected pass - then it is flipped into a test that must pass."""

from __future__ import annotations

import pytest

from amlhpc.sim import known
from amlhpc.sim.explore import run


@pytest.mark.parametrize("case", [pytest.param(case, id=f"{case.scenario}-{case.seed}-{case.kind}",
                                               marks=pytest.mark.xfail(strict=True, reason=case.defect))
                                  for case in known.CASES])
def test_the_invariant_holds(case):
    outcome = run(case.scenario, case.seed, settings=case.settings,
                  faults=case.faults() if case.faults else None, keep_trace=False)
    assert case.kind not in outcome.kinds(), outcome.report(trace=False)
    assert outcome.ok, outcome.report(trace=False)


@pytest.mark.parametrize("case", known.CASES, ids=lambda case: f"{case.scenario}-{case.seed}")
def test_each_case_shows_its_defect_and_the_sweep_rule_names_it(case):
    outcome = run(case.scenario, case.seed, settings=case.settings,
                  faults=case.faults() if case.faults else None, keep_trace=False)
    assert case.kind in outcome.kinds(), outcome.report(trace=False)
    assert known.cause(outcome) == case.defect
