"""The node's checkpoint duties in the launcher (local rank 0): restore when the job starts,
upload while it trains, report and prepare for an in-job restart, the final upload.

When the job starts the node's tier is empty (each job run has its own folder), so Blob is the
source, stream by stream:
- the folder stream (`<prefix>`, or `<prefix>/node-<k>` when every node writes): its latest
  version into the node's checkpoint folder;
- the versioned stream (`<prefix>/versions`): the newest committed version into
  `versions/step-N/`: this node's ranks' parts when the job runs at the world size that saved
  it; when it does not (the training then reshards: shrink-and-continue), every rank's small
  files and `remote.json`, and the ranks read the data they need from Blob by range (ranged.py).

For an in-job restart (amlhpc/jobs/runtime/launch/restart.py) the node reports the versions it holds intact
(every file's size and mtime checked against its rank's marker, whose SHA-256 was computed while
the file was written: no data is read unless a file changed or AMLHPC_CHECKPOINT_VERIFY=full) and, on node 0, the newest one committed in
Blob; then prepares what all nodes decided: keep the local version and drop newer ones, or
restore Blob's into the tier (a local copy that failed its check is replaced), or start over.

Standard library plus azure-storage-blob: ships in the image.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import clock
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.checkpoint import blocks, ranged, tier
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError
from amlhpc.jobs.runtime.checkpoint.settings import (
    CheckpointSettings,
    container_from_settings,
    stripes_from_settings,
)
from amlhpc.jobs.runtime.checkpoint.snapshot import scan
from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore, Manifest
from amlhpc.jobs.runtime.checkpoint.trust import RestoreTrust
from amlhpc.jobs.runtime.checkpoint.uploader import FOLDER_EXCLUDE, FolderUploader, VersionUploader
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.coord.kvstore import StoreLost, StoreTimeout

log = logging.getLogger("amlhpc.checkpoint")

SHARED_READ_WAIT_S = 3 * 3600.0
"""How long a node waits for node 0 to read a manifest every node needs (node 0 may still be staging)."""


class NodeCheckpoints:
    """One node's checkpoints as its launcher's local rank 0 handles them."""

    def __init__(self, settings: CheckpointSettings, *, node: int, nodes: int, local_size: int, world: int,
                 checkpoint_dir: Path, environ: Mapping[str, str], channel: Channel | None = None):
        from amlhpc.jobs.runtime.base.throttle import Throttle

        self.settings, self.node, self.nodes, self.local_size, self.world = settings, node, nodes, local_size, world
        self.environ = environ
        self.checkpoint_dir = Path(checkpoint_dir)
        self.full_verify = tier.full_verify(environ)
        """AMLHPC_CHECKPOINT_VERIFY=full: a restart hashes every byte of its copies (default: trusts the markers)."""
        container = container_from_settings(settings, environ)  # BlobConfigError (ValueError) on bad settings
        throttle = Throttle.from_mbits_per_s(settings.cap_mbps)  # one cap for the node's uploads
        stripes = stripes_from_settings(settings, container, environ)  # parts over the checkpoint accounts
        self.store = CheckpointStore(container, settings.stream(node), throttle=throttle, node=node, stripes=stripes,
                                     trust=RestoreTrust.from_environ(environ, settings.stream(node)), environ=environ)
        self.versions = CheckpointStore(container, settings.versions_stream, throttle=throttle, node=node,
                                        stripes=stripes, environ=environ,
                                        trust=RestoreTrust.from_environ(environ, settings.versions_stream))
        self.folder_uploader: FolderUploader | None = None
        self.version_uploader: VersionUploader | None = None
        self._versions_protect: set[str] | None = None
        """What the last start_uploads protected; set once the versioned uploads ever ran."""
        self.uploaded: list[str] = []
        self.skipped: list[str] = []
        """Versions the upload rounds passed over for newer ones (node 0; VersionUploader.skipped)."""
        self.channel = channel
        """The job's coordination store (None: one node, or none could be opened)."""
        self._sessions = 0
        """Upload sessions started (the same count on every node: once, then once per in-job restart)."""
        self._session: str | None = None
        """The session of the current version uploader (its scope on the job's store)."""

    @property
    def ranks(self) -> list[int]:
        """The global ranks of this node."""
        return list(range(self.node * self.local_size, (self.node + 1) * self.local_size))

    def _own_parts(self, path: str) -> bool:
        return any(path == f"rank-{r}.json" or path.startswith(f"rank-{r}/") for r in self.ranks)

    # --- at the start ---------------------------------------------------------------------
    def _shared(self, key: str, read: Callable[[], Manifest | None], stream: CheckpointStore) -> Manifest | None:
        """A manifest every node needs: node 0 reads it from Blob and tells the others through
        the job's store (one blob read per job, not one per node: a blob's target is 500 reads/s)."""
        if self.channel is None or self.nodes <= 1:
            return read()
        key = self.channel.key("restore", stream.stream, key)
        if self.node == 0:
            try:
                manifest = read()
            except Exception as exc:
                self.channel.publish(key, {"error": f"node 0 could not read it: {type(exc).__name__}: {exc}"})
                raise
            self.channel.publish(key, {"manifest": manifest.to_json() if manifest else None})
            return manifest
        document = self.channel.await_key(key, SHARED_READ_WAIT_S) or {}
        if document.get("error"):
            raise CheckpointError(f"{stream.stream}: {document['error']}")
        data = document.get("manifest")
        return Manifest.from_json(data, f"node 0's copy of {stream.pointer_name}", stream.data_prefix()) if data else None

    def restore_at_start(self) -> tuple[Manifest | None, Path | None]:
        """(the folder version restored, the versioned checkpoint to resume from), either None."""
        if self.settings.stream(0) == self.store.stream:  # one folder stream for every node
            latest = self._shared("latest", self.store.latest, self.store)
            folder = self.store.restore(self.checkpoint_dir, latest) if latest is not None else None
        else:
            folder = self.store.restore(self.checkpoint_dir)
        tier.discard_after(self.checkpoint_dir, None)  # nothing in this run's tier yet can be this run's
        return folder, self.restore_blob_version(self._shared("latest", self.versions.latest, self.versions))

    def restore_blob_version(self, manifest: Manifest | None = None) -> Path | None:
        """The committed version (default: the latest) into the tier; its folder, None when there is none."""
        manifest = manifest or self.versions.latest()
        if manifest is None:
            return None
        meta = manifest.meta
        local = meta.get("local")
        if not tier.is_version_name(local):
            raise CheckpointError(f"{self.versions.manifest_name(manifest.version)}: `meta.local` {local!r} is not a "
                                  "version folder name (step-NNNNNNNNN)")
        same_world = meta.get("world") == self.world
        target = tier.versions_dir(self.checkpoint_dir) / str(local)
        started = time.monotonic()
        if same_world:
            self.versions.restore(target, manifest, select=self._own_parts)
        else:
            self._restore_for_reshard(target, manifest)
        found = tier.read_version(target)
        needed = self.ranks if same_world else range(int(meta.get("world") or 0))
        if found is None or not found.holds(needed):
            raise CheckpointError(f"checkpoint {manifest.version} in Blob lacks the parts of rank(s) "
                                  f"{sorted(set(needed) - set(found.markers if found else ()))}")
        log.info("versioned checkpoint %s (step %s, saved by %s ranks) restored from Blob into %s in %.1fs%s",
                 manifest.version, meta.get("step"), meta.get("world"), target, time.monotonic() - started,
                 "" if same_world else f": every part's small files, to reshard for {self.world} ranks (the ranks "
                 "read the data by range)")
        return target

    def _restore_for_reshard(self, target: Path, manifest: Manifest) -> None:
        """Another world size: every part's small files (metadata, markers, trainer state) into
        the tier, and `remote.json` naming where the data files are (ranged.py: the ranks read
        the ranges their load needs). A part saved without block digests is restored whole."""
        listed = {e["path"].split("/", 1)[0] for e in manifest.files if e["path"].endswith(f"/{blocks.BLOCKS_FILE}")}

        def remote(path: str) -> bool:
            folder = path.split("/", 1)[0]
            return folder in listed and (path.endswith(blocks.DATA_SUFFIX) or path == f"{folder}/{blocks.BLOCKS_FILE}")
        self.versions.restore(target, manifest, select=lambda path: not remote(path))
        urls = dict(self.settings.account_urls())
        local = self._connection_endpoint()  # Azurite: every striped account is its one account (settings.py)
        remotes = [ranged.Remote(e["path"], e["blob"], e["size"], e.get("etag"),
                                 local or urls.get(e.get("account") or "", self.settings.account_url))
                   for e in manifest.files if remote(e["path"])]
        if remotes:
            ranged.write_remote(target, self.settings.container, remotes)

    def _connection_endpoint(self) -> str | None:
        """The blob endpoint of the connection string (Azurite) the node reads with, if any (not a secret)."""
        from amlhpc.jobs.runtime.blob import blobio

        given = self.environ.get(blobio.CONNECTION_STRING_VARIABLE)
        return blobio.parse_connection_string(given).blob_endpoint if given else None

    # --- while training ---------------------------------------------------------------------
    def start_uploads(self, protect: set[str] | None = None) -> None:
        """Background uploads: the folder (writer nodes), versioned checkpoints (every node)."""
        if self.folder_uploader is None and self.settings.is_writer(self.node):
            self.folder_uploader = FolderUploader(self.store, self.checkpoint_dir, self.settings.interval_s,
                                                  self.settings.keep)
            self.folder_uploader.mark_current()
            self.folder_uploader.start()
        self.version_uploader = self._version_uploader(protect)
        if self.version_uploader is not None:
            self.version_uploader.start()

    def _version_uploader(self, protect: set[str] | None, session: str | None = None) -> VersionUploader | None:
        """The versioned uploads of one session (each keeps its own books on the job's store), or
        None when several nodes have no store to keep them on. `session`: one node 0 named (the
        final upload's); default the node's next."""
        self._versions_protect = set(protect or ())
        if session is None:
            session, self._sessions = f"u{self._sessions}", self._sessions + 1
        self._session = session
        if self.nodes > 1 and self.channel is None:
            log.warning("versioned checkpoints are not uploaded: the %d nodes keep the books of a commit on the job's "
                        "coordination store, and none is open (no MASTER_ADDR)", self.nodes)
            return None
        channel = self.channel.scoped("ckpt", session) if self.channel is not None else None
        return VersionUploader(self.versions, self.checkpoint_dir, self.ranks, self.node, self.nodes,
                               self.settings.interval_s, self.settings.keep, self.settings.local_keep,
                               protect=protect, channel=channel)

    def cancel_version_uploads(self) -> None:
        if self.version_uploader is not None:
            self.version_uploader.cancel()
            self.uploaded += self.version_uploader.committed
            self.skipped += self.version_uploader.skipped
            self.version_uploader = None

    def finish(self, final_wait_s: float, generation_failed: Callable[[], bool] | None = None) -> list[str]:
        """The final uploads; returns the errors (empty when everything is committed).
        `generation_failed` (node 0 of several): whether the job's last training run failed
        anywhere, read from the job's store (see `_final_session`)."""
        errors = []
        if self.folder_uploader is not None:
            try:
                result = self.folder_uploader.finish()
                if result is not None and result.version:
                    log.info("checkpoint %s is the latest in %s/%s", result.version, self.settings.container,
                             self.store.stream)
            except CheckpointError as exc:
                errors.append(str(exc))
            self.uploaded += [r.version for r in self.folder_uploader.results if r.version]
        started = clock.monotonic()
        try:
            self._final_session(final_wait_s, generation_failed)
        except CheckpointError as exc:
            errors.append(str(exc))
            self.cancel_version_uploads()
        if self.version_uploader is not None:
            try:
                committed = self.version_uploader.finish(max(0.0, final_wait_s - (clock.monotonic() - started)))
                if committed:
                    log.info("versioned checkpoint %s is the latest in %s/%s", committed, self.settings.container,
                             self.versions.stream)
            except CheckpointError as exc:
                errors.append(str(exc))
            self.uploaded += self.version_uploader.committed
            self.skipped += self.version_uploader.skipped
        if self.skipped:
            log.warning("checkpoint uploads skipped %d version(s) for newer ones (%d committed): the upload takes "
                        "longer than interval_s", len(self.skipped), len(self.uploaded))
        return errors

    def _final_session(self, wait_s: float, generation_failed: Callable[[], bool] | None) -> None:
        """Every node commits the final version in the same upload session.

        An in-job restart that is weighed stops a node's versioned uploads (its report), and the
        job may end instead (a node preempted or lost, the same node hanging again): the newest
        version every node holds whole is what the next job resumes from, so it is committed as
        at any other end, in a new session. But a node that finds the generation's end already
        decided adopts it without reporting, so its uploads of the old session still run: whether
        a node stopped its uploads differs between nodes, and a node listening in the old session
        never hears node 0 lead the final commit in the new one (it waited out the final wait
        with nothing staged). So node 0 names the session and the others join it: a new one when
        its own uploads stopped or the last run failed anywhere (a node that reported published
        or read that failure before it looked for the decision, so node 0, which reaches this
        point only once the decision is stored, always sees it), else the one that runs."""
        if self._versions_protect is None:  # the versioned uploads never ran
            return
        if self.nodes <= 1 or self.channel is None:
            if self.version_uploader is None:
                self._open_final_session(None)
            return
        word = self.channel.key("ckpt", "final")
        if self.node == 0:
            if self.version_uploader is None or (generation_failed is not None and generation_failed()):
                self.cancel_version_uploads()
                self._open_final_session(None)
            self.channel.publish(word, {"session": self._session})
            return
        try:
            document = self.channel.await_key(word, wait_s)
        except (StoreTimeout, StoreLost) as exc:
            raise CheckpointError(f"node 0 named no upload session for the final versioned checkpoint: {exc}") from None
        session = document.get("session") if isinstance(document, dict) else None
        if not isinstance(session, str):
            raise CheckpointError(f"node 0's word on the final upload session is unreadable: {document!r}")
        if self.version_uploader is not None and session == self._session:
            return
        self.cancel_version_uploads()
        self._open_final_session(session)

    def _open_final_session(self, session: str | None) -> None:
        """A new uploader for the final commit; this node's records of earlier sessions are withdrawn."""
        self.version_uploader = self._version_uploader(self._versions_protect, session)
        if self.version_uploader is not None:
            self.version_uploader.open()

    # --- in-job restart -----------------------------------------------------------------
    def restart_report(self) -> dict[str, Any]:
        """Stop the version uploads; what this node holds intact; node 0: Blob's latest."""
        self.cancel_version_uploads()
        intact = []
        for version in reversed(tier.held(self.checkpoint_dir, self.ranks)):
            problem = version.verify(self.ranks, full=self.full_verify)
            if problem:
                log.warning("local checkpoint not intact, not offered for the restart: %s", problem)
                continue
            intact.append({"name": version.name, "step": version.step, "tag": version.tag})
        report: dict[str, Any] = {"versions": intact, "folder_files": bool(scan(self.checkpoint_dir, FOLDER_EXCLUDE))}
        if self.node == 0:
            latest = self.versions.latest()
            if latest is not None:
                report["blob_latest"] = {"version": latest.version, "step": latest.meta.get("step"),
                                         "tag": latest.meta.get("tag"), "local": latest.meta.get("local")}
        return report

    def apply(self, decision) -> Any:
        """Make the node's tier what the decision needs; the decision with `resume` (this node's
        folder to resume from) filled in, or turned into an end when the restore fails."""
        if decision.source == "local":
            tier.discard_after(self.checkpoint_dir, decision.step)
            return dataclasses.replace(decision, resume=str(tier.versions_dir(self.checkpoint_dir) / decision.version))
        tier.discard_after(self.checkpoint_dir, None)
        if decision.source == "none":
            return dataclasses.replace(decision, resume=None)
        try:
            manifest = self._shared(f"version-{decision.blob_version}",
                                    lambda: self.versions.manifest(decision.blob_version), self.versions)
            if manifest is None:
                raise CheckpointError(f"checkpoint {decision.blob_version} is no longer in Blob")
            resume = self.restore_blob_version(manifest)
        except Exception as exc:  # noqa: BLE001 - any restore failure ends the job: a new attempt restores again

            return dataclasses.replace(decision, result="end", reason=f"restoring {decision.blob_version} from Blob "
                                       f"failed: {type(exc).__name__}: {exc}", exit_code=ExitCode.RESTORE)
        return dataclasses.replace(decision, resume=str(resume))
