"""Every write of the checkpoint commit path survives a lost reply: Azure applied the write,
its answer never came, the SDK's retry got 409/412/404 about its own first try
(tests/faultproxy.py `lose`). Afterwards the newest version restores and the uploader keeps
moving; nothing the pointer names is deleted.

The two defects this guards: on the `latest` pointer, `commit` took the retry's 412
for another writer and deleted the manifest the pointer then named (restore failed until the
next commit, and a folder uploader never recovered); on a manifest, the retry's 409 raised
PointerConflict, which the version uploader did not catch: that version was retried first
every round and nothing newer committed."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.blob import blobio
from amlhpc.jobs.runtime.checkpoint import CheckpointStore, tier
from amlhpc.jobs.runtime.checkpoint.uploader import FolderUploader, VersionUploader
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from tests.faultproxy import FaultProxy
from tests.test_checkpoint_faults import assert_clean, assert_consistent, tree, write

pytestmark = pytest.mark.azurite

# (name, method, path pattern): each write of a folder version's upload and commit, in order
FOLDER_WRITES = [
    ("pending record", "PUT", r"/pending/[^/]+/node-0\.json$"),
    ("block", "PUT", r"/data/.*comp=block(&|$)"),
    ("block list", "PUT", r"/data/.*comp=blocklist"),
    ("manifest", "PUT", r"/manifests/[^/]+\.json$"),
    ("pointer", "PUT", r"/latest$"),
    ("lease withdrawal", "DELETE", r"/pending/[^/]+/node-0\.json$"),
    ("prune", "DELETE", r"/(manifests|data)/"),
]


def lose_first(method: str, pattern: str, after: int = 0):
    """A rule for the proxy: the `after+1`-th request matching loses its reply (once)."""
    seen = {"n": 0}
    compiled = re.compile(pattern)

    def rule(m: str, path: str) -> bool:
        if m != method or not compiled.search(path):
            return False
        seen["n"] += 1
        return seen["n"] == after + 1

    return rule


def proxied(azurite, proxy, container) -> object:
    return blobio.container_client(container.container_name, connection_string=proxy.connection_string(azurite),
                                   retry=blobio.RetrySettings.fast())


class TestFolderStream:
    @pytest.mark.parametrize("name, method, pattern", FOLDER_WRITES, ids=[w[0] for w in FOLDER_WRITES])
    def test_a_lost_reply_at_each_write(self, azurite, container, tmp_path, name, method, pattern):
        """v1 commits cleanly; v2's write loses its reply; v2 is committed and restorable,
        and v3 commits after it (the uploader keeps moving)."""
        direct = CheckpointStore(container, "run", block_bytes=64 << 10)
        source = write(tmp_path / "ckpt", {"model.pt": os.urandom(150_000), "meta.json": b'{"step": 1}'})
        direct.upload(source, keep=1)
        write(source, {"model.pt": os.urandom(150_000), "meta.json": b'{"step": 2}'})
        with FaultProxy(azurite.port, lose=lose_first(method, pattern)) as proxy:
            store = CheckpointStore(proxied(azurite, proxy, container), "run", block_bytes=64 << 10)
            uploader = FolderUploader(store, source, interval_s=3600, keep=1, settle_s=0)
            result = uploader.upload_once()
            assert proxy.counts["lost"] == 1, f"the reply to the {name} was never lost"
            assert uploader.errors == [] and result is not None and result.version
            assert direct.pointer()[0]["version"] == result.version
            assert_consistent(direct, tmp_path, tree(source))
            write(source, {"meta.json": b'{"step": 3}'})
            later = uploader.upload_once()
        assert later is not None and later.version and later.version != result.version
        assert_consistent(direct, tmp_path, tree(source))
        assert_clean(direct)

    def test_the_first_pointer_write_too(self, azurite, container, tmp_path):
        """No `latest` yet: the pointer is created (If-None-Match); the retry's 409 is ours."""
        source = write(tmp_path / "ckpt", {"a.bin": os.urandom(10_000)})
        with FaultProxy(azurite.port, lose=lose_first("PUT", r"/latest$")) as proxy:
            store = CheckpointStore(proxied(azurite, proxy, container), "first")
            result = store.upload(source, keep=1)
            assert proxy.counts["lost"] == 1
        direct = CheckpointStore(container, "first")
        assert direct.pointer()[0]["version"] == result.version
        assert_consistent(direct, tmp_path, tree(source))


def held(root: Path, step: int, ranks: list[int], world: int) -> None:
    version = tier.versions_dir(root) / tier.version_name(step)
    for rank in ranks:
        folder = tier.rank_dir(version, rank)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "shard.bin").write_bytes(os.urandom(5000))
        tier.write_marker(version, rank, step=step, world=world, tag="t0")


class TestVersionedStream:
    def nodes(self, container, tmp_path, channel_store, client0=None):
        uploaders = []
        for node in (0, 1):
            store = CheckpointStore(client0 if (client0 is not None and node == 0) else container, "job/versions",
                                    node=node)
            channel = Channel(channel_store, node=node, nodes=2, base_poll_s=0.01).scoped("ckpt", "u0")
            uploaders.append(VersionUploader(store, tmp_path / f"node{node}", [node], node, 2, interval_s=3600, keep=2,
                                             local_keep=5, channel=channel))
        for uploader in uploaders:
            uploader.store.take_over()
        uploaders[0]._announce(lead=None, committed=None)
        return uploaders

    def round(self, uploaders, step: int) -> None:
        for node in (0, 1):
            held(uploaders[node].checkpoint_dir, step, [node], 2)
        uploaders[0].lead_round()
        uploaders[1].follow_round()
        uploaders[0]._try_commit()
        uploaders[1].follow_round()

    @pytest.mark.parametrize("what, method, pattern", [("manifest", "PUT", r"/manifests/"),
                                                       ("pointer", "PUT", r"/latest$"),
                                                       ("lease withdrawal", "POST", r"comp=batch")])
    def test_a_lost_reply_does_not_hold_the_newer_versions_back(self, azurite, container, tmp_path, what, method,
                                                                pattern):
        shared = MemoryStore()
        with FaultProxy(azurite.port, lose=lose_first(method, pattern, after=1)) as proxy:
            uploaders = self.nodes(container, tmp_path, shared, client0=proxied(azurite, proxy, container))
            for step in (2, 4, 6, 8):
                self.round(uploaders, step)
            assert proxy.counts["lost"] == 1, f"the reply to the {what} was never lost"
        assert uploaders[0].committed == [f"{tier.blob_version(s, 't0')}" for s in (2, 4, 6, 8)]
        assert uploaders[0].errors == []
        store = CheckpointStore(container, "job/versions")
        assert store.pointer()[0]["version"] == tier.blob_version(8, "t0")
        assert store.latest().meta["step"] == 8
        assert store.pendings() == {}
        committed = tier.versions_dir(uploaders[1].checkpoint_dir) / "committed.json"
        assert '"step": 8' in committed.read_text(), "node 1 heard of the commit through the store"

    def test_a_version_that_cannot_commit_is_dropped_not_retried_first(self, container, tmp_path):
        """Another writer's manifest already holds step 4's name: step 4 is dropped with the
        conflict reported, and step 6 commits after it."""
        uploaders = self.nodes(container, tmp_path, MemoryStore())
        self.round(uploaders, 2)
        for node in (0, 1):
            held(uploaders[node].checkpoint_dir, 4, [node], 2)
        uploaders[0].lead_round()
        uploaders[1].follow_round()
        container.upload_blob(f"job/versions/manifests/{tier.blob_version(4, 't0')}.json",
                              b'{"schema": 1, "version": "someone else", "files": []}')
        uploaders[0]._try_commit()
        assert "already exists: another writer committed this version name" in uploaders[0].errors[-1]
        self.round(uploaders, 6)
        assert uploaders[0].committed == [tier.blob_version(2, "t0"), tier.blob_version(6, "t0")]
        assert uploaders[0].store.pointer()[0]["version"] == tier.blob_version(6, "t0")

    def test_a_follower_that_missed_the_leads_stages_the_versions_it_holds(self, container, tmp_path):
        """Node 1 saves steps 4 and 6 late (a write of its retried for a minute): node 0 led them,
        then step 8, which node 1 never holds. Node 1 still stages the newest led version it holds
        (6), and 6 commits; before, it staged only the version led now (8), and `latest` stayed at
        2 with no error."""
        uploaders = self.nodes(container, tmp_path, MemoryStore())
        self.round(uploaders, 2)
        for step in (4, 6, 8):
            held(uploaders[0].checkpoint_dir, step, [0], 2)
            uploaders[0].lead_round()
            uploaders[1].follow_round()
        for step in (4, 6):
            held(uploaders[1].checkpoint_dir, step, [1], 2)
        uploaders[1].follow_round()
        uploaders[0]._try_commit()
        assert uploaders[0].committed == [tier.blob_version(2, "t0"), tier.blob_version(6, "t0")]
        assert uploaders[0].store.pointer()[0]["version"] == tier.blob_version(6, "t0")
        uploaders[1].follow_round()
        assert tier.blob_version(4, "t0") not in uploaders[1]._staged, "a version older than the commit is settled"
        assert set(uploaders[1]._led) == {tier.blob_version(8, "t0")}


class TestManagedRecord:
    """The managed run's record (amlhpc/jobs/managed/record.py) is created create-only and saved
    ETag-conditional under a lease: a lost reply's retry answers 409/412, which was taken for
    another writer (the controller gave up its run)."""

    def test_create_and_save_survive_a_lost_reply(self, azurite, container):
        from amlhpc.jobs.managed.record import Record, RecordStore

        with FaultProxy(azurite.port, lose=lose_first("PUT", r"/supervision/run-1/supervision\.json$")) as proxy:
            store = RecordStore(proxied(azurite, proxy, container), "supervision/run-1")
            record = Record(run="run-1", recipe="cosmoflow", policy={})
            etag = store.create(record)
            assert proxy.counts["lost"] == 1
            assert store.load()[1] == etag
        with FaultProxy(azurite.port, lose=lose_first("PUT", r"/supervision/run-1/supervision\.json$")) as proxy:
            store = RecordStore(proxied(azurite, proxy, container), "supervision/run-1")
            assert store.acquire()
            etag = store.save(record, etag)
            assert proxy.counts["lost"] == 1
            assert store.load()[1] == etag
            etag = store.save(record, etag)  # and the next save goes on from it
            store.release()
