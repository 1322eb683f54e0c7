"""The quick health check a node runs before it takes part in an in-job restart (seconds, not
the startup gate's minutes): has anything broken on this node since the training started?

A failed training is restarted on the same nodes (amlhpc.jobs.runtime.launch.restart). When
the failure was the node's own hardware - a GPU that fell off the bus, a critical XID, a
fabric port that went down - the restart meets it again, up to `local_restarts` times
(NVIDIA's Resiliency Extension and SageMaker HyperPod check the node first for this reason:
github.com/NVIDIA/nvidia-resiliency-ext, docs "In-job restart", and
docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-resiliency-deep-health-checks.html,
read 2026-11-28). Three checks, each a piece of the startup health gate, compared with what
the node had when its training started (`Baseline`), so a node the gate never ran on (health
off) is judged on what changed, never on what it always was:

- GPUs (NVML): every GPU seen at the start still answers (a handle, its PCI id) and NVML
  still counts as many; the memory error counters within the gate's limits
  (amlhpc.jobs.runtime.health.ecc);
- XIDs (the kernel log, amlhpc.jobs.runtime.health.tools.check_xid's reading): a critical
  XID (amlhpc.jobs.runtime.node.xids) that was not in the log at the start;
- fabric (sysfs, amlhpc.jobs.runtime.health.infiniband): every InfiniBand port ACTIVE at the
  start still is, at no lower rate.

What cannot be read here (no NVML bindings, no kernel log in the container, no InfiniBand) is
skipped, as in the gate. The `restart.health-check` fault point sits before the checks: a test
or a rehearsal fails one node's check there (an armed error is a failed check).

Standard library only (NVML through its bindings when the image has them): ships in the image.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import clock, faultpoints
from amlhpc.jobs.runtime.health.ecc import check_ecc
from amlhpc.jobs.runtime.health.grading import FAIL
from amlhpc.jobs.runtime.health.infiniband import ib_ports
from amlhpc.jobs.runtime.health.results import CheckResult
from amlhpc.jobs.runtime.health.tools import Tools, parse_xids
from amlhpc.jobs.runtime.node.nvml import NvmlSession, bus_id, error_text, is_error, open_nvml
from amlhpc.jobs.runtime.node.xids import CRITICAL_XIDS

log = logging.getLogger("amlhpc.health.quick")

XID_READ_S = 10.0
"""The longest the kernel log read may take (the gate allows 30 s; a restart waits on this one)."""


@dataclass(frozen=True)
class Baseline:
    """What the node had when its training started."""

    gpus: tuple[str, ...] | None = None
    """The PCI ids of the GPUs NVML saw (None: NVML could not be read)."""
    ports: dict[str, float | None] = field(default_factory=dict)
    """"hca/port" -> rate (Gb/s) of each InfiniBand port ACTIVE at the start."""
    xids: frozenset[str] = frozenset()
    """The kernel log's critical XID lines at the start (None of them is news)."""


def _xid_lines(tools: Tools) -> frozenset[str] | None:
    code, text = tools.run(["dmesg", "--kernel"], XID_READ_S)
    if code != 0 or not text.strip():
        return None
    return frozenset(e.line for e in parse_xids(text, tools.now()) if e.xid in CRITICAL_XIDS)


def _gpus(session: NvmlSession) -> tuple[str, ...] | None:
    lib = session.lib
    if lib is None:
        return None
    try:
        return tuple(bus_id(lib, lib.nvmlDeviceGetHandleByIndex(i)) for i in range(lib.nvmlDeviceGetCount()))
    except lib.NVMLError as exc:
        log.warning("NVML at the start: %s: the pre-restart check reads no GPU", error_text(lib, exc))
        return None


def _active(sysfs: Path) -> dict[str, float | None]:
    return {f"{p['hca']}/{p['port']}": p["rate_gbits"] for p in ib_ports(sysfs) if p["state"] == "ACTIVE"}


def baseline(sysfs: Path = Path("/sys"), *, nvml_module: Any | None = None, tools: Tools | None = None) -> Baseline:
    """The node as its training starts (local rank 0, once per launch)."""
    with open_nvml(nvml_module) as session:
        gpus = _gpus(session)
    return Baseline(gpus, _active(sysfs), _xid_lines(tools or Tools()) or frozenset())


def _gpu_results(start: Baseline, session: NvmlSession) -> list[CheckResult]:
    lib = session.lib
    if lib is None or start.gpus is None:
        return []
    try:
        now = _gpus_strict(lib)
    except lib.NVMLError as exc:
        return [CheckResult("gpu", "node", FAIL, detail=f"NVML no longer answers ({error_text(lib, exc)}): a GPU fell "
                                                        "off the bus or its driver is wedged")]
    missing = [b for b in start.gpus if b not in now]
    if missing:
        return [CheckResult("gpu", "node", FAIL, float(len(now)), "GPUs", float(len(start.gpus)),
                            f"GPU(s) {', '.join(missing)} seen at the start are gone (fallen off the bus)")]
    return [r for r in check_ecc(session, len(start.gpus)) if r.status == FAIL]


def _gpus_strict(lib: Any) -> tuple[str, ...]:
    found = []
    for index in range(lib.nvmlDeviceGetCount()):
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        try:
            lib.nvmlDeviceGetMemoryInfo(handle)  # a lost GPU answers its handle from cache, not this
        except lib.NVMLError as exc:
            if not is_error(lib, exc, "NVML_ERROR_NOT_SUPPORTED"):
                raise
        found.append(bus_id(lib, handle))
    return tuple(found)


def _xid_results(start: Baseline, tools: Tools) -> list[CheckResult]:
    lines = _xid_lines(tools)
    new = sorted((lines or frozenset()) - start.xids)
    if not new:
        return []
    return [CheckResult("xid", "node", FAIL, float(len(new)), "events", 0.0,
                        f"critical GPU XID error(s) since the training started: {'; '.join(n[-160:] for n in new[:4])}")]


def _port_results(start: Baseline, sysfs: Path) -> list[CheckResult]:
    now = {f"{p['hca']}/{p['port']}": p for p in ib_ports(sysfs)}
    results = []
    for name, rate in sorted(start.ports.items()):
        port = now.get(name)
        if port is None or port["state"] != "ACTIVE":
            state = "gone" if port is None else f"state {port['state'] or 'unknown'}"
            results.append(CheckResult("infiniband", name, FAIL, detail=f"ACTIVE at the start, now {state}"))
        elif rate is not None and port["rate_gbits"] is not None and port["rate_gbits"] < rate:
            results.append(CheckResult("infiniband", name, FAIL, port["rate_gbits"], "Gb/s", rate,
                                       f"trained down from {rate:g} Gb/s since the start"))
    return results


def before_restart(start: Baseline, sysfs: Path = Path("/sys"), *, node: int = 0, nvml_module: Any | None = None,
                   tools: Tools | None = None) -> list[CheckResult]:
    """The failed checks (empty: the node may take part in the restart)."""
    started = clock.monotonic()
    try:
        faultpoints.reach("restart.health-check", node=node)
    except faultpoints.FaultInjected as exc:
        return [CheckResult("fault", "node", FAIL, detail=str(exc))]
    tools = tools or Tools()
    with open_nvml(nvml_module) as session:
        failed = _gpu_results(start, session)
    failed += _xid_results(start, tools) + _port_results(start, sysfs)
    log.info("pre-restart health check on node %d: %s in %.1fs", node,
             "; ".join(r.line() for r in failed) or "healthy", clock.monotonic() - started)
    return failed
