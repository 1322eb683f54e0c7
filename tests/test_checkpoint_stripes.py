"""Checkpoints striped over several storage accounts, a block size that fits any file, and the
versions an upload round skips, in the simulated Azure (amlhpc.sim: per-account request and
byte accounting, virtual time).

Striping: a version's parts are spread over the accounts with about the same bytes on each, the
manifest names each part's account, commit verifies each part in its own account, restore reads
it from there, retention deletes an old version's parts in every account, and a manifest naming
an account the job does not list is refused with the fix. Block size: a file larger than
floor x 50,000 blocks commits (a fixed block size failed at commit after every byte moved), and
a file larger than any block blob is refused before any request."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.blob import blocks
from amlhpc.jobs.runtime.checkpoint import CheckpointStore, tier
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError
from amlhpc.jobs.runtime.checkpoint.settings import parse_settings
from amlhpc.jobs.runtime.checkpoint.uploader import COMMITTED_FILE, VersionUploader
from amlhpc.sim.limits import BlobLimits
from amlhpc.sim.scenarios.checkpoints import save_version
from amlhpc.sim.world import World

ACCOUNTS = ("ckpta", "ckptb", "ckptc")


def write_files(folder: Path, sizes: dict[str, int]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in sizes.items():
        (folder / name).write_bytes(os.urandom(size))
    return folder


def striped(world: World, node: int = 0, accounts=ACCOUNTS, **kwargs) -> CheckpointStore:
    stripes = [(name, world.container("checkpoints", account=name)) for name in accounts]
    return CheckpointStore(stripes[0][1], "run", node=node, stripes=stripes, **kwargs)


def data_bytes(world: World, account: str) -> int:
    container = world.blob.accounts[account].containers.get("checkpoints")
    return sum(b.size for name, b in container.blobs.items() if "/data/" in name) if container else 0


class TestStriping:
    def test_parts_are_spread_evenly_recorded_verified_and_restored(self, tmp_path):
        sizes = {f"rank-{k}.pt": 30_000 + 1_000 * (k % 3) for k in range(12)}
        source = write_files(tmp_path / "src", sizes)
        with World(seed=1) as world:
            store = striped(world)
            result = world.call(lambda: store.upload(source, keep=1))
            manifest = world.call(store.latest)
            assert result.version and manifest is not None
            assert {f["account"] for f in manifest.files} == set(ACCOUNTS)
            per_account = {a: data_bytes(world, a) for a in ACCOUNTS}
            total = sum(sizes.values())
            assert sum(per_account.values()) == total
            assert max(per_account.values()) <= total / len(ACCOUNTS) * 1.1, per_account
            # Records, manifests and the pointer stay in the first account only.
            others = [n for a in ACCOUNTS[1:] for n in world.blob.accounts[a].containers["checkpoints"].blobs]
            assert all("/data/" in n for n in others), others
            target = tmp_path / "restored"
            world.call(lambda: store.restore(target))
            assert {p.name: p.read_bytes() for p in target.iterdir()} == {p.name: p.read_bytes() for p in source.iterdir()}

    def test_retention_deletes_old_parts_in_every_account(self, tmp_path):
        source = write_files(tmp_path / "src", {f"p{k}.bin": 5_000 for k in range(6)})
        with World(seed=2) as world:
            store = striped(world)
            world.call(lambda: store.upload(source, keep=1))
            first = {a: data_bytes(world, a) for a in ACCOUNTS}
            write_files(source, {f"p{k}.bin": 5_000 for k in range(6)})  # every file changed
            world.call(lambda: store.upload(source, keep=1))
            assert {a: data_bytes(world, a) for a in ACCOUNTS} == first  # the old version's parts are gone everywhere
            assert all(first.values())

    def test_a_commit_verifies_each_part_in_its_account(self, tmp_path):
        source = write_files(tmp_path / "src", {f"p{k}.bin": 4_000 for k in range(3)})
        with World(seed=3) as world:
            store = striped(world)
            version, _ = world.call(lambda: store.new_version(None))
            entries = world.call(lambda: store.stage(source, list(store_files(source)), version))
            victim = next(e for e in entries if e["account"] == "ckptb")
            world.call(lambda: world.container("checkpoints", account="ckptb").delete_blob(victim["blob"]))
            with pytest.raises(CheckpointError, match="not in Blob"):
                world.call(lambda: store.commit(version, 1, [0], {"layout": "folder"}, parts={0: entries}))
            assert world.call(store.pointer) == (None, None)

    def test_a_part_in_an_account_the_job_does_not_list_is_refused_with_the_fix(self, tmp_path):
        source = write_files(tmp_path / "src", {f"p{k}.bin": 4_000 for k in range(4)})
        with World(seed=4) as world:
            world.call(lambda: striped(world).upload(source))
            fewer = striped(world, accounts=ACCOUNTS[:2])
            with pytest.raises(CheckpointError, match="'ckptc'.*checkpointAccounts"):
                world.call(lambda: fewer.restore(tmp_path / "restored"))

    def test_a_manifest_naming_a_bad_account_is_refused(self, tmp_path):
        source = write_files(tmp_path / "src", {"a.bin": 100})
        with World(seed=5) as world:
            store = striped(world)
            world.call(lambda: store.upload(source))
            pointer, _ = world.call(store.pointer)
            name = store.manifest_name(pointer["version"])
            container = world.container("checkpoints", account=ACCOUNTS[0])
            document = json.loads(world.call(lambda: container.download_blob(name).readall()))
            document["files"][0]["account"] = "../evil"
            world.call(lambda: container.upload_blob(name, json.dumps(document).encode(), overwrite=True))
            with pytest.raises(CheckpointError, match="not a storage account name"):
                world.call(store.latest)


def store_files(folder: Path):
    from amlhpc.jobs.runtime.checkpoint.snapshot import scan

    return scan(folder).values()


class TestSettings:
    def test_accounts_give_endpoints_in_the_cloud_of_account_url(self):
        settings = parse_settings(json.dumps({"container": "checkpoints", "prefix": "e/r", "accounts": ["ck0", "ck1"],
                                              "account_url": "https://ck0.blob.core.chinacloudapi.cn/"}))
        assert settings.account_urls() == [("ck0", "https://ck0.blob.core.chinacloudapi.cn/"),
                                           ("ck1", "https://ck1.blob.core.chinacloudapi.cn/")]
        plain = parse_settings(json.dumps({"container": "checkpoints", "prefix": "e/r", "accounts": ["ck0"]}))
        assert plain.account_urls() == [("ck0", "https://ck0.blob.core.windows.net/")]

    @pytest.mark.parametrize("accounts", ["ck0", ["Bad_Name"], ["ck0", "ck0"], [1]])
    def test_bad_accounts_are_named(self, accounts):
        with pytest.raises(Exception, match="accounts"):
            parse_settings(json.dumps({"container": "checkpoints", "prefix": "e/r", "accounts": accounts}))


class TestBlockSize:
    def test_block_size_grows_to_fit_any_file_up_to_the_maximum(self):
        floor = 8 << 20
        assert blocks.block_bytes_for(floor * 50_000, floor) == floor
        bigger = blocks.block_bytes_for(floor * 50_000 + 1, floor)
        assert bigger == 9 << 20 and bigger * blocks.MAX_BLOCKS >= floor * 50_000 + 1
        assert blocks.block_bytes_for(blocks.MAX_BLOB_BYTES, floor) == blocks.MAX_BLOCK_BYTES
        with pytest.raises(blocks.BlobTooLarge, match="largest block blob"):
            blocks.block_bytes_for(blocks.MAX_BLOB_BYTES + 1, floor)

    def test_a_file_over_floor_times_the_block_limit_commits(self, tmp_path, monkeypatch):
        """The service allows 4 blocks here: a 3 MiB file with a 64 KiB floor needs 48 of them."""
        monkeypatch.setattr(blocks, "MAX_BLOCKS", 4)
        source = write_files(tmp_path / "src", {"big.pt": 3 << 20})
        with World(seed=6, limits=BlobLimits(max_committed_blocks=4)) as world:
            store = CheckpointStore(world.container("checkpoints"), "run", block_bytes=64 << 10)
            result = world.call(lambda: store.upload(source))
            assert result.version and world.call(store.latest).bytes == 3 << 20

    def test_a_file_larger_than_any_blob_is_refused_before_any_byte_moves(self, tmp_path, monkeypatch):
        monkeypatch.setattr(blocks, "MAX_BLOB_BYTES", 1 << 20)
        source = write_files(tmp_path / "src", {"huge.pt": (1 << 20) + 1, "small.pt": 10})
        with World(seed=7) as world:
            store = CheckpointStore(world.container("checkpoints"), "run")
            with pytest.raises(CheckpointError, match="huge.pt is 1,048,577 bytes.*split it"):
                world.call(lambda: store.upload(source))
            assert world.blob.accounts["simaccount"].containers["checkpoints"].blobs == {}
            assert world.blob.accounting.ops["put_block"] == 0


class TestSkippedVersions:
    def test_a_round_that_passes_over_versions_reports_them(self, tmp_path):
        with World(seed=8) as world:
            store = CheckpointStore(world.container("checkpoints"), "run/versions", node=0)
            uploader = VersionUploader(store, tmp_path, [0], 0, 1, interval_s=600, keep=2, local_keep=5)
            tag = tier.timeline_tag("run", 0)
            for step in (1, 2, 3):
                save_version(tmp_path, 0, step, 1, tag)
            world.call(uploader.open)
            world.call(uploader.lead_round)
            assert uploader.skipped == [uploader.blob_id(v) for v in tier.held(tmp_path, [0])[:2]]
            status = json.loads((tier.versions_dir(tmp_path) / COMMITTED_FILE).read_text())
            assert status["skipped"] == 2 and status["step"] == 3
            save_version(tmp_path, 0, 4, 1, tag)
            world.call(uploader.lead_round)  # one new version, nothing passed over: counted once
            assert len(uploader.skipped) == 2
