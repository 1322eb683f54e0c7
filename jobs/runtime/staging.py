"""Stage datasets from Blob to the node's scratch (or a shared mount) before training starts.

Entry point (what `jobs.runtime.launch` calls, on every process of the job):

    result = stage_inputs(specs, ranks)            # -> StageResult
    os.environ.update(result.env_for(ranks.rank))  # AMLHPC_DATA_DIR_<NAME>, AMLHPC_FILE_LIST_<NAME>

    specs: list[StageSpec], usually `specs_from_env()` (AMLHPC_STAGE_JSON, docs/contracts.md s. 4)
    ranks: jobs.runtime.ranks.Ranks, usually `ranks.from_env()`
    scratch: optional Path; default `scratch.pick_scratch()` (AMLHPC_SCRATCH > NVMe RAID0 > /mnt)
    shared_dir: optional Path; default AMLHPC_SHARED_DIR (needed by `shared` inputs)
    options: StageOptions (concurrency, bandwidth cap, timeouts, retry settings, report dir)

Local rank 0 of each node stages; every other local rank blocks in the same call at a
node-local barrier and gets the same StageResult once staging is done, or an exception
(`StagingError` with local rank 0's message, `BarrierTimeout`). Exceptions are the only
failure signal: an error never leaves a process believing the data is there.

Modes (per input, `mode` in AMLHPC_STAGE_JSON):

- `local`: each node downloads what its own ranks read. Files are split over nodes,
  balancing bytes (jobs.runtime.assign: largest first, then local search), and each
  node's share over its local ranks the same way. Rank r reads the files listed in
  `<scratch>/.amlhpc-staging/<name>/ranks/<r>.txt` (one path a line, relative to the data
  directory, sorted), which `AMLHPC_FILE_LIST_<NAME>` names. Every process derives the
  split from the same sorted listing, so it is deterministic; with equal file sizes the
  counts per rank differ by at most one.
- `replica`: every node downloads every file (no file lists: each rank sees it all).
- `shared`: the nodes together fill one shared directory (BeeOND/NFS, AMLHPC_SHARED_DIR),
  each downloading a disjoint, byte-balanced share; a node's ranks are released only when
  every node has finished (markers on the shared mount).

Data lands in `<root>/<name>/<path under prefix>` with `.gz` dropped for gzip blobs,
where root is the scratch (local, replica) or the shared directory. Staging's own files
(manifest, partial downloads, file lists) live beside it in `<root>/.amlhpc-staging/<name>/`,
never inside the data directory. A re-run skips every file the manifest records as
finished (same blob etag or checksum, same size on disk), adopts complete files from a
run killed between rename and record (their checksum is checked), and removes partial
downloads left behind. The per-node report (bytes in, bytes out, files, seconds, MB/s,
max/mean bytes per node, warnings) goes to `<report dir>/staging-node<k>.json`.

Command line: `python -m jobs.runtime.staging [options]` does the same for one process
(see --help). Exit codes: 0 staged; 2 bad input (stage spec, rank variables, scratch);
3 staging failed (a blob, another node or local rank 0 failed; the message names it);
4 timed out waiting for local rank 0 or another node.

The pieces, one module each: stagespec (the inputs), assign (the byte-balanced split),
fetch (one blob to one file), manifest (resume), nodebarrier (waiting), scratch (where),
blobio (clients and retries), throttle (the cap). This module wires them together.

Standard library plus azure-storage-blob / azure-identity / isal: ships in the image and
imports nothing from this repository outside jobs.runtime.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from jobs.runtime import assign, blobio, contract
from jobs.runtime import ranks as ranks_module
from jobs.runtime import scratch as scratch_module
from jobs.runtime.fetch import BlobEntry, Fetcher, FetchError, FetchResult
from jobs.runtime.manifest import Manifest, adoptable
from jobs.runtime.nodebarrier import (
    BarrierFailed,
    BarrierTimeout,
    NodeBarrier,
    SharedMarkers,
    write_json_atomic,
)
from jobs.runtime.stagespec import (  # re-exported: launch and tests use staging's names
    MODES,
    Mode,
    StageConfigError,
    StageSpec,
    egress_warning,
    node_gbits_from_env,
    specs_from_env,
    specs_from_json,
)
from jobs.runtime.throttle import Throttle

log = logging.getLogger("amlhpc.staging")

STAGING_DIR = ".amlhpc-staging"
TIMEOUT_VARIABLE = contract.STAGE_TIMEOUT_S
DEFAULT_TIMEOUT_S = 3 * 3600.0

EXIT_OK, EXIT_USAGE, EXIT_FAILED, EXIT_TIMEOUT = 0, 2, 3, 4

__all__ = ["StageSpec", "StageOptions", "StageResult", "InputResult", "StageConfigError", "StagingError",
           "BarrierTimeout", "stage_inputs", "specs_from_env", "specs_from_json", "egress_warning", "node_gbits_from_env",
           "MODES", "Mode"]


class StagingError(RuntimeError):
    """Staging did not complete; the message names the blobs or the node that failed."""


# ------------------------------------------------------------------ options and results


@dataclass(frozen=True)
class StageOptions:
    """How a node stages. None means 'derived from the CPU count'."""

    concurrency: int | None = None
    """HTTP requests in flight per node (default 8 per CPU, 16 to 64)."""
    file_workers: int | None = None
    """Files downloaded, decompressed and written at once (default 2 per CPU, 4 to 32)."""
    range_bytes: int = 8 << 20
    """Stored bytes per ranged GET; a blob larger than this is fetched in parallel ranges."""
    window: int = 4
    """Ranged GETs in flight per file."""
    cap_mbps: float | None = None
    """Bandwidth cap for this node's downloads, Mb/s (None: uncapped)."""
    node_gbits_per_s: float | None = None
    """What one node pulls from Blob (SKU storage_nic_gbits_per_s), for the egress warning."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """How long local ranks (and nodes, in shared mode) wait for staging to finish."""
    verify_existing: bool = False
    """Re-hash files the manifest says are finished instead of trusting size + record."""
    verify_sha256: bool = True
    """Check each file's SHA-256 against amlhpc_sha256. Off: size, gzip CRC-32 and the
    blob's etag are still checked; saves the hash's CPU where it costs more than inflating
    (CPUs without SHA instructions; bench/RESULTS.md)."""
    retry: blobio.RetrySettings = field(default_factory=blobio.RetrySettings)
    blob_attempts: int = 4
    """Whole-blob attempts on network failures beyond the retry policy's budget."""
    report_dir: Path | None = None
    """Where the per-node JSON report goes (default AMLHPC_REPORT_DIR or outputs/aml-hpc)."""
    progress_interval_s: float = 10.0

    def resolved(self) -> StageOptions:
        cpus = os.cpu_count() or 2
        concurrency = self.concurrency or max(16, min(64, 8 * cpus))
        file_workers = self.file_workers or max(4, min(32, 2 * cpus))
        return replace(self, concurrency=concurrency, file_workers=file_workers)


@dataclass
class InputResult:
    """What one node did for one input."""

    name: str
    mode: str
    data_dir: str
    staging_dir: str
    files_total: int
    """Files in the dataset."""
    files_node: int
    """Files this node is responsible for."""
    files_downloaded: int = 0
    files_skipped: int = 0
    bytes_in: int = 0
    """Stored (compressed) bytes downloaded."""
    bytes_out: int = 0
    """Uncompressed bytes written."""
    bytes_retried: int = 0
    seconds: float = 0.0
    balance: dict[str, Any] = field(default_factory=dict)
    file_lists: dict[str, str] = field(default_factory=dict)
    """Global rank (as a string, JSON keys) -> file list path, local mode only."""

    @property
    def mb_per_s(self) -> float:
        """Uncompressed MB/s written (10^6 bytes)."""
        return self.bytes_out / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "mb_per_s": round(self.mb_per_s, 2),
                "in_mb_per_s": round(self.bytes_in / 1e6 / self.seconds, 2) if self.seconds > 0 else 0.0}


@dataclass
class StageResult:
    """The node's staging outcome; identical for every local rank of the node."""

    node_index: int
    node_count: int
    host: str
    run_id: str
    inputs: list[InputResult]
    seconds: float
    scratch: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    report_path: str | None = None

    def env_for(self, rank: int) -> dict[str, str]:
        """AMLHPC_DATA_DIR_<NAME> (and AMLHPC_FILE_LIST_<NAME> in local mode) for global `rank`."""
        env = {}
        for item in self.inputs:
            env[contract.data_dir_var(item.name)] = item.data_dir
            if str(rank) in item.file_lists:
                env[contract.file_list_var(item.name)] = item.file_lists[str(rank)]
        return env

    @property
    def bytes_in(self) -> int:
        return sum(i.bytes_in for i in self.inputs)

    @property
    def bytes_out(self) -> int:
        return sum(i.bytes_out for i in self.inputs)

    def to_json(self) -> dict[str, Any]:
        return {
            "node_index": self.node_index, "node_count": self.node_count, "host": self.host, "run_id": self.run_id,
            "seconds": round(self.seconds, 3), "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
            "files": sum(i.files_downloaded + i.files_skipped for i in self.inputs),
            "mb_per_s": round(self.bytes_out / 1e6 / self.seconds, 2) if self.seconds > 0 else 0.0,
            "inputs": [i.to_json() for i in self.inputs], "scratch": self.scratch, "warnings": self.warnings,
            "report_path": self.report_path,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StageResult:
        fields = {f for f in InputResult.__dataclass_fields__}
        inputs = [InputResult(**{k: v for k, v in i.items() if k in fields}) for i in doc.get("inputs", [])]
        return cls(node_index=doc["node_index"], node_count=doc["node_count"], host=doc["host"], run_id=doc["run_id"],
                   inputs=inputs, seconds=doc.get("seconds", 0.0), scratch=doc.get("scratch"),
                   warnings=list(doc.get("warnings", [])), report_path=doc.get("report_path"))


# ------------------------------------------------------------------ listing and local paths


def list_entries(client, spec: StageSpec) -> list[BlobEntry]:
    """Blobs under the spec's prefix, sorted by name (directory markers skipped)."""
    from azure.core.exceptions import AzureError, ClientAuthenticationError, ResourceNotFoundError

    # A ContainerClient's url ends with the container: show the account part separately.
    container_url = blobio.safe_endpoint(getattr(client, "url", None) or spec.account_url)
    account_url = container_url.rsplit("/", 1)[0] if container_url.endswith("/" + spec.container) else container_url
    try:
        entries = [BlobEntry.from_properties(p)
                   for p in client.list_blobs(name_starts_with=spec.normalized_prefix or None, include=["metadata"])
                   if not (p.name.endswith("/") or (p.metadata or {}).get("hdi_isfolder") == "true")]
    except ResourceNotFoundError:
        raise StageConfigError.single(
            f"input {spec.name!r}", "container", f"{spec.container!r} does not exist at {account_url}",
            "check the stack outputs (storage.containers.datasets) the job was built from") from None
    except ClientAuthenticationError:
        raise StagingError(f"input {spec.name!r}: access to {account_url}/{spec.container} denied; the node's identity "
                           "(AZURE_CLIENT_ID) needs 'Storage Blob Data Reader' on the account") from None
    except AzureError as exc:  # unreachable endpoint, retries exhausted: the first line says which
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise StagingError(f"input {spec.name!r}: listing {account_url}/{spec.container} failed after retries: "
                           f"{type(exc).__name__}: {first}") from None
    if not entries:
        raise StageConfigError.single(
            f"input {spec.name!r}", "prefix", f"no blobs under {account_url}/{spec.container}/{spec.normalized_prefix}",
            f"upload the dataset first: python -m jobs data upload LOCAL_DIR --stack <stack> --prefix "
            f"{spec.prefix.strip('/') or '<name>'}")
    return sorted(entries, key=lambda e: e.name)


def relative_path(spec: StageSpec, entry: BlobEntry) -> str:
    """The file's path below the data directory; rejects names that would escape it."""
    rel = entry.local_name[len(spec.normalized_prefix):]
    parts = PurePosixPath(rel).parts
    if not rel or rel.startswith("/") or any(p in ("..", ".", "") for p in parts) or parts[0] == STAGING_DIR:
        raise StagingError(f"blob {entry.name!r} has a name that cannot be a file below the data directory; rename it")
    return str(PurePosixPath(*parts))


# ------------------------------------------------------------------ progress


class _Progress:
    def __init__(self, label: str, files: int, stored_bytes: int, interval_s: float):
        self.label, self.files, self.stored_bytes, self.interval_s = label, files, stored_bytes, interval_s
        self.done = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.started = time.monotonic()
        self._last = self.started
        self._lock = threading.Lock()

    def on_bytes(self, stored: int, out: int) -> None:
        with self._lock:
            self.bytes_in += stored
            self.bytes_out += out

    def file_done(self) -> None:
        with self._lock:
            self.done += 1

    def maybe_log(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-9)
        log.info("%s: %d/%d files, %.1f/%.1f MB in, %.1f MB out, %.1f MB/s out", self.label, self.done, self.files,
                 self.bytes_in / 1e6, self.stored_bytes / 1e6, self.bytes_out / 1e6, self.bytes_out / 1e6 / elapsed)


# ------------------------------------------------------------------ staging one input on one node


@dataclass
class _Plan:
    spec: StageSpec
    client: Any
    entries: list[BlobEntry]
    node_entries: list[BlobEntry]
    balance: assign.Balance
    per_rank: dict[int, list[BlobEntry]]


def _plan(spec: StageSpec, client, entries: list[BlobEntry], ranks: ranks_module.Ranks) -> _Plan:
    items = [assign.Item(e.name, e.size) for e in entries]
    by_name = {e.name: e for e in entries}
    per_rank: dict[int, list[BlobEntry]] = {}
    if spec.mode == "replica":
        node_entries = list(entries)
        balance = assign.measure([items] * ranks.node_count)
    elif spec.mode == "shared":
        groups = assign.balance(items, ranks.node_count)
        node_entries = [by_name[i.name] for i in groups[ranks.node_index]]
        balance = assign.measure(groups)
    else:
        split = assign.split_for_ranks(items, ranks.node_count, ranks.local_size)
        node_entries = [by_name[i.name] for i in split.per_node[ranks.node_index]]
        balance = split.node_balance()
        for rank in ranks.ranks_on_node(ranks.node_index):
            per_rank[rank] = [by_name[i.name] for i in split.per_rank[rank]]
    return _Plan(spec, client, entries, node_entries, balance, per_rank)


def _stage_input(plan: _Plan, root: Path, ranks: ranks_module.Ranks, options: StageOptions, throttle: Throttle) -> InputResult:
    spec = plan.spec
    data_dir = root / spec.name
    staging_dir = root / STAGING_DIR / spec.name
    partial_dir = staging_dir / "partial"
    data_dir.mkdir(parents=True, exist_ok=True)
    partial_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result = InputResult(spec.name, spec.mode, str(data_dir), str(staging_dir), len(plan.entries), len(plan.node_entries),
                         balance={"max_bytes_per_node": plan.balance.max_bytes,
                                  "mean_bytes_per_node": round(plan.balance.mean_bytes, 1),
                                  "imbalance": round(plan.balance.imbalance, 4),
                                  "bytes_per_node": list(plan.balance.bytes_per_bin),
                                  "files_per_node": list(plan.balance.items_per_bin)})

    # Partial downloads of an earlier, killed run of this node: never resumed, removed.
    mine = f"node{ranks.node_index}-"
    for stale in partial_dir.glob(mine + "*"):
        stale.unlink(missing_ok=True)

    manifest = Manifest(staging_dir, ranks.node_index)
    rels = {e.name: relative_path(spec, e) for e in plan.node_entries}
    todo: list[BlobEntry] = []
    for entry in plan.node_entries:
        rel = rels[entry.name]
        final = data_dir / rel
        if manifest.finished(entry, rel, final, options.verify_existing):
            result.files_skipped += 1
            continue
        adopted = adoptable(entry, final) if rel not in manifest.records or options.verify_existing else None
        if adopted:
            manifest.record(entry, rel, entry.expected_size or 0, adopted)
            result.files_skipped += 1
            continue
        todo.append(entry)
    todo.sort(key=lambda e: (-e.size, e.name))  # big files first: a shorter tail
    stored = sum(e.size for e in todo)
    log.info("input %s (%s): node %d/%d has %d of %d files (%.1f MB stored; max/mean per node %.1f/%.1f MB); "
             "%d already staged, %d to fetch into %s", spec.name, spec.mode, ranks.node_index, ranks.node_count,
             len(plan.node_entries), len(plan.entries), sum(e.size for e in plan.node_entries) / 1e6,
             plan.balance.max_bytes / 1e6, plan.balance.mean_bytes / 1e6, result.files_skipped, len(todo), data_dir)

    progress = _Progress(f"input {spec.name} node {ranks.node_index}", len(todo), stored, options.progress_interval_s)
    failures: list[str] = []
    try:
        with ThreadPoolExecutor(options.concurrency, thread_name_prefix="blob-get") as http, \
                ThreadPoolExecutor(options.file_workers, thread_name_prefix="blob-file") as files:
            fetcher = Fetcher(plan.client, http, range_bytes=options.range_bytes, window=options.window,
                              throttle=throttle, attempts_transient=options.blob_attempts,
                              retry_pause_s=options.retry.initial_backoff_s, verify_sha256=options.verify_sha256,
                              on_bytes=progress.on_bytes)
            futures: dict[Future, BlobEntry] = {}
            queue = iter(enumerate(todo))
            # A bounded number of files in the pool at once: a listing of 500k files must
            # not become 500k futures.
            in_flight = 4 * (options.file_workers or 1)
            pending: set[Future] = set()
            while True:
                while len(pending) < in_flight:
                    item = next(queue, None)
                    if item is None:
                        break
                    n, entry = item
                    partial = partial_dir / f"{mine}{n}-{os.getpid()}.partial"
                    future = files.submit(fetcher.fetch, entry, data_dir / rels[entry.name], partial)
                    futures[future] = entry
                    pending.add(future)
                if not pending:
                    break
                finished, pending = wait(pending, timeout=options.progress_interval_s, return_when=FIRST_COMPLETED)
                for future in finished:
                    entry = futures.pop(future)
                    try:
                        fetched: FetchResult = future.result()
                    except FetchError as exc:
                        failures.append(str(exc))
                        continue
                    except Exception as exc:  # noqa: BLE001 - reported with the blob's name
                        failures.append(f"blob {entry.name!r}: {type(exc).__name__}: {exc}")
                        continue
                    manifest.record(entry, rels[entry.name], fetched.bytes_out, fetched.sha256)
                    result.files_downloaded += 1
                    result.bytes_in += fetched.bytes_in
                    result.bytes_out += fetched.bytes_out
                    result.bytes_retried += fetched.bytes_retried
                    progress.file_done()
                progress.maybe_log()
    finally:
        manifest.close()
    progress.maybe_log(force=bool(todo))
    result.seconds = time.monotonic() - started
    if failures:
        shown = "\n  - ".join(failures[:10])
        more = f"\n  ... and {len(failures) - 10} more" if len(failures) > 10 else ""
        raise StagingError(f"input {spec.name!r}: {len(failures)} of {len(todo)} files failed on node "
                           f"{ranks.node_index} (finished files are kept; a re-run fetches only the rest):\n  - {shown}{more}")

    if plan.per_rank:
        lists_dir = staging_dir / "ranks"
        lists_dir.mkdir(parents=True, exist_ok=True)
        for rank, entries in plan.per_rank.items():
            path = lists_dir / f"{rank}.txt"
            tmp = lists_dir / f".{rank}.txt.{os.getpid()}.tmp"
            tmp.write_text("".join(rels[e.name] + "\n" for e in entries))
            os.replace(tmp, path)
            result.file_lists[str(rank)] = str(path)
    return result


# ------------------------------------------------------------------ the node's stager


def _barrier_dir(ranks: ranks_module.Ranks, env: Mapping[str, str]) -> Path:
    """Node-local: the forced scratch when set (simulated nodes differ there), else the temp dir."""
    base = Path(env.get(contract.SCRATCH) or tempfile.gettempdir())
    return base / ".amlhpc-barrier" / f"{ranks.run_id}-node{ranks.node_index}"


def _default_client_factory(options: StageOptions, env: Mapping[str, str]) -> Callable[[StageSpec], Any]:
    def make(spec: StageSpec):
        return blobio.container_client_from_env(spec.container, spec.account_url, env=env, retry=options.retry,
                                                max_connections=options.concurrency or 32)
    return make


def _lead(specs: Sequence[StageSpec], ranks: ranks_module.Ranks, scratch: Path | None, shared_dir: Path | None,
          options: StageOptions, env: Mapping[str, str], client_factory: Callable[[StageSpec], Any]) -> StageResult:
    started = time.monotonic()
    warnings: list[str] = []
    needs_shared = [s.name for s in specs if s.mode == "shared"]
    if needs_shared and shared_dir is None:
        raise StageConfigError.single(
            contract.SHARED_DIR, "", f"is not set, but input(s) {', '.join(needs_shared)} use mode 'shared'",
            "start a shared filesystem (python -m jobs beeond start --stack S --cluster C) and submit with it, "
            "or use mode 'local'")
    if shared_dir is not None and needs_shared and not Path(shared_dir).is_dir():
        raise StageConfigError.single(
            contract.SHARED_DIR, "", f"{shared_dir} is not a directory on node {ranks.node_index}",
            "check the BeeOND mount: python -m jobs beeond status --stack S --cluster C")

    plans = []
    for spec in specs:
        try:
            client = client_factory(spec)
        except blobio.BlobConfigError as exc:
            raise StageConfigError.single(f"input {spec.name!r}", "account_url", str(exc),
                                          "set account_url in AMLHPC_STAGE_JSON (the stack's storage.blobEndpoint) or "
                                          f"{contract.BLOB_CONNECTION_STRING} for Azurite") from None
        plans.append(_plan(spec, client, list_entries(client, spec), ranks))

    node_gbits = options.node_gbits_per_s if options.node_gbits_per_s is not None else node_gbits_from_env(env)
    for spec in specs:
        warning = egress_warning(spec, ranks.node_count, node_gbits, options.cap_mbps)
        if warning:
            warnings.append(warning)
            log.warning("%s", warning)

    scratch_info: dict[str, Any] | None = None
    local_plans = [p for p in plans if p.spec.mode != "shared"]
    if local_plans and scratch is None:
        needed = sum((e.expected_size or e.size) for p in local_plans for e in p.node_entries)
        picked = scratch_module.pick_scratch(scratch_module.Host(env=env), required_bytes=needed,
                                             resume_markers=[f"{STAGING_DIR}/{p.spec.name}" for p in local_plans])
        for note in picked.notes:
            log.warning("scratch: %s", note)
            warnings.append(f"scratch: {note}")
        log.info("scratch: %s -> %s", picked.detail, picked.path)
        scratch, scratch_info = picked.path, picked.to_json()
    elif scratch is not None:
        scratch_info = {"path": str(scratch), "kind": "given", "detail": "passed by the caller"}

    throttle = Throttle.from_mbits_per_s(options.cap_mbps)
    inputs: list[InputResult] = []
    for plan in plans:
        if plan.spec.mode == "shared":
            inputs.append(_stage_shared(plan, Path(shared_dir), ranks, options, throttle))  # type: ignore[arg-type]
        else:
            inputs.append(_stage_input(plan, Path(scratch), ranks, options, throttle))  # type: ignore[arg-type]
    return StageResult(ranks.node_index, ranks.node_count, socket.gethostname(), ranks.run_id, inputs,
                       time.monotonic() - started, scratch_info, warnings)


def _stage_shared(plan: _Plan, shared_dir: Path, ranks: ranks_module.Ranks, options: StageOptions, throttle: Throttle) -> InputResult:
    markers = SharedMarkers(shared_dir / STAGING_DIR / plan.spec.name / "nodes" / ranks.run_id, ranks.node_count,
                            options.timeout_s, run_id=ranks.run_id)
    markers.reset(ranks.node_index)
    try:
        result = _stage_input(plan, shared_dir, ranks, options, throttle)
    except Exception as exc:
        markers.failed(ranks.node_index, str(exc))
        raise
    markers.done(ranks.node_index, {"node": ranks.node_index, "files": result.files_node, "bytes_out": result.bytes_out})
    log.info("input %s: node %d finished its share; waiting for the other %d node(s)", plan.spec.name,
             ranks.node_index, ranks.node_count - 1)
    try:
        markers.wait_all()
    except BarrierFailed as exc:
        raise StagingError(f"input {plan.spec.name!r}: {exc}") from None
    result.seconds = max(result.seconds, 0.0)
    return result


def _write_report(result: StageResult, options: StageOptions, env: Mapping[str, str]) -> None:
    report_dir = Path(options.report_dir or env.get(contract.REPORT_DIR) or contract.DEFAULT_REPORT_DIR)
    path = report_dir / f"staging-node{result.node_index}.json"
    result.report_path = str(path)
    try:
        write_json_atomic(path, result.to_json())
    except OSError as exc:
        log.warning("could not write the staging report to %s: %s", path, exc)
        result.report_path = None


def stage_inputs(specs: Sequence[StageSpec], ranks: ranks_module.Ranks, scratch: Path | None = None, *,
                 shared_dir: Path | None = None, options: StageOptions | None = None,
                 env: Mapping[str, str] | None = None,
                 client_factory: Callable[[StageSpec], Any] | None = None) -> StageResult:
    """Stage `specs` for this node; call it on every process (see the module docstring)."""
    env = os.environ if env is None else env
    options = (options or StageOptions()).resolved()
    if shared_dir is None and env.get(contract.SHARED_DIR):
        shared_dir = Path(env[contract.SHARED_DIR])
    if not specs:
        return StageResult(ranks.node_index, ranks.node_count, socket.gethostname(), ranks.run_id, [], 0.0)
    timeout = float(env.get(TIMEOUT_VARIABLE) or options.timeout_s)
    options = replace(options, timeout_s=timeout)
    barrier = NodeBarrier(_barrier_dir(ranks, env), timeout, ranks.run_id)
    if not ranks.is_node_leader:
        log.info("local rank %d waits for local rank 0 to stage %d input(s)", ranks.local_rank, len(specs))
        try:
            return StageResult.from_json(barrier.wait())
        except BarrierFailed as exc:
            raise StagingError(f"staging failed on this node's local rank 0: {exc}") from None

    barrier.lead()
    try:
        result = _lead(specs, ranks, scratch, shared_dir, options, env,
                       client_factory or _default_client_factory(options, env))
    except BaseException as exc:
        barrier.fail(str(exc) if not isinstance(exc, KeyboardInterrupt) else "interrupted")
        raise
    _write_report(result, options, env)
    barrier.succeed(result.to_json())
    log.info("staged %d input(s) on node %d in %.1fs: %.1f MB in, %.1f MB out (%.1f MB/s)", len(result.inputs),
             result.node_index, result.seconds, result.bytes_in / 1e6, result.bytes_out / 1e6,
             result.bytes_out / 1e6 / result.seconds if result.seconds else 0.0)
    return result


# ------------------------------------------------------------------ command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jobs.runtime.staging",
        description="Stage the job's inputs (AMLHPC_STAGE_JSON) from Blob to this node's scratch. Run it on every "
                    "process: local rank 0 stages, the others wait. Exit codes: 0 staged, 2 bad input, 3 staging "
                    "failed, 4 timed out.")
    p.add_argument("--stage-json", help=f"inputs as JSON, or @FILE (default: ${contract.STAGE_JSON})")
    p.add_argument("--scratch", type=Path, help=f"stage local inputs here (default: ${contract.SCRATCH}, else NVMe "
                                                "RAID0, else the temp disk)")
    p.add_argument("--shared-dir", type=Path, help=f"shared mount for 'shared' inputs (default: ${contract.SHARED_DIR})")
    p.add_argument("--report-dir", type=Path, help=f"per-node JSON report directory (default: ${contract.REPORT_DIR} "
                                                   f"or {contract.DEFAULT_REPORT_DIR})")
    p.add_argument("--cap-mbps", type=float, help="bandwidth cap for this node's downloads, Mb/s")
    p.add_argument("--node-gbps", type=float, help="per-node Blob rate for the egress check, Gb/s (default: the SKU's "
                                                   f"storage_nic_gbits_per_s from ${contract.SKU_JSON})")
    p.add_argument("--concurrency", type=int, help="HTTP requests in flight on this node")
    p.add_argument("--file-workers", type=int, help="files fetched at once on this node")
    p.add_argument("--range-mib", type=float, default=8.0, help="MiB per ranged GET (default 8)")
    p.add_argument("--timeout-s", type=float, help=f"how long waiters wait (default: ${TIMEOUT_VARIABLE} or "
                                                   f"{DEFAULT_TIMEOUT_S:.0f})")
    p.add_argument("--verify-existing", action="store_true", help="re-hash files a previous run finished")
    p.add_argument("--no-sha256", action="store_true", help="skip the SHA-256 check (size, gzip CRC-32 and etag "
                                                            "are still checked): for CPUs without SHA instructions")
    p.add_argument("--fast-retries", action="store_true", help="millisecond retry backoffs (local Azurite only)")
    p.add_argument("--print-env", action="store_true", help="print `export NAME=value` lines for this rank")
    p.add_argument("--json", action="store_true", help="print the node's result as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors on stderr")
    return p


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)
    env = os.environ if env is None else env
    try:
        ranks = ranks_module.from_env(env)
    except ranks_module.RankError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, stream=sys.stderr,
                        format=f"[staging node {ranks.node_index} rank {ranks.rank}] %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    try:
        if args.stage_json:
            text = args.stage_json
            if text.startswith("@"):
                try:
                    text = Path(text[1:]).read_text()
                except OSError as exc:
                    raise StageConfigError.single("--stage-json", text, f"cannot read the file ({exc.strerror})",
                                                  "give inline JSON or @PATH to a readable file") from None
            specs = specs_from_json(text, "--stage-json")
        else:
            specs = specs_from_env(env)
        if not specs:
            raise StageConfigError.single(contract.STAGE_JSON, "", "is not set: nothing to stage",
                                          "set it (jobs/build.py does for inputs in mode 'stage') or pass --stage-json")
        defaults = StageOptions()
        options = StageOptions(
            concurrency=args.concurrency, file_workers=args.file_workers, range_bytes=int(args.range_mib * (1 << 20)),
            cap_mbps=args.cap_mbps, node_gbits_per_s=args.node_gbps,
            timeout_s=args.timeout_s or float(env.get(TIMEOUT_VARIABLE) or DEFAULT_TIMEOUT_S),
            verify_existing=args.verify_existing, verify_sha256=not args.no_sha256,
            retry=blobio.RetrySettings.fast() if args.fast_retries else defaults.retry,
            report_dir=args.report_dir)
        if args.timeout_s:
            env = {**env, TIMEOUT_VARIABLE: str(args.timeout_s)}
        result = stage_inputs(specs, ranks, args.scratch, shared_dir=args.shared_dir, options=options, env=env)
    except (StageConfigError, scratch_module.ScratchError, blobio.BlobConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (StagingError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BarrierTimeout as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    if args.json:
        print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    if args.print_env:
        for name, value in sorted(result.env_for(ranks.rank).items()):
            print(f"export {name}={_shell_quote(value)}")
    return EXIT_OK


def _shell_quote(value: str) -> str:
    import shlex

    return shlex.quote(value)


if __name__ == "__main__":
    sys.exit(main())
