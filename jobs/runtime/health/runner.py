"""One health run on every process of the job, and its verdict.

Order on each process:
1. ranks (jobs.runtime.ranks) and the size's facts (AMLHPC_SKU_JSON); bad input exits 2;
2. with more than one rank, join a process group (MASTER_ADDR/MASTER_PORT);
3. local rank 0 checks its node (GPUs one after another, InfiniBand, ECC) while the
   node's other ranks wait in the next step;
4. every rank takes part in the per-node and the job-wide all-reduce;
5. the node reports are exchanged, each metric is compared with the fleet, and every
   rank reaches the same verdict;
6. local rank 0 writes its node's JSON report, rank 0 the summary and the table.

Exit status: 0 healthy (or `warn`/`report` mode); 2 bad input; 3 a node failed in `gate`
mode (every rank of the job exits 3, so the job stops before training, with the host and
the failed check in the log).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from jobs.runtime.contract import DEFAULT_REPORT_DIR
from jobs.runtime.errors import EXIT_USAGE, RuntimeInputError
from jobs.runtime.health.checks import FULL, QUICK, node_checks
from jobs.runtime.health.collective import (
    Collective,
    CollectiveError,
    grade_job_allreduce,
    grade_node_allreduce,
    message_bytes,
)
from jobs.runtime.health.fleet import apply_fleet
from jobs.runtime.health.grading import FAIL
from jobs.runtime.health.measure import TorchGpuMeasurer
from jobs.runtime.health.results import CheckResult, NodeReport
from jobs.runtime.health.summary import render, write_summary
from jobs.runtime.nvml import open_nvml
from jobs.runtime.ranks import Ranks, from_env

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 3
MODES = ("gate", "warn", "report")


@dataclass(frozen=True)
class HealthOptions:
    mode: str = "gate"
    quick: bool = False
    report_dir: Path = Path(DEFAULT_REPORT_DIR)
    sysfs: Path = Path("/sys")
    timeout_s: float = 600.0
    """Rendezvous and collective timeout."""


@dataclass
class HealthOutcome:
    exit_code: int
    reports: list[NodeReport]
    failing: list[NodeReport]


def _environment(measurer) -> dict:
    torch = getattr(measurer, "torch", None)
    info: dict = {"torch": getattr(torch, "__version__", None) if torch else None}
    if torch is not None:
        info["cuda"] = torch.version.cuda
        count = measurer.device_count()
        info["gpus"] = [measurer.device_name(i) for i in range(count)]
    return info


def _collectives(collective: Collective, ranks: Ranks, sku, sizes, report: NodeReport) -> list[CheckResult]:
    """Per-node then job-wide all-reduce; returns the job-wide results."""
    job: list[CheckResult] = []
    nbytes, note = message_bytes(collective, sku, sizes.cpu_allreduce_bytes)
    if ranks.local_size > 1:
        figure = collective.allreduce(collective.node_group(), ranks.local_rank, ranks.local_size, nbytes,
                                      sizes.allreduce_iters, sizes.allreduce_warmup)
        if ranks.is_node_leader:
            report.checks.append(grade_node_allreduce(figure, sku, note))
    if ranks.node_count > 1:
        figure = collective.allreduce(None, ranks.rank, ranks.world_size, nbytes, sizes.allreduce_iters,
                                      sizes.allreduce_warmup)
        job.append(grade_job_allreduce(figure, sku, ranks.node_count, note))
    return job


def run_health(options: HealthOptions, environ: Mapping[str, str] | None = None, *,
               measurer_factory: Callable = TorchGpuMeasurer, nvml_factory: Callable = open_nvml,
               collective_factory: Callable = Collective.open, stream: TextIO | None = None) -> HealthOutcome:
    """Run the checks on this process (see the module docstring)."""
    from jobs.runtime.skufacts import load_sku_facts

    environ = os.environ if environ is None else environ
    stream = stream or sys.stderr
    try:
        ranks = from_env(environ)
        sku = load_sku_facts(environ)
    except RuntimeInputError as exc:  # RankError included
        print(exc.render(), file=stream)
        return HealthOutcome(EXIT_USAGE, [], [])
    sizes = QUICK if options.quick else FULL
    started = time.time()
    report = NodeReport(socket.gethostname(), ranks.node_index, sku.name if sku else None, options.mode, options.quick,
                        datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"))
    job_checks: list[CheckResult] = []
    collective = None
    if ranks.world_size > 1:
        try:
            collective = collective_factory(ranks, environ, options.timeout_s)
        except CollectiveError as exc:
            job_checks.append(CheckResult("rendezvous", "job", FAIL, detail=str(exc)))
    try:
        if ranks.is_node_leader:
            measurer = measurer_factory()
            with nvml_factory() as nvml:
                report.checks.extend(node_checks(sku, measurer, nvml, sizes, options.sysfs, environ))
            report.environment = _environment(measurer)
        exchanged = False
        reports = [report] if ranks.is_node_leader else []
        if collective is not None:
            try:
                job_checks.extend(_collectives(collective, ranks, sku, sizes, report))
            except Exception as exc:  # noqa: BLE001 - a broken collective is the finding
                job_checks.append(CheckResult("allreduce_job", "job", FAIL,
                                              detail=f"all-reduce failed: {type(exc).__name__}: {exc}"[:400]))
            else:
                report.checks.extend(job_checks)
                report.seconds = time.time() - started
                try:
                    gathered = collective.gather(report.to_json() if ranks.is_node_leader else None)
                    reports = [NodeReport.from_json(g) for g in gathered if g is not None]
                    exchanged = True
                except Exception as exc:  # noqa: BLE001
                    job_checks.append(CheckResult("exchange", "job", FAIL,
                                                  detail=f"reports could not be exchanged: {type(exc).__name__}: {exc}"[:400]))
        if not exchanged:
            for check in job_checks:
                if check not in report.checks:
                    report.checks.append(check)
            report.seconds = time.time() - started
    finally:
        if collective is not None:
            collective.close()
    stats = apply_fleet(reports)
    mine = next((r for r in reports if r.node == ranks.node_index), report)
    if ranks.is_node_leader:
        path = mine.write(options.report_dir)
        _print_node(mine, options.mode, path, stream)
    if ranks.rank == 0 and reports:
        write_summary(options.report_dir, reports, stats)
        render(reports, stats, stream)
    failing = [r for r in reports if r.status == FAIL]
    if not ranks.is_node_leader and any(c.status == FAIL for c in job_checks):
        failing = failing or [report]
    code = EXIT_UNHEALTHY if failing and options.mode == "gate" else EXIT_HEALTHY
    if failing and (ranks.rank == 0 or (ranks.is_node_leader and mine in failing)):
        _print_verdict(failing, options.mode, stream)
    return HealthOutcome(code, reports, failing)


def _print_node(report: NodeReport, mode: str, path: Path, stream: TextIO) -> None:
    label = {"gate": "FAIL", "warn": "WARNING", "report": "FAIL"}[mode]
    for check in report.failures():
        print(f"health {label}: node {report.node} ({report.host}): {check.line()}", file=stream)
    for check in report.warnings():
        print(f"health warn: node {report.node} ({report.host}): {check.line()}", file=stream)
    print(f"health: node {report.node} ({report.host}) {report.status.upper()} in {report.seconds:.1f}s, report {path}",
          file=stream)


def _print_verdict(failing: list[NodeReport], mode: str, stream: TextIO) -> None:
    names = ", ".join(f"node {r.node} ({r.host}): " + ", ".join(sorted({c.check + ' ' + c.subject for c in r.failures()}))
                      for r in failing)
    if mode == "gate":
        print(f"health gate FAILED, stopping before training: {names}", file=stream)
    else:
        print(f"health: unhealthy node(s), continuing ({mode} mode): {names}", file=stream)

