"""Stage datasets from Blob to the node's scratch (or a shared mount) before training starts.

Entry point (what `amlhpc.jobs.runtime.launch.launcher` calls, on every process of the job):

    result = stage_inputs(specs, ranks)            # -> StageResult
    os.environ.update(result.env_for(ranks.rank))  # AMLHPC_DATA_DIR_<NAME>, AMLHPC_FILE_LIST_<NAME>

    specs: list[StageSpec], usually `specs_from_env()` (AMLHPC_STAGE_JSON, docs/contracts.md s. 4)
    ranks: amlhpc.jobs.runtime.base.ranks.Ranks, usually `ranks.from_env()`
    scratch: optional Path; default `scratch.pick_scratch()` (AMLHPC_SCRATCH > NVMe RAID0 > /mnt)
    shared_dir: optional Path; default AMLHPC_SHARED_DIR (needed by `shared` inputs)
    options: StageOptions (concurrency, bandwidth cap, timeout, retry settings, report dir)

Local rank 0 of each node stages; every other local rank blocks in the same call at a
node-local barrier and gets the same StageResult once staging is done, or an exception
(`StagingError` with local rank 0's message, `StagingTimedOut`, `BarrierTimeout`,
`StageConfigError` when rank 0 found bad input). Exceptions are the only failure signal:
an error never leaves a process believing the data is there. The barrier is keyed by the
job's id and its inputs (amlhpc.jobs.runtime.base.jobid), and its markers carry this launch's
generation (amlhpc.jobs.runtime.base.launchid: a launcher's AMLHPC_LAUNCH_ID, torchrun's attempt
directory, or a unique job id with the node's boot and container), so an earlier
launch's markers never release this launch's ranks, even under the same job id. Several
local ranks with none of these cannot tell launches apart: staging refuses to run (exit 2).

Modes (per input, `mode` in AMLHPC_STAGE_JSON):

- `local`: each node downloads what its own ranks read. Files are split over nodes,
  balancing bytes (amlhpc.jobs.runtime.staging.assign: largest first, then local search), and each
  node's share over its local ranks the same way. Rank r reads the files listed in
  `<scratch>/.amlhpc-staging/<name>/ranks/<r>.json` (a JSON array of paths relative to
  the data directory, amlhpc.jobs.runtime.staging.filelist), which `AMLHPC_FILE_LIST_<NAME>` names. Every
  process derives the split from the same listing, so it is deterministic; with equal
  file sizes the counts per rank differ by at most one.
- `replica`: every node downloads every file (no file lists: each rank sees it all).
- `shared`: the nodes together fill one shared directory (BeeOND/NFS, AMLHPC_SHARED_DIR),
  each downloading a disjoint, byte-balanced share; a node's ranks are released only when
  every node has finished (markers on the shared mount).

Data lands in `<root>/<name>/<path under prefix>` with `.gz` dropped for gzip blobs,
where root is the scratch (local, replica) or the shared directory (amlhpc.jobs.runtime.staging.datadir
refuses names that collide or cannot be files). After staging the data directory holds
exactly the dataset (replica, shared) or the node's share (local): files of blobs deleted
since, or of another node's share after the node count changed, are removed. Staging's
own files (manifest, partial downloads, file lists, the lock) live beside it in
`<root>/.amlhpc-staging/<name>/`, never inside the data directory. One stager per input
and node at a time (amlhpc.jobs.runtime.staging.stagelock): a second one fails and names the first. A
re-run skips every file the manifest records as finished (same blob etag or stored
digest, same size on disk), adopts complete files from a run killed before recording
them (their SHA-256 is checked), and removes partial downloads left behind. The per-node
report (bytes in and out, files, seconds, MB/s, balance, how files were verified,
warnings) goes to `<report dir>/staging-node<k>.json`.

The whole of a node's staging has one deadline, the timeout (AMLHPC_STAGE_TIMEOUT_S,
default 3 h): a server that drips bytes, or retries that never end, fail the node with
"timed out" instead of holding it forever.

Command line: `python -m amlhpc.jobs.runtime.staging [options]` does the same for one process
(see --help). Exit codes: 0 staged; 2 bad input (stage spec, options, rank variables,
scratch); 3 staging failed (a blob, another node, local rank 0 or another stager holding
the input failed or is in the way; the message names it); 4 timed out (the deadline
passed, or waiting for local rank 0 or another node did).

The pieces, one module each: stagespec (the inputs), jobid (whose markers), listing and
blobhttp (reading Blob), assign (the byte-balanced split), datadir (paths, stale files),
fetch (one blob to one file, verified), gzmembers (parallel inflate), manifest (resume),
stagelock (one stager), nodebarrier (waiting), scratch (where), filelist (rank lists),
throttle (the cap), repair (the command that fixes a refused blob). This module wires them together.

Standard library plus azure-storage-blob / azure-identity / isal: ships in the image and
imports nothing from this repository outside amlhpc.jobs.runtime.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import operator
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass, field, replace
from itertools import repeat
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import clock, contract, faultpoints, jobid, launchid, workers
from amlhpc.jobs.runtime.base import ranks as ranks_module
from amlhpc.jobs.runtime.base.errors import RuntimeProblem
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.base.throttle import Throttle
from amlhpc.jobs.runtime.blob import blobhttp, blobio, listing
from amlhpc.jobs.runtime.blob import fetch as fetch_module
from amlhpc.jobs.runtime.blob.blobhttp import BlobReadError, Deadline, DeadlineExceeded
from amlhpc.jobs.runtime.blob.fetch import (
    BlobEntry,
    Fetcher,
    FetchError,
    FetchResult,
    IntegrityError,
)
from amlhpc.jobs.runtime.coord import jobstore, pacing
from amlhpc.jobs.runtime.coord.agree import Barrier, Channel, farewell, greet
from amlhpc.jobs.runtime.coord.kvstore import StoreLost
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from amlhpc.jobs.runtime.coord.nodebarrier import (
    BarrierFailed,
    BarrierTimeout,
    NodeBarrier,
    write_json_atomic,
)
from amlhpc.jobs.runtime.node import scratch as scratch_module
from amlhpc.jobs.runtime.staging import (
    assign,
    budget,
    datadir,
    dataversion,
    filelist,
    repair,
    shares,
)
from amlhpc.jobs.runtime.staging.manifest import Manifest, adoptable
from amlhpc.jobs.runtime.staging.stagelock import InputLock, StagingLocked
from amlhpc.jobs.runtime.staging.stagespec import (  # re-exported: launch and tests use staging's names
    MODES,
    Mode,
    StageConfigError,
    StageSpec,
    egress_warning,
    node_gbits_from_env,
    specs_from_env,
    specs_from_json,
)

log = logging.getLogger("amlhpc.staging")

STAGING_DIR = ".amlhpc-staging"
TIMEOUT_VARIABLE = contract.STAGE_TIMEOUT_S
DEFAULT_TIMEOUT_S = 3 * 3600.0
WAIT_FOR_DERIVED_S = 7 * 24 * 3600.0
"""How long local ranks wait for local rank 0 when its timeout is derived from the bytes (budget)."""

__all__ = ["StageSpec", "StageOptions", "StageResult", "InputResult", "StageConfigError", "StagingError",
           "StagingTimedOut", "BarrierTimeout", "stage_inputs", "specs_from_env", "specs_from_json", "egress_warning",
           "node_gbits_from_env", "MODES", "Mode"]


class StagingError(RuntimeError):
    """Staging did not complete; the message names the blobs or the node that failed."""


class StagingTimedOut(StagingError):
    """The staging deadline passed (exit 4)."""


# ------------------------------------------------------------------ options and results


@dataclass(frozen=True)
class StageOptions:
    """How a node stages. None means 'derived from the CPU count'."""

    concurrency: int | None = None
    """HTTP requests in flight per node (default 8 per CPU, 16 to 64)."""
    file_workers: int | None = None
    """Files downloaded, decompressed and written at once (default 2 per CPU, 4 to 32)."""
    inflate_workers: int | None = None
    """Threads inflating gzip members of large files (default one per CPU)."""
    range_bytes: int = 8 << 20
    """Stored bytes per ranged GET; a blob larger than this is fetched in parallel ranges."""
    window: int = 4
    """Ranged GETs in flight per file."""
    cap_mbps: float | None = None
    """Bandwidth cap for this node's downloads, Mb/s (None: uncapped)."""
    node_gbits_per_s: float | None = None
    """What one node pulls from Blob (SKU storage_nic_gbits_per_s), for the egress warning."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """The node's staging deadline, and how long local ranks (and nodes, in shared mode) wait."""
    timeout_given: bool = False
    """Whether timeout_s was given (AMLHPC_STAGE_TIMEOUT_S, --timeout-s); if not, it is a floor the stager
    raises to what the bytes need at the account's egress (amlhpc.jobs.runtime.staging.budget)."""
    verify_existing: bool = False
    """Re-hash files the manifest says are finished (against amlhpc_sha256) instead of trusting size + record."""
    verify_sha256: bool = False
    """Also check each file's SHA-256 against amlhpc_sha256. The default checks (stored digest,
    gzip CRC-32, sizes) already cover every byte; this costs a hash of the whole output."""
    retry: blobio.RetrySettings = field(default_factory=blobio.RetrySettings)
    blob_attempts: int = 4
    """Whole-blob attempts on network failures beyond the retry policy's budget."""
    report_dir: Path | None = None
    """Where the per-node JSON report goes (default AMLHPC_REPORT_DIR or outputs/aml-hpc)."""
    progress_interval_s: float = 10.0

    def worker_counts(self) -> tuple[int, int, int]:
        """(concurrency, file_workers, inflate_workers): the given counts, else those derived from
        the CPU count."""
        cpus = os.cpu_count() or 2
        return (self.concurrency or max(16, min(64, 8 * cpus)), self.file_workers or max(4, min(32, 2 * cpus)),
                self.inflate_workers or cpus)

    def resolved(self) -> StageOptions:
        concurrency, file_workers, inflate_workers = self.worker_counts()
        return replace(self, concurrency=concurrency, file_workers=file_workers, inflate_workers=inflate_workers)

    def validate(self) -> None:
        """StageConfigError naming every option that cannot work (the command line's names)."""
        checks = [("--concurrency", self.concurrency, 1, "HTTP requests in flight, e.g. 32"),
                  ("--file-workers", self.file_workers, 1, "files at once, e.g. 8"),
                  ("--inflate-workers", self.inflate_workers, 1, "threads, e.g. the CPU count"),
                  ("--window", self.window, 1, "ranged GETs in flight per file, e.g. 4"),
                  ("--blob-attempts", self.blob_attempts, 1, "whole-blob attempts, e.g. 4")]
        problems = [RuntimeProblem("staging options", flag, f"{value} is below {low}", hint)
                    for flag, value, low, hint in checks if value is not None and value < low]
        if not 4 << 10 <= self.range_bytes <= 1 << 30:
            problems.append(RuntimeProblem("staging options", "--range-mib", f"{self.range_bytes / (1 << 20):g} MiB is "
                                           "outside 4 KiB to 1024 MiB", "MiB per ranged GET, default 8"))
        for flag, value, hint in (("--cap-mbps", self.cap_mbps, "megabits per second, or leave it out for no cap"),
                                  ("--node-gbps", self.node_gbits_per_s, "gigabits per second"),
                                  ("--timeout-s", self.timeout_s, "seconds, default 10800")):
            if value is not None and not value > 0:
                problems.append(RuntimeProblem("staging options", flag, f"{value:g} is not positive", hint))
        if problems:
            raise StageConfigError(problems, "invalid staging options")


def timeout_from_env(env: Mapping[str, str], default: float) -> float:
    """AMLHPC_STAGE_TIMEOUT_S as seconds (default when unset); StageConfigError when it is not a positive number."""
    text = (env.get(TIMEOUT_VARIABLE) or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise StageConfigError.single(TIMEOUT_VARIABLE, "", f"{text!r} is not a positive number of seconds",
                                      "e.g. 10800 (3 h), or unset it")
    return value


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
    files_removed: int = 0
    """Files in the data directory that are not (or no longer) part of what this node holds, deleted."""
    files_unverifiable: int = 0
    """Staged files --verify-existing kept unchecked: their blobs record no checksum to check them with."""
    renamed: int = 0
    """Of this node's files, those staged under another name: inflated ones without `.gz`, `name/` as `name`."""
    bytes_in: int = 0
    """Stored (compressed) bytes downloaded."""
    bytes_out: int = 0
    """Uncompressed bytes written."""
    bytes_retried: int = 0
    seconds: float = 0.0
    balance: dict[str, Any] = field(default_factory=dict)
    verified: dict[str, int] = field(default_factory=dict)
    """How downloaded files were checked (fetch.Checks.label) -> files."""
    file_lists: dict[str, str] = field(default_factory=dict)
    """Global rank (as a string, JSON keys) -> file list path, local mode only."""
    version: int | None = None
    """The dataset version staged (None: an un-versioned prefix's listing)."""
    manifest_digest: str = ""
    """The digest of the manifest (or listing) every node planned from."""

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
    budget: dict[str, Any] = field(default_factory=dict)
    """What staging derived from the bytes and the egress: cap_mbps, timeout_s, expected_s (budget)."""

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
            "report_path": self.report_path, "budget": self.budget,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StageResult:
        fields = set(InputResult.__dataclass_fields__)
        inputs = [InputResult(**{k: v for k, v in i.items() if k in fields}) for i in doc.get("inputs", [])]
        return cls(node_index=doc["node_index"], node_count=doc["node_count"], host=doc["host"], run_id=doc["run_id"],
                   inputs=inputs, seconds=doc.get("seconds", 0.0), scratch=doc.get("scratch"),
                   warnings=list(doc.get("warnings", [])), report_path=doc.get("report_path"),
                   budget=dict(doc.get("budget") or {}))


# ------------------------------------------------------------------ listing and the plan


def list_entries(reader, spec: StageSpec, deadline: Deadline = blobhttp.NO_DEADLINE) -> list[BlobEntry]:
    """Blobs under the spec's prefix, sorted by name (folder markers skipped): an un-versioned dataset's listing."""
    shown = reader.shown_url
    entries = _list(reader, spec, spec.normalized_prefix, deadline)
    if not entries:
        raise StageConfigError.single(
            f"input {spec.name!r}", "prefix", f"no blobs under {shown}/{spec.normalized_prefix}",
            f"upload the dataset first: python -m amlhpc.jobs data upload LOCAL_DIR --stack <stack> --prefix "
            f"{spec.prefix.strip('/') or '<name>'}")
    return _usable(spec, entries)


def _list(reader, spec: StageSpec, prefix: str, deadline: Deadline) -> list[BlobEntry]:
    shown = reader.shown_url
    account_url = shown.rsplit("/", 1)[0]
    try:
        return listing.list_all(lambda marker: reader.list_page(prefix, marker, deadline=deadline), with_metadata=False)
    except BlobReadError as exc:
        if exc.status == 404:
            raise StageConfigError.single(
                f"input {spec.name!r}", "container", f"{spec.container!r} does not exist at {account_url}",
                "check the stack outputs (storage.containers.datasets) the job was built from") from None
        if exc.status == 403:
            raise StagingError(f"input {spec.name!r}: access to {shown} denied; the node's identity "
                               "(AZURE_CLIENT_ID) needs 'Storage Blob Data Reader' on the account") from None
        raise StagingError(f"input {spec.name!r}: listing {shown} failed after retries: {exc}") from None
    except listing.ListingError as exc:
        raise StagingError(f"input {spec.name!r}: listing {shown} returned something unexpected: {exc}") from None


def _usable(spec: StageSpec, entries: list[BlobEntry]) -> list[BlobEntry]:
    """Sorted by name, gz-names applied, folder markers left out."""
    names = [e.name for e in entries]
    if any(a > b for a, b in zip(names, names[1:], strict=False)):
        entries.sort(key=lambda e: e.name)
        names = [e.name for e in entries]
    if spec.inflate == "gz-names":  # the user says every *.gz blob is gzip, whatever its Content-Encoding
        entries = [e._replace(content_encoding="gzip") if e.name.endswith(".gz") and not e.gzip else e for e in entries]
    return _drop_folder_markers(spec, entries, names)


@dataclass
class _Source:
    """What a node plans from: a committed version's manifest, or an un-versioned prefix's listing."""

    spec: StageSpec
    """The spec to stage, its prefix the version's (`<name>/v<k>`)."""
    entries: list[BlobEntry]
    version: int | None
    """None: an un-versioned prefix (listed)."""
    digest: str
    versions: dataversion.Versions
    manifest: dataversion.Manifest | None = None
    """The version's manifest; when it is in parts, `entries` is empty and each node reads its parts."""


def _versions(reader, spec: StageSpec, deadline: Deadline) -> dataversion.Versions:
    found = _list(reader, spec, dataversion.versions_prefix(spec.prefix), deadline)
    return dataversion.parse_listing(spec.prefix, [(e.name, e.size, e.etag) for e in found])


def _manifest_source(reader, spec: StageSpec, versions: dataversion.Versions, version: int,
                     deadline: Deadline) -> _Source:
    def get(blob: str, size: int, etag: str | None) -> bytes:
        try:
            return reader.get(blob, 0, size, etag=etag, deadline=deadline)[0]
        except BlobReadError as exc:
            raise StagingError(f"input {spec.name!r}: reading version {version}'s manifest {blob} failed: {exc}") from None
    try:
        manifest = dataversion.read_manifest(get, versions, version)
    except dataversion.VersionError as exc:
        raise StagingError(f"input {spec.name!r}: {exc}") from None
    versioned = replace(spec, prefix=dataversion.data_prefix(spec.prefix, version))
    if not manifest.files:
        raise StageConfigError.single(f"input {spec.name!r}", "version", f"version {version} holds no files",
                                      "upload the dataset again as a new version")
    how = f"in {len(manifest.parts)} parts; this node reads those of its share" if manifest.parts else "one GET"
    log.info("input %s: version %d of %s (manifest %s: %d files, %.1f MB stored; %s, no listing)", spec.name,
             version, spec.prefix.strip("/"), manifest.digest, manifest.files, manifest.bytes / 1e6, how)
    return _Source(versioned, _usable(versioned, manifest.entries), version, manifest.digest, versions, manifest)


def resolve_source(reader, spec: StageSpec, deadline: Deadline = blobhttp.NO_DEADLINE, node: int = 0) -> _Source:
    """The version to stage (the spec's, or the newest committed) and its files from its manifest,
    read in node `node`'s slot (pacing.read_slot_s); an un-versioned prefix's listing when the
    prefix holds no versions and none is named."""
    clock.sleep(pacing.read_slot_s(node))  # every node reads the same listing and manifest: in slots
    versions = _versions(reader, spec, deadline)
    dataset = spec.prefix.strip("/")
    upload = f"python -m amlhpc.jobs data upload LOCAL_DIR --stack <stack> --prefix {dataset}"
    if versions.empty:
        if spec.version is not None:
            raise StageConfigError.single(
                f"input {spec.name!r}", "version", f"{spec.version}: {dataset} holds no versions (an un-versioned "
                "upload, or none)", f"upload it as a version ({upload}), then name the version it prints")
        entries = list_entries(reader, spec, deadline)
        log.warning("input %s: %s is not versioned: staging its listing, which an upload in progress can change under "
                    "the job; upload it as a version (%s)", spec.name, dataset, upload)
        return _Source(spec, entries, None, _listing_digest(entries), versions)
    wanted = spec.version if spec.version is not None else versions.latest
    if wanted is None or wanted not in versions.committed:
        if wanted is not None and wanted in versions.writing:
            raise StagingError(
                f"input {spec.name!r}: version {wanted} of {dataset} is still being written (its upload has not "
                f"committed its manifest; {versions.describe()}); wait for the upload to finish (or re-run it to "
                "finish it), or name a committed version")
        raise StageConfigError.single(
            f"input {spec.name!r}", "version", f"{wanted if wanted is not None else 'latest'}: no such committed version "
            f"of {dataset} ({versions.describe()})", f"name a committed version, or upload one ({upload})")
    return _manifest_source(reader, spec, versions, wanted, deadline)


def _drop_folder_markers(spec: StageSpec, entries: list[BlobEntry], names: list[str]) -> list[BlobEntry]:
    """Empty blobs named like a folder of other blobs are folder markers (written by tools for
    accounts without a hierarchical namespace), not files: leave them out."""
    empty = {e.name for e in entries if e.size == 0}
    if not empty:
        return entries
    folders = {name.rpartition("/")[0] for name in names} & empty
    if folders:
        log.info("input %s: %d empty blob(s) are folder markers of other blobs, e.g. %r: not staged", spec.name,
                 len(folders), next(iter(folders)))
        entries = [e for e in entries if e.name not in folders]
    return entries


@dataclass
class _Plan:
    spec: StageSpec
    reader: Any
    entries: list[BlobEntry]
    rels: list[str]
    """Path below the data directory of each entry."""
    node_idx: list[int]
    """Indices (into entries) of this node's files."""
    per_rank: dict[int, list[int]]
    """Global rank -> indices of its files (local mode)."""
    bytes_per_node: list[int]
    files_per_node: list[int]
    source: _Source | None = None
    """The version (or listing) planned from; None only for plans made by hand."""
    share: dict[str, Any] | None = None
    """A plan from a manifest in parts (shares.read_share): what the node read and the bound on
    every node's bytes; the other nodes' exact shares are in parts this node did not read."""

    @property
    def files_total(self) -> int:
        return int(self.share["files"]) if self.share else len(self.entries)

    @property
    def max_node_bytes(self) -> int:
        return int(self.share["max_bytes_per_node"]) if self.share else max(self.bytes_per_node)

    def balance(self) -> dict[str, Any]:
        if self.share:
            return dict(self.share)
        mean = sum(self.bytes_per_node) / len(self.bytes_per_node)
        return {"max_bytes_per_node": max(self.bytes_per_node), "mean_bytes_per_node": round(mean, 1),
                "imbalance": round(max(self.bytes_per_node) / mean, 4) if mean else 1.0,
                "bytes_per_node": self.bytes_per_node, "files_per_node": self.files_per_node}


def _local_paths(spec: StageSpec, entries: list[BlobEntry]) -> list[str]:
    try:
        return datadir.local_paths(spec.normalized_prefix, entries)
    except datadir.PathProblems as exc:
        raise StageConfigError([RuntimeProblem(f"input {spec.name!r}", "blobs", p) for p in exc.problems],
                               f"input {spec.name!r} cannot be staged as files") from None


def plan_source(source: _Source, reader, ranks: ranks_module.Ranks, deadline: Deadline) -> _Plan:
    """The node's plan from what it resolved: the whole listing (inline manifests, listings), or
    the parts of a manifest in parts that hold the node's share."""
    manifest = source.manifest
    plan = (_plan_from_parts(source.spec, reader, manifest, ranks, deadline) if manifest and manifest.parts
            else make_plan(source.spec, reader, source.entries, ranks))
    plan.source = source
    return plan


def _plan_from_parts(spec: StageSpec, reader, manifest: dataversion.Manifest, ranks: ranks_module.Ranks,
                     deadline: Deadline) -> _Plan:
    def get(part: dataversion.PartRef) -> bytes:
        try:
            return reader.get(part.blob, 0, part.size, deadline=deadline)[0]
        except BlobReadError as exc:
            raise StagingError(f"input {spec.name!r}: reading {part.blob}, a part of version {manifest.version}'s "
                               f"manifest, failed: {exc}") from None
    try:
        share = shares.read_share(manifest, get, spec.mode, ranks.node_index, ranks.node_count)
    except dataversion.VersionError as exc:
        raise StagingError(f"input {spec.name!r}: {exc}") from None
    entries = _usable(spec, share.entries)
    rels = _local_paths(spec, entries)
    node_idx = [k for k, e in enumerate(entries) if e.name in share.mine]
    per_rank: dict[int, list[int]] = {}
    if spec.mode == "local":
        local = assign.split_share([e.size for e in entries], node_idx, ranks.local_size)
        per_rank = dict(zip(ranks.ranks_on_node(ranks.node_index), local, strict=True))
    node_bytes = sum(entries[k].size for k in node_idx)
    summary = {"rule": "contiguous", "files": manifest.files, "parts": len(manifest.parts),
               "parts_read": share.parts_read, "node_bytes": node_bytes, "node_files": len(node_idx),
               "mean_bytes_per_node": round(manifest.bytes / ranks.node_count, 1),
               "max_bytes_per_node": share.max_node_bytes}
    log.info("input %s: %d of the manifest's %d parts read for this node's share (%d files, %.1f MB)", spec.name,
             share.parts_read, len(manifest.parts), len(node_idx), node_bytes / 1e6)
    return _Plan(spec, reader, entries, rels, node_idx, per_rank, [], [], share=summary)


def make_plan(spec: StageSpec, reader, entries: list[BlobEntry], ranks: ranks_module.Ranks) -> _Plan:
    """Paths and this node's share (and its ranks' files in local mode)."""
    rels = _local_paths(spec, entries)
    sizes = [e.size for e in entries]
    per_rank: dict[int, list[int]] = {}
    if spec.mode == "replica":
        everything = list(range(len(entries)))
        return _Plan(spec, reader, entries, rels, everything, per_rank, [sum(sizes)] * ranks.node_count,
                     [len(entries)] * ranks.node_count)
    if spec.mode == "shared":
        groups = assign.balance_indices(sizes, ranks.node_count)
    else:
        groups, local = assign.node_and_ranks(sizes, ranks.node_count, ranks.local_size, ranks.node_index)
        per_rank = dict(zip(ranks.ranks_on_node(ranks.node_index), local, strict=True))
    return _Plan(spec, reader, entries, rels, groups[ranks.node_index], per_rank,
                 [sum(map(sizes.__getitem__, g)) for g in groups], [len(g) for g in groups])


def _renamed(plan: _Plan) -> tuple[int, str]:
    """How many of this node's blobs land under another name than theirs below the prefix, and
    one example. Every rename shortens the name (a dropped `.gz`, '/' or empty segment), so
    comparing lengths in C finds them without building a string per file."""
    cut = len(plan.spec.normalized_prefix)
    names = list(map(operator.attrgetter("name"), map(plan.entries.__getitem__, plan.node_idx)))
    rels = list(map(plan.rels.__getitem__, plan.node_idx))
    lengths = list(map(operator.sub, map(len, names), repeat(cut)))
    count = sum(map(operator.ne, lengths, map(len, rels)))
    if not count:
        return 0, ""
    k = next(i for i, (a, b) in enumerate(zip(lengths, map(len, rels), strict=True)) if a != b)
    return count, f"{names[k][cut:]} -> {rels[k]}"


# ------------------------------------------------------------------ staging one input on one node


class _Progress:
    def __init__(self, label: str, files: int, stored_bytes: int, interval_s: float):
        self.label, self.files, self.stored_bytes, self.interval_s = label, files, stored_bytes, interval_s
        self.done = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.started = clock.monotonic()
        self._last = self.started
        self._lock = threading.Lock()

    def on_bytes(self, stored: int, out: int) -> None:
        with self._lock:
            self.bytes_in += stored
            self.bytes_out += out

    def maybe_log(self, force: bool = False) -> None:
        now = clock.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-9)
        log.info("%s: %d/%d files, %.1f/%.1f MB in, %.1f MB out, %.1f MB/s out", self.label, self.done, self.files,
                 self.bytes_in / 1e6, self.stored_bytes / 1e6, self.bytes_out / 1e6, self.bytes_out / 1e6 / elapsed)


@dataclass
class _Dirs:
    data: Path
    staging: Path
    partial: Path

    @classmethod
    def make(cls, root: Path, name: str) -> _Dirs:
        dirs = cls(root / name, root / STAGING_DIR / name, root / STAGING_DIR / name / "partial")
        try:
            dirs.data.mkdir(parents=True, exist_ok=True)
            dirs.partial.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StagingError(f"cannot create {exc.filename or dirs.data}: {exc.strerror or exc}") from None
        dirs.check(name)
        return dirs

    def check(self, name: str) -> None:
        """Files are downloaded into `partial` and renamed into `data`: both must be writable
        and on one filesystem (a read-only mount or a link to another disk at the data
        directory would otherwise fail each rename with EXDEV, 'Invalid cross-device link')."""
        if not os.access(self.data, os.W_OK | os.X_OK):
            raise StageConfigError.single(
                f"input {name!r}", "data directory", f"{self.data} is not writable (a read-only mount or directory?)",
                "staging writes the dataset there: unmount or make it writable, or stage to another scratch "
                f"({contract.SCRATCH})")
        data_dev, partial_dev = os.stat(self.data).st_dev, os.stat(self.partial).st_dev
        if data_dev != partial_dev:
            raise StageConfigError.single(
                f"input {name!r}", "data directory", f"{self.data} is on another filesystem than {self.partial} "
                "(a mount or a symbolic link at the data directory?)",
                "finished files are renamed from the second into the first, which works only within one filesystem: "
                f"remove the mount or link, or stage to a scratch where both are one filesystem ({contract.SCRATCH})")


def _prepare(plan: _Plan, dirs: _Dirs, ranks: ranks_module.Ranks, options: StageOptions, clean_all: bool,
             result: InputResult) -> tuple[list[int], Manifest]:
    """Clear this node's partial files and stale files; the indices still to fetch, and the manifest."""
    mine = f"node{ranks.node_index}-"
    for leftover in dirs.partial.glob(mine + "*"):  # an earlier, killed run of this node (we hold the lock)
        leftover.unlink(missing_ok=True)
    present = datadir.files_below(dirs.data)
    if clean_all or plan.spec.mode != "shared":
        keep = set(plan.rels) if clean_all or plan.spec.mode == "replica" else {plan.rels[k] for k in plan.node_idx}
        removed = datadir.remove_stale(dirs.data, present, keep)
        for rel in removed:
            present.pop(rel, None)
        result.files_removed = len(removed)
        if removed:
            log.info("input %s: removed %d file(s) that are not in the dataset (or this node's share) any more, e.g. %s",
                     plan.spec.name, len(removed), removed[0])
    manifest = Manifest(dirs.staging, ranks.node_index)
    todo, check = [], []
    for k in plan.node_idx:
        entry, rel = plan.entries[k], plan.rels[k]
        size = present.get(rel)
        if manifest.finished(entry, rel, size):
            if options.verify_existing:
                check.append(k)  # re-hashed below
            else:
                result.files_skipped += 1
        elif size is not None and rel not in manifest.records:
            check.append(k)  # complete but not recorded (a run killed before its manifest batch)? adopted below
        else:
            todo.append(k)
    recorded = {k for k in check if plan.rels[k] in manifest.records}
    for k, verdict in zip(check, _check_present(plan, check, dirs.data, present, recorded), strict=True):
        if verdict == "fetch":
            todo.append(k)
            continue
        if plan.rels[k] not in manifest.records:
            manifest.record(plan.entries[k], plan.rels[k], present[plan.rels[k]])
        result.files_skipped += 1
        if verdict == "unverifiable":
            result.files_unverifiable += 1
    if result.files_unverifiable:
        log.warning("input %s: %d staged file(s) kept unchecked by --verify-existing: their blobs record no checksum "
                    "(another tool's, never sealed), so a new download could not be checked either; seal the dataset "
                    "(python -m amlhpc.jobs data seal --stack STACK --prefix %s) to verify them", plan.spec.name,
                    result.files_unverifiable, plan.spec.prefix.strip("/"))
    if manifest.should_compact(len(plan.node_idx)):
        manifest.compact({plan.rels[k]: plan.entries[k] for k in plan.node_idx})
    todo.sort(key=lambda k: -plan.entries[k].size)  # big files first: a shorter tail
    for parent in sorted({plan.rels[k].rpartition("/")[0] for k in todo} - {""}):
        (dirs.data / parent).mkdir(parents=True, exist_ok=True)
    return todo, manifest


def _check_present(plan: _Plan, indices: list[int], data_dir: Path, present: dict[str, int],
                   recorded: set[int]) -> list[str]:
    """For each file on disk: 'keep' (it is its blob, whole), 'fetch' (it is not, or cannot be
    shown to be and was never recorded) or 'unverifiable' (recorded as staged, and its blob
    carries nothing to check it against: kept, as a download could not be checked either).

    Checked against the blob's amlhpc_size and amlhpc_sha256 (read with Get Blob Properties:
    listing leaves metadata out); a blob stored as it is (not inflated) is checked against
    its stored checksum (Content-MD5 or amlhpc_stored_sha256, which `jobs data seal`
    records for another tool's blobs). `recorded`: indices the manifest says were staged."""
    if not indices:
        return []

    def one(k: int) -> str:
        entry = plan.entries[k]
        try:
            entry = fetch_module.with_headers(entry, plan.reader.head(entry.name, etag=entry.etag))
        except (BlobReadError, DeadlineExceeded):
            return "fetch"
        path, size = data_dir / plan.rels[k], present.get(plan.rels[k])
        if entry.expected_sha256 is not None:
            return "keep" if adoptable(entry, path, size) else "fetch"
        if not entry.gzip and (entry.stored_sha256 or entry.content_md5):
            return "keep" if size == entry.size and fetch_module.file_matches_stored(path, entry) else "fetch"
        if entry.gzip and (entry.stored_sha256 or entry.content_md5):
            return "fetch"  # checkable only by fetching it again: a verified download replaces it
        return "unverifiable" if k in recorded else "fetch"

    with workers.pool(min(16, len(indices)), "blob-check") as pool:
        return list(pool.map(one, indices))


def _fetch_all(plan: _Plan, todo: list[int], dirs: _Dirs, manifest: Manifest, ranks: ranks_module.Ranks,
               options: StageOptions, throttle: Throttle, deadline: Deadline, result: InputResult,
               corrupt: list[BlobEntry] | None = None) -> list[str]:
    """Fetch `todo` (a bounded number of files in flight); returns the failures (the blobs whose
    bytes did not verify are added to `corrupt`)."""
    entries, rels = plan.entries, plan.rels
    progress = _Progress(f"input {plan.spec.name} node {ranks.node_index}", len(todo),
                         sum(entries[k].size for k in todo), options.progress_interval_s)
    failures: list[str] = []
    data, partial = str(dirs.data), str(dirs.partial)
    tag = f"node{ranks.node_index}-"
    concurrency, file_workers, inflate_workers = options.worker_counts()
    with workers.pool(concurrency, "blob-get") as http, \
            workers.pool(inflate_workers, "inflate") as inflate, \
            workers.pool(file_workers, "blob-file") as files:
        fetcher = Fetcher(plan.reader, http, inflate, range_bytes=options.range_bytes, window=options.window,
                          throttle=throttle, attempts_transient=options.blob_attempts,
                          retry_pause_s=options.retry.initial_backoff_s, verify_sha256=options.verify_sha256,
                          deadline=deadline, on_bytes=progress.on_bytes)
        queue = iter(todo)
        # A bounded number of files in the pool at once: a listing of 500k files must not become 500k futures.
        in_flight = 4 * file_workers
        pending: dict[Future, int] = {}
        try:
            while True:
                for k in queue:
                    final, temp = f"{data}/{rels[k]}", f"{partial}/{tag}{k}-{os.getpid()}.partial"
                    pending[files.submit(fetcher.fetch, entries[k], final, temp)] = k
                    if len(pending) >= in_flight:
                        break
                if not pending:
                    break
                remaining = deadline.remaining()
                timeout = options.progress_interval_s if remaining is None else max(0.05, min(options.progress_interval_s, remaining))
                finished, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
                for future in finished:
                    k = pending.pop(future)
                    _record(future, entries[k], rels[k], manifest, result, failures, corrupt)
                    progress.done += 1
                progress.maybe_log()
                deadline.check(f"staging input {plan.spec.name!r}")
        except DeadlineExceeded:
            for future in pending:
                future.cancel()
            raise
    progress.maybe_log(force=bool(todo))
    return failures


def _record(future: Future, entry: BlobEntry, rel: str, manifest: Manifest, result: InputResult,
            failures: list[str], corrupt: list[BlobEntry] | None = None) -> None:
    try:
        fetched: FetchResult = future.result()
    except FetchError as exc:
        failures.append(str(exc))
        if isinstance(exc, IntegrityError) and corrupt is not None:
            corrupt.append(entry)
        return
    except DeadlineExceeded:
        raise
    except Exception as exc:  # noqa: BLE001 - reported with the blob's name
        failures.append(f"blob {entry.name!r}: {type(exc).__name__}: {exc}")
        return
    manifest.record(entry, rel, fetched.bytes_out)
    result.files_downloaded += 1
    result.bytes_in += fetched.bytes_in
    result.bytes_out += fetched.bytes_out
    result.bytes_retried += fetched.bytes_retried
    result.verified[fetched.verified] = result.verified.get(fetched.verified, 0) + 1


def _write_file_lists(plan: _Plan, dirs: _Dirs, result: InputResult) -> None:
    for rank, indices in plan.per_rank.items():
        path = dirs.staging / "ranks" / f"{rank}.json"
        filelist.write(path, (plan.rels[k] for k in indices))
        result.file_lists[str(rank)] = str(path)


def _stage_input(plan: _Plan, root: Path, ranks: ranks_module.Ranks, options: StageOptions, throttle: Throttle,
                 job: jobid.JobIdentity, deadline: Deadline, clean_all: bool = False) -> InputResult:
    """Stage this node's share of one input into `root` (see the module docstring)."""
    spec = plan.spec
    dirs = _Dirs.make(root, spec.name)
    started = clock.monotonic()
    renamed, example = _renamed(plan)
    result = InputResult(spec.name, spec.mode, str(dirs.data), str(dirs.staging), plan.files_total,
                         len(plan.node_idx), balance=plan.balance(), renamed=renamed)
    if renamed:
        log.info("input %s: %d blob(s) are staged under another name: gzip-encoded ones are inflated and lose their "
                 ".gz, a name ending in '/' loses it (e.g. %s)", spec.name, renamed, example)
    try:
        with InputLock(dirs.staging, ranks.node_index, spec.name, job.job_id):
            faultpoints.reach("staging.after-lock", input=spec.name, node=ranks.node_index)
            todo, manifest = _prepare(plan, dirs, ranks, options, clean_all, result)
            log.info("input %s (%s): node %d/%d has %d of %d files (%.1f MB stored); %d already staged, %d to fetch "
                     "into %s", spec.name, spec.mode, ranks.node_index, ranks.node_count, len(plan.node_idx),
                     plan.files_total, sum(plan.entries[k].size for k in plan.node_idx) / 1e6, result.files_skipped,
                     len(todo), dirs.data)
            corrupt: list[BlobEntry] = []
            try:
                failures = _fetch_all(plan, todo, dirs, manifest, ranks, options, throttle, deadline, result, corrupt)
            finally:
                manifest.close()
            result.seconds = clock.monotonic() - started
            if failures:
                shown = "\n  - ".join(failures[:10])
                more = f"\n  ... and {len(failures) - 10} more" if len(failures) > 10 else ""
                advice = "".join(f"\n{line}" for line in repair.advice(plan.reader, spec, corrupt))
                raise StagingError(f"input {spec.name!r}: {len(failures)} of {len(todo)} files failed on node "
                                   f"{ranks.node_index} (finished files are kept; a re-run fetches only the rest):"
                                   f"\n  - {shown}{more}{advice}")
            _write_file_lists(plan, dirs, result)
    except StagingLocked as exc:
        raise StagingError(str(exc)) from None
    except OSError as exc:
        raise StagingError(f"input {spec.name!r}: cannot write {exc.filename or dirs.data}: {exc.strerror or exc}") from None
    transfer_only = sum(n for label, n in result.verified.items() if "transfer only" in label)
    if transfer_only:
        log.warning("input %s: %d file(s) carry no digest of their stored bytes (uploaded by another tool with Put "
                    "Block List): only their transfer was checked (range MD5)", spec.name, transfer_only)
    return result


# ------------------------------------------------------------------ the node's stager


def _barrier_dir(key: str, ranks: ranks_module.Ranks) -> Path:
    """Node-local (the temp dir every local rank sees), keyed by the job and the node."""
    return Path(tempfile.gettempdir()) / "amlhpc-barrier" / f"{key}-node{ranks.node_index}"


def _default_reader_factory(options: StageOptions, env: Mapping[str, str]) -> Callable[[StageSpec], Any]:
    def make(spec: StageSpec):
        url, auth = blobhttp.auth_from_env(spec.container, spec.account_url, env)
        return blobhttp.Reader(url, auth, options.retry)
    return make


def _check_shared(specs: Sequence[StageSpec], shared_dir: Path | None, ranks: ranks_module.Ranks) -> None:
    needs_shared = [s.name for s in specs if s.mode == "shared"]
    if needs_shared and shared_dir is None:
        raise StageConfigError.single(
            contract.SHARED_DIR, "", f"is not set, but input(s) {', '.join(needs_shared)} use mode 'shared'",
            "start a shared filesystem (python -m amlhpc.jobs beeond start --stack S --cluster C) and submit with it, "
            "or use mode 'local'")
    if shared_dir is not None and needs_shared:
        if not Path(shared_dir).is_dir():
            raise StageConfigError.single(
                contract.SHARED_DIR, "", f"{shared_dir} is not a directory on node {ranks.node_index}",
                "check the BeeOND mount: python -m amlhpc.jobs beeond status --stack S --cluster C")
        scratch_module.check_writable(Path(shared_dir), contract.SHARED_DIR, "check the shared mount (BeeOND/NFS)")


def _plans(specs: Sequence[StageSpec], ranks: ranks_module.Ranks, reader_factory, deadline: Deadline) -> list[_Plan]:
    plans = []
    for spec in specs:
        try:
            reader = reader_factory(spec)
        except blobio.BlobConfigError as exc:
            raise StageConfigError.single(f"input {spec.name!r}", "account_url", str(exc),
                                          "set account_url in AMLHPC_STAGE_JSON (the stack's storage.blobEndpoint) or "
                                          f"{contract.BLOB_CONNECTION_STRING} for Azurite") from None
        plans.append(plan_source(resolve_source(reader, spec, deadline, ranks.node_index), reader, ranks, deadline))
    return plans


def _agree(plan: _Plan, ranks: ranks_module.Ranks, channel: Channel, key: str, deadline: Deadline) -> _Plan:
    """All nodes stage from one manifest: the first node's (version, digest) is stored on the job's
    store and every node adopts it. A node that resolved `latest` to another committed version
    plans again from the agreed one (a version never changes once committed); a node that cannot
    (a named version, or a listing: an un-versioned prefix changed between the nodes' listings)
    refuses, as does one whose copy of the agreed manifest differs."""
    source = getattr(plan, "source", None) or _Source(plan.spec, plan.entries, None, _listing_digest(plan.entries),
                                                      dataversion.Versions())
    scope = channel.scoped("staging", key, plan.spec.name)
    mine = {"version": source.version, "digest": source.digest, "node": ranks.node_index}
    agreed, _ = scope.decide(scope.key("plan"), mine)
    faultpoints.reach("staging.agreed", input=plan.spec.name, node=ranks.node_index)
    if agreed.get("digest") == source.digest:
        return plan
    requested = replace(plan.spec, prefix=plan.spec.prefix.rpartition("/")[0]) if source.version is not None else plan.spec
    other = agreed.get("version")
    if source.version is not None and requested.version is None and isinstance(other, int):
        versions = source.versions
        if other not in versions.committed:
            versions = _versions(plan.reader, requested, deadline)
        if other in versions.committed:
            log.info("input %s: node %s planned from version %s, this node found version %s as the latest: staging "
                     "version %s", plan.spec.name, agreed.get("node"), other, source.version, other)
            adopted = _manifest_source(plan.reader, requested, versions, other, deadline)
            if adopted.digest == agreed.get("digest"):
                return plan_source(adopted, plan.reader, ranks, deadline)
    theirs = f"version {other}" if other is not None else "a listing"
    ours = f"version {source.version}" if source.version is not None else "a listing"
    raise StagingError(
        f"input {plan.spec.name!r}: node {ranks.node_index} planned from {ours} (manifest {source.digest}), node "
        f"{agreed.get('node')} from {theirs} ({agreed.get('digest')}): the nodes would stage different data. "
        + ("The dataset changed while the nodes listed it: upload it as a version (python -m amlhpc.jobs data upload "
           f"LOCAL_DIR --stack <stack> --prefix {requested.prefix.strip('/')}) and re-run the job"
           if source.version is None or other is None else "Re-run the job"))


def _pick_scratch(plans: list[_Plan], scratch: Path | None, env: Mapping[str, str],
                  warnings: list[str]) -> tuple[Path | None, dict[str, Any] | None]:
    local_plans = [p for p in plans if p.spec.mode != "shared"]
    if not local_plans:
        return scratch, None
    if scratch is not None:
        return scratch_module.check_writable(Path(scratch), "--scratch"), {
            "path": str(scratch), "kind": "given", "detail": "passed by the caller"}
    # Stored bytes: a lower bound for gzip blobs (listing leaves out the metadata that has amlhpc_size).
    needed = sum(p.entries[k].size for p in local_plans for k in p.node_idx)
    picked = scratch_module.pick_scratch(scratch_module.Host(env=env), required_bytes=needed,
                                         resume_markers=[f"{STAGING_DIR}/{p.spec.name}" for p in local_plans])
    for note in picked.notes:
        log.warning("scratch: %s", note)
        warnings.append(f"scratch: {note}")
    log.info("scratch: %s -> %s", picked.detail, picked.path)
    return picked.path, picked.to_json()


def _lead(specs: Sequence[StageSpec], ranks: ranks_module.Ranks, scratch: Path | None, shared_dir: Path | None,
          options: StageOptions, env: Mapping[str, str], reader_factory: Callable[[StageSpec], Any],
          job: jobid.JobIdentity, key: str, deadline: Deadline, generation: launchid.Generation,
          channel: Channel | None = None) -> StageResult:
    started = clock.monotonic()
    warnings: list[str] = []
    _check_shared(specs, shared_dir, ranks)
    if env.get(contract.SCRATCH) and scratch is None:  # bad input before anything is listed
        scratch_module.check_writable(Path(env[contract.SCRATCH]), contract.SCRATCH)
    if not job.unique and ranks.world_size > 1:
        warnings.append(f"no unique job id (AZUREML_RUN_ID, AMLHPC_RUN_ID, torchrun --rdzv-id, PMIx): staging's "
                        f"markers are keyed by the inputs and trust only this launch's ({generation.source})")
        log.warning("%s", warnings[-1])
    plans = _plans(specs, ranks, reader_factory, deadline)
    if ranks.node_count > 1:  # shared inputs agree inside _stage_shared, where a refusal also fails the barrier
        plans = [p if p.spec.mode == "shared" else _agree(p, ranks, _job_channel(channel, ranks, env), key, deadline)
                 for p in plans]
    node_gbits = options.node_gbits_per_s if options.node_gbits_per_s is not None else node_gbits_from_env(env)
    planned = budget.derive([budget.InputLoad(p.spec.name, p.spec.mode, p.spec.egress_gbps, p.max_node_bytes)
                             for p in plans], ranks.node_count, node_gbits=node_gbits, cap_mbps=options.cap_mbps,
                            timeout_s=options.timeout_s, timeout_given=options.timeout_given)
    if planned.refusals:
        raise StageConfigError(planned.refusals, "staging cannot finish in time")
    for line in planned.lines:
        log.info("staging budget: %s", line)
    if planned.timeout_s > options.timeout_s:
        deadline = Deadline(planned.timeout_s - (clock.monotonic() - started))
        options = replace(options, timeout_s=planned.timeout_s)
    for spec in specs:
        warning = egress_warning(spec, ranks.node_count, node_gbits, planned.cap_mbps)
        if warning:
            warnings.append(warning)
            log.warning("%s", warning)
    scratch, scratch_info = _pick_scratch(plans, scratch, env, warnings)
    throttle = Throttle.from_mbits_per_s(planned.cap_mbps)
    inputs: list[InputResult] = []
    try:
        for plan in plans:
            if plan.spec.mode == "shared":
                inputs.append(_stage_shared(plan, Path(shared_dir), ranks, options, throttle, job, key, deadline,  # type: ignore[arg-type]
                                            _job_channel(channel, ranks, env)))
            else:
                inputs.append(_stage_input(plan, Path(scratch), ranks, options, throttle, job, deadline))  # type: ignore[arg-type]
            inputs[-1].version = plan.source.version if plan.source else None
            inputs[-1].manifest_digest = plan.source.digest if plan.source else ""
    finally:
        for plan in plans:
            plan.reader.close()
    return StageResult(ranks.node_index, ranks.node_count, socket.gethostname(), job.job_id, inputs,
                       clock.monotonic() - started, scratch_info, warnings,
                       budget={"cap_mbps": planned.cap_mbps, "timeout_s": options.timeout_s,
                               "expected_s": planned.expected_s, "lines": planned.lines})


def _job_channel(channel: Channel | None, ranks: ranks_module.Ranks, env: Mapping[str, str]) -> Channel:
    """The job's store for the nodes' agreement on the manifest and the shared-mode barrier: the
    launcher's, or one this process opens (the staging command on its own), or, for one node,
    one in memory."""
    if channel is not None:
        return channel
    if ranks.node_count <= 1:
        return Channel(MemoryStore(), node=0, nodes=1)
    try:
        opened = jobstore.open_for_node(env, ranks.node_index, ranks.node_count, ranks.world_size)
    except jobstore.CoordinationUnavailable as exc:
        raise StagingError(f"staging: {exc}") from None
    if opened is None:
        raise StageConfigError.single(
            "MASTER_ADDR", "", f"staging across {ranks.node_count} nodes needs the job's coordination store (the "
            "nodes agree on the dataset version there), "
            "and no rendezvous host is known", "set MASTER_ADDR (Azure ML sets it for distribution: pytorch and mpi)")
    _opened.append(opened)
    channel = Channel(opened.store, node=ranks.node_index, nodes=ranks.node_count)
    greet(channel, BYE)
    return channel


_opened: list[jobstore.JobStore] = []
"""Stores the staging command opened for itself (closed when it ends)."""
BYE_WAIT_S = 60.0
BYE = "staging/bye"


def close_opened(node_index: int, node_count: int, failing: bool = False) -> None:
    """Close the stores this process opened; node 0 first waits (bounded) until every node has
    said goodbye (when `failing`, every node that reached the store: agree.farewell), so none
    loses the store before it read the barrier's outcome."""
    while _opened:
        opened = _opened.pop()
        channel = Channel(opened.store, node=node_index, nodes=node_count)
        try:
            farewell(channel, BYE, hosting=opened.serving, wait_s=BYE_WAIT_S, failing=failing)
        except StoreLost:
            pass
        opened.close()


def _stage_shared(plan: _Plan, shared_dir: Path, ranks: ranks_module.Ranks, options: StageOptions, throttle: Throttle,
                  job: jobid.JobIdentity, key: str, deadline: Deadline, channel: Channel) -> InputResult:
    """This node's share of the shared directory, then a barrier of every node on the job's store
    (one poll is one `check`, whatever the node count: the markers on the shared mount it
    replaces cost every node 2N file opens per poll). The nodes first agree on the manifest
    they plan from (`_agree`)."""
    barrier = Barrier(channel.scoped("staging", key, plan.spec.name), "nodes", ranks.node_count,
                      max(deadline.remaining() or options.timeout_s, 0.0))
    try:
        plan = _agree(plan, ranks, channel, key, deadline)
    except StagingError as exc:
        with contextlib.suppress(StoreLost):
            barrier.fail(str(exc))
        raise
    faultpoints.reach("shared.listed", node=ranks.node_index)
    try:
        result = _stage_input(plan, shared_dir, ranks, options, throttle, job, deadline, clean_all=ranks.node_index == 0)
    except Exception as exc:
        with contextlib.suppress(StoreLost):
            barrier.fail(f"node {ranks.node_index} failed staging its share: {exc}")
        raise
    try:
        barrier.arrive({"files": result.files_node, "bytes_out": result.bytes_out})
        faultpoints.reach("shared.after-done", node=ranks.node_index)
        log.info("input %s: node %d finished its share; waiting for the other %d node(s)", plan.spec.name,
                 ranks.node_index, ranks.node_count - 1)
        barrier.wait()
    except BarrierFailed as exc:
        raise StagingError(f"input {plan.spec.name!r}: {exc}") from None
    except BarrierTimeout as exc:
        raise StagingTimedOut(f"input {plan.spec.name!r}: {exc}") from None
    return result


def _listing_digest(entries: list[BlobEntry]) -> str:
    """What the nodes planned from: names, sizes and etags of the listing (16 hex digits)."""
    digest = hashlib.sha256("\0".join(map(operator.attrgetter("name"), entries)).encode("utf-8", "surrogatepass"))
    digest.update(repr(list(map(operator.attrgetter("size"), entries))).encode())
    digest.update("\0".join(map(str, map(operator.attrgetter("etag"), entries))).encode())
    return digest.hexdigest()[:16]


def _write_report(result: StageResult, options: StageOptions, env: Mapping[str, str]) -> None:
    report_dir = Path(options.report_dir or env.get(contract.REPORT_DIR) or contract.DEFAULT_REPORT_DIR)
    path = report_dir / f"staging-node{result.node_index}.json"
    result.report_path = str(path)
    try:
        write_json_atomic(path, result.to_json())
    except OSError as exc:
        log.warning("could not write the staging report to %s: %s", path, exc)
        result.report_path = None


def _wait_for_leader(barrier: NodeBarrier, ranks: ranks_module.Ranks, inputs: int) -> StageResult:
    log.info("local rank %d waits for local rank 0 to stage %d input(s)", ranks.local_rank, inputs)
    try:
        return StageResult.from_json(barrier.wait())
    except BarrierFailed as exc:
        message = f"staging failed on this node's local rank 0: {exc}"
        if exc.kind == "usage":
            raise StageConfigError.single("local rank 0", "", message) from None
        if exc.kind == "timeout":
            raise StagingTimedOut(message) from None
        raise StagingError(message) from None


def _failure_kind(exc: BaseException) -> str:
    if isinstance(exc, StagingTimedOut | BarrierTimeout | DeadlineExceeded):
        return "timeout"
    if isinstance(exc, StageConfigError | scratch_module.ScratchError | blobio.BlobConfigError):
        return "usage"
    return "failed"


def stage_inputs(specs: Sequence[StageSpec], ranks: ranks_module.Ranks, scratch: Path | None = None, *,
                 shared_dir: Path | None = None, options: StageOptions | None = None,
                 env: Mapping[str, str] | None = None,
                 reader_factory: Callable[[StageSpec], Any] | None = None, channel: Channel | None = None) -> StageResult:
    """Stage `specs` for this node; call it on every process (see the module docstring).
    `channel`: the job's coordination store (the launcher's); shared-mode inputs wait for every
    node there (the staging command opens its own)."""
    env = os.environ if env is None else env
    options = (options or StageOptions()).resolved()
    if (env.get(TIMEOUT_VARIABLE) or "").strip():
        options = replace(options, timeout_s=timeout_from_env(env, options.timeout_s), timeout_given=True)
    options.validate()
    if shared_dir is None and env.get(contract.SHARED_DIR):
        shared_dir = Path(env[contract.SHARED_DIR])
    job = jobid.identify(env)
    if not specs:
        return StageResult(ranks.node_index, ranks.node_count, socket.gethostname(), job.job_id, [], 0.0)
    key = job.key(jobid.inputs_digest(specs, ranks.node_count, ranks.local_size))
    generation = launchid.node_generation(env, ranks.local_size)
    if generation is None:
        raise StageConfigError.single("launch identity", "", launchid.refusal(ranks.local_size), launchid.REFUSAL_HINT)
    # Local ranks wait as long as local rank 0's deadline, which it may raise from the bytes it lists
    # (budget); a leader that dies or fails releases them at once, so a long wait costs nothing.
    wait_s = options.timeout_s if options.timeout_given else max(options.timeout_s, WAIT_FOR_DERIVED_S)
    barrier = NodeBarrier(_barrier_dir(key, ranks), wait_s, job.job_id, generation=generation.value)
    if not ranks.is_node_leader:
        return _wait_for_leader(barrier, ranks, len(specs))
    deadline = Deadline(options.timeout_s)
    try:
        barrier.lead()
    except OSError as exc:
        raise StagingError(f"local rank 0 could not set up the node barrier in {barrier.directory}: "
                           f"{exc.strerror or exc}") from None
    try:
        result = _lead(specs, ranks, scratch, shared_dir, options, env,
                       reader_factory or _default_reader_factory(options, env), job, key, deadline, generation, channel)
    except DeadlineExceeded as exc:
        barrier.fail(str(exc), "timeout")
        raise StagingTimedOut(str(exc)) from None
    except BaseException as exc:
        barrier.fail(str(exc) if not isinstance(exc, KeyboardInterrupt) else "interrupted", _failure_kind(exc))
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
        prog="python -m amlhpc.jobs.runtime.staging",
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
    p.add_argument("--inflate-workers", type=int, help="threads inflating large files' gzip members (default: CPUs)")
    p.add_argument("--range-mib", type=float, default=8.0, help="MiB per ranged GET (default 8)")
    p.add_argument("--timeout-s", type=float, help=f"the deadline, and how long waiters wait (default: "
                                                   f"${TIMEOUT_VARIABLE} or {DEFAULT_TIMEOUT_S:.0f})")
    p.add_argument("--verify-existing", action="store_true", help="re-hash files a previous run finished")
    p.add_argument("--sha256", action="store_true", help="also check each file's SHA-256 against amlhpc_sha256 (the "
                                                         "default checks already cover every byte)")
    p.add_argument("--fast-retries", action="store_true", help="millisecond retry backoffs (local Azurite only)")
    p.add_argument("--print-env", action="store_true", help="print `export NAME=value` lines for this rank")
    p.add_argument("--json", action="store_true", help="print the node's result as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors on stderr")
    return p


def _specs_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> list[StageSpec]:
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
                                      "set it (amlhpc/jobs/plan/build.py does for inputs in mode 'stage') or pass --stage-json")
    return specs


def _options_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> StageOptions:
    timeout = args.timeout_s if args.timeout_s is not None else timeout_from_env(env, DEFAULT_TIMEOUT_S)
    options = StageOptions(
        concurrency=args.concurrency, file_workers=args.file_workers, inflate_workers=args.inflate_workers,
        range_bytes=int(args.range_mib * (1 << 20)), cap_mbps=args.cap_mbps, node_gbits_per_s=args.node_gbps,
        timeout_s=timeout, timeout_given=args.timeout_s is not None or bool((env.get(TIMEOUT_VARIABLE) or "").strip()),
        verify_existing=args.verify_existing, verify_sha256=args.sha256,
        retry=blobio.RetrySettings.fast() if args.fast_retries else blobio.RetrySettings(), report_dir=args.report_dir)
    options.validate()
    return options


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)
    env = os.environ if env is None else env
    try:
        ranks = ranks_module.from_env(env)
    except ranks_module.RankError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, stream=sys.stderr,
                        format=f"[staging node {ranks.node_index} rank {ranks.rank}] %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    staged = False
    try:
        options = _options_from_args(args, env)
        specs = _specs_from_args(args, env)
        if args.timeout_s is not None:
            env = {**env, TIMEOUT_VARIABLE: str(args.timeout_s)}
        result = stage_inputs(specs, ranks, args.scratch, shared_dir=args.shared_dir, options=options, env=env)
        staged = True
    except (StageConfigError, scratch_module.ScratchError, blobio.BlobConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except (StagingTimedOut, BarrierTimeout) as exc:  # before OSError: BarrierTimeout is a TimeoutError
        print(f"error: timed out: {exc}", file=sys.stderr)
        return ExitCode.STAGING_TIMEOUT
    except (StagingError, StoreLost, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.STAGING
    finally:
        close_opened(ranks.node_index, ranks.node_count, failing=not staged)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    if args.print_env:
        import shlex

        for name, value in sorted(result.env_for(ranks.rank).items()):
            print(f"export {name}={shlex.quote(value)}")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
