"""Pass/warn/fail for one figure, bus bandwidth, and the fleet comparison (pure logic)."""

from __future__ import annotations

import pytest

from amlhpc.core import skus
from amlhpc.jobs.runtime.health import fleet
from amlhpc.jobs.runtime.health.grading import (
    FAIL,
    INFO,
    PASS,
    WARN,
    bus_bandwidth,
    grade_band,
    grade_minimum,
    worst,
)
from amlhpc.jobs.runtime.health.results import CheckResult, NodeReport


class TestGradeMinimum:
    # ND96asr_v4's H2D pass mark from the catalog (azure-nhc: >= 21 GB/s; the NDv4 performance article: > 20).
    MINIMUM = skus.get("Standard_ND96asr_v4").health.h2d_gbytes_per_s_min

    def test_below_the_mark_fails(self):
        assert grade_minimum(self.MINIMUM - 0.01, self.MINIMUM) == FAIL

    def test_at_the_mark_warns(self):
        """Exactly the published figure passes Azure's check but has no margin left."""
        assert grade_minimum(self.MINIMUM, self.MINIMUM) == WARN

    def test_within_three_and_a_half_percent_warns(self):
        assert grade_minimum(self.MINIMUM * 1.034, self.MINIMUM) == WARN

    def test_beyond_the_margin_passes(self):
        assert grade_minimum(self.MINIMUM * 1.036, self.MINIMUM) == PASS
        assert grade_minimum(26.1, self.MINIMUM) == PASS  # the NDv4 performance article's measured bandwidthTest figure

    def test_no_mark_is_info(self):
        assert grade_minimum(1.0, None) == INFO


class TestGradeBand:
    def test_h100_multinode_band(self):
        """H100 v5 multi-node all-reduce: expected 450, warn below 400, fail below 300 GB/s."""
        (band,) = skus.get("Standard_ND96isr_H100_v5").health.multinode
        _, warn_below, fail_below = band.busbw_gbytes_per_s
        assert grade_band(455, warn_below, fail_below) == PASS
        assert grade_band(399, warn_below, fail_below) == WARN
        assert grade_band(299, warn_below, fail_below) == FAIL


def test_worst():
    assert worst([PASS, WARN, INFO]) == WARN
    assert worst([PASS, FAIL, WARN]) == FAIL
    assert worst([]) == PASS


class TestBusBandwidth:
    def test_formula(self):
        """busbw = algbw x 2(n-1)/n: 8 ranks at 100 GB/s algbw is 175 GB/s on the bus."""
        assert bus_bandwidth(100.0, 8) == pytest.approx(175.0)
        assert bus_bandwidth(100.0, 2) == pytest.approx(100.0)
        assert bus_bandwidth(100.0, 1) == 0.0

    def test_needs_a_rank(self):
        with pytest.raises(ValueError):
            bus_bandwidth(1.0, 0)


def _report(node: int, gemm: list[float], allreduce: float | None = None) -> NodeReport:
    checks = [CheckResult("gemm", f"gpu{i}", PASS, v, "TFLOP/s") for i, v in enumerate(gemm)]
    if allreduce is not None:
        checks.append(CheckResult("allreduce_node", "node", PASS, allreduce, "GB/s"))
    return NodeReport(f"host{node}", node, "Standard_ND96asr_v4", "gate", False, "2026-01-01T00:00:00+00:00", checks=checks)


class TestFleet:
    def test_too_few_samples_are_not_compared(self):
        """Three samples cannot say which one is slow."""
        reports = [_report(0, [100.0, 100.0, 50.0])]
        assert fleet.fleet_findings(reports) == {}

    def test_warn_and_fail_against_the_median(self):
        """Eight GPUs: one 5 % below the median warns, one 8 % below fails, the rest pass."""
        reports = [_report(0, [250.0, 250.0, 250.0, 250.0, 250.0, 250.0, 237.5, 230.0])]
        found = fleet.fleet_findings(reports)[0]
        by_subject = {c.subject: c for c in found}
        assert set(by_subject) == {"gpu6", "gpu7"}
        assert by_subject["gpu6"].status == WARN and by_subject["gpu6"].check == "fleet:gemm"
        assert by_subject["gpu7"].status == FAIL
        assert "8.0% below the fleet median 250.0 (8 samples)" in by_subject["gpu7"].detail

    def test_one_bad_node_among_four(self):
        """Per-node all-reduce over 4 nodes: the slow node is named, the median is not dragged."""
        reports = [_report(n, [250.0], allreduce=v) for n, v in enumerate([235.0, 236.0, 234.0, 200.0])]
        found = fleet.fleet_findings(reports)
        assert list(found) == [3]
        assert found[3][0].status == FAIL and found[3][0].check == "fleet:allreduce_node"

    def test_two_sigma_rule_above_ten_samples(self):
        """A tight fleet of 16 GPUs: 3 % below is inside the percentage rule but > 2 sigma out."""
        values = [250.0 + (i % 3) * 0.1 for i in range(15)] + [242.5]
        found = fleet.fleet_findings([_report(0, values)])[0]
        assert [(c.subject, c.status) for c in found] == [("gpu15", WARN)]
        assert "sigma below the mean" in found[0].detail

    def test_two_sigma_not_used_at_ten_samples(self):
        values = [250.0 + (i % 3) * 0.1 for i in range(9)] + [242.5]
        assert fleet.fleet_findings([_report(0, values)]) == {}

    def test_apply_replaces_old_findings(self):
        """Summarising twice does not duplicate fleet results."""
        reports = [_report(0, [250.0, 250.0, 250.0, 200.0])]
        fleet.apply_fleet(reports)
        fleet.apply_fleet(reports)
        assert sum(c.check.startswith("fleet:") for c in reports[0].checks) == 1
        assert reports[0].status == FAIL

    def test_stats(self):
        (stats,) = fleet.metric_stats([_report(0, [1.0, 2.0, 3.0, 4.0])])
        assert (stats.samples, stats.median, stats.minimum, stats.maximum) == (4, 2.5, 1.0, 4.0)
