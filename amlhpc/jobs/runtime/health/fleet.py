"""Compare each measured figure with the rest of the fleet (pure functions).

A GPU can pass its absolute pass mark and still be the one that slows a synchronous job
down: every step waits for the slowest rank. Azure's node health checks' rule of thumb, applied to every
sample of a metric across the job (each GPU's GEMM, H2D, D2H, D2D; each node's all-reduce):

- with at least `MIN_SAMPLES` samples, the baseline is the median (one bad sample cannot
  drag it down the way it drags a mean): warn at 3.5 %, fail at 7 % below it;
- with more than `SIGMA_SAMPLES` samples, a sample more than 2 standard deviations below
  the mean is flagged too (at least a warning), which catches outliers in a tight fleet
  before they reach 3.5 %.

Per-GPU metrics compare GPUs with each other, so even one node of 8 GPUs is a fleet.
Only findings (warn/fail) become results, named `fleet:<metric>`.

On sizes with a multi-node NVLink domain (GB200/GB300: 18 VMs per NVL72 rack), the nodes'
domains (each node's `nvlink_fabric` ClusterUUID) are compared too: a job spread over more than
one domain warns (`fleet:nvlink_domain`), since NCCL then uses NVLink only within each domain
and InfiniBand between them (Azure's baseline: about 937 GB/s all-reduce within a rack, 200
GB/s across racks).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from amlhpc.jobs.runtime.health.grading import FAIL, PASS, WARN, worst
from amlhpc.jobs.runtime.health.results import CheckResult, NodeReport

FLEET_METRICS: dict[str, str] = {"gemm": "TFLOP/s", "h2d": "GB/s", "d2h": "GB/s", "d2d": "GB/s", "allreduce_node": "GB/s"}
MIN_SAMPLES = 4
SIGMA_SAMPLES = 10
FLEET_WARN = 0.035
FLEET_FAIL = 0.07
SIGMAS = 2.0


@dataclass(frozen=True)
class MetricStats:
    metric: str
    unit: str
    samples: int
    median: float
    mean: float
    stdev: float
    minimum: float
    maximum: float

    def to_json(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def metric_stats(reports: list[NodeReport]) -> list[MetricStats]:
    """Median, mean, spread of every fleet metric that has samples."""
    stats = []
    for metric, unit in FLEET_METRICS.items():
        values = [v for r in reports for _, v in r.values(metric)]
        if values:
            stats.append(MetricStats(metric, unit, len(values), statistics.median(values), statistics.fmean(values),
                                     statistics.stdev(values) if len(values) > 1 else 0.0, min(values), max(values)))
    return stats


def grade_sample(value: float, median: float, mean: float, stdev: float, samples: int) -> tuple[str, str]:
    """(status, why) for one sample against its fleet."""
    if samples < MIN_SAMPLES or median <= 0:
        return PASS, ""
    deficit = 1 - value / median
    status = FAIL if deficit >= FLEET_FAIL else WARN if deficit >= FLEET_WARN else PASS
    why = f"{deficit:.1%} below the fleet median {median:.1f} ({samples} samples)"
    if samples > SIGMA_SAMPLES and stdev > 0 and value < mean - SIGMAS * stdev:
        status = worst([status, WARN])
        why += f"; {(mean - value) / stdev:.1f} sigma below the mean {mean:.1f}"
    return status, why


def fleet_findings(reports: list[NodeReport]) -> dict[int, list[CheckResult]]:
    """Findings per report (index into `reports`); reports without findings are absent."""
    findings: dict[int, list[CheckResult]] = {}
    for stats in metric_stats(reports):
        for position, report in enumerate(reports):
            for subject, value in report.values(stats.metric):
                status, why = grade_sample(value, stats.median, stats.mean, stats.stdev, stats.samples)
                if status != PASS:
                    findings.setdefault(position, []).append(CheckResult(
                        f"fleet:{stats.metric}", subject, status, value, stats.unit,
                        stats.median * (1 - FLEET_FAIL), why))
    return findings


def nvlink_domains(reports: list[NodeReport]) -> dict[str, list[str]]:
    """ClusterUUID -> hosts, from each node's nvlink_fabric result (nodes without one are left out)."""
    from amlhpc.jobs.runtime.health.tools import DOMAIN_PREFIX

    domains: dict[str, list[str]] = {}
    for report in reports:
        for check in report.checks:
            if check.check == "nvlink_fabric" and check.subject == "node" and check.detail.startswith(DOMAIN_PREFIX):
                domains.setdefault(check.detail.removeprefix(DOMAIN_PREFIX), []).append(report.host)
    return domains


def domain_findings(reports: list[NodeReport]) -> list[CheckResult]:
    """One warning when the job's nodes sit in more than one NVLink domain."""
    domains = nvlink_domains(reports)
    if len(domains) < 2:
        return []
    spread = "; ".join(f"{uuid}: {len(hosts)} node(s)" for uuid, hosts in sorted(domains.items(), key=lambda d: -len(d[1])))
    return [CheckResult("fleet:nvlink_domain", "job", WARN, float(len(domains)), "domains", 1.0,
                        f"the job spans {len(domains)} NVLink domains ({spread}): multi-node NVLink only within each, "
                        "InfiniBand between them")]


def apply_fleet(reports: list[NodeReport]) -> list[MetricStats]:
    """Replace each report's fleet findings with fresh ones; returns the fleet statistics."""
    for report in reports:
        report.checks = [c for c in report.checks if not c.check.startswith("fleet:")]
    for position, extra in fleet_findings(reports).items():
        reports[position].checks.extend(extra)
    spread = domain_findings(reports)
    for report in reports:
        report.checks.extend(spread)
    return metric_stats(reports)
