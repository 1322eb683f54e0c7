"""Checkpoints to Blob storage: uploaded in the background under a bandwidth cap,
committed atomically, N versions kept, the latest restored when a job starts again.

Settings: AMLHPC_CHECKPOINT_JSON (docs/contracts.md section 4)

    {"account_url": "https://<account>.blob.core.windows.net/",  # or AMLHPC_BLOB_CONNECTION_STRING (Azurite)
     "container": "checkpoints", "prefix": "<experiment>/<name>",
     "keep": 3,               # versions kept, >= 1
     "cap_mbps": 2300,        # per uploading node, Mb/s; 0 or null: no cap
     "interval_s": 600,       # background upload period
     "writers": "rank0",      # optional: "rank0" (rank 0 writes, e.g. DDP), "per_node" or "per_rank"
                              #   (sharded, e.g. DeepSpeed ZeRO: every node uploads its own stream)
     "ingress_gbps": 25}      # optional: account ingress, to warn when writers x cap exceeds it

The NDv4 performance article caps each writer so that writers x cap stays under the account's ingress (8 x
2300 Mb/s < 20 Gb/s); the job builder derives `cap_mbps` that way, and the launcher warns
when `ingress_gbps` is given and the product exceeds it.

One uploader per node (the launcher's local rank 0) uploads the node's checkpoint folder,
so `cap_mbps` is per node and "writers" x cap means uploading nodes x cap: 1 with "rank0",
every node otherwise. Layout of one stream (`<prefix>`, or `<prefix>/node-<k>` when every
node writes):

    <stream>/data/<version>/<path>       file contents (block blobs, metadata amlhpc_sha256/amlhpc_size)
    <stream>/manifests/<version>.json    every file of a version: path, blob, size, sha256, mtimeNs
    <stream>/latest                      pointer {"version", "manifest"}: THE commit point

A version is committed only when the pointer is written, after every part and the
manifest are in; a process killed mid-upload leaves the pointer on the previous complete
version, and its orphan parts are deleted by the next upload's retention pass. The
pointer is written with an ETag condition, so two writers on one prefix fail loudly
instead of interleaving. Unchanged files (same path, size and mtime as in the previous
version) are not uploaded again: the manifest points at the blob that already holds them.
Retention deletes manifests beyond `keep` first, then every data blob no kept manifest
references. Versions are named `<sequence>-<UTC time>-<random>`, sequence counting up.

A file is uploaded from a consistent state or not at all: its size and mtime must be the
same before and after it is read, else the version is abandoned (the training was still
writing) and retried at the next interval. Restores verify size and SHA-256 and write each
file through a temporary name, so a restore never leaves a partial file under a final name.

    python -m jobs.runtime.checkpoint upload|restore DIR [--node K]
    python -m jobs.runtime.checkpoint list|prune [--node K]

Standard library plus azure-storage-blob (through jobs.runtime.blobio): ships in the image.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobs.runtime.contract import CHECKPOINT_JSON
from jobs.runtime.errors import EXIT_USAGE, RuntimeInputError, RuntimeProblem, load_json_object
from jobs.runtime.throttle import UNLIMITED, Throttle

log = logging.getLogger("amlhpc.checkpoint")

SCHEMA = 1
POINTER = "latest"
WRITERS = ("rank0", "per_node", "per_rank")
TMP_SUFFIX = ".amlhpc-tmp"
SKIPPED_SUFFIXES = (TMP_SUFFIX, ".tmp")
"""Temporary names (ours, and a writer's `x.tmp` before its rename) are never uploaded."""
BLOCK_BYTES = 8 << 20
"""Staged block size: large enough for throughput, small enough to retry cheaply."""
_CONTAINER_NAME = re.compile(r"^(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*$")
_FIX = "the job builder sets it from the stack's checkpoints container; resubmit, or correct the JSON by hand"


class CheckpointError(RuntimeError):
    """A checkpoint could not be restored or committed (the message names the blob)."""


class FileChanged(CheckpointError):
    """A file changed while it was being uploaded: the version is abandoned, not committed."""


class PointerConflict(CheckpointError):
    """Another writer moved the `latest` pointer while this version was uploading."""


# --- settings -------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointSettings:
    container: str
    prefix: str
    account_url: str | None = None
    keep: int = 3
    cap_mbps: float | None = None
    interval_s: float = 600.0
    writers: str = "rank0"
    ingress_gbps: float | None = None

    def stream(self, node_index: int) -> str:
        """The blob prefix this node writes to and restores from."""
        return self.prefix if self.writers == "rank0" else f"{self.prefix}/node-{node_index}"

    def is_writer(self, node_index: int) -> bool:
        """Whether this node uploads (node 0 only when rank 0 writes the checkpoint)."""
        return self.writers != "rank0" or node_index == 0

    def ingress_warning(self, nodes: int) -> str | None:
        """The NDv4 performance article's rule: writers x cap must stay below the account's ingress."""
        if not self.ingress_gbps:
            return None
        writers = 1 if self.writers == "rank0" else nodes
        if not self.cap_mbps:
            return (f"checkpoint uploads are not capped: {writers} writer(s) may exceed the account ingress of "
                    f"{self.ingress_gbps:g} Gb/s and be throttled; set cap_mbps below {self.ingress_gbps * 1000 / writers:.0f}")
        total_gbps = writers * self.cap_mbps / 1000
        if total_gbps > self.ingress_gbps:
            return (f"{writers} checkpoint writer(s) x {self.cap_mbps:g} Mb/s = {total_gbps:g} Gb/s exceeds the account "
                    f"ingress of {self.ingress_gbps:g} Gb/s: uploads will be throttled; set cap_mbps below "
                    f"{self.ingress_gbps * 1000 / writers:.0f}")
        return None


def _number(problems: list[RuntimeProblem], data: Mapping, key: str, minimum: float, integer: bool = False):
    value = data.get(key)
    if value is None:
        return None
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        problems.append(RuntimeProblem(CHECKPOINT_JSON, key, f"must be {kind}, got {value!r}", _FIX))
        return None
    if value < minimum:
        problems.append(RuntimeProblem(CHECKPOINT_JSON, key, f"must be >= {minimum:g}, got {value!r}", _FIX))
        return None
    return value


def parse_settings(text: str, reference: str = CHECKPOINT_JSON) -> CheckpointSettings:
    """Parse AMLHPC_CHECKPOINT_JSON; RuntimeInputError names every bad key."""
    data = load_json_object(text, reference, _FIX)
    problems: list[RuntimeProblem] = []
    container = data.get("container")
    if not isinstance(container, str) or not _CONTAINER_NAME.match(container):
        problems.append(RuntimeProblem(reference, "container", f"{container!r} is not a valid container name",
                                       "3-63 lowercase letters, digits and single hyphens, e.g. 'checkpoints' "
                                       "(the stack output storage.containers.checkpoints)"))
    prefix = data.get("prefix")
    if not isinstance(prefix, str) or not prefix.strip("/"):
        problems.append(RuntimeProblem(reference, "prefix", f"must name the job's folder in the container, got {prefix!r}",
                                       "e.g. 'cosmoflow/run-1'; a re-run with the same prefix resumes from it"))
    elif any(part in ("", ".", "..") for part in prefix.strip("/").split("/")):
        problems.append(RuntimeProblem(reference, "prefix", f"{prefix!r} has empty, '.' or '..' segments", "use a/b/c"))
    account_url = data.get("account_url")
    if account_url is not None and (not isinstance(account_url, str) or not account_url.startswith(("https://", "http://"))):
        # Not echoed: a connection string or SAS pasted here by mistake would be a secret in the log.
        problems.append(RuntimeProblem(reference, "account_url", "must be the blob endpoint URL (https://...)",
                                       "the stack output storage.blobEndpoint, e.g. https://<account>.blob.core.windows.net/"))
    keep = _number(problems, data, "keep", 1, integer=True)
    cap = _number(problems, data, "cap_mbps", 0)
    interval = _number(problems, data, "interval_s", 1)
    ingress = _number(problems, data, "ingress_gbps", 0)
    writers = data.get("writers", "rank0")
    if writers not in WRITERS:
        problems.append(RuntimeProblem(reference, "writers", f"must be one of {', '.join(WRITERS)}, got {writers!r}",
                                       "'rank0' when rank 0 writes the checkpoint (DDP), 'per_node'/'per_rank' when "
                                       "ranks write shards (DeepSpeed ZeRO)"))
    if problems:
        raise RuntimeInputError(problems, title=f"{reference} is not usable")
    return CheckpointSettings(container, prefix.strip("/"), account_url, keep if keep is not None else 3,
                              cap or None, float(interval) if interval is not None else 600.0, writers, ingress or None)


def settings_from_env(environ: Mapping[str, str] | None = None) -> CheckpointSettings | None:
    """The settings, or None when AMLHPC_CHECKPOINT_JSON is unset (no checkpointing)."""
    environ = os.environ if environ is None else environ
    text = environ.get(CHECKPOINT_JSON, "").strip()
    return parse_settings(text) if text else None


def container_from_settings(settings: CheckpointSettings, environ: Mapping[str, str] | None = None):
    """A ContainerClient: Azurite through AMLHPC_BLOB_CONNECTION_STRING, else managed identity."""
    from jobs.runtime import blobio

    return blobio.container_client_from_env(settings.container, settings.account_url, env=environ)


# --- local snapshot -------------------------------------------------------------------


@dataclass(frozen=True)
class LocalFile:
    path: str
    """Relative, '/'-separated."""
    size: int
    mtime_ns: int


def scan(folder: Path) -> dict[str, LocalFile]:
    """Regular files under `folder`; symlinks and temporary names (*.tmp) are left out."""
    files: dict[str, LocalFile] = {}
    if not folder.is_dir():
        return files
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            if name.endswith(SKIPPED_SUFFIXES):
                continue
            full = Path(root) / name
            try:
                st = full.lstat()
            except FileNotFoundError:
                continue  # deleted while we walked: not part of this snapshot
            if not full.is_symlink() and full.is_file():
                rel = full.relative_to(folder).as_posix()
                files[rel] = LocalFile(rel, st.st_size, st.st_mtime_ns)
    return files


def signature(files: Mapping[str, LocalFile]) -> tuple:
    return tuple(sorted((f.path, f.size, f.mtime_ns) for f in files.values()))


# --- manifests ------------------------------------------------------------------------


@dataclass
class Manifest:
    version: str
    sequence: int
    created_at: str
    files: list[dict[str, Any]] = field(default_factory=list)
    """{"path", "blob", "size", "sha256", "mtimeNs"} per file."""

    @property
    def bytes(self) -> int:
        return sum(f["size"] for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "version": self.version, "sequence": self.sequence, "createdAt": self.created_at,
                "bytes": self.bytes, "files": self.files}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"manifest schema {data.get('schema')!r} is not {SCHEMA}")
        return cls(data["version"], int(data["sequence"]), data["createdAt"], list(data["files"]))


def _sequence(version: str) -> int:
    head = version.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


@dataclass
class UploadResult:
    version: str | None
    """The committed version, None when nothing changed."""
    uploaded_files: int = 0
    reused_files: int = 0
    uploaded_bytes: int = 0
    seconds: float = 0.0
    pruned_versions: list[str] = field(default_factory=list)
    deleted_blobs: int = 0

    @property
    def mbits_per_s(self) -> float:
        return self.uploaded_bytes * 8 / 1e6 / self.seconds if self.seconds else 0.0


# --- the store ------------------------------------------------------------------------


class CheckpointStore:
    """One stream of versions in a container. Thread-safe for one writer."""

    def __init__(self, container, stream: str, *, throttle: Throttle | None = None, workers: int = 4,
                 blocks_in_flight: int = 4, block_bytes: int = BLOCK_BYTES):
        self.container = container
        self.stream = stream.strip("/")
        self.throttle = throttle or UNLIMITED
        self.workers = workers
        self.blocks_in_flight = blocks_in_flight
        self.block_bytes = block_bytes
        self._lock = threading.Lock()

    # names
    @property
    def pointer_name(self) -> str:
        return f"{self.stream}/{POINTER}"

    def manifest_name(self, version: str) -> str:
        return f"{self.stream}/manifests/{version}.json"

    def data_prefix(self, version: str | None = None) -> str:
        return f"{self.stream}/data/{version}/" if version else f"{self.stream}/data/"

    # reading
    def _read_json(self, name: str) -> tuple[dict[str, Any], str] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            downloader = self.container.get_blob_client(name).download_blob()
            return json.loads(downloader.readall()), downloader.properties.etag
        except ResourceNotFoundError as exc:
            if getattr(exc, "error_code", None) == "ContainerNotFound":
                raise CheckpointError(f"container {self.container.container_name!r} does not exist: create it (the stack "
                                      "declares it as storage.containers.checkpoints) or fix the container in "
                                      "AMLHPC_CHECKPOINT_JSON") from None
            return None

    def pointer(self) -> tuple[dict[str, Any] | None, str | None]:
        """(pointer document, etag), (None, None) when no version was ever committed."""
        found = self._read_json(self.pointer_name)
        return found if found else (None, None)

    def latest(self) -> Manifest | None:
        """The committed latest version's manifest, or None."""
        return self._manifest_of(self.pointer()[0])

    def _manifest_of(self, pointer: dict[str, Any] | None) -> Manifest | None:
        if pointer is None:
            return None
        found = self._read_json(pointer["manifest"])
        if found is None:
            raise CheckpointError(f"{self.pointer_name} names {pointer['manifest']}, which does not exist: the version was "
                                  "deleted by hand; delete the pointer blob to start fresh, or point it at an older manifest")
        return Manifest.from_json(found[0])

    def versions(self) -> list[str]:
        """Versions that have a manifest, oldest first."""
        prefix = f"{self.stream}/manifests/"
        names = [b.name[len(prefix):-len(".json")] for b in self.container.list_blobs(name_starts_with=prefix)
                 if b.name.endswith(".json")]
        return sorted(names, key=lambda v: (_sequence(v), v))

    # writing
    def _new_version(self, previous: Manifest | None) -> tuple[str, int]:
        sequence = max([previous.sequence if previous else 0, *(_sequence(v) for v in self.versions())]) + 1
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        return f"{sequence:06d}-{stamp}-{secrets.token_hex(2)}", sequence

    def _upload_file(self, folder: Path, entry: LocalFile, blob_name: str, blocks: ThreadPoolExecutor) -> str:
        """Stage the file's blocks (capped, several in flight), commit; returns its SHA-256.

        Verified as `jobs data upload` and staging verify (jobs.runtime.fetch): each block goes
        with its MD5, which the service checks before storing it; the committed blob's
        Content-MD5 is the MD5 of the whole file and `amlhpc_stored_sha256` (= `amlhpc_sha256`,
        checkpoints are stored as they are) its SHA-256."""
        from azure.storage.blob import ContentSettings

        client = self.container.get_blob_client(blob_name)
        path = folder / entry.path
        digest, md5 = hashlib.sha256(), hashlib.md5()
        block_ids: list[str] = []
        pending: deque = deque()
        with open(path, "rb") as handle:
            st = os.fstat(handle.fileno())
            if (st.st_size, st.st_mtime_ns) != (entry.size, entry.mtime_ns):
                raise FileChanged(f"{entry.path} changed before it was read")
            while True:
                chunk = handle.read(self.block_bytes)
                if not chunk:
                    break
                self.throttle.acquire(len(chunk))
                digest.update(chunk)
                md5.update(chunk)
                block_id = f"{len(block_ids):010d}"  # the SDK base64-encodes; ids must share a length
                block_ids.append(block_id)
                pending.append(blocks.submit(client.stage_block, block_id, chunk, length=len(chunk),
                                             validate_content=True))
                while len(pending) >= self.blocks_in_flight:
                    pending.popleft().result()
            while pending:
                pending.popleft().result()
        st = os.stat(path)
        if (st.st_size, st.st_mtime_ns) != (entry.size, entry.mtime_ns):
            raise FileChanged(f"{entry.path} changed while it was uploaded")
        sha = digest.hexdigest()
        client.commit_block_list(block_ids, metadata={"amlhpc_sha256": sha, "amlhpc_size": str(entry.size),
                                                      "amlhpc_stored_sha256": sha},
                                 content_settings=ContentSettings(content_type="application/octet-stream",
                                                                  content_md5=bytearray(md5.digest())))
        return sha

    def upload(self, folder: Path, keep: int = 3, files: Mapping[str, LocalFile] | None = None) -> UploadResult:
        """Upload `folder` as a new version, commit it, prune to `keep` versions.

        Returns a result with version None when the folder is empty or identical to the
        latest version. Raises FileChanged (nothing committed) when the folder changed
        underneath, PointerConflict when another writer committed meanwhile.
        """
        with self._lock:
            return self._upload(folder, keep, files)

    def _upload(self, folder: Path, keep: int, files: Mapping[str, LocalFile] | None) -> UploadResult:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError

        started = time.monotonic()
        files = scan(folder) if files is None else files
        pointer, etag = self.pointer()
        previous = self._manifest_of(pointer)
        if not files:
            return UploadResult(None)
        reusable = {f["path"]: f for f in previous.files} if previous else {}
        if previous and signature(files) == tuple(sorted((f["path"], f["size"], f["mtimeNs"]) for f in previous.files)):
            return UploadResult(None, reused_files=len(files))
        version, sequence = self._new_version(previous)
        entries: list[dict[str, Any]] = []
        to_upload: list[LocalFile] = []
        for entry in files.values():
            old = reusable.get(entry.path)
            if old and (old["size"], old["mtimeNs"]) == (entry.size, entry.mtime_ns):
                entries.append(dict(old))
            else:
                to_upload.append(entry)
        result = UploadResult(version, reused_files=len(entries))
        with ThreadPoolExecutor(self.workers, thread_name_prefix="ckpt-file") as file_pool, \
                ThreadPoolExecutor(self.workers * self.blocks_in_flight, thread_name_prefix="ckpt-block") as block_pool:
            futures = {file_pool.submit(self._upload_file, folder, e, self.data_prefix(version) + e.path, block_pool): e
                       for e in sorted(to_upload, key=lambda e: e.path)}
            try:
                for future, entry in futures.items():
                    sha = future.result()
                    entries.append({"path": entry.path, "blob": self.data_prefix(version) + entry.path,
                                    "size": entry.size, "sha256": sha, "mtimeNs": entry.mtime_ns})
                    result.uploaded_files += 1
                    result.uploaded_bytes += entry.size
                    log.info("checkpoint %s: uploaded %s (%d bytes)", version, entry.path, entry.size)
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
        manifest = Manifest(version, sequence, datetime.now(UTC).isoformat(timespec="seconds"),
                            sorted(entries, key=lambda f: f["path"]))
        self.container.upload_blob(self.manifest_name(version), json.dumps(manifest.to_json()).encode(), overwrite=False)
        pointer = json.dumps({"schema": SCHEMA, "version": version, "manifest": self.manifest_name(version),
                              "createdAt": manifest.created_at}).encode()
        try:
            if etag is None:
                self.container.upload_blob(self.pointer_name, pointer, overwrite=False)
            else:
                self.container.upload_blob(self.pointer_name, pointer, overwrite=True, etag=etag,
                                           match_condition=MatchConditions.IfNotModified)
        except (ResourceExistsError, ResourceModifiedError):
            raise PointerConflict(f"{self.pointer_name} was moved by another writer while {version} uploaded: two jobs "
                                  "are writing checkpoints under one prefix; give each its own prefix") from None
        result.seconds = time.monotonic() - started
        log.info("checkpoint %s committed: %d file(s) uploaded (%d bytes, %.0f Mb/s), %d unchanged",
                 version, result.uploaded_files, result.uploaded_bytes, result.mbits_per_s, result.reused_files)
        result.pruned_versions, result.deleted_blobs = self.prune(keep)
        return result

    def prune(self, keep: int) -> tuple[list[str], int]:
        """Keep the newest `keep` versions (always the one `latest` names); delete older
        manifests first, then every data blob no kept manifest references (orphans of
        killed uploads included). Returns (deleted versions, deleted data blobs)."""
        keep = max(keep, 1)
        pointer, _ = self.pointer()
        if pointer is None:
            return [], 0  # nothing committed: never delete a first upload's parts under someone's feet
        versions = self.versions()
        kept = set(versions[-keep:]) | {pointer["version"]}
        dropped = [v for v in versions if v not in kept]
        for version in dropped:
            self.container.delete_blob(self.manifest_name(version))
        referenced: set[str] = set()
        for version in kept:
            found = self._read_json(self.manifest_name(version))
            if found:
                referenced.update(f["blob"] for f in found[0]["files"])
        stale = [b.name for b in self.container.list_blobs(name_starts_with=self.data_prefix()) if b.name not in referenced]
        for name in stale:
            self.container.delete_blob(name)
        if dropped or stale:
            log.info("checkpoint retention: %d old version(s) and %d unreferenced blob(s) deleted", len(dropped), len(stale))
        return dropped, len(stale)

    # restoring
    def _restore_file(self, folder: Path, entry: dict[str, Any]) -> bool:
        """Download one file (verified) unless an identical one is there; True if downloaded."""
        target = folder / entry["path"]
        if target.is_file() and target.stat().st_size == entry["size"] and _sha256(target) == entry["sha256"]:
            os.utime(target, ns=(entry["mtimeNs"], entry["mtimeNs"]))
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + TMP_SUFFIX)
        digest = hashlib.sha256()
        size = 0
        try:
            from azure.core.exceptions import ResourceNotFoundError

            try:
                stream = self.container.get_blob_client(entry["blob"]).download_blob()
            except ResourceNotFoundError:
                raise CheckpointError(f"checkpoint blob {entry['blob']} is missing: the version is incomplete") from None
            with open(tmp, "wb") as handle:
                for chunk in stream.chunks():
                    digest.update(chunk)
                    size += len(chunk)
                    handle.write(chunk)
            if size != entry["size"] or digest.hexdigest() != entry["sha256"]:
                raise CheckpointError(f"checkpoint blob {entry['blob']} does not match its manifest "
                                      f"({size} bytes, sha256 {digest.hexdigest()[:12]}..., expected {entry['size']} bytes, "
                                      f"{entry['sha256'][:12]}...)")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        os.utime(target, ns=(entry["mtimeNs"], entry["mtimeNs"]))
        return True

    def restore(self, folder: Path) -> Manifest | None:
        """Download the latest version into `folder` (verified); None when there is none."""
        manifest = self.latest()
        if manifest is None:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with ThreadPoolExecutor(self.workers, thread_name_prefix="ckpt-restore") as pool:
            downloaded = sum(pool.map(lambda e: self._restore_file(folder, e), manifest.files))
        log.info("checkpoint %s restored into %s: %d file(s), %d bytes, %d already present, %.1fs", manifest.version,
                 folder, downloaded, manifest.bytes, len(manifest.files) - downloaded, time.monotonic() - started)
        return manifest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --- background uploads ---------------------------------------------------------------


class BackgroundUploader:
    """Uploads `folder` every `interval_s` while training runs, and once more at the end.

    A round is skipped when nothing changed since the last committed version, and when the
    folder is still changing (two scans `settle_s` apart differ). Upload errors are logged
    and retried next round: a storage hiccup must not kill the training.
    """

    def __init__(self, store: CheckpointStore, folder: Path, interval_s: float, keep: int, settle_s: float = 2.0):
        self.store, self.folder, self.interval_s, self.keep, self.settle_s = store, folder, interval_s, keep, settle_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: tuple | None = None
        self.results: list[UploadResult] = []
        self.errors: list[str] = []

    def mark_current(self) -> None:
        """Treat the folder as already uploaded (after a restore)."""
        self._last = signature(scan(self.folder))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="checkpoint-uploader", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.upload_once(settle_s=self.settle_s)

    def upload_once(self, settle_s: float = 0.0) -> UploadResult | None:
        files = scan(self.folder)
        if not files or signature(files) == self._last:
            return None
        if settle_s:
            time.sleep(settle_s)
            again = scan(self.folder)
            if signature(again) != signature(files):
                log.info("checkpoint folder still changing: upload deferred to the next round")
                return None
        try:
            result = self.store.upload(self.folder, self.keep, files)
        except FileChanged as exc:
            log.info("checkpoint upload abandoned, nothing committed: %s", exc)
            return None
        except Exception as exc:  # noqa: BLE001 - keep training; report and retry next round
            self.errors.append(f"{type(exc).__name__}: {exc}")
            log.warning("checkpoint upload failed, will retry: %s: %s", type(exc).__name__, exc)
            return None
        self._last = signature(files)
        self.results.append(result)
        return result

    def finish(self, attempts: int = 3) -> UploadResult | None:
        """Stop the loop, wait for a running upload, upload what is left. Raises
        CheckpointError when the last state could not be committed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for _ in range(attempts):
            files = scan(self.folder)
            if not files or signature(files) == self._last:
                return self.results[-1] if self.results else None
            before = len(self.errors)
            result = self.upload_once()
            if result is not None:
                return result
            if len(self.errors) == before:
                time.sleep(1.0)  # abandoned because a file changed: let the writer finish
        raise CheckpointError(f"the final checkpoint of {self.folder} could not be uploaded: "
                              + (self.errors[-1] if self.errors else "files kept changing"))


# --- command line ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m jobs.runtime.checkpoint upload|restore|list|prune` with AMLHPC_CHECKPOINT_JSON.
    Exit 0, 1 on a storage or integrity error, 2 on bad input."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m jobs.runtime.checkpoint", description=main.__doc__)
    parser.add_argument("action", choices=("upload", "restore", "list", "prune"))
    parser.add_argument("folder", nargs="?", type=Path, help="checkpoint folder (upload, restore)")
    parser.add_argument("--node", type=int, default=0, help="node index, for writers 'all' (default 0)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    try:
        settings = settings_from_env()
        if settings is None:
            raise RuntimeInputError.single(CHECKPOINT_JSON, "", "is not set",
                                           'set it to {"container": "checkpoints", "prefix": "...", ...}')
        if args.action in ("upload", "restore") and args.folder is None:
            raise RuntimeInputError.single("command line", "folder", f"{args.action} needs the checkpoint folder", "")
        container = container_from_settings(settings)
    except RuntimeInputError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # blobio.BlobConfigError: never holds a secret
        print(f"checkpoint: {exc}", file=sys.stderr)
        return EXIT_USAGE
    store = CheckpointStore(container, settings.stream(args.node), throttle=Throttle.from_mbits_per_s(settings.cap_mbps))
    try:
        if args.action == "upload":
            result = store.upload(args.folder, settings.keep)
            print(json.dumps({"version": result.version, "uploadedFiles": result.uploaded_files,
                              "reusedFiles": result.reused_files, "uploadedBytes": result.uploaded_bytes,
                              "mbitsPerS": round(result.mbits_per_s, 1), "pruned": result.pruned_versions}))
        elif args.action == "restore":
            manifest = store.restore(args.folder)
            print(json.dumps({"version": manifest.version if manifest else None}))
        elif args.action == "list":
            pointer, _ = store.pointer()
            print(json.dumps({"latest": pointer["version"] if pointer else None, "versions": store.versions()}))
        else:
            dropped, deleted = store.prune(settings.keep)
            print(json.dumps({"prunedVersions": dropped, "deletedBlobs": deleted}))
    except CheckpointError as exc:
        print(f"checkpoint: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
