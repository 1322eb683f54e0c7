"""What machine a benchmark ran on: CPU, cores, memory, Python, load, Azurite's version."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return 0.0


def azurite_version() -> str:
    try:
        return json.loads((ROOT / "node_modules" / "azurite" / "package.json").read_text())["version"]
    except (OSError, KeyError, json.JSONDecodeError):
        return "unknown"


def describe_machine() -> dict[str, object]:
    return {"cpu": _cpu_model(), "cpus": os.cpu_count() or 1, "mem_gib": _mem_gib(),
            "python": platform.python_version(), "platform": platform.platform()}
