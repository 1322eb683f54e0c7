"""Node telemetry while the training runs, so that a slow step can be explained afterwards.

The launcher's local rank 0 of each node starts a `Sampler` with the training command and
stops it when the command exits. Every `interval_s` (AMLHPC_TELEMETRY_INTERVAL_S, default 30;
0 turns it off) it records one sample:

- every GPU, through NVML (amlhpc.jobs.runtime.node.nvml): utilisation of the GPU and of its memory (%),
  memory used and total (MiB), power draw and limit (W), temperature (C), SM and memory clocks
  (MHz), the active clock event ("throttle") reasons by the names nvidia-smi prints, and the
  XID events NVML delivered since the previous sample (critical: in Azure's list of XIDs that
  fail a node, amlhpc.jobs.runtime.node.xids.CRITICAL_XIDS);
- every RDMA port, from sysfs (amlhpc.jobs.runtime.node.rdma): state, rate, and its counters
  (counters/*): data sent and received as Gb/s over the interval (port_xmit_data and
  port_rcv_data count 4-byte words, the InfiniBand PortCounters convention the kernel keeps),
  and how much every error counter grew;
- the host: CPU busy % over the interval (/proc/stat), load average, memory used and available;
- the step the node's local rank 0 last reported (amlhpc.jobs.runtime.base.progress), to line samples up
  with the training's own step log.

Where a source is missing (no NVIDIA driver, no NVML bindings, no RDMA device) the sample
says so (`"gpus": {"absent": "<why>"}`) and records nothing in its place: a CPU rehearsal
has host figures only. Samples go, as JSON lines, to `<report dir>/telemetry-node<k>.jsonl`
(the run's record: uploaded with outputs/), and the node's summary (samples, peaks, XIDs,
throttle reasons seen, IB error growth) to `<report dir>/telemetry-node<k>.summary.json`,
rewritten after every sample, so a node that dies mid-run still leaves its summary; the
summary also goes into the launch report.

MLflow gets only a few run-wide metrics (`RUN_METRICS`), from the first node alone, when mlflow
is installed and MLFLOW_TRACKING_URI is set (Azure ML sets it in every job): Azure ML keeps at
most 50 metric names per run and 1 million values per run (Microsoft Learn, "Service limits in
Azure Machine Learning" and "Manage and increase quotas and limits for resources with Azure
Machine Learning", 2026-01), and ~110 figures per node every 30 s would be 13 M values per
run-hour at 1,000 nodes. `logged_values()` says what a run logs: it does not grow with the
node count (tests/test_telemetry.py holds it under the limit at 1,000 nodes for 24 h).

Standard library (mlflow and the NVML bindings when the image has them): ships in the image.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import contract, progress
from amlhpc.jobs.runtime.node import nvml, rdma
from amlhpc.jobs.runtime.node.xids import CRITICAL_XIDS

log = logging.getLogger("amlhpc.telemetry")

DEFAULT_INTERVAL_S = 30.0
FILE_PATTERN = "telemetry-node{node:03d}.jsonl"
SUMMARY_PATTERN = "telemetry-node{node:03d}.summary.json"
METRICS_NODE = 0
"""The node whose sampler logs `RUN_METRICS`; the others write their files only."""
RUN_METRICS = ("telemetry/gpu_util_mean_pct", "telemetry/gpu_temperature_max_c", "telemetry/gpu_sm_clock_min_mhz",
               "telemetry/gpus_throttled", "telemetry/xid_events", "telemetry/ib_xmit_gbits_per_s",
               "telemetry/ib_rcv_gbits_per_s", "telemetry/ib_errors_grown", "telemetry/cpu_busy_pct", "telemetry/step")
"""Every metric name telemetry logs to the run (the first node's figures, one value each per sample)."""
EVENT_REASONS = (  # nvml.h clocks event reason bits, named as nvidia-smi -q -d PERFORMANCE prints them
    (0x1, "Idle"), (0x2, "Applications Clocks Setting"), (0x4, "SW Power Cap"), (0x8, "HW Slowdown"),
    (0x10, "Sync Boost"), (0x20, "SW Thermal Slowdown"), (0x40, "HW Thermal Slowdown"),
    (0x80, "HW Power Brake Slowdown"), (0x100, "Display Clock Setting"),
)
RATE_COUNTERS = {"port_xmit_data": "xmit_gbits_per_s", "port_rcv_data": "rcv_gbits_per_s"}
"""Counted in 4-byte words; reported as Gb/s over the interval."""
ERROR_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                  "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
                  "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors", "VL15_dropped", "port_xmit_wait")
"""Reported as their growth since the previous sample (port_xmit_wait: ticks the port had data
to send and no credit, congestion rather than an error)."""


def interval_from_env(environ: Mapping[str, str]) -> float:
    """AMLHPC_TELEMETRY_INTERVAL_S, or the default; a bad value is named and the default used."""
    raw = environ.get(contract.TELEMETRY_INTERVAL_S, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        log.warning("%s=%r is not a number of seconds >= 0: sampling every %gs", contract.TELEMETRY_INTERVAL_S, raw,
                    DEFAULT_INTERVAL_S)
        return DEFAULT_INTERVAL_S
    return value


# --- GPUs ------------------------------------------------------------------------------


class GpuReader:
    """NVML readings per GPU, and the XID events NVML queued since the last call."""

    def __init__(self, module: Any | None = None):
        self.session = nvml.open_nvml(module)
        self.reason = self.session.reason
        self.handles: list[Any] = []
        self.bus_ids: list[str] = []
        self.events = None
        lib: Any = self.session.lib
        if lib is None:
            return
        try:
            count = lib.nvmlDeviceGetCount()
            self.handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.bus_ids = [nvml.bus_id(lib, h) for h in self.handles]
        except lib.NVMLError as exc:
            self.reason = f"NVML could not list the GPUs ({nvml.error_text(lib, exc)})"
            self.close()
            return
        if not self.handles:
            self.reason = "NVML found no GPU"
            self.close()
            return
        self._register_xid_events()

    def _register_xid_events(self) -> None:
        lib: Any = self.session.lib
        try:
            events = lib.nvmlEventSetCreate()
        except lib.NVMLError as exc:
            log.info("telemetry: no NVML event set (%s): XID events are not watched", nvml.error_text(lib, exc))
            return
        registered = 0
        for handle in self.handles:
            try:
                lib.nvmlDeviceRegisterEvents(handle, lib.nvmlEventTypeXidCriticalError, events)
                registered += 1
            except lib.NVMLError as exc:
                log.info("telemetry: XID events not available on a GPU (%s)", nvml.error_text(lib, exc))
        self.events = events if registered else None

    @property
    def present(self) -> bool:
        return self.session.lib is not None

    def read(self) -> list[dict[str, Any]]:
        """One record per GPU; a figure NVML refuses is left out (never guessed)."""
        lib: Any = self.session.lib
        out = []
        for index, handle in enumerate(self.handles):
            gpu: dict[str, Any] = {"index": index, "bus_id": self.bus_ids[index]}
            self._try(gpu, handle, lambda h: _utilisation(lib, h))
            self._try(gpu, handle, lambda h: _memory(lib, h))
            self._try(gpu, handle, lambda h: {"power_w": lib.nvmlDeviceGetPowerUsage(h) / 1000.0})
            self._try(gpu, handle, lambda h: {"power_limit_w": lib.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0})
            self._try(gpu, handle, lambda h: {"temperature_c": lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU)})
            self._try(gpu, handle, lambda h: {"sm_clock_mhz": lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM)})
            self._try(gpu, handle, lambda h: {"memory_clock_mhz": lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_MEM)})
            self._try(gpu, handle, lambda h: {"throttle_reasons": reason_names(lib.nvmlDeviceGetCurrentClocksEventReasons(h))})
            out.append(gpu)
        return out

    def _try(self, record: dict[str, Any], handle: Any, read: Callable[[Any], dict[str, Any]]) -> None:
        lib: Any = self.session.lib
        try:
            record.update(read(handle))
        except lib.NVMLError as exc:
            record.setdefault("unavailable", []).append(nvml.error_text(lib, exc))

    def xid_events(self) -> list[dict[str, Any]]:
        """Every XID event queued since the last call (a zero-timeout wait until NVML has none)."""
        lib: Any = self.session.lib
        if lib is None or self.events is None:
            return []
        found = []
        while True:
            try:
                event = lib.nvmlEventSetWait_v2(self.events, 0)
            except lib.NVMLError as exc:
                if not nvml.is_error(lib, exc, "NVML_ERROR_TIMEOUT"):
                    log.info("telemetry: reading NVML events failed (%s)", nvml.error_text(lib, exc))
                return found
            try:
                bus = nvml.bus_id(lib, event.device)
            except lib.NVMLError:
                bus = ""
            xid = int(event.eventData)
            found.append({"gpu": self.bus_ids.index(bus) if bus in self.bus_ids else None, "bus_id": bus, "xid": xid,
                          "critical": xid in CRITICAL_XIDS})

    def close(self) -> None:
        lib: Any = self.session.lib
        if lib is not None and self.events is not None:
            try:
                lib.nvmlEventSetFree(self.events)
            except lib.NVMLError:
                pass
            self.events = None
        self.session.close()


def _utilisation(lib, handle) -> dict[str, Any]:
    rates = lib.nvmlDeviceGetUtilizationRates(handle)
    return {"util_percent": rates.gpu, "memory_util_percent": rates.memory}  # the names `jobs report` reads


def _memory(lib, handle) -> dict[str, Any]:
    info = lib.nvmlDeviceGetMemoryInfo(handle)
    return {"memory_used_mib": info.used / (1 << 20), "memory_total_mib": info.total / (1 << 20)}


def reason_names(mask: int) -> list[str]:
    """The clocks event reasons in an NVML bit mask, by nvidia-smi's names."""
    return [name for bit, name in EVENT_REASONS if mask & bit]


# --- RDMA ports and the host ---------------------------------------------------------------


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def port_counters(sysfs: Path, port: rdma.RdmaPort) -> dict[str, int]:
    folder = sysfs / "class" / "infiniband" / port.device / "ports" / port.port / "counters"
    found = {}
    for name in (*RATE_COUNTERS, *ERROR_COUNTERS):
        value = _read_int(folder / name)
        if value is not None:
            found[name] = value
    return found


def _cpu_times(proc: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    try:
        first = (proc / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    values = [int(v) for v in first[1:] if v.isdigit()]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def _memory_kib(proc: Path) -> dict[str, int]:
    found = {}
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                found[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return found


# --- the sampler ---------------------------------------------------------------------------


@dataclass
class Summary:
    """What the launch report says about the node's telemetry."""

    samples: int = 0
    file: str | None = None
    gpus: int = 0
    gpu_absent: str | None = None
    ib_ports: int = 0
    max_temperature_c: float | None = None
    min_sm_clock_mhz: float | None = None
    throttle_reasons_seen: list[str] = field(default_factory=list)
    xid_events: list[dict[str, Any]] = field(default_factory=list)
    xids_watched: bool = False
    """Whether NVML delivered XID events to us at all (a container may not be allowed to)."""
    ib_errors: dict[str, int] = field(default_factory=dict)
    """Per port: how much its error counters grew while the training ran."""
    max_cpu_busy_pct: float | None = None


class Sampler:
    """Samples the node every `interval_s` on a thread, between `start()` and `stop()`."""

    def __init__(self, node: int, report_dir: Path, interval_s: float, *, sysfs: Path = Path("/sys"),
                 proc: Path = Path("/proc"), nvml_module: Any | None = None,
                 progress_file: Path | Callable[[], Path | None] | None = None,
                 mlflow: Any | None = None, clock: Callable[[], float] = time.time):
        self.node, self.interval_s, self.sysfs, self.proc = node, interval_s, sysfs, proc
        self.progress_file, self.clock = progress_file, clock
        self.path = Path(report_dir) / FILE_PATTERN.format(node=node)
        self.summary_path = Path(report_dir) / SUMMARY_PATTERN.format(node=node)
        self.gpus = GpuReader(nvml_module)
        self.mlflow = mlflow if node == METRICS_NODE else None  # the run's metric count must not grow with N
        self.summary = Summary(file=str(self.path), gpus=len(self.gpus.handles),
                               gpu_absent=None if self.gpus.present else self.gpus.reason,
                               xids_watched=self.gpus.events is not None)
        self._previous_ports: dict[str, dict[str, int]] = {}
        self._previous_cpu = _cpu_times(proc)
        self._previous_time = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # one sample
    def sample(self) -> dict[str, Any]:
        """Take, record and return one sample."""
        with self._lock:
            now = self.clock()
            elapsed = max(now - self._previous_time, 1e-9)
            record: dict[str, Any] = {"time": round(now, 3), "node": self.node, "interval_s": round(elapsed, 3)}
            where = self.progress_file() if callable(self.progress_file) else self.progress_file
            reading = progress.read(where) if where else None
            record["step"] = reading.step if reading else None
            if self.gpus.present:
                record["gpus"] = self.gpus.read()
                record["xid_events"] = self.gpus.xid_events()
            else:
                record["gpus"] = {"absent": self.gpus.reason}
            record["ib"] = self._ports(elapsed)
            record["host"] = self._host()
            self._previous_time = now
            self._record(record)
            return record

    def _ports(self, elapsed: float) -> dict[str, Any]:
        ports = rdma.rdma_ports(self.sysfs)
        out: dict[str, Any] = {}
        for port in ports:
            counters = port_counters(self.sysfs, port)
            before = self._previous_ports.get(port.name)
            entry: dict[str, Any] = {"state": port.state, "rate_gbits": port.rate_gbits, "link_layer": port.link_layer}
            if before is not None:
                for name, label in RATE_COUNTERS.items():
                    if name in counters and name in before:
                        entry[label] = max(counters[name] - before[name], 0) * 4 * 8 / elapsed / 1e9
                grown = {name: counters[name] - before[name] for name in ERROR_COUNTERS
                         if name in counters and name in before and counters[name] > before[name]}
                if grown:
                    entry["errors_grown"] = grown
            self._previous_ports[port.name] = counters
            out[port.name] = entry
        return out

    def _host(self) -> dict[str, Any]:
        host: dict[str, Any] = {}
        cpu = _cpu_times(self.proc)
        if cpu and self._previous_cpu and cpu[1] > self._previous_cpu[1]:
            host["cpu_busy_pct"] = 100.0 * (cpu[0] - self._previous_cpu[0]) / (cpu[1] - self._previous_cpu[1])
        self._previous_cpu = cpu or self._previous_cpu
        try:
            host["load_1m"] = float((self.proc / "loadavg").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
        memory = _memory_kib(self.proc)
        if "MemTotal" in memory and "MemAvailable" in memory:
            host["memory_used_gib"] = (memory["MemTotal"] - memory["MemAvailable"]) / (1 << 20)
            host["memory_available_gib"] = memory["MemAvailable"] / (1 << 20)
        return host

    def _record(self, record: dict[str, Any]) -> None:
        self._summarise(record)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
            # through a temporary name: a reader (or the upload of outputs/) never sees half a summary
            tmp = self.summary_path.with_name(f".{self.summary_path.name}.tmp")
            tmp.write_text(json.dumps(self.summary.__dict__, indent=1, sort_keys=True))
            os.replace(tmp, self.summary_path)
        except OSError as exc:
            log.warning("telemetry: could not write %s: %s", self.path, exc)
        if self.mlflow is not None:
            try:
                self.mlflow.log_metrics(metrics_of(record), step=self.summary.samples)
            except Exception as exc:  # noqa: BLE001 - metrics are a convenience; the file is the record
                log.warning("telemetry: MLflow refused the metrics (%s: %s); the samples stay in %s", type(exc).__name__,
                            exc, self.path)
                self.mlflow = None

    def _summarise(self, record: dict[str, Any]) -> None:
        s = self.summary
        s.samples += 1
        for gpu in record["gpus"] if isinstance(record["gpus"], list) else []:
            if "temperature_c" in gpu:
                s.max_temperature_c = _extreme(max, s.max_temperature_c, gpu["temperature_c"])
            if "sm_clock_mhz" in gpu:
                s.min_sm_clock_mhz = _extreme(min, s.min_sm_clock_mhz, gpu["sm_clock_mhz"])
            for reason in gpu.get("throttle_reasons", []):
                if reason not in s.throttle_reasons_seen:
                    s.throttle_reasons_seen.append(reason)
        s.xid_events.extend(record.get("xid_events", []))
        s.ib_ports = len(record["ib"])
        for name, port in record["ib"].items():
            for counter, grown in port.get("errors_grown", {}).items():
                key = f"{name} {counter}"
                s.ib_errors[key] = s.ib_errors.get(key, 0) + grown
        busy = record["host"].get("cpu_busy_pct")
        if busy is not None:
            s.max_cpu_busy_pct = _extreme(max, s.max_cpu_busy_pct, busy)

    # the thread
    def start(self) -> Sampler:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="amlhpc-telemetry", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception as exc:  # noqa: BLE001 - telemetry must never stop a training
                log.warning("telemetry: a sample failed (%s: %s)", type(exc).__name__, exc)

    def stop(self) -> dict[str, Any]:
        """A last sample, then the summary for the launch report."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            self.sample()
        except Exception as exc:  # noqa: BLE001
            log.warning("telemetry: the last sample failed (%s: %s)", type(exc).__name__, exc)
        self.gpus.close()
        return self.summary.__dict__


def _extreme(pick, current, value):
    return value if current is None else pick(current, value)


def metrics_of(record: Mapping[str, Any]) -> dict[str, float]:
    """A sample as the run's few metrics (`RUN_METRICS`): means, extremes and sums over the node's
    GPUs and ports, so the names never carry a node, GPU or port (the files keep those)."""
    out: dict[str, float] = {}
    gpus = record["gpus"] if isinstance(record["gpus"], list) else []
    utils = [g["util_percent"] for g in gpus if isinstance(g.get("util_percent"), int | float)]
    temps = [g["temperature_c"] for g in gpus if isinstance(g.get("temperature_c"), int | float)]
    clocks = [g["sm_clock_mhz"] for g in gpus if isinstance(g.get("sm_clock_mhz"), int | float)]
    if utils:
        out["telemetry/gpu_util_mean_pct"] = float(sum(utils) / len(utils))
    if temps:
        out["telemetry/gpu_temperature_max_c"] = float(max(temps))
    if clocks:
        out["telemetry/gpu_sm_clock_min_mhz"] = float(min(clocks))
    if gpus:
        out["telemetry/gpus_throttled"] = float(sum(bool(set(g.get("throttle_reasons", [])) - {"Idle"}) for g in gpus))
        out["telemetry/xid_events"] = float(len(record.get("xid_events", [])))
    ports = record["ib"].values()
    if ports:
        for key in ("xmit_gbits_per_s", "rcv_gbits_per_s"):
            if any(key in port for port in ports):
                out[f"telemetry/ib_{key}"] = float(sum(port.get(key, 0.0) for port in ports))
        out["telemetry/ib_errors_grown"] = float(sum(sum(p.get("errors_grown", {}).values()) for p in ports))
    if "cpu_busy_pct" in record["host"]:
        out["telemetry/cpu_busy_pct"] = float(record["host"]["cpu_busy_pct"])
    if record.get("step") is not None:
        out["telemetry/step"] = float(record["step"])
    return out


def logged_values(hours: float, interval_s: float = DEFAULT_INTERVAL_S) -> int:
    """At most how many metric values telemetry logs to a run of `hours`, whatever its node count:
    every `RUN_METRICS` name once per sample, one sample per interval plus the first and last."""
    if interval_s <= 0:
        return 0
    return len(RUN_METRICS) * (int(hours * 3600 / interval_s) + 2)


def _mlflow(environ: Mapping[str, str]) -> Any | None:
    if not environ.get("MLFLOW_TRACKING_URI"):
        return None
    try:
        import mlflow
    except ImportError:
        return None
    return mlflow


def start_for(launcher) -> Sampler | None:
    """The launcher's hook: a started Sampler on the node's local rank 0, else None."""
    if not launcher.ranks.is_node_leader:
        return None
    interval = interval_from_env(launcher.environ)
    if interval <= 0:
        return None
    def progress_file() -> Path | None:  # each in-job restart's command reports into a file of its own
        value = launcher.child_env.get(contract.PROGRESS_FILE)
        return Path(value) if value else None

    try:
        return Sampler(launcher.ranks.node_index, launcher.options.report_dir, interval, sysfs=launcher.options.sysfs,
                       progress_file=progress_file,
                       mlflow=_mlflow(launcher.environ)).start()
    except Exception as exc:  # noqa: BLE001 - telemetry must never stop a training
        log.warning("telemetry not started (%s: %s)", type(exc).__name__, exc)
        return None


