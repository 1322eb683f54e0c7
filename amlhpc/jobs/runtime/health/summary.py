"""The summary across nodes: a table for people (rich when installed, plain text
otherwise, since the runtime image need not carry rich) and a JSON document.

One row per node: its status, the weakest GPU's GEMM/H2D/D2H/D2D figures, the node's
all-reduce, healthy InfiniBand ports, ECC, and the checks that failed or warned. Job-wide
figures (all-reduce across nodes, rendezvous) are listed once under the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from amlhpc.jobs.runtime.base.errors import RuntimeInputError, RuntimeProblem
from amlhpc.jobs.runtime.health.fleet import MetricStats, apply_fleet
from amlhpc.jobs.runtime.health.grading import FAIL, NOT_CHECKED, PASS, SKIP, WARN, worst
from amlhpc.jobs.runtime.health.results import CheckResult, NodeReport

SUMMARY_FILE = "health-summary.json"
REPORT_GLOB = "health-node*.json"
JOB_CHECKS = ("allreduce_job", "rendezvous", "exchange", "fleet:nvlink_domain")


def overall(reports: list[NodeReport]) -> str:
    """The job's status: the worst node, ignoring nodes that could not be graded."""
    graded = [r.status for r in reports if r.status in (PASS, WARN, FAIL)]
    return worst(graded) if graded else (reports[0].status if reports else SKIP)


def _min(report: NodeReport, check: str) -> str:
    values = [v for _, v in report.values(check)]
    return f"{min(values):.1f}" if values else "-"


def _ib(report: NodeReport) -> str:
    ports = [c for c in report.checks if c.check == "infiniband" and c.subject != "node"]
    if not ports:
        skipped = any(c.check == "infiniband" and c.status == "skip" for c in report.checks)
        return "skip" if skipped else "-"
    healthy = sum(c.status == PASS for c in ports)
    return f"{healthy}/{len(ports)}"


def _ecc(report: NodeReport) -> str:
    ecc = [c for c in report.checks if c.check == "ecc"]
    if not ecc:
        return "-"
    if all(c.status == "skip" for c in ecc):
        return "skip"
    return worst(c.status for c in ecc)


def _problems(report: NodeReport) -> list[CheckResult]:
    return [c for c in report.checks if c.status in (FAIL, NOT_CHECKED, WARN) and c.check not in JOB_CHECKS]


COLUMNS = ("node", "host", "status", "GEMM TFLOP/s", "H2D GB/s", "D2H GB/s", "D2D GB/s", "all-reduce GB/s",
           "IB ports", "ECC", "problems")


def rows(reports: list[NodeReport]) -> list[list[str]]:
    table = []
    for report in sorted(reports, key=lambda r: r.node):
        problems = _problems(report)
        text = "; ".join(c.line() for c in problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
        table.append([str(report.node), report.host, report.status, _min(report, "gemm"), _min(report, "h2d"),
                      _min(report, "d2h"), _min(report, "d2d"), _min(report, "allreduce_node"), _ib(report), _ecc(report),
                      text or "-"])
    return table


def job_checks(reports: list[NodeReport]) -> list[CheckResult]:
    """Job-wide results, once (every node carries a copy)."""
    seen: dict[tuple[str, str], CheckResult] = {}
    for report in reports:
        for check in report.checks:
            if check.check in JOB_CHECKS:
                seen.setdefault((check.check, check.detail), check)
    return list(seen.values())


def render(reports: list[NodeReport], stats: list[MetricStats], stream: TextIO | None = None) -> None:
    """Print the table (rich if importable) and the job-wide lines."""
    stream = stream or sys.stdout
    body = rows(reports)
    status = overall(reports)
    title = f"node health: {len(reports)} node(s), {status.upper()}"
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        have_rich = False
    else:
        have_rich = True
    if have_rich:
        table = Table(title=title, show_lines=False)
        for column in COLUMNS:
            table.add_column(column, overflow="fold")
        colors = {FAIL: "red", NOT_CHECKED: "red", WARN: "yellow", PASS: "green"}
        for row in body:
            color = colors.get(row[2])
            table.add_row(*row[:2], f"[{color}]{row[2]}[/]" if color else row[2], *row[3:])
        Console(file=stream, width=200, soft_wrap=False).print(table)
    else:
        widths = [max(len(COLUMNS[i]), *(len(r[i]) for r in body)) if body else len(COLUMNS[i]) for i in range(len(COLUMNS))]
        print(title, file=stream)
        print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)), file=stream)
        for row in body:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)), file=stream)
    for check in job_checks(reports):
        print(f"job: {check.status.upper()} {check.line()}", file=stream)
    for s in stats:
        print(f"fleet {s.metric}: {s.samples} samples, median {s.median:.1f} {s.unit}, "
              f"min {s.minimum:.1f}, max {s.maximum:.1f}, stdev {s.stdev:.2f}", file=stream)


def summary_document(reports: list[NodeReport], stats: list[MetricStats]) -> dict:
    return {
        "status": overall(reports),
        "nodes": [{"node": r.node, "host": r.host, "status": r.status,
                   "failed": [c.line() for c in r.failures()], "warned": [c.line() for c in r.warnings()]}
                  for r in sorted(reports, key=lambda r: r.node)],
        "job": [c.__dict__ for c in job_checks(reports)],
        "fleet": [s.to_json() for s in stats],
    }


def write_summary(folder: Path, reports: list[NodeReport], stats: list[MetricStats]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SUMMARY_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary_document(reports, stats), indent=2) + "\n")
    tmp.replace(path)
    return path


def load_reports(folder: Path) -> list[NodeReport]:
    """Every node report in `folder` (searched recursively: Azure ML nests outputs per node)."""
    if not folder.is_dir():
        raise RuntimeInputError.single(str(folder), "", "is not a directory",
                                       "give the report directory (--report-dir of the health run, default outputs/aml-hpc)")
    problems, reports = [], []
    files = sorted(folder.rglob(REPORT_GLOB))
    for path in files:
        try:
            reports.append(NodeReport.from_json(json.loads(path.read_text())))
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(RuntimeProblem(str(path), "", f"is not a node health report ({exc})",
                                           "remove it or re-run the health checks"))
    if problems:
        raise RuntimeInputError(problems, title="unreadable health reports")
    if not files:
        raise RuntimeInputError.single(str(folder), "", f"holds no {REPORT_GLOB} files",
                                       "run `python -m amlhpc.jobs.runtime.health --report-dir DIR` first, or download the job's outputs")
    # One report per node: the newest wins when a folder holds several runs.
    newest: dict[int, NodeReport] = {}
    for report in reports:
        if report.node not in newest or report.started_at > newest[report.node].started_at:
            newest[report.node] = report
    return list(newest.values())


def summarize(folder: Path, stream: TextIO | None = None) -> tuple[list[NodeReport], list[MetricStats]]:
    reports = load_reports(folder)
    stats = apply_fleet(reports)
    render(reports, stats, stream)
    return reports, stats
