"""A run's records, read from its folder: what the training, the launcher, the rehearsal and
the supervision wrote, and nothing else. What is absent stays absent (the page says "not
recorded"); nothing is estimated here except where a record names its price.

The folder is a rehearsal's (`.rehearsal/<run>/`) or a download of an Azure ML run's
outputs and logs (`jobs report RUN --stack S`). Files are found by name anywhere below it:

- `std_log_process_<rank>.txt` (Azure ML's user_logs, and the rehearsal's): JSON metric
  lines `{"step": N, ...}` as amlhpc/jobs/workloads/common.py prints them on rank 0: `loss`,
  `epoch_loss`, throughput as `tokens_per_s`, `samples_per_s` or `throughput`, `mfu` (a
  fraction) or `mfu_percent`, and `step_time_s` (with `node`, or on any rank: per-node step
  time); the workload's header line with `peak_tflops` and `peak_source` (MFU's
  denominator). Each attempt of the run is a segment of its own: a rehearsal marks where an
  attempt starts (`{"aml_hpc_attempt": ...}`, amlhpc/jobs/local/rehearsal.py), older logs by
  the launcher's `starting:` line, a download of a managed run by the attempt's job folder;
  a step that goes back starts a segment too.
- `telemetry*.jsonl`: node samples `{"time": <unix s or ISO 8601>, "node": K, "gpus":
  [{"index": i, "util_percent": u, "memory_used_mib": m}], "host": {"cpu_busy_pct": c,
  "memory_used_gib": g}}` (utilisation and memory per GPU, and of the node's host; a node
  without GPUs has `"gpus": {"absent": why}`).
- `launch-node<K>.json` (the launcher's report): seconds per phase; `staging-node<K>.json`:
  files and bytes staged per input; `metrics.json`: the training's summary. A rehearsal
  keeps each attempt's under `attempts/<n>/node<K>/`; where those exist, they are read
  instead of the nodes' own copies (the last attempt's).
- `attempts.jsonl` (one line per rehearsal attempt) and `supervision.json` (a managed run's
  record): the attempts, their times and cost.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LAUNCH_PHASES = ("staging", "health", "pinning", "restore", "training", "final_upload")
"""The order the launcher runs its phases in (amlhpc/jobs/runtime/launch/launcher.py); its report keeps
their durations only."""
THROUGHPUT_KEYS = (("tokens_per_s", "tokens/s"), ("samples_per_s", "samples/s"), ("throughput", "per s"))
_LOG = re.compile(r"std_log_process_(\d+)\.txt$")
_NODE_DIR = re.compile(r"^node(\d+)$")


@dataclass
class Series:
    """One line of a plot: (x, y) points in segments - a new segment for each attempt, after
    a step that goes back (a restart), or across a gap in time - each with its attempt."""

    label: str
    segments: list[list[tuple[float, float]]] = field(default_factory=list)
    attempts: list[int | None] = field(default_factory=list)
    """The attempt (1, 2, ...) of each segment; None where the records do not say."""

    def add(self, x: float, y: float, attempt: int | None = None, gap: float | None = None) -> None:
        last = self.segments[-1][-1][0] if self.segments and self.segments[-1] else None
        if (last is None or x <= last or (self.attempts and attempt != self.attempts[-1])
                or (gap is not None and x - last > gap)):
            self.segments.append([])
            self.attempts.append(attempt)
        self.segments[-1].append((float(x), float(y)))

    @property
    def points(self) -> list[tuple[float, float]]:
        return [p for segment in self.segments for p in segment]


@dataclass
class NodePhases:
    node: int
    host: str
    phases: dict[str, float]
    """Seconds per launcher phase, in LAUNCH_PHASES order."""
    exit_code: int | None
    source: str
    attempt: int | None = None


@dataclass
class Staged:
    node: int
    input: str
    files: int
    bytes_in: int
    bytes_out: int
    seconds: float
    attempt: int | None = None


@dataclass(frozen=True)
class Peak:
    """MFU's denominator as an attempt's header line gave it."""

    attempt: int | None
    tflops: float
    source: str


@dataclass
class Attempt:
    number: int
    name: str
    started: datetime
    ended: datetime | None
    nodes: int
    usd: float | None
    outcome: str


@dataclass
class RunRecords:
    run: str
    folder: Path
    loss: Series | None = None
    epoch_loss: Series | None = None
    throughput: Series | None = None
    throughput_unit: str = ""
    mfu: Series | None = None
    step_times: dict[int, Series] = field(default_factory=dict)
    gpu_util: dict[str, Series] = field(default_factory=dict)
    gpu_memory: dict[str, Series] = field(default_factory=dict)
    host_cpu: dict[str, Series] = field(default_factory=dict)
    host_memory: dict[str, Series] = field(default_factory=dict)
    """Each node's host: CPU busy % and memory used (GiB), from the same samples."""
    gpus_absent: str = ""
    """Why a node's samples hold no GPU (the sampler's own words), when none does."""
    time_origin: float | None = None
    """Unix time of the first telemetry sample: 0 on the time axes."""
    peaks: list[Peak] = field(default_factory=list)
    phases: list[NodePhases] = field(default_factory=list)
    staging: list[Staged] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    cost_basis: str = ""
    """Where the attempts' costs come from (the record, or a rehearsal's planned price)."""
    outcome: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Records that exist but could not be read (named, with why)."""

    def source(self, path: Path) -> None:
        self.sources.append(path.relative_to(self.folder).as_posix())

    def attempt_at(self, when: float) -> int | None:
        """The attempt running at unix time `when` (None: between attempts, or none recorded)."""
        for a in self.attempts:
            end = (a.ended or a.started).timestamp()
            if a.started.timestamp() - 1 <= when <= end + 1:
                return a.number
        return None

    def attempt_of(self, path: Path) -> int | None:
        """The attempt a downloaded file belongs to: a folder named as an attempt's job
        (`jobs report RUN --stack S` downloads each attempt into one), or `attempts/<n>/`."""
        parts = path.relative_to(self.folder).parts
        if len(parts) > 2 and parts[0] == ATTEMPT_REPORTS and parts[1].isdigit():
            return int(parts[1])
        names = {a.name: a.number for a in self.attempts}
        return next((names[p] for p in parts if p in names), None)


ATTEMPT_REPORTS = "attempts"
"""The rehearsal's per-attempt copies of the launcher and staging reports (amlhpc/jobs/local/rehearsal.py)."""
ATTEMPT_MARK = "aml_hpc_attempt"
"""The line a rehearsal writes into each process log where an attempt starts (amlhpc/jobs/local/rehearsal.py)."""
_LAUNCH_STARTING = re.compile(r"^\[launch rank \d+\] starting: ")
"""The launcher's line as the attempt's training starts (an in-job restart says `starting (in-job restart N)`)."""


def read(folder: Path, run: str | None = None) -> RunRecords:
    """Everything the folder records about the run."""
    records = RunRecords(run or folder.name, folder)
    _attempts(records)
    _metrics(records)
    _telemetry(records)
    _launch_reports(records)
    summary = _first(folder, "metrics.json")
    if summary is not None:
        records.summary = _json(records, summary) or {}
    return records


def _first(folder: Path, name: str) -> Path | None:
    return next(iter(sorted(folder.rglob(name))), None)


def _json(records: RunRecords, path: Path) -> Any:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        records.problems.append(f"{path.relative_to(records.folder)}: {exc}")
        return None
    records.source(path)
    return document


def _node_of(path: Path, folder: Path) -> int | None:
    for part in path.relative_to(folder).parts:
        match = _NODE_DIR.match(part)
        if match:
            return int(match.group(1))
    return None


def _log_lines(path: Path, attempt_of_file: int | None):
    """(attempt, JSON object) of every JSON line of a process log; the attempt counts the
    rehearsal's attempt marks, else the launcher's `starting:` lines, else is the file's own."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    lines = text.splitlines()
    marked = any(ATTEMPT_MARK in line for line in lines)
    attempt = attempt_of_file
    counted = 0
    for line in lines:
        line = line.strip()
        if attempt_of_file is None and (ATTEMPT_MARK in line if marked else _LAUNCH_STARTING.match(line)):
            counted += 1
            attempt = counted
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield (attempt if attempt is not None or attempt_of_file is not None else 1), value


def _metrics(records: RunRecords) -> None:
    logs = sorted(((int(m.group(1)), records.attempt_of(p) or 0, p) for p in records.folder.rglob("std_log_process_*.txt")
                   if (m := _LOG.search(p.name))), key=lambda item: (item[0], item[1], item[2]))
    for rank, attempt_of_file, path in logs:
        read_any = False
        for attempt, line in _log_lines(path, attempt_of_file or None):
            if rank == 0 and isinstance(line.get("peak_tflops"), int | float) and "step" not in line:
                records.peaks.append(Peak(attempt, float(line["peak_tflops"]), str(line.get("peak_source") or "")))
            if not isinstance(line.get("step"), int):
                continue
            read_any = True
            step = line["step"]
            if rank == 0:
                _rank0_line(records, step, line, attempt)
            step_time = line.get("step_time_s")
            if isinstance(step_time, int | float):
                node = line.get("node", _node_of(path, records.folder) if rank else 0)
                node = int(node) if isinstance(node, int) else rank
                records.step_times.setdefault(node, Series(f"node {node}")).add(step, step_time, attempt)
        if read_any:
            records.source(path)


def _rank0_line(records: RunRecords, step: int, line: dict[str, Any], attempt: int | None) -> None:
    if isinstance(line.get("loss"), int | float):
        records.loss = records.loss or Series("loss per step")
        records.loss.add(step, line["loss"], attempt)
    if isinstance(line.get("epoch_loss"), int | float):
        records.epoch_loss = records.epoch_loss or Series("mean loss per epoch")
        records.epoch_loss.add(step, line["epoch_loss"], attempt)
    for key, unit in THROUGHPUT_KEYS:
        if isinstance(line.get(key), int | float):
            records.throughput = records.throughput or Series(key)
            records.throughput_unit = records.throughput_unit or unit
            if records.throughput.label == key:
                records.throughput.add(step, line[key], attempt)
            break
    mfu = line.get("mfu_percent", line["mfu"] * 100 if isinstance(line.get("mfu"), int | float) else None)
    if isinstance(mfu, int | float):
        records.mfu = records.mfu or Series("MFU %")
        records.mfu.add(step, mfu, attempt)


def _when(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _telemetry(records: RunRecords) -> None:
    samples, hosts = [], []
    for path in sorted(records.folder.rglob("telemetry*.jsonl")):
        node_dir = _node_of(path, records.folder)
        count = 0
        for line in path.read_text(errors="replace").splitlines():
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            when = _when(sample.get("time")) if isinstance(sample, dict) else None
            if when is None:
                continue
            node = sample.get("node", node_dir if node_dir is not None else 0)
            gpus = sample.get("gpus")  # {"absent": why} on a node without GPUs
            for gpu in gpus if isinstance(gpus, list) else []:
                if isinstance(gpu, dict):
                    samples.append((when, node, gpu))
                    count += 1
            if isinstance(gpus, dict) and isinstance(gpus.get("absent"), str):
                records.gpus_absent = records.gpus_absent or gpus["absent"]
            if isinstance(sample.get("host"), dict):
                hosts.append((when, node, sample["host"]))
                count += 1
        if count:
            records.source(path)
    if samples or hosts:
        start = min(s[0] for s in samples + hosts)
        records.time_origin = start
        gap = _gap([s[0] for s in samples + hosts])
        _gpu_series(records, samples, start, gap)
        _host_series(records, hosts, start, gap)


def _gap(times: list[float]) -> float:
    """Seconds between samples beyond which a line stops: the sampling interval, several times
    over (a run between attempts, a sampler that stopped), at least 10 s."""
    ordered = sorted(set(times))
    steps = sorted(b - a for a, b in zip(ordered, ordered[1:], strict=False))
    typical = steps[len(steps) // 2] if steps else 0.0
    return max(10.0, 5 * typical)


def _gpu_series(records: RunRecords, samples: list, start: float, gap: float) -> None:
    for when, node, gpu in sorted(samples, key=lambda s: s[0]):
        label = f"node {node} gpu {gpu.get('index', '?')}"
        util = gpu.get("util_percent", gpu.get("utilization_percent"))
        memory = gpu.get("memory_used_mib")
        if memory is None and isinstance(gpu.get("memory_used_bytes"), int | float):
            memory = gpu["memory_used_bytes"] / 2**20
        attempt = records.attempt_at(when)
        if isinstance(util, int | float):
            records.gpu_util.setdefault(label, Series(label)).add(when - start, util, attempt, gap)
        if isinstance(memory, int | float):
            records.gpu_memory.setdefault(label, Series(label)).add(when - start, memory / 1024, attempt, gap)


def _host_series(records: RunRecords, hosts: list, start: float, gap: float) -> None:
    for when, node, host in sorted(hosts, key=lambda s: s[0]):
        label = f"node {node}"
        attempt = records.attempt_at(when)
        if isinstance(host.get("cpu_busy_pct"), int | float):  # absent from a node's first sample
            records.host_cpu.setdefault(label, Series(label)).add(when - start, host["cpu_busy_pct"], attempt, gap)
        if isinstance(host.get("memory_used_gib"), int | float):
            records.host_memory.setdefault(label, Series(label)).add(when - start, host["memory_used_gib"], attempt, gap)


def _reports(records: RunRecords, pattern: str) -> list[Path]:
    """The reports named `pattern`: each attempt's kept copies where a rehearsal kept them
    (the nodes' own copies are the last attempt's again), else every one."""
    found = sorted(records.folder.rglob(pattern))
    kept = [p for p in found if p.relative_to(records.folder).parts[0] == ATTEMPT_REPORTS]
    return kept or found


def _launch_reports(records: RunRecords) -> None:
    for path in _reports(records, "launch-node*.json"):
        doc = _json(records, path)
        if not isinstance(doc, dict):
            continue
        phases = doc.get("phases") or {}
        ordered = {k: float(phases[k]) for k in LAUNCH_PHASES if isinstance(phases.get(k), int | float)}
        ordered |= {k: float(v) for k, v in phases.items() if k not in ordered and isinstance(v, int | float)}
        records.phases.append(NodePhases(int(doc.get("node", _node_of(path, records.folder) or 0)),
                                         str(doc.get("host", "")), ordered, doc.get("exit_code"),
                                         path.relative_to(records.folder).as_posix(), records.attempt_of(path)))
    for path in _reports(records, "staging-node*.json"):
        doc = _json(records, path)
        if not isinstance(doc, dict):
            continue
        node = int(doc.get("node_index", _node_of(path, records.folder) or 0))
        for item in doc.get("inputs") or []:
            records.staging.append(Staged(node, str(item.get("name", "?")), int(item.get("files_node") or 0),
                                          int(item.get("bytes_in") or 0), int(item.get("bytes_out") or 0),
                                          float(item.get("seconds") or 0.0), records.attempt_of(path)))
    records.phases.sort(key=lambda p: (p.attempt or 0, p.node))
    records.staging.sort(key=lambda s: (s.attempt or 0, s.node, s.input))


def _time(text: Any) -> datetime | None:
    when = _when(text)
    return datetime.fromtimestamp(when, UTC) if when is not None else None


def _attempts(records: RunRecords) -> None:
    record_path = _first(records.folder, "supervision.json")
    if record_path is not None and _managed_attempts(records, record_path):
        return
    path = records.folder / "attempts.jsonl"
    if not path.is_file():
        return
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]
    records.source(path)
    prices = set()
    for i, line in enumerate(lines, 1):
        started, ended = _time(line.get("started_at")), _time(line.get("ended_at"))
        if started is None:
            continue
        price, nodes = line.get("usd_per_node_hour"), int(line.get("nodes") or 0)
        hours = (ended - started).total_seconds() / 3600 if ended else 0.0
        usd = nodes * hours * price if isinstance(price, int | float) else None
        codes = [int(c) for c in (line.get("exit_codes") or {}).values()]
        canceled = line.get("canceled") if isinstance(line.get("canceled"), dict) else None
        outcome = f"canceled (by {canceled.get('by') or 'a user'})" if canceled else \
            "succeeded" if codes and all(c == 0 for c in codes) else \
            f"failed (status {next(c for c in codes if c != 0)})" if codes else "?"
        records.attempts.append(Attempt(i, str(line.get("run_id", f"attempt {i}")), started, ended, nodes, usd, outcome))
        if isinstance(price, int | float):
            prices.add((line.get("sku"), price, line.get("price_source")))
    if prices:
        sku, price, source = sorted(prices, key=str)[-1]
        records.cost_basis = (f"rehearsal time x nodes at the planned size's price ({sku}, ${price:,.3f}/node-hour, "
                              f"{source}): what the same time would cost in Azure")
    if records.attempts:
        records.outcome = records.attempts[-1].outcome


def _managed_attempts(records: RunRecords, path: Path) -> bool:
    from amlhpc.jobs.managed.record import Record

    data = _json(records, path)
    try:
        record = Record.from_json(data)
    except (TypeError, ValueError) as exc:
        records.problems.append(f"{path.relative_to(records.folder)}: {exc}")
        return False
    policy = record.rules()
    for a in record.attempts:
        started = _time(a.started_at) or _time(a.submitted_at)
        if started is None:
            continue
        ended = _time(a.ended_at)
        usd = a.usd if a.usd is not None else policy.attempt_usd(a.hours(ended or datetime.now(UTC)))
        outcome = a.status or a.state
        if a.cause:
            outcome += f": {a.cause}"
        records.attempts.append(Attempt(a.number, a.job, started, ended, a.nodes, usd, outcome))
    records.cost_basis = (f"the managed run's record (attempts, plus "
                          f"${record.controller_usd(policy.controller_usd_per_hour):,.2f} for its controller)")
    records.outcome = record.state + (f": {record.reason}" if record.reason else "")
    return True
