"""What the health checks produce: one `CheckResult` per figure, one `NodeReport` per node.

The node report is the JSON file a node writes (`health-node<NNN>-<host>.json` in the
report directory) and the object the nodes exchange to compare themselves with the fleet:

    {"schema": 1, "host": "...", "node": 0, "sku": "Standard_ND96asr_v4" | null,
     "mode": "gate" | "warn" | "report", "quick": false, "startedAt": ISO, "seconds": 12.3,
     "status": "pass" | "warn" | "fail",
     "environment": {"torch": "2.x", "cuda": "12.x" | null, "gpus": ["NVIDIA A100-SXM4-40GB", ...]},
     "checks": [{"check": "gemm", "subject": "gpu2 0003:00:00.0", "status": "pass",
                 "value": 265.1, "unit": "TFLOP/s", "threshold": 187.2, "detail": "..."}, ...]}

`status` is the worst graded check (fail > warn > pass; a "not-checked" check, whose tool the
size needs but the node lacks, counts as fail), or "info"/"skip" when no check could be graded
(a CPU-only machine).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.health.grading import (
    FAIL,
    INFO,
    NOT_CHECKED,
    PASS,
    SKIP,
    WARN,
    verdict,
    worst,
)

SCHEMA = 1
STATUSES = (PASS, WARN, FAIL, NOT_CHECKED, SKIP, INFO)


def fmt(value: float) -> str:
    """A figure for people: one decimal from 10 up, three significant digits below."""
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


@dataclass
class CheckResult:
    check: str
    """gpu_count, gemm, h2d, d2h, d2d, allreduce_node, allreduce_job, infiniband, ecc, fleet:<metric>."""
    subject: str
    """What was checked: "node", "job", "gpu3 0004:00:00.0", "mlx5_ib0/1"."""
    status: str
    value: float | None = None
    unit: str = ""
    threshold: float | None = None
    """The fail line the value was compared with, if any."""
    detail: str = ""

    def line(self) -> str:
        """One human line: 'gemm gpu3 0004:00:00.0: 150.2 TFLOP/s < 187.2 (detail)'."""
        text = f"{self.check} {self.subject}".strip()
        if self.value is not None:
            text += f": {fmt(self.value)} {self.unit}".rstrip()
            if self.threshold is not None:
                text += f" ({'<' if self.status == FAIL else '>='} {fmt(self.threshold)})"
        if self.status == NOT_CHECKED:
            text += " not checked"
        if self.detail:
            text += f" - {self.detail}" if self.value is not None else f": {self.detail}"
        return text


@dataclass
class NodeReport:
    host: str
    node: int
    sku: str | None
    mode: str
    quick: bool
    started_at: str
    seconds: float = 0.0
    environment: dict[str, Any] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def status(self) -> str:
        """Worst graded check (not-checked counts as fail); "info" or "skip" when nothing could be graded."""
        graded = [verdict(c.status) for c in self.checks if c.status in (PASS, WARN, FAIL, NOT_CHECKED)]
        if graded:
            return worst(graded)
        return INFO if any(c.status == INFO for c in self.checks) else SKIP

    def failures(self) -> list[CheckResult]:
        """Failed checks, and those the size needs that could not run (not-checked)."""
        return [c for c in self.checks if c.status in (FAIL, NOT_CHECKED)]

    def warnings(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == WARN]

    def values(self, check: str) -> list[tuple[str, float]]:
        """(subject, value) of every measured result of one check."""
        return [(c.subject, c.value) for c in self.checks if c.check == check and c.value is not None]

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "host": self.host, "node": self.node, "sku": self.sku, "mode": self.mode,
                "quick": self.quick, "startedAt": self.started_at, "seconds": round(self.seconds, 3),
                "status": self.status, "environment": self.environment,
                "checks": [asdict(c) for c in self.checks]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeReport:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r} is not {SCHEMA}")
        checks = []
        for raw in data["checks"]:
            if raw.get("status") not in STATUSES:
                raise ValueError(f"check {raw.get('check')!r} has status {raw.get('status')!r}")
            checks.append(CheckResult(**raw))
        return cls(host=data["host"], node=int(data["node"]), sku=data.get("sku"), mode=data["mode"],
                   quick=bool(data["quick"]), started_at=data["startedAt"], seconds=float(data.get("seconds", 0)),
                   environment=dict(data.get("environment") or {}), checks=checks)

    def file_name(self) -> str:
        host = re.sub(r"[^A-Za-z0-9._-]", "_", self.host)[:60]
        return f"health-node{self.node:03d}-{host}.json"

    def write(self, folder: Path) -> Path:
        """Write the report atomically (temp file + rename) into `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / self.file_name()
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)
        return path
