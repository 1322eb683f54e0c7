"""One stream of checkpoint versions in a Blob container: leases, parts, verified commits, safe restores.

Layout of a stream (`<prefix>`, `<prefix>/node-<k>` or `<prefix>/versions`, see settings.py):

    <stream>/data/<version>/<path>             parts: file contents (block blobs, metadata amlhpc_sha256/amlhpc_size)
    <stream>/pending/<version>/node-<k>.json   node k's lease while it uploads its parts of a version: every blob it
                                               writes or reuses; then (state "staged") each part's size, SHA-256,
                                               ETag; its metadata names its state and the data folders it leases
    <stream>/manifests/<version>.json          every file of a committed version: path, blob, size, sha256, mtimeNs, etag
    <stream>/latest                            {"version", "manifest"}: THE commit point

A version moves through these steps (each arrow is a named fault point, amlhpc/jobs/runtime/base/faultpoints.py):

    stage (every node with parts): pending record "uploading" -> parts (blocks under ids unique to the upload
        session, so two writers of one blob never mix blocks) -> pending record "staged"
    commit (one committer, given every node's parts: through the job's store, or its own): every part checked
        in Blob from one listing per data folder (it exists, its size and SHA-256 metadata are what the node
        uploaded, its ETag is the one the upload got) -> manifest (create-only) -> `latest` (ETag-conditional:
        a second writer fails loudly) -> pending records deleted (256 per request)

Every write survives a lost reply (the service applied it, the answer never came, the SDK's
retry got 409/412/404): after a 409 on the manifest it is read back and adopted when it names
this version and these files; after a 409/412 on the pointer it is read back, and naming this
version the commit is done; a manifest is withdrawn only while the pointer names another
version (amlhpc.jobs.runtime.blob.writes). A commit of a version `latest` already names returns it.

So a version is committed only when every part it names exists as uploaded, and a part is never
without a record that references it: the pending record is written before the part and removed
only after the manifest and pointer that reference it. Retention (prune.py) reads in the order
that makes this enough: data blobs first, then pending records, then manifests and the pointer.

A process killed anywhere leaves `latest` on the previous complete version; its pending record
keeps its parts from being pruned until the same node's next upload session takes the node's
old records over (or, for a node that never comes back, until the record is `stale_pending_s`
old). Unchanged files (same path, size and mtime as in the previous version) are not uploaded
again: the manifest points at the blob that already holds them.

Restores check every path and blob name of a manifest (safepath.py: nothing outside the folder,
nothing outside the stream), download each file through a temporary name, verify size and
SHA-256, and only then rename it.

Standard library plus azure-storage-blob (through amlhpc.jobs.runtime.blob.blobio): ships in the image.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import secrets
import threading
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import clock, contract, faultpoints, jobid, workers
from amlhpc.jobs.runtime.base.throttle import UNLIMITED, Throttle
from amlhpc.jobs.runtime.blob import blocks
from amlhpc.jobs.runtime.blob.writes import delete_many, read_back
from amlhpc.jobs.runtime.checkpoint import safepath
from amlhpc.jobs.runtime.checkpoint.errors import (
    CheckpointError,
    FileChanged,
    NotReady,
    PartMissing,
    PointerConflict,
    UnsafeCheckpoint,
    UploadCancelled,
)
from amlhpc.jobs.runtime.checkpoint.pending import LEASE_ALL, LEASES_MAX_CHARS, Pending
from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of
from amlhpc.jobs.runtime.checkpoint.snapshot import TMP_SUFFIX, LocalFile, scan, signature
from amlhpc.jobs.runtime.checkpoint.trust import MANIFEST_DIGEST, RestoreTrust
from amlhpc.jobs.runtime.coord import nodestatus

log = logging.getLogger("amlhpc.checkpoint")

SCHEMA = 1
POINTER = "latest"
BLOCK_BYTES = 8 << 20
"""Staged block size: large enough for throughput, small enough to retry cheaply."""
BUSY_FIRST_PAUSE_S, BUSY_MAX_PAUSE_S = 1.0, 15.0
BUSY_LIMIT_S = 1800.0
"""A block the account keeps refusing as busy (503 ServerBusy: its ingress or request rate is
over its target) is sent again, after pauses of 1 s doubling to 15 s, for this long beyond the
client's own retries: a checkpoint's burst on a loaded account is load, not a fault, and must not
fail the part (every part failed is uploaded again, adding to the load). Past it, it is a fault."""
STALE_PENDING_S = 24 * 3600.0
"""A pending record this old belongs to an uploader that is gone: its lease no longer holds."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
"""A storage account name (3-24 lowercase letters and digits)."""


@dataclass
class Manifest:
    version: str
    sequence: int
    created_at: str
    files: list[dict[str, Any]] = field(default_factory=list)
    """{"path", "blob", "size", "sha256", "mtimeNs", "etag"} per file."""
    meta: dict[str, Any] = field(default_factory=dict)
    """What the version is: {"layout": "folder"} or {"layout": "versions", "step", "world", "nodes", ...}."""

    @property
    def bytes(self) -> int:
        return sum(f["size"] for f in self.files)

    @property
    def digest(self) -> str:
        """SHA-256 of the manifest's content (its canonical JSON): the pointer carries it, signed,
        so a manifest rewritten after the commit is told apart (fields a reader ignores do not count)."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "version": self.version, "sequence": self.sequence, "createdAt": self.created_at,
                "bytes": self.bytes, "meta": self.meta, "files": self.files}

    @classmethod
    def from_json(cls, data: Any, where: str, data_prefix: str) -> Manifest:
        """Parse and check a manifest read from Blob (input a lower principal may have written)."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise CheckpointError(f"{where}: not a schema-{SCHEMA} checkpoint manifest")
        files = data.get("files")
        if not isinstance(files, list):
            raise CheckpointError(f"{where}: `files` is not a list")
        seen: set[str] = set()
        for entry in files:
            if not isinstance(entry, dict):
                raise CheckpointError(f"{where}: a file entry is not an object")
            path = safepath.checked_relative(entry.get("path"), where)
            safepath.checked_blob(entry.get("blob"), data_prefix, where)
            size, sha = entry.get("size"), entry.get("sha256")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise CheckpointError(f"{where}: {path}: size {size!r} is not a byte count")
            if not isinstance(sha, str) or not _SHA256.match(sha):
                raise CheckpointError(f"{where}: {path}: sha256 {sha!r} is not a SHA-256 digest")
            account = entry.get("account")
            if account is not None and (not isinstance(account, str) or not _ACCOUNT.match(account)):
                raise CheckpointError(f"{where}: {path}: account {account!r} is not a storage account name")
            if path in seen:
                raise CheckpointError(f"{where}: {path} is listed twice")
            seen.add(path)
        meta = data["meta"] if isinstance(data.get("meta"), dict) else {}
        return cls(str(data.get("version")), int(data.get("sequence", -1)), str(data.get("createdAt", "")),
                   list(files), meta)


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


def signed_pointer(document: dict[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The pointer signed with the attempt's evidence key when the job has one (a managed
    run's attempt: AMLHPC_EVIDENCE_KEY, the attempt's job id), so its controller can tell it
    from one another job wrote (amlhpc.jobs.managed.evidence)."""
    env = os.environ if environ is None else environ
    key = (env.get(contract.EVIDENCE_KEY) or "").strip()
    return nodestatus.sign_pointer(key, jobid.identify(env).job_id, document) if key else document


class CheckpointStore:
    """One stream of versions in a container; `node` is the node this process uploads for."""

    def __init__(self, container, stream: str, *, throttle: Throttle | None = None, workers: int = 4,
                 blocks_in_flight: int = 4, block_bytes: int = BLOCK_BYTES, node: int = 0,
                 cancel: threading.Event | None = None, stale_pending_s: float = STALE_PENDING_S,
                 stripes: Sequence[tuple[str, Any]] = (), trust: RestoreTrust | None = None,
                 environ: Mapping[str, str] | None = None):
        self.container = container
        self.environ = environ
        """The attempt's environment, whose evidence key signs `latest` (None: the process's)."""
        self.trust = trust
        """A managed attempt's rule for which pointer to follow (checkpoint/trust.py); None: as found."""
        self._digests: dict[str, str] = {}
        """version -> its manifest's digest, from a pointer followed: manifest(version) checks it."""
        self.stripes: dict[str, Any] = dict(stripes)
        """Account name -> its container, in striping order (the first is `container`'s account, which
        holds the records, manifests and pointer); empty: every part in `container`."""
        self.stream = stream.strip("/")
        self.throttle = throttle or UNLIMITED
        self.workers = workers
        self.blocks_in_flight = blocks_in_flight
        self.block_bytes = block_bytes
        self.node = node
        self.cancel = cancel or threading.Event()
        self.stale_pending_s = stale_pending_s
        self._lock = threading.Lock()
        self.busy_retries = 0
        """Blocks sent again after the account answered busy beyond the client's own retries."""

    # --- accounts ------------------------------------------------------------------------
    def container_of(self, entry: Mapping[str, Any]) -> Any:
        """The container that holds a part (its manifest entry's `account`; none: `container`)."""
        account = entry.get("account")
        if account is None or (not self.stripes and account == getattr(self.container, "account_name", None)):
            return self.container
        found = self.stripes.get(account)
        if found is None:
            raise CheckpointError(f"part {entry.get('blob')} lives in storage account {account!r}, which is not among "
                                  f"this job's checkpoint accounts ({', '.join(self.stripes) or 'one account'}): list "
                                  "it in the stack's checkpointAccounts (or the job's AMLHPC_CHECKPOINT_JSON "
                                  "`accounts`) to read this version")
        return found

    def data_containers(self) -> list[Any]:
        """Every container that may hold parts: `container` and each striped account's."""
        found = [self.container]
        found += [c for c in self.stripes.values() if all(c is not f for f in found)]
        return found

    def assign(self, files: Sequence[LocalFile]) -> dict[str, str | None]:
        """path -> the account its part goes to: the largest file first, each to the account with
        the fewest bytes so far (ties: rotated by node, so the job's nodes start on different
        accounts). Every account then takes about the same bytes, so a version's upload takes
        size / (accounts x ingress), not size / ingress."""
        names = list(self.stripes)
        if len(names) < 2:
            return {f.path: (names[0] if names else None) for f in files}
        load = [0] * len(names)
        found: dict[str, str | None] = {}
        for local in sorted(files, key=lambda f: (-f.size, f.path)):
            index = min(range(len(names)), key=lambda i: (load[i], (i - self.node) % len(names)))
            load[index] += local.size
            found[local.path] = names[index]
        return found

    # --- names ----------------------------------------------------------------------------
    @property
    def pointer_name(self) -> str:
        return f"{self.stream}/{POINTER}"

    def manifest_name(self, version: str) -> str:
        return f"{self.stream}/manifests/{version}.json"

    def data_prefix(self, version: str | None = None) -> str:
        return f"{self.stream}/data/{version}/" if version else f"{self.stream}/data/"

    def pending_prefix(self, version: str | None = None) -> str:
        return f"{self.stream}/pending/{version}/" if version else f"{self.stream}/pending/"

    def pending_name(self, version: str, node: int | None = None) -> str:
        return f"{self.pending_prefix(version)}node-{self.node if node is None else node}.json"

    # --- reading --------------------------------------------------------------------------
    def _read_json(self, name: str) -> tuple[Any, str] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            downloader = self.container.get_blob_client(name).download_blob()
            raw = downloader.readall()
        except ResourceNotFoundError as exc:
            if getattr(exc, "error_code", None) == "ContainerNotFound":
                raise CheckpointError(f"container {self.container.container_name!r} does not exist: create it (the stack "
                                      "declares it as storage.containers.checkpoints) or fix the container in "
                                      "AMLHPC_CHECKPOINT_JSON") from None
            return None
        try:
            return json.loads(raw), downloader.properties.etag
        except (ValueError, UnicodeDecodeError):
            raise CheckpointError(f"{name} is not JSON: it was not written by a checkpoint uploader") from None

    def pointer(self) -> tuple[dict[str, Any] | None, str | None]:
        """(pointer document, etag), (None, None) when no version was ever committed."""
        found = self._read_json(self.pointer_name)
        if not found:
            return None, None
        document, etag = found
        if not isinstance(document, dict) or not isinstance(document.get("version"), str):
            raise CheckpointError(f"{self.pointer_name} is not a checkpoint pointer")
        return document, etag

    def latest(self) -> Manifest | None:
        """The committed latest version's manifest (in a managed attempt, the one its trust
        rule follows), or None."""
        return self._manifest_of(self._followed(self.pointer()[0]))

    def _followed(self, pointer: dict[str, Any] | None) -> dict[str, Any] | None:
        return self.trust.choose(pointer) if self.trust is not None else pointer

    def manifest(self, version: str) -> Manifest | None:
        """The version's manifest; checked against its digest when a followed pointer gave one."""
        found = self._read_json(self.manifest_name(version))
        if not found:
            return None
        manifest = Manifest.from_json(found[0], self.manifest_name(version), self.data_prefix())
        expected = self._digests.get(version)
        if expected is not None and manifest.digest != expected:
            raise UnsafeCheckpoint(f"{self.manifest_name(version)} is not the manifest its pointer committed (SHA-256 "
                                   f"{manifest.digest[:12]}..., the pointer says {expected[:12]}...): rewritten after "
                                   f"the commit; refused. {safepath.FIX}")
        return manifest

    def _manifest_of(self, pointer: dict[str, Any] | None) -> Manifest | None:
        if pointer is None:
            return None
        version = pointer["version"]
        safepath.checked_relative(version, self.pointer_name)
        if "/" in version:
            raise UnsafeCheckpoint(f"{self.pointer_name}: version {version!r} is not a version name; refused. {safepath.FIX}")
        digest = pointer.get(MANIFEST_DIGEST)
        if isinstance(digest, str):
            self._digests[version] = digest
        manifest = self.manifest(version)
        if manifest is None:
            raise CheckpointError(f"{self.pointer_name} names {self.manifest_name(version)}, which does not exist: the "
                                  "version was deleted by hand; delete the pointer blob to start fresh, or point it at an "
                                  "older manifest")
        return manifest

    def versions(self) -> list[str]:
        """Versions that have a manifest, oldest first."""
        prefix = f"{self.stream}/manifests/"
        names = [b.name[len(prefix):-len(".json")] for b in self.container.list_blobs(name_starts_with=prefix)
                 if b.name.endswith(".json")]
        return sorted(names, key=lambda v: (sequence_of(v), v))

    def pendings(self) -> dict[str, dict[int, Pending]]:
        """Every pending record: version -> node -> record, from one listing with metadata."""
        found: dict[str, dict[int, Pending]] = {}
        prefix = self.pending_prefix()
        for blob in self.container.list_blobs(name_starts_with=prefix, include=["metadata"]):
            version, _, leaf = blob.name[len(prefix):].partition("/")
            node_text = leaf.removeprefix("node-").removesuffix(".json")
            if not node_text.isdigit():
                continue
            found.setdefault(version, {})[int(node_text)] = Pending(version, int(node_text), dict(blob.metadata or {}),
                                                                    blob.last_modified)
        return found

    def staged_parts(self, version: str, nodes: Collection[int]) -> dict[int, list[dict[str, Any]]]:
        """The parts each of `nodes` staged for `version`, read from their pending records in Blob
        (one read per node: for one node, or by hand; a job's nodes pass theirs through the job's
        store instead). NotReady names the nodes that have not staged."""
        parts: dict[int, list[dict[str, Any]]] = {}
        waiting = []
        for node in sorted(nodes):
            read = self._read_json(self.pending_name(version, node))
            document = read[0] if read is not None and isinstance(read[0], dict) else None
            if document is None or document.get("state") != "staged":
                waiting.append(node)
                continue
            parts[node] = [p for p in document.get("parts", []) if isinstance(p, dict)]
        if waiting:
            raise NotReady(f"version {version}: node(s) {', '.join(map(str, waiting))} have not staged their parts")
        return parts

    def is_stale(self, pending: Pending) -> bool:
        if pending.last_modified is None:
            return False
        return clock.time() - pending.last_modified.timestamp() > self.stale_pending_s

    # --- staging parts --------------------------------------------------------------------
    def new_version(self, previous: Manifest | None) -> tuple[str, int]:
        sequence = max([previous.sequence if previous else 0, *(sequence_of(v) for v in self.versions())]) + 1
        stamp = datetime.fromtimestamp(clock.time(), UTC).strftime("%Y%m%dT%H%M%SZ")
        return f"{sequence:06d}-{stamp}-{secrets.token_hex(2)}", sequence

    def _write_pending(self, version: str, document: dict[str, Any]) -> None:
        """The node's lease: the document (its parts, once staged), and in metadata its state and
        the data folders it leases, so prune reads every lease from one listing."""
        folders = sorted({b[:b.index("/", len(self.data_prefix())) + 1] for b in document.get("blobs", [])
                          if b.startswith(self.data_prefix()) and "/" in b[len(self.data_prefix()):]})
        leases = ",".join(folders)
        if len(leases) > LEASES_MAX_CHARS or any(not b.startswith(self.data_prefix()) for b in document.get("blobs", [])):
            leases = LEASE_ALL
        name, body = self.pending_name(version), json.dumps(document).encode()
        self._until_not_busy(f"{name}:{document.get('state')}", lambda: self.container.upload_blob(
            name, body, overwrite=True, metadata={"amlhpc_state": str(document.get("state")), "amlhpc_leases": leases}))

    def _delete_quietly(self, name: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self.container.delete_blob(name)
        except ResourceNotFoundError:
            pass

    def abandon(self, version: str, node: int | None = None) -> None:
        """Withdraw a node's pending record (its parts become orphans that prune may delete)."""
        self._delete_quietly(self.pending_name(version, node))

    def abandon_all(self, version: str, nodes: Collection[int]) -> int:
        """Withdraw the pending records of `nodes` for `version`, 256 per request."""
        return delete_many(self.container, [self.pending_name(version, n) for n in nodes])

    def take_over(self, keep: Collection[str] = frozenset()) -> list[str]:
        """Withdraw this node's pending records of earlier upload sessions (an uploader that was
        killed or cancelled); versions in `keep` are left alone. Returns the versions withdrawn."""
        withdrawn = [v for v, nodes in self.pendings().items() if self.node in nodes and v not in keep]
        for version in withdrawn:
            self.abandon(version)
        if withdrawn:
            log.info("checkpoint: withdrew the pending record(s) of %s left by an earlier upload of node %d",
                     ", ".join(withdrawn), self.node)
        return withdrawn

    def _check_cancel(self) -> None:
        if self.cancel.is_set():
            raise UploadCancelled("the checkpoint upload was cancelled; nothing committed")

    def _upload_file(self, folder: Path, entry: LocalFile, blob_name: str, block_pool: Executor,
                     session: str, account: str | None = None) -> tuple[str, str]:
        """Stage the file's blocks (capped, several in flight), commit; returns (SHA-256, ETag).

        Verified as `jobs data upload` and staging verify (amlhpc.jobs.runtime.blob.fetch): each block goes
        with its MD5, which the service checks before storing it; the committed blob's
        Content-MD5 is the MD5 of the whole file and `amlhpc_stored_sha256` (= `amlhpc_sha256`,
        checkpoints are stored as they are) its SHA-256. Block ids start with the upload
        session's own random id: a second writer of the same blob stages other blocks, and
        each commit names only its own."""
        from azure.core.exceptions import HttpResponseError
        from azure.storage.blob import ContentSettings

        client = self.container_of({"account": account, "blob": blob_name}).get_blob_client(blob_name)
        path = folder / entry.path
        block_bytes = blocks.block_bytes_for(entry.size, self.block_bytes)  # 50,000 blocks fit the file
        digest, md5 = hashlib.sha256(), hashlib.md5()
        block_ids: list[str] = []
        pending: deque = deque()
        with open(path, "rb") as handle:
            st = os.fstat(handle.fileno())
            if (st.st_size, st.st_mtime_ns) != (entry.size, entry.mtime_ns):
                raise FileChanged(f"{entry.path} changed before it was read")
            while True:
                self._check_cancel()
                chunk = handle.read(block_bytes)
                if not chunk:
                    break
                self.throttle.acquire(len(chunk))
                digest.update(chunk)
                md5.update(chunk)
                block_id = f"{session}{len(block_ids):08d}"  # the SDK base64-encodes; ids must share a length
                block_ids.append(block_id)
                pending.append(block_pool.submit(self._stage_block, client, block_id, chunk))
                while len(pending) >= self.blocks_in_flight:
                    pending.popleft().result()
                if len(block_ids) == 1:
                    pending.popleft().result()
                    faultpoints.reach("checkpoint.block-staged")
            while pending:
                pending.popleft().result()
        st = os.stat(path)
        if (st.st_size, st.st_mtime_ns) != (entry.size, entry.mtime_ns):
            raise FileChanged(f"{entry.path} changed while it was uploaded")
        sha = digest.hexdigest()
        try:
            result = self._until_not_busy(f"{session}:{blob_name}", lambda: client.commit_block_list(
                block_ids, metadata={"amlhpc_sha256": sha, "amlhpc_size": str(entry.size), "amlhpc_stored_sha256": sha},
                content_settings=ContentSettings(content_type="application/octet-stream",
                                                 content_md5=bytearray(md5.digest()))))
        except HttpResponseError as exc:
            if getattr(exc, "error_code", None) != "InvalidBlockList":
                raise
            # Committing a blob discards every block not in its list: another session committed
            # this blob while ours staged it, and took our blocks with it.
            raise PointerConflict(f"another writer committed {blob_name} while this upload staged it: two jobs are "
                                  "writing checkpoints under one prefix; give each its own prefix") from None
        faultpoints.reach("checkpoint.part-committed")
        return sha, result["etag"]

    def _until_not_busy(self, key: str, request: Callable[[], Any]) -> Any:
        """`request()`, sent again while its account answers busy (BUSY_LIMIT_S); the cancel is
        heard between tries. `key` seeds the pauses' jitter: per request, and the same in a replay."""
        from azure.core.exceptions import HttpResponseError

        rng = random.Random(key)
        waited, pause = 0.0, BUSY_FIRST_PAUSE_S
        while True:
            try:
                return request()
            except HttpResponseError as exc:
                if getattr(exc, "status_code", None) != 503 or waited >= BUSY_LIMIT_S:
                    raise
            self._check_cancel()
            with self._lock:
                self.busy_retries += 1
            slept = pause * rng.uniform(0.7, 1.3)
            clock.sleep(slept)
            waited, pause = waited + slept, min(pause * 2, BUSY_MAX_PAUSE_S)

    def _stage_block(self, client: Any, block_id: str, chunk: bytes) -> None:
        self._until_not_busy(block_id, lambda: client.stage_block(block_id, chunk, length=len(chunk),
                                                                    validate_content=True))

    def stage(self, folder: Path, files: list[LocalFile], version: str, reused: Sequence[dict[str, Any]] = (),
              blob_of: Callable[[str], str] | None = None) -> list[dict[str, Any]]:
        """Upload this node's parts of `version` under a pending record; returns their manifest
        entries (`reused` ones included). On any failure the node's record is withdrawn, so
        nothing half-uploaded is ever staged."""
        blob_of = blob_of or (lambda path: self.data_prefix(version) + path)
        session = secrets.token_hex(8)
        planned = sorted({e["blob"] for e in reused} | {blob_of(f.path) for f in files})
        record = {"schema": SCHEMA, "version": version, "node": self.node, "session": session, "state": "uploading",
                  "blobs": planned, "written": clock.time()}
        self._check_cancel()
        for local in files:  # before any byte moves: a file no block blob can hold is refused, not retried
            try:
                blocks.check_fits(local.path, local.size)
            except blocks.BlobTooLarge as exc:
                raise CheckpointError(f"version {version} not uploaded: {exc}") from None
        accounts = self.assign(files)
        self._write_pending(version, record)
        entries: list[dict[str, Any]] = [dict(e) for e in reused]
        try:
            faultpoints.reach("checkpoint.pending-written")
            with workers.pool(self.workers, "ckpt-file") as file_pool, \
                    workers.pool(self.workers * self.blocks_in_flight, "ckpt-block") as block_pool:
                futures = {file_pool.submit(self._upload_file, folder, e, blob_of(e.path), block_pool, session,
                                            accounts[e.path]): e
                           for e in sorted(files, key=lambda e: e.path)}
                try:
                    for future, entry in futures.items():
                        sha, etag = future.result()
                        entries.append({"path": entry.path, "blob": blob_of(entry.path), "size": entry.size,
                                        "sha256": sha, "mtimeNs": entry.mtime_ns, "etag": etag,
                                        **({"account": accounts[entry.path]} if accounts[entry.path] else {})})
                        log.info("checkpoint %s: uploaded %s (%d bytes)", version, entry.path, entry.size)
                except BaseException:
                    for future in futures:
                        future.cancel()
                    raise
            self._check_cancel()
            self._write_pending(version, {**record, "state": "staged", "parts": sorted(entries, key=lambda e: e["path"]),
                                          "written": clock.time()})
            faultpoints.reach("checkpoint.parts-recorded")
        except BaseException:
            try:
                self.abandon(version)
            except Exception:  # noqa: BLE001 - the original error matters; the record goes stale or is taken over
                pass
            raise
        return entries

    # --- committing -----------------------------------------------------------------------
    def _listed(self, entries: Collection[dict[str, Any]]) -> dict[tuple[int, str], Any]:
        """The parts' blobs as the service lists them (size, ETag, metadata): one listing per data
        folder the parts lie in and account (pages of 5,000), never a request per part."""
        folders: dict[int, tuple[Any, set[str]]] = {}
        data = self.data_prefix()
        for entry in entries:
            name = entry["blob"]
            rest = name[len(data):] if name.startswith(data) else ""
            container = self.container_of(entry)
            folders.setdefault(id(container), (container, set()))[1].add(
                data + rest.split("/", 1)[0] + "/" if "/" in rest else name)
        found: dict[tuple[int, str], Any] = {}
        for key, (container, names) in folders.items():
            for folder in sorted(names):
                for blob in container.list_blobs(name_starts_with=folder, include=["metadata"]):
                    found[key, blob.name] = blob
        return found

    def _verify(self, entry: dict[str, Any], listed: Mapping[tuple[int, str], Any]) -> None:
        props = listed.get((id(self.container_of(entry)), entry["blob"]))
        if props is None:
            raise PartMissing(f"part {entry['blob']} of the version is not in Blob (deleted or never finished): not "
                              "committed")
        if props.size != entry["size"] or (props.metadata or {}).get("amlhpc_sha256") != entry["sha256"]:
            raise PartMissing(f"part {entry['blob']} is not what was uploaded ({props.size} bytes, expected "
                              f"{entry['size']}): not committed")
        if entry.get("etag") and _bare(props.etag) != _bare(entry["etag"]):  # listings drop the quotes
            raise PartMissing(f"part {entry['blob']} was overwritten after its upload (ETag {props.etag}, uploaded as "
                              f"{entry['etag']}): another writer uses this prefix; not committed")

    def _write_manifest(self, manifest: Manifest) -> Manifest:
        """Create the version's manifest. A 409 is ours when the manifest there names the same
        version and files (our own write whose reply was lost, or an earlier try of this commit
        that stopped before the pointer): that one is adopted. Otherwise PointerConflict."""
        from azure.core.exceptions import ResourceExistsError

        name = self.manifest_name(manifest.version)
        try:
            self.container.upload_blob(name, json.dumps(manifest.to_json()).encode(), overwrite=False)
            return manifest
        except ResourceExistsError:
            pass
        found = read_back(self.container, name)
        if found is not None:
            try:
                there = Manifest.from_json(json.loads(found[0]), name, self.data_prefix())
            except (ValueError, CheckpointError):
                there = None
            if there is not None and (there.version, there.files, there.meta) == (manifest.version, manifest.files,
                                                                                  manifest.meta):
                log.info("checkpoint %s: the manifest is already there, as this commit wrote it (a lost reply or "
                         "an earlier try): kept", manifest.version)
                return there
        raise PointerConflict(f"{name} already exists: another writer committed this version name; give each job "
                              "its own prefix")

    def _withdraw_if_unrestorable(self, manifest: Manifest) -> None:
        """After a pointer conflict the version's manifest stays (see _move_pointer), unless its
        parts are already gone (another writer's retention took them): a manifest that cannot
        be restored is withdrawn, so every manifest left names parts that exist."""
        listed = self._listed(manifest.files)
        try:
            for entry in manifest.files:
                self._verify(entry, listed)
        except PartMissing as exc:
            log.info("checkpoint %s: withdrawn after the conflict (%s)", manifest.version, exc)
            self._delete_quietly(self.manifest_name(manifest.version))

    def _move_pointer(self, version: str, payload: bytes, expected_etag: str | None) -> None:
        """Point `latest` at `version`. After a 409/412 the pointer is read back: naming this
        version, it is our write (its first reply was lost). Otherwise PointerConflict, and the
        version's manifest stays (commit withdraws it only when its parts are gone): the first
        try may have moved the pointer (its reply lost) before another writer moved it on, and a
        managed run's controller may have seen the version committed in that window and pinned
        it for the next attempt (withdrawing the manifest lost that version). A manifest `latest`
        does not name misleads nobody: restores follow the pointer, and retention treats it like
        any other version."""
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError

        try:
            if expected_etag is None:
                self.container.upload_blob(self.pointer_name, payload, overwrite=False)
            else:
                self.container.upload_blob(self.pointer_name, payload, overwrite=True, etag=expected_etag,
                                           match_condition=MatchConditions.IfNotModified)
            return
        except (ResourceExistsError, ResourceModifiedError):
            pass
        found = read_back(self.container, self.pointer_name)
        named = None
        if found is not None:
            try:
                named = json.loads(found[0]).get("version")
            except (ValueError, AttributeError):
                named = None
        if named == version:
            log.info("checkpoint %s: `latest` already names it (the reply to the pointer's write was lost)", version)
            return
        raise PointerConflict(f"{self.pointer_name} was moved by another writer (to {named}) while {version} uploaded: "
                              "two jobs are writing checkpoints under one prefix; give each its own prefix")

    def commit(self, version: str, sequence: int, nodes: list[int], meta: dict[str, Any],
               expected_etag: str | None | bool = False,
               parts: Mapping[int, Sequence[dict[str, Any]]] | None = None) -> Manifest:
        """Commit `version` from the parts `nodes` staged: `parts` (node -> manifest entries, what
        the nodes told the committer through the job's store), else their pending records in Blob.
        NotReady when a node has not staged; PartMissing when a part is not in Blob as uploaded;
        PointerConflict when another writer moved `latest` (compared with `expected_etag`;
        False: the pointer as read now). Every write survives a lost reply (see _write_manifest,
        _move_pointer)."""
        head, head_etag = self.pointer()
        if expected_etag is False:
            expected_etag = head_etag
        if head is not None and head["version"] == version:
            log.info("checkpoint %s: already committed (`latest` names it)", version)
            manifest = self.manifest(version)
            if manifest is not None:
                return manifest
        if head is not None and sequence_of(head["version"]) >= sequence:
            # `latest` never moves back: a writer that committed this far is another one, or this version is stale.
            raise PointerConflict(f"{self.pointer_name} names {head['version']}, not older than {version}: two jobs are "
                                  "writing checkpoints under one prefix (give each its own prefix), or the version is "
                                  "stale; not committed")
        if parts is None:
            parts = self.staged_parts(version, nodes)
        waiting = [n for n in nodes if n not in parts]
        if waiting:
            raise NotReady(f"version {version}: node(s) {', '.join(map(str, waiting))} have not staged their parts")
        entries: dict[str, dict[str, Any]] = {}
        for node in nodes:
            for part in parts[node]:
                if part.get("path") in entries and entries[part["path"]]["blob"] != part.get("blob"):
                    raise CheckpointError(f"version {version}: two nodes staged {part['path']}; not committed")
                entries[part["path"]] = dict(part)
        manifest = Manifest(version, sequence, datetime.fromtimestamp(clock.time(), UTC).isoformat(timespec="seconds"),
                            sorted(entries.values(), key=lambda f: f["path"]), meta)
        Manifest.from_json(manifest.to_json(), f"pending records of {version}", self.data_prefix())  # same checks as restore
        listed = self._listed(manifest.files)
        for entry in manifest.files:
            self._verify(entry, listed)
        faultpoints.reach("checkpoint.verified")
        manifest = self._write_manifest(manifest)
        faultpoints.reach("checkpoint.manifest-written")
        pointer = json.dumps(signed_pointer({"schema": SCHEMA, "version": version, "manifest": self.manifest_name(version),
                                             "createdAt": manifest.created_at,
                                             MANIFEST_DIGEST: manifest.digest}, self.environ)).encode()
        try:
            self._move_pointer(version, pointer, expected_etag)  # type: ignore[arg-type]
        except PointerConflict:
            self._withdraw_if_unrestorable(manifest)
            raise
        faultpoints.reach("checkpoint.pointer-written")
        self.abandon_all(version, set(nodes) | set(parts))
        log.info("checkpoint %s committed: %d file(s), %d bytes", version, len(manifest.files), manifest.bytes)
        return manifest

    # --- one node's folder as a version ----------------------------------------------------
    def upload(self, folder: Path, keep: int = 3, files: Mapping[str, LocalFile] | None = None,
               exclude: frozenset[str] = frozenset()) -> UploadResult:
        """Upload `folder` as a new version, commit it, prune to `keep` versions.

        Returns a result with version None when the folder is empty or identical to the
        latest version. Raises FileChanged (nothing committed) when the folder changed
        underneath, PointerConflict when another writer committed meanwhile.
        """
        with self._lock:
            return self._upload(folder, keep, files, exclude)

    def _upload(self, folder: Path, keep: int, files: Mapping[str, LocalFile] | None, exclude: frozenset[str]) -> UploadResult:
        started = clock.monotonic()
        files = scan(folder, exclude) if files is None else files
        pointer, etag = self.pointer()
        try:
            previous = self._manifest_of(self._followed(pointer))
        except CheckpointError as exc:
            # A previous version this job cannot use (its manifest rewritten or deleted by another
            # writer) must not stop every later commit: this one reuses nothing from it.
            log.warning("checkpoint %s: the previous version is not usable (%s); this version is uploaded whole",
                        self.stream, exc)
            previous = None
        if not files:
            return UploadResult(None)
        self.take_over()  # this node's earlier sessions are over: their leases go
        if previous and signature(files) == tuple(sorted((f["path"], f["size"], f["mtimeNs"]) for f in previous.files)):
            return UploadResult(None, reused_files=len(files))
        version, sequence = self.new_version(previous)
        reusable = {f["path"]: f for f in previous.files} if previous else {}
        reused, to_upload = [], []
        for entry in files.values():
            old = reusable.get(entry.path)
            if old and (old["size"], old["mtimeNs"]) == (entry.size, entry.mtime_ns):
                reused.append(old)
            else:
                to_upload.append(entry)
        entries = self.stage(folder, to_upload, version, reused)
        result = UploadResult(version, reused_files=len(reused), uploaded_files=len(to_upload),
                              uploaded_bytes=sum(e.size for e in to_upload))
        self.commit(version, sequence, [self.node], {"layout": "folder"}, expected_etag=etag, parts={self.node: entries})
        result.seconds = clock.monotonic() - started
        log.info("checkpoint %s committed: %d file(s) uploaded (%d bytes, %.0f Mb/s), %d unchanged",
                 version, result.uploaded_files, result.uploaded_bytes, result.mbits_per_s, result.reused_files)
        result.pruned_versions, result.deleted_blobs = self.prune(keep)
        return result

    def prune(self, keep: int) -> tuple[list[str], int]:
        """Retention (prune.py): returns (deleted versions, deleted data blobs)."""
        from amlhpc.jobs.runtime.checkpoint.prune import prune

        return prune(self, keep)

    # --- restoring ------------------------------------------------------------------------
    def _restore_file(self, folder: Path, entry: dict[str, Any], where: str) -> bool:
        """Download one file (verified) unless an identical one is there; True if downloaded."""
        from azure.core.exceptions import ResourceNotFoundError

        target = safepath.target_in(folder, entry["path"], where)
        if target.is_file() and target.stat().st_size == entry["size"] and sha256_of(target) == entry["sha256"]:
            os.utime(target, ns=(entry["mtimeNs"], entry["mtimeNs"]))
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        safepath.target_in(folder, entry["path"], where)  # the folders just made are ours; check nothing moved
        tmp = target.with_name(target.name + TMP_SUFFIX)
        digest = hashlib.sha256()
        size = 0
        try:
            try:
                stream = self.container_of(entry).get_blob_client(entry["blob"]).download_blob()
            except ResourceNotFoundError:
                raise CheckpointError(f"checkpoint blob {entry['blob']} is missing: the version is incomplete") from None
            with open(tmp, "xb") as handle:
                for chunk in stream.chunks():
                    digest.update(chunk)
                    size += len(chunk)
                    handle.write(chunk)
            if size != entry["size"] or digest.hexdigest() != entry["sha256"]:
                raise CheckpointError(f"checkpoint blob {entry['blob']} does not match its manifest "
                                      f"({size} bytes, sha256 {digest.hexdigest()[:12]}..., expected {entry['size']} bytes, "
                                      f"{entry['sha256'][:12]}...)")
            faultpoints.reach("checkpoint.restore-file-written")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        os.utime(target, ns=(entry["mtimeNs"], entry["mtimeNs"]))
        return True

    def restore(self, folder: Path, manifest: Manifest | None = None,
                select: Callable[[str], bool] | None = None) -> Manifest | None:
        """Download a version (default: the latest) into `folder`, verified; None when there is
        none. `select(path)` limits it to some files (a node's own parts)."""
        manifest = manifest or self.latest()
        if manifest is None:
            return None
        where = self.manifest_name(manifest.version)
        wanted = [e for e in manifest.files if select is None or select(e["path"])]
        for entry in wanted:  # every path is checked before anything is written
            safepath.target_in(folder, entry["path"], where)
        folder.mkdir(parents=True, exist_ok=True)
        started = clock.monotonic()
        with workers.pool(self.workers, "ckpt-restore") as pool:
            downloaded = sum(pool.map(lambda e: self._restore_file(folder, e, where), wanted))
        log.info("checkpoint %s restored into %s: %d file(s), %d bytes, %d already present, %.1fs", manifest.version,
                 folder, downloaded, sum(e["size"] for e in wanted), len(wanted) - downloaded, clock.monotonic() - started)
        return manifest


def _bare(etag: str | None) -> str:
    return (etag or "").strip('"')


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
