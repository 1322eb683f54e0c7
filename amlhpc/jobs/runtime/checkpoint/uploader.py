"""The launcher's background uploads: the node's checkpoint folder, and versioned checkpoints.

`FolderUploader` (any training code): uploads the checkpoint folder every `interval_s` while
training runs, and once more at the end, as one version per upload (store.upload). A round is
skipped when nothing changed since the last committed version, and when the folder is still
changing (two scans `settle_s` apart differ). Upload errors are logged and retried next round:
a storage hiccup must not kill the training.

`VersionUploader` (versioned checkpoints, tier.py): every node stages its own parts of a version
into one stream; node 0 leads. Every `interval_s` node 0 picks the newest version it holds whole
and has not committed, stages its parts; the other nodes see node 0's pending record and stage
their parts of the same version (when they hold it); node 0 commits when every node has staged
(store.commit verifies every part first). In between, each node keeps `local_keep` versions on
its NVMe (never one being uploaded). `cancel()` stops everything at once (an in-job restart):
an upload in flight withdraws its pending record and commits nothing.

Standard library plus azure-storage-blob: ships in the image.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from amlhpc.jobs.runtime.base import clock
from amlhpc.jobs.runtime.checkpoint import tier
from amlhpc.jobs.runtime.checkpoint.errors import (
    CheckpointError,
    FileChanged,
    NotReady,
    PartMissing,
    UploadCancelled,
)
from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of
from amlhpc.jobs.runtime.checkpoint.snapshot import scan, signature
from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore, UploadResult

log = logging.getLogger("amlhpc.checkpoint")

COMMITTED_FILE = "committed.json"
FOLDER_EXCLUDE = frozenset({tier.VERSIONS_DIR})
"""The folder uploader leaves the versioned tier to the version uploader."""


class FolderUploader:
    """Uploads `folder` every `interval_s` while training runs, and once more at the end."""

    def __init__(self, store: CheckpointStore, folder: Path, interval_s: float, keep: int, settle_s: float = 2.0):
        self.store, self.folder, self.interval_s, self.keep, self.settle_s = store, folder, interval_s, keep, settle_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: tuple | None = None
        self.results: list[UploadResult] = []
        self.errors: list[str] = []

    def _scan(self):
        return scan(self.folder, FOLDER_EXCLUDE)

    def mark_current(self) -> None:
        """Treat the folder as already uploaded (after a restore)."""
        self._last = signature(self._scan())

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="checkpoint-uploader", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.upload_once(settle_s=self.settle_s)

    def upload_once(self, settle_s: float = 0.0) -> UploadResult | None:
        files = self._scan()
        if not files or signature(files) == self._last:
            return None
        if settle_s:
            clock.sleep(settle_s)
            if signature(self._scan()) != signature(files):
                log.info("checkpoint folder still changing: upload deferred to the next round")
                return None
        try:
            result = self.store.upload(self.folder, self.keep, files, exclude=FOLDER_EXCLUDE)
        except (FileChanged, UploadCancelled) as exc:
            log.info("checkpoint upload abandoned, nothing committed: %s", exc)
            return None
        except Exception as exc:  # noqa: BLE001 - keep training; report and retry next round
            self.errors.append(f"{type(exc).__name__}: {exc}")
            log.warning("checkpoint upload failed, will retry: %s: %s", type(exc).__name__, exc)
            return None
        self._last = signature(files)
        self.results.append(result)
        return result

    def cancel(self) -> None:
        """Stop now: an upload in flight is abandoned (an in-job restart)."""
        self.store.cancel.set()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.store.cancel.clear()

    def finish(self, attempts: int = 3) -> UploadResult | None:
        """Stop the loop, wait for a running upload, upload what is left. Raises
        CheckpointError when the last state could not be committed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for _ in range(attempts):
            files = self._scan()
            if not files or signature(files) == self._last:
                return self.results[-1] if self.results else None
            before = len(self.errors)
            result = self.upload_once()
            if result is not None:
                return result
            if len(self.errors) == before:
                clock.sleep(1.0)  # abandoned because a file changed: let the writer finish
        raise CheckpointError(f"the final checkpoint of {self.folder} could not be uploaded: "
                              + (self.errors[-1] if self.errors else "files kept changing"))


BackgroundUploader = FolderUploader
"""The name the launcher and the tests knew it by."""


class VersionUploader:
    """One node's side of the versioned stream (see the module docstring)."""

    def __init__(self, store: CheckpointStore, checkpoint_dir: Path, ranks: list[int], node: int, nodes: int,
                 interval_s: float, keep: int, local_keep: int, poll_s: float = 1.0, protect: set[str] | None = None):
        self.store, self.checkpoint_dir, self.ranks, self.node, self.nodes = store, Path(checkpoint_dir), ranks, node, nodes
        self.interval_s, self.keep, self.local_keep, self.poll_s = interval_s, keep, local_keep, poll_s
        self.protect = set(protect or ())
        """Local version folders never pruned (the one training resumed from)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._staged: dict[str, tier.LocalVersion] = {}
        """Blob version -> local version this node staged and that is not committed yet."""
        self._uploading: str | None = None
        self.committed: list[str] = []
        self.errors: list[str] = []

    # what is where
    def _held(self) -> list[tier.LocalVersion]:
        return [v for v in tier.held(self.checkpoint_dir, self.ranks) if v.tag]

    @staticmethod
    def blob_id(version: tier.LocalVersion) -> str:
        return tier.blob_version(version.step, version.tag or "untagged")

    def _meta(self, version: tier.LocalVersion) -> dict:
        return {"layout": "versions", "step": version.step, "world": version.world, "tag": version.tag,
                "local": version.name, "nodes": self.nodes}

    # one node's parts of one version
    def _stage(self, version: tier.LocalVersion) -> None:
        blob = self.blob_id(version)
        self._uploading = version.name
        try:
            files = version.files(self.ranks)
            self.store.stage(version.path, files, blob)
            self._staged[blob] = version
            log.info("checkpoint %s: node %d staged %d file(s) (%d bytes)", blob, self.node, len(files),
                     sum(f.size for f in files))
        finally:
            self._uploading = None

    def _head_step(self) -> int:
        pointer, _ = self.store.pointer()
        return sequence_of(pointer["version"]) if pointer else -1

    def _try_commit(self) -> None:
        head = self._head_step()
        for blob, version in sorted(self._staged.items(), key=lambda item: item[1].step):
            if version.step <= head:  # a newer one is committed already
                self.store.abandon(blob)
                del self._staged[blob]
                continue
            try:
                self.store.commit(blob, version.step, list(range(self.nodes)), self._meta(version))
            except NotReady:
                continue
            except PartMissing as exc:
                log.warning("checkpoint %s not committed: %s", blob, exc)
                self.store.abandon(blob)
                del self._staged[blob]
                continue
            del self._staged[blob]
            self.committed.append(blob)
            self._note_committed(blob, version.step)
            # Older staged versions will never be newer than this one: withdraw them.
            for older in [b for b, v in self._staged.items() if v.step <= version.step]:
                self.store.abandon(older)
                del self._staged[older]
            self.store.prune(self.keep)

    def lead_round(self) -> None:
        """Node 0: stage the newest version held whole and not in Blob yet, then try to commit."""
        known, head = set(self.store.versions()) | set(self._staged), self._head_step()
        fresh = [v for v in self._held() if v.step > head and self.blob_id(v) not in known]
        if fresh:
            self._stage(fresh[-1])
        self._try_commit()

    def _note_committed(self, blob: str, step: int) -> None:
        """`versions/committed.json`: the newest version this node knows is committed (for the
        training and the tests, which can then act after a commit rather than after a time)."""
        path = tier.versions_dir(self.checkpoint_dir) / COMMITTED_FILE
        try:
            current = json.loads(path.read_text()).get("step", -1) if path.exists() else -1
            if step > current:
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text(json.dumps({"version": blob, "step": step, "written": clock.time()}))
                os.replace(tmp, path)
        except (OSError, ValueError) as exc:
            log.warning("could not note the committed checkpoint: %s", exc)

    def follow_round(self) -> None:
        """Other nodes: stage the parts of what node 0 is uploading, when this node holds it."""
        pointer, _ = self.store.pointer()
        if pointer is not None:
            mine = {self.blob_id(v): v for v in self._held()}
            if pointer["version"] in mine:
                self._note_committed(pointer["version"], mine[pointer["version"]].step)
        pendings = self.store.pendings()
        led = {v for v, nodes in pendings.items() if 0 in nodes}
        for blob in [b for b in self._staged if b not in led]:  # node 0 committed or dropped it
            if self.node in pendings.get(blob, {}):
                self.store.abandon(blob)
            del self._staged[blob]
        mine = {self.blob_id(v): v for v in self._held()}
        wanted = sorted((b for b in led & set(mine) if b not in self._staged), key=lambda b: mine[b].step)
        if wanted:
            self._stage(mine[wanted[-1]])

    def prune_local(self) -> list[str]:
        protect = self.protect | {v.name for v in self._staged.values()} | ({self._uploading} if self._uploading else set())
        return tier.prune_local(self.checkpoint_dir, self.ranks, self.local_keep, protect)

    # the loop
    def _step(self, lead_due: bool) -> None:
        try:
            if self.node == 0:
                if lead_due:
                    self.lead_round()
                elif self._staged:
                    self._try_commit()
            else:
                self.follow_round()
        except (FileChanged, UploadCancelled) as exc:
            log.info("checkpoint upload abandoned, nothing committed: %s", exc)
        except Exception as exc:  # noqa: BLE001 - keep training; report and retry next round
            self.errors.append(f"{type(exc).__name__}: {exc}")
            log.warning("checkpoint upload failed, will retry: %s: %s", type(exc).__name__, exc)
        try:
            self.prune_local()
        except OSError as exc:
            log.warning("local checkpoint retention failed: %s", exc)

    def _loop(self) -> None:
        next_lead = clock.monotonic() + self.interval_s
        while not self._stop.wait(self.poll_s):
            due = clock.monotonic() >= next_lead
            if due:
                next_lead = clock.monotonic() + self.interval_s
            self._step(due)

    def start(self) -> None:
        self.store.take_over()
        self._thread = threading.Thread(target=self._loop, name="checkpoint-versions", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """Stop now (an in-job restart): an upload in flight is abandoned, nothing committed."""
        self.store.cancel.set()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for blob in list(self._staged):
            try:
                self.store.abandon(blob)
            except Exception:  # noqa: BLE001 - a stale record is taken over by the next session
                pass
        self._staged.clear()
        self.store.cancel.clear()

    def finish(self, deadline_s: float) -> str | None:
        """At the end of the job: commit the newest version (node 0), or stage this node's parts of
        it (others), within `deadline_s`. Returns the committed version, or raises CheckpointError."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        held = self._held()
        if not held:
            return None
        target = self.blob_id(held[-1])
        deadline = clock.monotonic() + deadline_s
        while clock.monotonic() < deadline:
            pointer, _ = self.store.pointer()
            if pointer is not None and sequence_of(pointer["version"]) >= held[-1].step:
                return pointer["version"]
            self._step(lead_due=self.node == 0 and target not in self._staged)
            clock.sleep(self.poll_s)
        raise CheckpointError(f"the final versioned checkpoint {target} was not committed within {deadline_s:.0f}s"
                              + (f": {self.errors[-1]}" if self.errors else " (a node did not stage its parts)"))

