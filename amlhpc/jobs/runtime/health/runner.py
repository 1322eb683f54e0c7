"""One health run on every process of the job, and its verdict.

Order on each process:
1. ranks (amlhpc.jobs.runtime.base.ranks) and the size's facts (AMLHPC_SKU_JSON); bad input exits 2;
2. with more than one rank, join a process group (MASTER_ADDR/MASTER_PORT);
3. local rank 0 checks its node (GPUs one after another, InfiniBand, ECC) while the
   node's other ranks wait in the next step;
4. every rank takes part in the per-node and the job-wide all-reduce;
5. the node reports are exchanged; the job-wide figure is graded against the size's band for
   what the all-reduce crossed (the nodes' NVLink domains, from their reports) and for SHARP on
   or off, and the result joins every node's report; each metric is compared with the fleet,
   and every rank reaches the same verdict;
6. local rank 0 writes its node's JSON report, rank 0 the summary and the table.

Exit status: 0 healthy (or `warn`/`report` mode); 2 bad input; 3 a node failed in `gate`
mode (every rank of the job exits 3, so the job stops before training, with the host and
the failed check in the log); 8 (amlhpc/jobs/runtime/base/exit_codes.py) when the failure is NCCL using
TCP sockets between the nodes of an InfiniBand size. The node's all-reduce runs without the
topology file, as Azure's check does; NCCL's init log goes to the report folder
(nccl-init-<host>-<pid>.log) and is read back for the transport NCCL chose.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from amlhpc.jobs.runtime.base.contract import DEFAULT_REPORT_DIR
from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.base.process_env import process_env
from amlhpc.jobs.runtime.base.ranks import Ranks, from_env
from amlhpc.jobs.runtime.health.checks import FULL, QUICK, Sizes, node_checks
from amlhpc.jobs.runtime.health.collective import (
    AllReduceFigure,
    Collective,
    CollectiveError,
    grade_job_allreduce,
    grade_node_allreduce,
    message_bytes,
)
from amlhpc.jobs.runtime.health.fleet import apply_fleet, nvlink_domains
from amlhpc.jobs.runtime.health.grading import FAIL, SKIP
from amlhpc.jobs.runtime.health.measure import TorchGpuMeasurer
from amlhpc.jobs.runtime.health.results import CheckResult, NodeReport
from amlhpc.jobs.runtime.health.summary import render, write_summary
from amlhpc.jobs.runtime.node.multinode import job_topology, sharp_on
from amlhpc.jobs.runtime.node.nccl_transport import parse_init_log, verdict
from amlhpc.jobs.runtime.node.nvml import open_nvml

if TYPE_CHECKING:  # imported where it runs: run_health loads it at its start
    from amlhpc.jobs.runtime.node.skufacts import SkuFacts

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


def _without_topology_file() -> AbstractContextManager[None]:
    """The node's communicator starts without NCCL_TOPO_FILE, as Azure's single-node NCCL check
    now runs (azure_nccl_allreduce.nhc passes NCCL_TOPO_FILE= since 2025-06-26: the file gave
    false failures on H100/H200); the job-wide one keeps it."""
    return process_env({"NCCL_TOPO_FILE": ""})


def nccl_log_settings(report_dir: Path) -> dict[str, str]:
    """NCCL's init log into a file per process, so the transport NCCL chose can be read back."""
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
            "NCCL_DEBUG_FILE": str(report_dir / "nccl-init-%h-%p.log")}


def transport_check(report_dir: Path, sku, node_count: int, environ: Mapping[str, str], sysfs: Path,
                    backend: str) -> CheckResult:
    """What NCCL chose between the nodes, read from this process's init log."""
    if backend != "nccl":
        return CheckResult("nccl_transport", "node", SKIP, detail=f"{backend} backend: NCCL did not start on this machine")
    path = report_dir / f"nccl-init-{socket.gethostname()}-{os.getpid()}.log"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return CheckResult("nccl_transport", "node", SKIP, detail=f"no NCCL init log at {path}")
    choice = parse_init_log(text)
    status, detail = verdict(choice, sku.name if sku else "this size", bool(sku and sku.infiniband), node_count,
                             environ, sysfs)
    return CheckResult("nccl_transport", "node", status, detail=detail)


@dataclass(frozen=True)
class JobAllReduce:
    """The job-wide all-reduce, measured; graded once the nodes' reports are in."""

    figure: AllReduceFigure
    note: str


def _collectives(collective: Collective, ranks: Ranks, sku, sizes, report: NodeReport) -> JobAllReduce | None:
    """Per-node then job-wide all-reduce; returns the job-wide figure (None on one node)."""
    nbytes, note = message_bytes(collective, sku, sizes.cpu_allreduce_bytes)
    if ranks.local_size > 1:
        with _without_topology_file():
            figure = collective.allreduce(collective.node_group(), ranks.local_rank, ranks.local_size, nbytes,
                                          sizes.allreduce_iters, sizes.allreduce_warmup)
        if ranks.is_node_leader:
            report.checks.append(grade_node_allreduce(figure, sku, note))
    if ranks.node_count > 1:
        figure = collective.allreduce(None, ranks.rank, ranks.world_size, nbytes, sizes.allreduce_iters,
                                      sizes.allreduce_warmup)
        return JobAllReduce(figure, note)
    return None


def _grade_job(measured: JobAllReduce, sku, ranks: Ranks, reports: list[NodeReport],
               environ: Mapping[str, str]) -> CheckResult:
    """The job-wide figure against the band for the topology the nodes' reports show."""
    hosts = {host: uuid for uuid, names in nvlink_domains(reports).items() for host in names}
    domains = [hosts.get(r.host) for r in reports] + [None] * max(ranks.node_count - len(reports), 0)
    topology = job_topology(sku, domains, ranks.node_count)
    return grade_job_allreduce(measured.figure, sku, ranks.node_count, measured.note, topology, sharp_on(environ))


def run_health(options: HealthOptions, environ: Mapping[str, str] | None = None, *,
               measurer_factory: Callable = TorchGpuMeasurer, nvml_factory: Callable = open_nvml,
               collective_factory: Callable = Collective.open, stream: TextIO | None = None) -> HealthOutcome:
    """Run the checks on this process (see the module docstring)."""
    from amlhpc.jobs.runtime.node.skufacts import load_sku_facts

    environ = os.environ if environ is None else environ
    stream = stream or sys.stderr
    try:
        ranks = from_env(environ)
        sku = load_sku_facts(environ)
    except RuntimeInputError as exc:  # RankError included
        print(exc.render(), file=stream)
        return HealthOutcome(ExitCode.USAGE, [], [])
    sizes = QUICK if options.quick else FULL
    started = time.time()
    report = NodeReport(socket.gethostname(), ranks.node_index, sku.name if sku else None, options.mode, options.quick,
                        datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"))
    job_checks: list[CheckResult] = []
    with ExitStack() as stack:
        collective = None
        if ranks.world_size > 1:
            options.report_dir.mkdir(parents=True, exist_ok=True)
            # Read by NCCL from the process environment when the collective starts below.
            stack.enter_context(process_env(nccl_log_settings(options.report_dir)))
            try:
                collective = collective_factory(ranks, environ, options.timeout_s)
            except CollectiveError as exc:
                job_checks.append(CheckResult("rendezvous", "job", FAIL, detail=str(exc)))
            else:
                stack.callback(collective.close)
        if ranks.is_node_leader:
            measurer = measurer_factory()
            with nvml_factory() as nvml:
                report.checks.extend(node_checks(sku, measurer, nvml, sizes, options.sysfs, environ))
            report.environment = _environment(measurer)
        reports = _job_phase(collective, ranks, sku, sizes, report, job_checks, options, environ, started)
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
    code = _exit_code(failing, options.mode)
    if failing and (ranks.rank == 0 or (ranks.is_node_leader and mine in failing)):
        _print_verdict(failing, options.mode, stream)
    return HealthOutcome(code, reports, failing)


def _job_phase(collective: Collective | None, ranks: Ranks, sku: SkuFacts | None, sizes: Sizes,
               report: NodeReport, job_checks: list[CheckResult], options: HealthOptions, environ: Mapping[str, str],
               started: float) -> list[NodeReport]:
    """The job-wide checks over `collective` (None: a world of one, or no rendezvous), graded and
    exchanged; the reports this process knows (every node's when exchanged, else its own). The
    job-wide results are in `job_checks` and in the reports."""
    job_allreduce: JobAllReduce | None = None
    exchanged = False
    reports = [report] if ranks.is_node_leader else []
    if collective is not None:
        try:
            job_allreduce = _collectives(collective, ranks, sku, sizes, report)
        except Exception as exc:  # noqa: BLE001 - a broken collective is the finding
            job_checks.append(CheckResult("allreduce_job", "job", FAIL,
                                          detail=f"all-reduce failed: {type(exc).__name__}: {exc}"[:400]))
        else:
            if ranks.is_node_leader:
                report.checks.append(transport_check(options.report_dir, sku, ranks.node_count, environ,
                                                     options.sysfs, getattr(collective, "backend", "")))
            report.checks.extend(job_checks)
            report.seconds = time.time() - started
            try:
                gathered = collective.gather(report.to_json() if ranks.is_node_leader else None)
                reports = [NodeReport.from_json(g) for g in gathered if g is not None]
                exchanged = True
            except Exception as exc:  # noqa: BLE001
                job_checks.append(CheckResult("exchange", "job", FAIL,
                                              detail=f"reports could not be exchanged: {type(exc).__name__}: {exc}"[:400]))
    if job_allreduce is not None:
        graded = _grade_job(job_allreduce, sku, ranks, reports if exchanged else [report], environ)
        job_checks.append(graded)
        for each in reports if exchanged else []:
            each.checks.append(graded)
    if not exchanged:
        for check in job_checks:
            if check not in report.checks:
                report.checks.append(check)
        report.seconds = time.time() - started
    return reports


def _exit_code(failing: list[NodeReport], mode: str) -> ExitCode:
    """OK unless a node fails in gate mode: HEALTH, or NCCL_SOCKETS when NCCL ran on TCP between
    the nodes (the more specific cause)."""
    if not failing or mode != "gate":
        return ExitCode.OK
    if any(c.check == "nccl_transport" and c.status == FAIL for r in failing for c in r.checks):
        return ExitCode.NCCL_SOCKETS
    return ExitCode.HEALTH


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

