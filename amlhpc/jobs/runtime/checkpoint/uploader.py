"""The launcher's background uploads: the node's checkpoint folder, and versioned checkpoints.

`FolderUploader` (any training code): uploads the checkpoint folder every `interval_s` while
training runs, and once more at the end, as one version per upload (store.upload). A round is
skipped when nothing changed since the last committed version, and when the folder is still
changing (two scans `settle_s` apart differ). Upload errors are logged and retried next round:
a storage hiccup must not kill the training.

`VersionUploader` (versioned checkpoints, tier.py): every node stages its own parts of a version
into one stream; node 0 leads, and the nodes keep the books of a commit on the job's
coordination store (amlhpc.jobs.runtime.coord.agree), not in Blob. Every `interval_s` node 0 picks the
newest version it holds whole and has not committed, and announces it: one create-only entry
in a log of its leads (`leads/<n>`, the n-th version it led, or the n-th it dropped), then `lead`
(the log's length) and a counter `changes` the others poll: one store call per node per poll at
any node count, and one more to read the entries a node has not read yet. Node 0 stages its
parts; each other node keeps every version led and not yet committed or dropped, and stages
the newest of them it holds and has not staged, one per poll, and tells node 0 (its parts under
`<version>/node-<k>`, a counter `<version>/staged`). So a node that fell behind (a write whose
retries took a minute) still stages the versions every node holds, not only the one led now:
a follower that knew only the current lead never staged the older ones, which then stayed
uncommitted while `latest` stopped moving, without an error. Once every node staged a version,
node 0 reads their parts in one call and commits (store.commit verifies every part from one
listing per data folder first), then announces `committed`; every older version is then
settled for every node. A version that cannot be committed (a part missing, another writer's
pointer) is dropped (a `dropped` entry in the log), never retried before the newer ones. In
between, each node keeps `local_keep` versions on its NVMe (never one being uploaded).
`cancel()` stops everything at once (an in-job restart): an upload in flight withdraws its
pending record and commits nothing. The store's keys are scoped per upload session
(NodeCheckpoints counts them alike on every node), so a restarted training never reads the
announcements of the one before.

The Blob pending records stay: they are the leases prune honours (store.py).

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
    PartMissing,
    PointerConflict,
    UploadCancelled,
)
from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of
from amlhpc.jobs.runtime.checkpoint.snapshot import scan, signature
from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore, UploadResult
from amlhpc.jobs.runtime.coord import pacing
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.coord.kvstore import StoreLost

log = logging.getLogger("amlhpc.checkpoint")

COMMITTED_FILE = "committed.json"
FOLDER_EXCLUDE = frozenset({tier.VERSIONS_DIR})
"""The folder uploader leaves the versioned tier to the version uploader."""
LEADS_PER_READ = 256
"""Entries of node 0's log of leads a follower reads in one store call."""


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
                 interval_s: float, keep: int, local_keep: int, poll_s: float = 1.0, protect: set[str] | None = None,
                 channel: Channel | None = None):
        self.store, self.checkpoint_dir, self.ranks, self.node, self.nodes = store, Path(checkpoint_dir), ranks, node, nodes
        self.interval_s, self.keep, self.local_keep = interval_s, keep, local_keep
        self.poll_s = pacing.store_poll_s(poll_s, nodes)
        self.protect = set(protect or ())
        """Local version folders never pruned (the one training resumed from)."""
        if nodes > 1 and channel is None:
            raise CheckpointError(f"versioned checkpoints of a {nodes}-node job need the job's coordination store "
                                  "(node 0's, at MASTER_ADDR): none is open")
        self.channel = channel
        """The job's store, scoped to this stream and upload session (None for one node)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._staged: dict[str, tier.LocalVersion] = {}
        """Blob version -> local version this node staged and that is not committed yet."""
        self._parts: dict[str, list[dict]] = {}
        """Node 0: its own parts of each version it staged."""
        self._uploading: str | None = None
        self._head = -1
        """The step `latest` names (node 0 reads Blob; the others hear it through the store)."""
        self._head_version: str | None = None
        self._seen = 0
        """Followers: the count of node 0's announcements last read."""
        self._leads = 0
        """Node 0: entries in its log of leads; the others: entries of it read."""
        self._newest_lead: dict | None = None
        """Node 0: the newest version it led (repeated in `lead` beside the log's length)."""
        self._led: dict[str, int] = {}
        """Followers: versions node 0 led and neither committed nor dropped yet (blob -> step)."""
        self.committed: list[str] = []
        self.errors: list[str] = []
        self.skipped: list[str] = []
        """Node 0: versions every node held that a round passed over for a newer one (each once):
        their steps were never in Blob, so the recovery point is older than the interval says."""

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
    def _stage(self, version: tier.LocalVersion) -> list[dict]:
        blob = self.blob_id(version)
        self._uploading = version.name
        try:
            files = version.files(self.ranks)
            entries = self.store.stage(version.path, files, blob)
            self._staged[blob] = version
            log.info("checkpoint %s: node %d staged %d file(s) (%d bytes)", blob, self.node, len(files),
                     sum(f.size for f in files))
            return entries
        finally:
            self._uploading = None

    # node 0
    def _announce(self, **documents: dict | None) -> None:
        """Node 0: tell the other nodes what it leads or committed (one counter they poll)."""
        if self.channel is None:
            return
        for name, document in documents.items():
            self.channel.publish(self.channel.key(name), document)
        # An over-count (a retried add) only makes the followers read the announcements once more.
        self.channel.count(self.channel.key("changes"))

    def _log_lead(self, blob: str, step: int, dropped: bool = False) -> None:
        """Node 0: append one entry to the log of its leads (create-only: a retry after a lost
        reply finds its own entry), then announce the log's new length. Every entry stays, so a
        node that missed announcements reads the ones it has not read (see the module docstring)."""
        if self.channel is None:
            return
        self._leads += 1
        self.channel.decide(self.channel.key("leads", self._leads), {"version": blob, "step": step,
                                                                     **({"dropped": True} if dropped else {})})
        if not dropped:
            self._newest_lead = {"version": blob, "step": step}
        self._announce(lead={**(self._newest_lead or {}), "leads": self._leads})

    def _read_head(self) -> int:
        pointer, _ = self.store.pointer()
        self._head = sequence_of(pointer["version"]) if pointer else -1
        self._head_version = pointer["version"] if pointer else None
        return self._head

    def _drop(self, blob: str, announce: bool = False) -> None:
        """Node 0: withdraw every node's lease of a version that will not be committed; `announce`
        it for one that is not older than a committed one (the others would stage it otherwise)."""
        self.store.abandon_all(blob, range(self.nodes))
        version = self._staged.pop(blob, None)
        self._parts.pop(blob, None)
        if announce and version is not None:
            self._log_lead(blob, version.step, dropped=True)

    def _ready_parts(self, blob: str) -> dict[int, list[dict]] | None:
        """Every node's parts of `blob` once every node staged it (two store calls), else None."""
        parts = {self.node: self._parts[blob]}
        if self.channel is None:
            return parts
        # The counter is a hint (a follower's add retried after a lost reply counts twice); the
        # followers' own keys confirm it, so `gather` never waits on a part not yet published.
        keys = [self.channel.key(blob, f"node-{k}") for k in range(1, self.nodes)]
        if self.channel.count(self.channel.key(blob, "staged"), 0) < self.nodes - 1 or not self.channel.all_present(keys):
            return None
        others = self.channel.gather(keys)
        for k, document in enumerate(others, start=1):
            if not isinstance(document, list):
                return None
            parts[k] = document
        return parts

    def _try_commit(self) -> None:
        head = self._head
        for blob, version in sorted(self._staged.items(), key=lambda item: item[1].step):
            if version.step <= head:  # a newer one is committed already
                self._drop(blob)
                continue
            parts = self._ready_parts(blob)
            if parts is None:
                continue
            try:
                self.store.commit(blob, version.step, list(range(self.nodes)), self._meta(version), parts=parts)
            except (PartMissing, PointerConflict) as exc:
                # Never retried: a version that cannot commit must not stand before the newer ones.
                log.warning("checkpoint %s not committed: %s", blob, exc)
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self._drop(blob, announce=True)
                continue
            self._staged.pop(blob, None)
            self._parts.pop(blob, None)
            self.committed.append(blob)
            self._head, self._head_version = version.step, blob
            head = version.step
            self._note_committed(blob, version.step)
            self._announce(committed={"version": blob, "step": version.step})
            # Older staged versions will never be newer than this one: withdraw them.
            for older in [b for b, v in self._staged.items() if v.step <= version.step]:
                self._drop(older)
            self.store.prune(self.keep)

    def lead_round(self) -> None:
        """Node 0: stage the newest version held whole and not in Blob yet, then try to commit."""
        known, head = set(self.store.versions()) | set(self._staged), self._read_head()
        fresh = [v for v in self._held() if v.step > head and self.blob_id(v) not in known]
        passed = [self.blob_id(v) for v in fresh[:-1] if self.blob_id(v) not in self.skipped]
        if passed:
            # The uploader takes the newest each round: an upload slower than the interval passes
            # over versions. Said, counted and in the status file, never silent.
            self.skipped += passed
            log.warning("checkpoint %s skipped (a newer one is uploaded instead; %d skipped in all): the upload of "
                        "a version takes longer than interval_s, so fewer steps reach Blob; stripe the checkpoint "
                        "over more storage accounts or lengthen interval_s", ", ".join(passed), len(self.skipped))
            self._write_status({"skipped": len(self.skipped), "lastSkipped": passed[-1]})
        if fresh:
            blob = self.blob_id(fresh[-1])
            self._log_lead(blob, fresh[-1].step)
            self._parts[blob] = self._stage(fresh[-1])
        self._try_commit()

    def _note_committed(self, blob: str, step: int) -> None:
        """`versions/committed.json`: the newest version this node knows is committed (for the
        training and the tests, which can then act after a commit rather than after a time), and
        on node 0 how many versions the rounds skipped."""
        self._write_status({"version": blob, "step": step}, newer_step=step)

    def _write_status(self, fields: dict, newer_step: int | None = None) -> None:
        """Merge `fields` into `versions/committed.json` (only when `newer_step` is newer, if given)."""
        path = tier.versions_dir(self.checkpoint_dir) / COMMITTED_FILE
        try:
            current = json.loads(path.read_text()) if path.exists() else {}
            if newer_step is not None and newer_step <= current.get("step", -1):
                return
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps({**current, **fields, "skipped": len(self.skipped), "written": clock.time()}))
            os.replace(tmp, path)
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("could not note the checkpoint status: %s", exc)

    # the other nodes
    def _hear(self) -> None:
        """Followers: node 0's announcements, one store call per poll (two when something changed,
        and one more for the entries of its log of leads not read yet)."""
        assert self.channel is not None
        changes = self.channel.count(self.channel.key("changes"), 0)
        if changes == self._seen:
            return
        self._seen = changes
        lead, committed = self.channel.gather([self.channel.key("lead"), self.channel.key("committed")])
        logged = lead.get("leads") if isinstance(lead, dict) else None
        while isinstance(logged, int) and logged > self._leads:
            # Node 0 writes an entry before the length that counts it: every key read here exists.
            numbers = range(self._leads + 1, min(logged, self._leads + LEADS_PER_READ) + 1)
            for entry in self.channel.gather([self.channel.key("leads", n) for n in numbers]):
                if not isinstance(entry, dict) or not isinstance(entry.get("version"), str):
                    continue
                if entry.get("dropped"):
                    self._led.pop(entry["version"], None)
                elif isinstance(entry.get("step"), int):
                    self._led[entry["version"]] = entry["step"]
            self._leads = numbers[-1]
        if isinstance(committed, dict) and isinstance(committed.get("step"), int) and committed["step"] > self._head:
            self._head, self._head_version = committed["step"], committed.get("version")
            mine = {self.blob_id(v): v for v in self._held()}
            if committed.get("version") in mine:
                self._note_committed(committed["version"], committed["step"])
        # Committed, or older than the committed one (node 0 withdrew them): settled.
        self._led = {blob: step for blob, step in self._led.items() if step > self._head}

    def follow_round(self) -> None:
        """Other nodes: stage this node's parts of the newest version node 0 leads that this node
        holds and has not staged (one per poll; the older ones in the next polls, unless a commit
        settles them first)."""
        self._hear()
        for settled in [b for b in self._staged if b not in self._led]:  # committed or dropped
            del self._staged[settled]
        mine = {self.blob_id(v): v for v in self._held()}
        todo = sorted((b for b in self._led if b in mine and b not in self._staged), key=lambda b: self._led[b])
        if not todo:
            return
        blob = todo[-1]
        assert self.channel is not None
        # Its slot in the job's burst (the pending record and its update, a block and a block
        # list per file; more blocks for a large file: the slot is a floor, not a cap). Waited
        # here: a slot left to the next poll puts every follower a poll behind node 0's lead.
        # Its phase in the job's bytes: the first block of every node in the same second would
        # pass the accounts' ingress however the caps add up (pacing.byte_offset_s).
        clock.sleep(max(pacing.stage_offset_s(self.node, 2 * len(mine[blob].files(self.ranks)) + 2),
                        pacing.byte_offset_s(self.node, self.nodes, self.store.block_bytes, self.store.throttle.rate)))
        entries = self._stage(mine[blob])
        self.channel.publish(self.channel.key(blob, f"node-{self.node}"), entries)
        self.channel.count(self.channel.key(blob, "staged"))

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
        except StoreLost:
            raise
        except Exception as exc:  # noqa: BLE001 - keep training; report and retry next round
            self.errors.append(f"{type(exc).__name__}: {exc}")
            log.warning("checkpoint upload failed, will retry: %s: %s", type(exc).__name__, exc)
        try:
            self.prune_local()
        except OSError as exc:
            log.warning("local checkpoint retention failed: %s", exc)

    def _loop(self) -> None:
        next_lead = clock.monotonic() + self.interval_s
        try:
            while not self._stop.wait(self.poll_s):
                due = clock.monotonic() >= next_lead
                if due:
                    next_lead = clock.monotonic() + self.interval_s
                self._step(due)
        except StoreLost as exc:
            self.errors.append(str(exc))
            log.error("checkpoint uploads stopped: %s", exc)

    def open(self) -> None:
        """Begin the session: this node's records of earlier sessions are withdrawn; node 0 writes
        the keys the others read (they read `lead` and `committed` together, so both must exist)."""
        self.store.take_over()
        if self.node == 0 and self.channel is not None:
            self._announce(lead=None, committed=None)

    def start(self) -> None:
        self.open()
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
                if self.node == 0:
                    self._drop(blob)
                else:
                    self.store.abandon(blob)
            except Exception:  # noqa: BLE001 - a stale record is taken over by the next session
                pass
        self._staged.clear()
        self._parts.clear()
        self.store.cancel.clear()

    def _committed_step(self) -> int:
        """The step `latest` names: Blob's pointer on node 0, node 0's word to the others."""
        if self.node == 0 or self.channel is None:
            return self._read_head()
        self._hear()
        return self._head

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
        try:
            while clock.monotonic() < deadline:
                if self._committed_step() >= held[-1].step:
                    if self.node == 0 and self.channel is not None:
                        # The others may be in a session that never heard of it (the final
                        # upload's, opened after an in-job restart was weighed): tell them.
                        self._announce(committed={"version": self._head_version, "step": self._head})
                    return self._head_version
                self._step(lead_due=self.node == 0 and target not in self._staged)
                clock.sleep(self.poll_s)
        except StoreLost as exc:
            raise CheckpointError(f"the final versioned checkpoint {target} was not committed: {exc}") from None
        raise CheckpointError(f"the final versioned checkpoint {target} was not committed within {deadline_s:.0f}s"
                              + (f": {self.errors[-1]}" if self.errors else " (a node did not stage its parts)"))
