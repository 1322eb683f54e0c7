"""`python -m amlhpc.jobs.runtime.health`: run the checks, or summarize a folder of node reports.

    python -m amlhpc.jobs.runtime.health [--quick] [--mode gate|warn|report] [--report-dir DIR]
        Run on every process of the job (Azure ML starts one per GPU). Exit 0 healthy
        (always 0 in warn and report modes), 2 bad input, 3 a node failed (gate mode).
    python -m amlhpc.jobs.runtime.health summarize DIR [--json]
        The table over the health-node*.json files under DIR. Exit 0, 3 when a node
        failed, 2 when DIR holds no readable report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from amlhpc.jobs.runtime.base.contract import DEFAULT_REPORT_DIR, REPORT_DIR
from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.health.runner import (
    MODES,
    HealthOptions,
    run_health,
)


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m amlhpc.jobs.runtime.health",
                                     description="Node health checks; `summarize DIR` tabulates reports.")
    parser.add_argument("--mode", choices=MODES, default="gate",
                        help="gate: exit 3 when a node fails (stops the job); warn: log and go on; "
                             "report: a standalone health job, always exit 0 (default: gate)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (same message sizes)")
    parser.add_argument("--report-dir", type=Path, default=None,
                        help=f"where node reports go (default: ${REPORT_DIR}, else {DEFAULT_REPORT_DIR})")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="rendezvous and collective timeout (default 600)")
    parser.add_argument("--sysfs", type=Path, default=Path("/sys"), help=argparse.SUPPRESS)
    return parser


def _summarize(argv: list[str]) -> int:
    from amlhpc.jobs.runtime.health.summary import summarize, summary_document

    parser = argparse.ArgumentParser(prog="python -m amlhpc.jobs.runtime.health summarize",
                                     description="Summary table over per-node health reports.")
    parser.add_argument("folder", type=Path, help="folder holding health-node*.json (searched recursively)")
    parser.add_argument("--json", action="store_true", help="print the summary document as JSON instead")
    args = parser.parse_args(argv)
    try:
        if args.json:
            from amlhpc.jobs.runtime.health.fleet import apply_fleet
            from amlhpc.jobs.runtime.health.summary import load_reports

            reports = load_reports(args.folder)
            stats = apply_fleet(reports)
            print(json.dumps(summary_document(reports, stats), indent=2))
        else:
            reports, _ = summarize(args.folder, sys.stdout)
    except RuntimeInputError as exc:
        print(exc.render(), file=sys.stderr)
        return ExitCode.USAGE
    return ExitCode.HEALTH if any(r.status == "fail" for r in reports) else ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["summarize"]:
        return _summarize(argv[1:])
    args = _run_parser().parse_args(argv)
    # Number CUDA devices in PCI bus order (as nvidia-smi and sysfs do) so each GPU can be
    # matched with its NUMA node; read by CUDA when PyTorch initialises it, below.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    report_dir = args.report_dir or Path(os.environ.get(REPORT_DIR) or DEFAULT_REPORT_DIR)
    options = HealthOptions(args.mode, args.quick, report_dir, args.sysfs, args.timeout)
    return run_health(options).exit_code


if __name__ == "__main__":
    sys.exit(main())
