"""The checks Azure's node health checks (Azure/azurehpc-health-checks customTests, read
2026-11-23) run with the node's own tools, each parsing the tool's real output:

- GPU XID errors in the kernel log (azure_gpu_xid.nhc): a critical XID (the codes below) in
  `dmesg` or the syslog fails the node when it is recent by Azure's rule: the whole hours since
  it, (now - then) // 3600, at most 2 (XID_WINDOW_HOURS, the check's default time_threshold), so
  an old XID no longer fails a node until its next reboot. dmesg's seconds since boot are dated
  with /proc/uptime; a line with no readable time counts as recent;
- clock throttle reasons (azure_gpu_clock_throttling.nhc): `nvidia-smi -q -d PERFORMANCE`;
  hardware slowdown, thermal or power-brake throttling warns, as Azure's check only warns;
- NVLink status (azure_gpu_nvlink.nhc): `nvidia-smi nvlink --status`; only an inactive link (or
  a GPU whose links are all inactive) fails, as Azure's check: empty output passes ("NVLINK is
  not enabled", NC40ads_H100_v5 has none), and so does a GPU that lists no link (a warning where
  the catalog says the size has NVLink: the peer-bandwidth check then grades the links);
- the multi-node NVLink fabric on GB200/GB300 (Azure/azhpc-images tests/test-definitions.sh
  verify_nvlink_setup, 2026-07-29): each GPU's `nvidia-smi -q` Fabric block must say State
  Completed, Status Success, a non-zero CliqueId and a non-zero ClusterUUID (the NVL72 rack's
  domain); a health summary of Unhealthy warns;
- InfiniBand port state (`ibstat <device>` for each InfiniBand device sysfs lists: a bare
  `ibstat` stops at the first device it cannot open, such as the Ethernet RDMA device
  mlx5_an0 of ND A100 v4 and H100/H200 v5 sizes, Azure/azhpc-images#213) and link flaps
  (azure_ib_link_flapping.nhc: 5 or more "lost carrier" events of one device in 24 hours fail);
- NVMe device count (azure_nvme_count.nhc: nvme<N>n1 namespaces, from sysfs here);
- InfiniBand write bandwidth per HCA (azure_ib_write_bw_gdr.nhc / _non_gdr.nhc: perftest's
  `ib_write_bw` loopback, with --use_cuda or --use_rocm for GPUDirect RDMA);
- InfiniBand write bandwidth runs with Azure's flags, bound to the HCA's NUMA node with numactl;
- NCCL all-reduce with nccl-tests' `all_reduce_perf`, one rank per GPU under mpirun as Azure's
  check runs it (azure_nccl_allreduce.nhc, without the topology file), RCCL's with rccl-tests'
  on AMD sizes (azure_rccl_allreduce.nhc);
- kernel.numa_balancing: on warns on AMD sizes (AMD's MI300X workload optimization guide).

Every check takes a `Tools` (runs a command, reads a file) so tests feed recorded outputs.
A tool the size's checks need that is missing or cannot run (not installed, "command not
found", nvidia-smi without the driver's libnvidia-ml.so) is graded "not-checked", which fails
the node's verdict: the images ship every one of them (amlhpc/images/pins.toml [tools]). A check
that does not apply (NVIDIA's tools on an AMD size) or a log the container may not read is a
skip that says why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from amlhpc.jobs.runtime.health.grading import (
    FAIL,
    INFO,
    NOT_CHECKED,
    PASS,
    SKIP,
    WARN,
    grade_minimum,
)
from amlhpc.jobs.runtime.health.results import CheckResult
from amlhpc.jobs.runtime.node.rdma import state_name
from amlhpc.jobs.runtime.node.skufacts import SkuFacts
from amlhpc.jobs.runtime.node.xids import CRITICAL_XIDS, XID_WINDOW_HOURS

UPTIME = Path("/proc/uptime")
FLAP_WINDOW_S = 24 * 3600
FLAP_THRESHOLD = 5
"""Azure's link-flap rule: 5 "lost carrier" events of one device within 24 hours."""
THROTTLE_WARN = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")
"""Reasons that mean the GPU runs below its clocks for a hardware or thermal cause (nvml.h)."""
KERNEL_LOGS = (Path("/var/log/syslog"), Path("/var/log/messages"), Path("/var/log/kern.log"))
TOOLS_DIR = Path("/opt/aml-hpc/tools/bin")
"""Where the images install the health tools (amlhpc/images/common/bin/install_health_tools.sh)."""
PACKAGES = {"nvidia-smi": "the NVIDIA driver's utilities (NVIDIA container runtime, capability 'utility')",
            "ibstat": "infiniband-diags", "ib_write_bw": "perftest built with GPU memory support",
            "all_reduce_perf": "nccl-tests (rccl-tests on AMD), built with MPI=1",
            "mpirun": "Open MPI (the NGC images' HPC-X; the ROCm image's Open MPI)"}
_MISSING = re.compile(r"command not found|: not found|executable file not found|No such file or directory|"
                      r"cannot open shared object file")


@dataclass
class Tools:
    """How checks reach the node: commands and files (tests replace both)."""

    # Factories: the defaults are defined below the class.
    run: Callable[[list[str], float], tuple[int, str]] = field(default_factory=lambda: _run)
    read: Callable[[Path], str | None] = field(default_factory=lambda: _read)
    which: Callable[[str], str | None] = field(default_factory=lambda: shutil.which)
    now: Callable[[], float] = time.time
    executable: Callable[[Path], bool] = field(default_factory=lambda: _executable)
    """Whether a file is there and may be run (tools installed off PATH, such as DCGM's ubergemm)."""


def _run(command: list[str], timeout: float) -> tuple[int, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, done.stdout + done.stderr


def tool_problem(name: str, code: int, text: str) -> str | None:
    """Why `name` could not run, when its exit and output say so (exit 126/127, "command not
    found", a missing library), else None: a tool that ran and reported is graded on its output."""
    missing = code in (126, 127) or "libnvidia-ml.so" in text or (code != 0 and name in text and _MISSING.search(text))
    if missing:
        first = text.strip().splitlines()[0][:160] if text.strip() else f"exit {code}"
        return f"{name} cannot run here ({first})"
    return None


def not_checked(check: str, name: str, why: str = "") -> CheckResult:
    """The result of a check whose tool is missing: it fails the node's verdict, with what to install."""
    why = why or f"{name} is not on PATH"
    return CheckResult(check, "node", NOT_CHECKED,
                       detail=f"{why}: not checked; the size expects it (install {PACKAGES.get(name, name)}, "
                              "or use the aml-hpc image that fits the size)")


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


# --- XID ------------------------------------------------------------------------------

_XID = re.compile(r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d+),")
_SYSLOG_TIME = re.compile(r"^(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<hms>\d\d:\d\d:\d\d) ")
_DMESG_T_TIME = re.compile(r"^\[(?P<stamp>[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \d{4})\]")
_DMESG_BOOT_TIME = re.compile(r"^\[\s*(?P<seconds>\d+\.\d+)\]")


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str
    line: str
    when: float | None
    """Epoch seconds where the log says (syslog, dmesg -T), else None (dmesg's seconds since boot)."""


def _syslog_time(line: str, now: float) -> float | None:
    match = _SYSLOG_TIME.match(line)
    if match:
        year = datetime.fromtimestamp(now).year
        for candidate_year in (year, year - 1):  # syslog has no year: the nearest past date
            try:
                stamp = datetime.strptime(f"{candidate_year} {match['mon']} {match['day']} {match['hms']}", "%Y %b %d %H:%M:%S")
            except ValueError:
                continue
            if stamp.timestamp() <= now + 60:
                return stamp.timestamp()
        return None
    match = _DMESG_T_TIME.match(line)
    if match:
        return datetime.strptime(" ".join(match["stamp"].split()), "%a %b %d %H:%M:%S %Y").timestamp()
    return None


def parse_xids(text: str, now: float, booted: float | None = None) -> list[XidEvent]:
    """Every `NVRM: Xid (PCI:...): N,` line (syslog, journalctl -k, dmesg or dmesg -T format);
    dmesg's `[seconds since boot]` is dated when the boot time (epoch seconds) is known."""
    events = []
    for line in text.splitlines():
        match = _XID.search(line)
        if match:
            when = _syslog_time(line, now)
            since_boot = _DMESG_BOOT_TIME.match(line)
            if when is None and since_boot and booted is not None:
                when = booted + float(since_boot["seconds"])
            events.append(XidEvent(int(match["xid"]), match["pci"], line.strip(), when))
    return events


def xid_is_recent(event: XidEvent, now: float) -> bool:
    """Azure's rule: the whole hours since the XID, (now - then) // 3600, at most XID_WINDOW_HOURS;
    an XID with no readable time counts."""
    return event.when is None or (now - event.when) // 3600 <= XID_WINDOW_HOURS


def _boot_time(tools: Tools, now: float) -> float | None:
    uptime = tools.read(UPTIME)
    try:
        return now - float((uptime or "").split()[0])
    except (IndexError, ValueError):
        return None


def check_xid(tools: Tools) -> list[CheckResult]:
    code, text = tools.run(["dmesg", "--kernel"], 30)
    source = "dmesg"
    if code != 0 or not text.strip():
        for path in KERNEL_LOGS:
            content = tools.read(path)
            if content is not None:
                source, text = str(path), content
                break
        else:
            return [CheckResult("xid", "node", SKIP, detail="the kernel log is not readable in this container "
                                "(dmesg not permitted, no /var/log/syslog): XID errors not checked")]
    now = tools.now()
    events = parse_xids(text, now, _boot_time(tools, now))
    recent = [e for e in events if xid_is_recent(e, now)]
    older = sorted({e.xid for e in events if e not in recent and e.xid in CRITICAL_XIDS})
    critical = [e for e in recent if e.xid in CRITICAL_XIDS]
    window = f"within Azure's {XID_WINDOW_HOURS}-hour window"
    if critical:
        listed = "; ".join(f"Xid {e.xid} on {e.pci}" for e in critical[:8])
        return [CheckResult("xid", "node", FAIL, float(len(critical)), "events", 0.0,
                            f"critical GPU XID errors in {source} {window}: {listed} (the GPU needs a reset or replacement)")]
    others = sorted({e.xid for e in recent})
    detail = f"no critical XID in {source} {window}" + (
        f" (other XIDs seen: {', '.join(map(str, others))}: application-level)" if others else "")
    if older:
        detail += f"; older critical XID(s) {', '.join(map(str, older))} outside the window, not counted"
    return [CheckResult("xid", "node", PASS, float(len(critical)), "events", 0.0, detail)]


# --- clock throttle reasons -------------------------------------------------------------

_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_SECTION = re.compile(r"^\s+Clocks (Event|Throttle) Reasons\s*$")
_ITEM = re.compile(r"^\s+(.+?)\s+:\s+(Active|Not Active|N/A)\s*$")


def parse_clock_reasons(text: str) -> dict[str, dict[str, bool]]:
    """{GPU bus id: {reason: active}} from `nvidia-smi -q -d PERFORMANCE` (either section name)."""
    gpus: dict[str, dict[str, bool]] = {}
    current: str | None = None
    in_section = False
    for line in text.splitlines():
        header = _GPU_HEADER.match(line)
        if header:
            current, in_section = header.group(1), False
            gpus[current] = {}
            continue
        if _SECTION.match(line):
            in_section = current is not None
            continue
        item = _ITEM.match(line) if in_section else None
        if item and current is not None:
            gpus[current][item.group(1).strip()] = item.group(2) == "Active"
        elif in_section and line.strip() and not item:
            in_section = False
    return gpus


def check_throttle(tools: Tools) -> list[CheckResult]:
    if not tools.which("nvidia-smi"):
        return [not_checked("throttle", "nvidia-smi")]
    code, text = tools.run(["nvidia-smi", "-q", "-d", "PERFORMANCE"], 60)
    problem = tool_problem("nvidia-smi", code, text)
    if problem:
        return [not_checked("throttle", "nvidia-smi", problem)]
    gpus = parse_clock_reasons(text) if code == 0 else {}
    if not gpus:
        return [CheckResult("throttle", "node", SKIP, detail=f"nvidia-smi -q -d PERFORMANCE gave no GPU (exit {code})")]
    results = []
    for bus_id, reasons in gpus.items():
        hardware = [r for r in THROTTLE_WARN if reasons.get(r)]
        active = [r for r, on in reasons.items() if on]
        if hardware:
            results.append(CheckResult("throttle", bus_id, WARN, detail=f"clocks held down by {', '.join(hardware)} "
                                       "(cooling or power): GEMM and all-reduce figures may be low"))
        else:
            results.append(CheckResult("throttle", bus_id, PASS, detail="active reasons: " + (", ".join(active) or "none")))
    return results


# --- NVLink ----------------------------------------------------------------------------

_NVLINK_GPU = re.compile(r"^GPU (\d+): (.*)$")
_LINK = re.compile(r"^\s+Link (\d+): (.*)$")


def parse_nvlink_status(text: str) -> dict[int, dict]:
    """{GPU index: {"name", "links": {n: text}, "all_inactive": bool}} from `nvidia-smi nvlink --status`."""
    gpus: dict[int, dict] = {}
    current: int | None = None
    for line in text.splitlines():
        header = _NVLINK_GPU.match(line)
        if header:
            current = int(header.group(1))
            gpus[current] = {"name": header.group(2), "links": {}, "all_inactive": False}
            continue
        if current is None:
            continue
        link = _LINK.match(line)
        if link:
            gpus[current]["links"][int(link.group(1))] = link.group(2).strip()
        elif "all links are inactive" in line.lower():
            gpus[current]["all_inactive"] = True
    return gpus


def check_nvlink(tools: Tools, sku: SkuFacts | None) -> list[CheckResult]:
    expected = bool(sku and (sku.nvlink or sku.health.nvlink_check))
    has_nvlink = bool(sku and sku.nvlink)
    if not tools.which("nvidia-smi"):
        return [not_checked("nvlink", "nvidia-smi")]
    code, text = tools.run(["nvidia-smi", "nvlink", "--status"], 60)
    problem = tool_problem("nvidia-smi", code, text)
    if problem:
        return [not_checked("nvlink", "nvidia-smi", problem)]
    if code != 0 and "inactive" not in text.lower():
        return [CheckResult("nvlink", "node", FAIL if expected else SKIP, detail=f"nvidia-smi nvlink --status failed (exit {code})")]
    gpus = parse_nvlink_status(text)
    if not gpus or not any(g["links"] or g["all_inactive"] for g in gpus.values()):
        # Azure's check: empty output is "NVLINK is not enabled" and passes; only inactive links fail.
        if has_nvlink and sku is not None:
            return [CheckResult("nvlink", "node", WARN, 0.0, "links", detail=f"nvidia-smi reports no NVLink, though {sku.name} "
                                "has NVLink: Azure's check passes this (only inactive links fail); the peer-read check "
                                "grades the GPU-to-GPU bandwidth")]
        if not expected or sku is None:
            return [CheckResult("nvlink", "node", SKIP, detail="no NVLink on this size")]
        return [CheckResult("nvlink", "node", PASS, 0.0, "links", detail=f"no NVLink on {sku.name} (empty nvidia-smi "
                            "nvlink --status passes, as Azure's check_nvlink_status)")]
    results = []
    for index, gpu in sorted(gpus.items()):
        inactive = [n for n, state in gpu["links"].items() if "inactive" in state.lower()]
        if gpu["all_inactive"] or inactive:
            what = "all links inactive" if gpu["all_inactive"] else f"link(s) {', '.join(map(str, inactive))} inactive"
            results.append(CheckResult("nvlink", f"gpu{index}", FAIL, float(len(gpu["links"]) - len(inactive)), "links",
                                       detail=f"{what} ({gpu['name'][:60]})"))
        elif not gpu["links"]:
            status = WARN if has_nvlink else PASS
            results.append(CheckResult("nvlink", f"gpu{index}", status, 0.0, "links",
                                       detail="no link listed (no inactive link: Azure's check passes it)"))
        else:
            results.append(CheckResult("nvlink", f"gpu{index}", PASS, float(len(gpu["links"])), "links", detail="all links active"))
    return results


# --- multi-node NVLink fabric (GB200/GB300) ----------------------------------------------

ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def parse_fabric(text: str) -> list[dict[str, str]]:
    """One {gpu, State, Status, CliqueId, ClusterUUID, Summary} per Fabric block of `nvidia-smi -q`
    (also from quoted excerpts without GPU lines: gpu is then "")."""
    blocks: list[dict[str, str]] = []
    gpu = ""
    fabric: dict[str, str] | None = None
    fabric_indent = -1
    for line in text.splitlines():
        header = _GPU_HEADER.match(line)
        if header:
            gpu, fabric = header.group(1), None
            continue
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if line.strip() == "Fabric":
            fabric, fabric_indent = {"gpu": gpu}, indent
            blocks.append(fabric)
            continue
        if fabric is None:
            continue
        if indent <= fabric_indent:
            fabric = None
            continue
        key, sep, value = line.strip().partition(":")
        if sep:
            fabric.setdefault(key.strip(), value.strip())
    return blocks


def check_nvlink_fabric(tools: Tools, sku: SkuFacts | None) -> list[CheckResult]:
    """Azure's rules for the GB-family NVLink fabric, per GPU, and the node's NVLink domain
    (its ClusterUUID, in the node result's detail for the job-wide comparison)."""
    if not sku or not sku.nvlink_domain_vms:
        return []
    if not tools.which("nvidia-smi"):
        return [not_checked("nvlink_fabric", "nvidia-smi")]
    code, text = tools.run(["nvidia-smi", "-q"], 120)
    problem = tool_problem("nvidia-smi", code, text)
    if problem:
        return [not_checked("nvlink_fabric", "nvidia-smi", problem)]
    blocks = parse_fabric(text)
    if not blocks:
        return [CheckResult("nvlink_fabric", "node", FAIL, detail=f"nvidia-smi -q shows no Fabric block (exit {code}), "
                            f"but {sku.name} is part of a {sku.nvlink_domain_vms}-VM NVLink domain")]
    results = []
    for index, block in enumerate(blocks):
        problems = []
        if block.get("State") != "Completed":
            problems.append(f"State {block.get('State', '?')!r} (expected Completed)")
        if block.get("Status") != "Success":
            problems.append(f"Status {block.get('Status', '?')!r} (expected Success)")
        if block.get("CliqueId", "0") in ("0", "", "N/A"):
            problems.append(f"CliqueId {block.get('CliqueId', '?')!r} (expected non-zero)")
        if block.get("ClusterUUID", ZERO_UUID) in (ZERO_UUID, "", "N/A"):
            problems.append(f"ClusterUUID {block.get('ClusterUUID', '?')!r} (the NVLink fabric did not register this GPU)")
        subject = f"gpu{index} {block['gpu']}".strip()
        if problems:
            results.append(CheckResult("nvlink_fabric", subject, FAIL, detail="; ".join(problems)))
        elif block.get("Summary") == "Unhealthy":
            results.append(CheckResult("nvlink_fabric", subject, WARN, detail=f"fabric health summary Unhealthy "
                                       f"(clique {block['CliqueId']}, domain {block['ClusterUUID']})"))
        else:
            results.append(CheckResult("nvlink_fabric", subject, PASS,
                                       detail=f"clique {block['CliqueId']}, domain {block['ClusterUUID']}"))
    domains = sorted({b.get("ClusterUUID", "") for b in blocks} - {ZERO_UUID, "", "N/A"})
    if len(domains) == 1:
        node = CheckResult("nvlink_fabric", "node", PASS, float(len(blocks)), "GPUs", detail=f"{DOMAIN_PREFIX}{domains[0]}")
    else:
        node = CheckResult("nvlink_fabric", "node", FAIL, float(len(blocks)), "GPUs",
                           detail=f"the node's GPUs report {len(domains)} NVLink domains: {', '.join(domains) or 'none'}")
    return [node, *results]


DOMAIN_PREFIX = "NVLink domain "
"""The node result's detail starts with it, followed by the ClusterUUID (read by the fleet comparison)."""


# --- InfiniBand: ibstat, link flaps ------------------------------------------------------

_CA = re.compile(r"^CA '([^']+)'")
_PORT = re.compile(r"^\s*Port (\d+):\s*$")
_FIELD = re.compile(r"^\s*([A-Za-z ]+):\s*(.*?)\s*$")


def parse_ibstat(text: str) -> list[dict]:
    """[{device, port, state, phys_state, rate_gbits, link_layer}] from `ibstat`."""
    ports: list[dict] = []
    device = None
    port: dict | None = None
    for line in text.splitlines():
        ca = _CA.match(line)
        if ca:
            device, port = ca.group(1), None
            continue
        number = _PORT.match(line)
        if number and device:
            port = {"device": device, "port": number.group(1), "state": "", "phys_state": "", "rate_gbits": None,
                    "link_layer": ""}
            ports.append(port)
            continue
        field_ = _FIELD.match(line)
        if field_ and port is not None:
            key, value = field_.group(1).strip().lower(), field_.group(2)
            if key == "state":
                port["state"] = state_name(value).upper()
            elif key == "physical state":
                port["phys_state"] = state_name(value)
            elif key == "rate":
                port["rate_gbits"] = float(value) if re.fullmatch(r"[0-9.]+", value) else None
            elif key == "link layer":
                port["link_layer"] = value
    return ports


def _ibstat_devices(tools: Tools, sysfs: Path) -> tuple[list[str], list[str], str]:
    """(InfiniBand devices to ask ibstat about, RDMA devices left out as not InfiniBand, where
    the list came from). sysfs says each port's link layer; without it, `ibstat -l` names them."""
    from amlhpc.jobs.runtime.node.rdma import rdma_ports

    ports = rdma_ports(sysfs)
    if ports:
        infiniband = sorted({p.device for p in ports if p.infiniband})
        return infiniband, sorted({p.device for p in ports} - set(infiniband)), "sysfs"
    code, text = tools.run(["ibstat", "-l"], 30)
    names = [line.strip() for line in text.splitlines() if re.fullmatch(r"[A-Za-z0-9_.-]+", line.strip())] if code == 0 else []
    return names, [], "ibstat -l"


def check_ibstat(tools: Tools, sku: SkuFacts | None, sysfs: Path = Path("/sys")) -> list[CheckResult]:
    """Port state from `ibstat <device>`, one InfiniBand device at a time: a bare `ibstat`
    stops at the first device it cannot open (ND A100 v4 / H100 / H200 v5 have the Ethernet
    RDMA device mlx5_an0 beside the InfiniBand HCAs), losing every port after it."""
    if not sku or not sku.infiniband:
        return []
    if not tools.which("ibstat"):
        return [not_checked("ibstat", "ibstat")]
    devices, ethernet, listed_by = _ibstat_devices(tools, sysfs)
    results = []
    ports: list[dict] = []
    for device in devices:
        code, text = tools.run(["ibstat", device], 60)
        problem = tool_problem("ibstat", code, text)
        if problem:
            return [not_checked("ibstat", "ibstat", problem)]
        found = [dict(p, device=device) for p in parse_ibstat(text)]
        if not found:
            status = FAIL if listed_by == "sysfs" else INFO
            results.append(CheckResult("ibstat", device, status, detail=f"ibstat {device} gave no port (exit {code}): "
                                       f"{text.strip()[-200:]}" + ("" if status == FAIL else "; not counted")))
            continue
        ports.extend(p for p in found if p["link_layer"] in ("InfiniBand", ""))
    for port in ports:
        problems = []
        if port["state"] != "ACTIVE":
            problems.append(f"state {port['state'] or '?'}")
        if port["phys_state"] != "LinkUp":
            problems.append(f"physical state {port['phys_state'] or '?'}")
        if port["rate_gbits"] is not None and port["rate_gbits"] < sku.ib_gbits_per_s_per_hca:
            problems.append(f"rate {port['rate_gbits']:g} below {sku.ib_gbits_per_s_per_hca} Gb/s")
        results.append(CheckResult("ibstat", f"{port['device']}/{port['port']}", FAIL if problems else PASS,
                                   port["rate_gbits"], "Gb/s", float(sku.ib_gbits_per_s_per_hca), "; ".join(problems) or "Active, LinkUp"))
    left_out = f" ({', '.join(ethernet)} left out: Ethernet RDMA, which ibstat cannot read)" if ethernet else ""
    count = CheckResult("ibstat", "node", PASS if len(ports) >= sku.ib_hcas else FAIL, float(len(ports)), "ports",
                        float(sku.ib_hcas), f"ibstat lists {len(ports)} InfiniBand port(s) on the device(s) {listed_by} "
                        f"names, {sku.name} has {sku.ib_hcas}{left_out}")
    return [count, *results]


_FLAP = re.compile(r"\b(ib[0-9A-Za-z_]+): [Ll]ost carrier")


def count_link_flaps(text: str, now: float, window_s: float = FLAP_WINDOW_S) -> dict[str, int]:
    """{device: "lost carrier" events within the window} from syslog lines."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        match = _FLAP.search(line)
        if not match:
            continue
        when = _syslog_time(line, now)
        if when is not None and now - window_s <= when <= now + 60:
            counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return counts


def check_link_flaps(tools: Tools, sku: SkuFacts | None, sysfs: Path) -> list[CheckResult]:
    if not sku or not sku.infiniband:
        return []
    from amlhpc.jobs.runtime.node.rdma import infiniband_ports

    results = []
    downed = [(p.name, p.link_downed) for p in infiniband_ports(sysfs) if p.link_downed]
    if downed:
        results.append(CheckResult("ib_link_downed", "node", WARN, float(sum(n for _, n in downed)), "events",
                                   detail="links went down since the counters were reset: " + ", ".join(f"{d} x{n}" for d, n in downed)))
    for path in KERNEL_LOGS[:2]:
        text = tools.read(path)
        if text is None:
            continue
        counts = count_link_flaps(text, tools.now())
        flapping = {d: n for d, n in counts.items() if n >= FLAP_THRESHOLD}
        if flapping:
            results.append(CheckResult("ib_link_flaps", "node", FAIL, float(max(flapping.values())), "events",
                                       float(FLAP_THRESHOLD), "IB link flapping in the last 24 h: "
                                       + ", ".join(f"{d} ({n} lost carrier)" for d, n in sorted(flapping.items()))))
        else:
            results.append(CheckResult("ib_link_flaps", "node", PASS, float(max(counts.values(), default=0)), "events",
                                       float(FLAP_THRESHOLD), f"fewer than {FLAP_THRESHOLD} lost-carrier events per device in 24 h ({path})"))
        return results
    results.append(CheckResult("ib_link_flaps", "node", SKIP, detail="no syslog in this container: link flaps not counted "
                               "(the sysfs link_downed counters are checked)"))
    return results


# --- NVMe count --------------------------------------------------------------------------

def nvme_namespaces(sysfs: Path) -> list[str]:
    """nvme<N>n1 block devices, as Azure counts /dev/nvme<N>n1 (sysfs works inside a container)."""
    try:
        names = os.listdir(sysfs / "block")
    except OSError:
        return []
    return sorted(n for n in names if re.fullmatch(r"nvme\d+n1", n))


def check_nvme(sysfs: Path, sku: SkuFacts | None) -> list[CheckResult]:
    expected = sku.health.nvme_count if sku else None
    found = nvme_namespaces(sysfs)
    if expected is None or sku is None:
        return [CheckResult("nvme_count", "node", INFO, float(len(found)), "devices",
                            detail="no published count for this size: " + (", ".join(found) or "none"))]
    status = PASS if len(found) == expected else FAIL
    return [CheckResult("nvme_count", "node", status, float(len(found)), "devices", float(expected),
                        f"{len(found)} NVMe namespace(s) ({', '.join(found) or 'none'}), {sku.name} has {expected}")]


# --- ib_write_bw, nccl-tests --------------------------------------------------------------

_BW_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(Gb|MB|MiB)/sec\]\s+BW average\[(Gb|MB|MiB)/sec\]")


def parse_ib_write_bw(text: str) -> tuple[float, str] | None:
    """(average bandwidth in Gb/s, the result line) from perftest's ib_write_bw report."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        header = _BW_HEADER.search(line)
        if not header:
            continue
        for row in lines[i + 1:]:
            fields = row.split()
            if len(fields) >= 4 and fields[0].isdigit():
                average = float(fields[3])
                unit = header.group(2)
                gbits = average if unit == "Gb" else average * 8 / 1000 if unit == "MB" else average * 8 * 1.048576 / 1000
                return gbits, row.strip()
    return None


IB_WRITE_GDR_ARGS = ("-s", "8388608", "-x", "0", "-F", "--report_gbits", "--perform_warm_up")
"""azure_ib_write_bw_gdr.nhc: 8 MiB messages (plus -p <port> and --use_cuda=<GPU> -d <HCA>)."""
IB_WRITE_NON_GDR_DURATION_S = 10
IB_WRITE_PORTS = 18510
"""Azure's GDR check gives HCA i the port 18510 + i, all HCAs at once."""


@dataclass(frozen=True)
class IbWriteRun:
    """One HCA's loopback: the server and the client command lines, as Azure's check builds them."""

    device: str
    subject: str
    server: list[str]
    client: list[str]
    binding: str
    """How the pair is bound to the HCA's NUMA node ("" when it could not be)."""


def _numa_node(sysfs: Path, device: str) -> int | None:
    try:
        node = int((sysfs / "class" / "infiniband" / device / "device" / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _first_cpu(sysfs: Path, node: int) -> int | None:
    try:
        text = (sysfs / "devices" / "system" / "node" / f"node{node}" / "cpulist").read_text().strip()
        return int(re.split(r"[-,]", text)[0])
    except (OSError, ValueError, IndexError):
        return None


def ib_write_runs(tools: Tools, sku: SkuFacts, sysfs: Path) -> list[IbWriteRun]:
    """The ib_write_bw loopback per active InfiniBand port, with Azure's flags and NUMA binding:
    GPUDirect (azure_ib_write_bw_gdr.nhc) `numactl -N n -m n ib_write_bw -p 18510+i -s 8388608 -x 0
    -F --report_gbits --perform_warm_up --use_cuda=i -d <hca>`, every HCA at once; from host
    memory (azure_ib_write_bw_non_gdr.nhc) `numactl --membind=n -C <cpu> ib_write_bw -s <size> -D 10
    -x 0 -F --report_gbits --perform_warm_up -d <hca> -q 2`, server on the NUMA node's first CPU and
    client on the next, one HCA after another. n is the HCA's NUMA node (sysfs)."""
    from amlhpc.jobs.runtime.node.rdma import infiniband_ports

    health = sku.health
    numactl = tools.which("numactl")
    runs = []
    for index, port in enumerate(infiniband_ports(sysfs, active_only=True)):
        node = _numa_node(sysfs, port.device)
        if health.ib_write_gpudirect:
            memory = "rocm" if sku.gpu_vendor == "amd" else "cuda"
            args = ["ib_write_bw", "-p", str(IB_WRITE_PORTS + index), *IB_WRITE_GDR_ARGS,
                    f"--use_{memory}={index % max(sku.gpus, 1)}", "-d", port.device]
            bind = ["numactl", "-N", str(node), "-m", str(node)] if numactl and node is not None else []
            server, client = bind + args, bind + args + ["localhost"]
            binding = f"numactl -N {node} -m {node}" if bind else ""
        else:
            args = ["ib_write_bw", "-s", str(health.ib_write_message_bytes), "-D", str(IB_WRITE_NON_GDR_DURATION_S), "-x", "0",
                    "-F", "--report_gbits", "--perform_warm_up", "-d", port.device, "-q", "2"]
            cpu = _first_cpu(sysfs, node) if node is not None else None
            if numactl and node is not None and cpu is not None:
                server = ["numactl", f"--membind={node}", "-C", str(cpu), *args]
                client = ["numactl", f"--membind={node}", "-C", str(cpu + 1), *args, "localhost"]
                binding = f"numactl --membind={node} -C {cpu}/{cpu + 1}"
            else:
                server, client, binding = args, [*args, "localhost"], ""
        runs.append(IbWriteRun(port.device, port.name, server, client, binding))
    return runs


def _run_pairs(tools: Tools, runs: list[IbWriteRun], together: bool) -> list[tuple[int, str]]:
    """Each loopback: its server started (on a real node), then its client; all pairs at once
    (Azure's GDR check) or one after another (the host-memory check)."""
    answers: list[tuple[int, str]] = [(1, "not run")] * len(runs)

    def one(i: int) -> None:
        answers[i] = tools.run(runs[i].client, 120)

    servers = []
    for i, run in enumerate(runs):
        if not together:
            servers.append(_start_server(tools, run.server))
            time.sleep(2 if servers[-1] else 0)
            one(i)
            _stop(servers.pop())
    if together:
        servers = [_start_server(tools, run.server) for run in runs]
        time.sleep(2 if any(servers) else 0)
        threads = [threading.Thread(target=one, args=(i,), name=f"ib_write_bw-{runs[i].device}") for i in range(len(runs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for server in servers:
            _stop(server)
    return answers


def _start_server(tools: Tools, command: list[str]) -> subprocess.Popen | None:
    if tools.run is not _run:
        return None  # recorded answers in tests: no server process
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(server: subprocess.Popen | None) -> None:
    if server is not None:
        server.kill()
        server.wait()


def check_ib_write(tools: Tools, sku: SkuFacts | None, sysfs: Path) -> list[CheckResult]:
    """perftest loopback per HCA (GPUDirect where the size's check uses it), graded per HCA."""
    if not sku or not sku.infiniband:
        return []
    if not tools.which("ib_write_bw"):
        return [not_checked("ib_write", "ib_write_bw")]
    health = sku.health
    runs = ib_write_runs(tools, sku, sysfs)
    results = []
    for run, (code, text) in zip(runs, _run_pairs(tools, runs, together=health.ib_write_gpudirect), strict=True):
        problem = tool_problem("ib_write_bw", code, text)
        if problem:
            return [not_checked("ib_write", "ib_write_bw", problem)]
        parsed = parse_ib_write_bw(text)
        if parsed is None:
            results.append(CheckResult("ib_write", run.subject, FAIL, detail=f"ib_write_bw gave no result (exit {code}): {text.strip()[-200:]}"))
            continue
        gbits, line = parsed
        minimum = health.ib_write_gbits_per_s_per_hca_min
        how = "GPUDirect RDMA, every HCA at once" if health.ib_write_gpudirect else "host memory"
        bound = f", {run.binding}" if run.binding else ", not NUMA-bound (numactl or the HCA's NUMA node missing)"
        results.append(CheckResult("ib_write", run.subject, grade_minimum(gbits, minimum), gbits, "Gb/s", minimum,
                                   f"loopback write from {how}{bound}: {line}"))
    return results


_AVG_BUSBW = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)")
_WRONG = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)")


def parse_nccl_tests(text: str) -> tuple[float | None, bool]:
    """(average bus bandwidth GB/s, data correct) from nccl-tests' all_reduce_perf summary."""
    busbw = _AVG_BUSBW.search(text)
    wrong = _WRONG.search(text)
    return (float(busbw.group(1)) if busbw else None), not (wrong and wrong.group(2) == "FAILED") and "FAILED" not in text


_RANK_LINE = re.compile(r"^(?:\[[^\]]*\]<stdout>:)?#\s+Rank\s+(\d+)\s", re.MULTILINE)

NCCL_TEST_ENV = (("NCCL_IB_PCI_RELAXED_ORDERING", "1"), ("UCX_IB_PCI_RELAXED_ORDERING", "on"), ("UCX_TLS", "tcp"),
                 ("UCX_NET_DEVICES", "eth0"), ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"), ("NCCL_SOCKET_IFNAME", "eth0"))
"""The environment Azure's single-node all-reduce checks pass to every rank (mpirun -x),
azure_nccl_allreduce.nhc and azure_rccl_allreduce.nhc alike."""
RCCL_TEST_ENV = (("HSA_NO_SCRATCH_RECLAIM", "1"),)
"""RCCL only: the ROCm runtime keeps kernels' scratch memory. Azure's azure_rccl_allreduce.nhc writes
`-x HSA_NO_SCRATCH_RECLAIM=1` among the test binary's own arguments, where rccl-tests reads -x as
--cta_policy: the variable never reaches the ranks there. Here it goes to them as mpirun's -x."""


def nccl_test_command(binary: str, sku: SkuFacts | None, gpus: int) -> list[str]:
    """Azure's single-node all-reduce check: one rank per GPU under mpirun (-np <gpus>, --map-by
    ppr:<gpus>:node, --bind-to numa, hcoll off), `all_reduce_perf -b S -f 2 -g 1 -e S -c 1`, NCCL
    without the topology file (azure_nccl_allreduce.nhc since 2025-06-26: it gave false failures
    on H100/H200); RCCL's with HSA_NO_SCRATCH_RECLAIM=1 (azure_rccl_allreduce.nhc)."""
    size = str(sku.health.nccl_allreduce_message_bytes if sku else 1 << 30)
    amd = bool(sku and sku.gpu_vendor == "amd")
    env = [*NCCL_TEST_ENV, *(RCCL_TEST_ENV if amd else (("NCCL_TOPO_FILE", ""),))]
    exported = [word for name, value in env for word in ("-x", f"{name}={value}")]
    return ["mpirun", "-np", str(gpus), "--map-by", f"ppr:{gpus}:node", "--bind-to", "numa", "-mca", "coll_hcoll_enable", "0",
            "--allow-run-as-root", "-x", "LD_LIBRARY_PATH", *exported,
            binary, "-b", size, "-f", "2", "-g", "1", "-e", size, "-c", "1"]


def check_nccl_tests(tools: Tools, sku: SkuFacts | None, gpus: int) -> list[CheckResult]:
    """nccl-tests' all_reduce_perf over this node's GPUs, one rank per GPU as Azure's check runs it
    (nccl_test_command); rccl-tests' binary of the same name on AMD sizes (azure_rccl_allreduce.nhc).
    The report's "# Rank" lines must show one rank per GPU: a binary built without MPI run under
    mpirun is N separate one-GPU tests, not an all-reduce."""
    library = "RCCL" if sku and sku.gpu_vendor == "amd" else "NCCL"
    binary = tools.which("all_reduce_perf") or next(
        (str(p) for p in (TOOLS_DIR / "all_reduce_perf", Path("/opt/nccl-tests/build/all_reduce_perf")) if p.is_file()), None)
    if not binary:
        return [not_checked("nccl_tests", "all_reduce_perf")]
    if gpus < 2:
        return [CheckResult("nccl_tests", "node", SKIP, detail="one GPU: nothing to all-reduce")]
    if not tools.which("mpirun"):
        return [not_checked("nccl_tests", "mpirun", "mpirun is not on PATH (one rank per GPU, as Azure's check runs "
                            "all_reduce_perf, needs it)")]
    size = sku.health.nccl_allreduce_message_bytes if sku else 1 << 30
    code, text = tools.run(nccl_test_command(binary, sku, gpus), 600)
    problem = tool_problem("all_reduce_perf", code, text) or tool_problem("mpirun", code, text)
    if problem:
        return [not_checked("nccl_tests", "all_reduce_perf", problem)]
    ranks = {int(r) for r in _RANK_LINE.findall(text)}
    if ranks and len(ranks) != gpus:
        return [CheckResult("nccl_tests", "node", NOT_CHECKED, float(len(ranks)), "ranks", float(gpus),
                            f"all_reduce_perf reports {len(ranks)} rank(s) for {gpus} processes: the binary was built "
                            "without MPI (build nccl-tests/rccl-tests with MPI=1, as the aml-hpc images do)")]
    busbw, correct = parse_nccl_tests(text)
    minimum = sku.health.nccl_allreduce_busbw_gbytes_per_s_min if sku else None
    if busbw is None:
        return [CheckResult("nccl_tests", "node", FAIL, detail=f"all_reduce_perf gave no result (exit {code}): {text.strip()[-200:]}")]
    if not correct:
        return [CheckResult("nccl_tests", "node", FAIL, busbw, "GB/s", minimum, "all_reduce_perf found wrong values")]
    topology = "" if library == "RCCL" else ", no topology file"
    return [CheckResult("nccl_tests", "node", grade_minimum(busbw, minimum), busbw, "GB/s", minimum,
                        f"{library} all_reduce_perf, {gpus} ranks (one per GPU, mpirun --bind-to numa) at {size >> 20} MiB{topology}")]


NUMA_BALANCING = Path("/proc/sys/kernel/numa_balancing")


def check_numa_balancing(tools: Tools, sku: SkuFacts | None) -> list[CheckResult]:
    """Linux's automatic NUMA balancing moves pages under running kernels; AMD's MI300X guidance
    (ROCm docs, AMD Instinct MI300X workload optimization: "Disable NUMA auto-balancing") is to
    turn it off for RCCL. On: a warning on AMD sizes, reported elsewhere."""
    text = tools.read(NUMA_BALANCING)
    if text is None:
        return [CheckResult("numa_balancing", "node", SKIP, detail=f"{NUMA_BALANCING} is not readable here")]
    value = text.strip()
    if value in ("", "0"):
        return [CheckResult("numa_balancing", "node", PASS, 0.0, detail="NUMA auto-balancing is off (kernel.numa_balancing=0)")]
    amd = bool(sku and sku.gpu_vendor == "amd")
    why = ("AMD's MI300X guidance is 0 (variable RCCL and training performance otherwise)" if amd
           else "it can move memory under running GPU kernels")
    return [CheckResult("numa_balancing", "node", WARN if amd else INFO, float(value) if value.isdigit() else None,
                        detail=f"NUMA auto-balancing is on (kernel.numa_balancing={value}): {why}; on the host: "
                               "sudo sysctl kernel.numa_balancing=0")]


NVIDIA_ONLY = ("xid", "throttle", "nvlink")
"""Checks read from NVIDIA's driver (the NVRM kernel log, nvidia-smi)."""


def tool_checks(sku: SkuFacts | None, sysfs: Path, gpus: int, tools: Tools | None = None) -> list[CheckResult]:
    """Every check above, for a node with GPUs. On AMD sizes NVIDIA's driver checks do not
    apply (Azure's MI300X configuration runs none of them either) and are skipped with why."""
    tools = tools or Tools()
    if sku and sku.gpu_vendor == "amd":
        reason = (f"{sku.name} has AMD GPUs: this check reads NVIDIA's driver (nvidia-smi, NVRM kernel log), "
                  "and Azure's MI300X health configuration has no counterpart")
        results = [CheckResult(check, "node", SKIP, detail=reason) for check in NVIDIA_ONLY]
    else:
        results = check_xid(tools) + check_throttle(tools) + check_nvlink(tools, sku) + check_nvlink_fabric(tools, sku)
    results += check_ibstat(tools, sku, sysfs) + check_link_flaps(tools, sku, sysfs) + check_nvme(sysfs, sku)
    results += check_ib_write(tools, sku, sysfs) + check_nccl_tests(tools, sku, gpus) + check_numa_balancing(tools, sku)
    return results


def skipped_on_cpu(reason: str) -> list[CheckResult]:
    """The same checks on a machine that is not the size's hardware: each skipped, with the reason."""
    return [CheckResult(check, "node", SKIP, detail=reason)
            for check in ("xid", "throttle", "nvlink", "ibstat", "ib_link_flaps", "nvme_count", "ib_write", "nccl_tests",
                          "numa_balancing")]
