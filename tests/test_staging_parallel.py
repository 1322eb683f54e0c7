"""Large files inflated on several cores, and what staging verifies, blob kind by blob kind, on a real Azurite."""

from __future__ import annotations

import base64
import gzip
import hashlib
import threading
from pathlib import Path

import pytest

from amlhpc.jobs.data import upload
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.base.ranks import validated
from amlhpc.jobs.runtime.blob import blobio, gzmembers
from amlhpc.jobs.runtime.staging import stager as staging
from bench.dataset import generate
from tests.faultproxy import FaultProxy
from tests.test_staging import data_files, leftovers, put_blob, source_files, spec_json, stage_local

pytestmark = pytest.mark.azurite
OPTIONS = staging.StageOptions(retry=blobio.RetrySettings.fast(), range_bytes=256 << 10, inflate_workers=2)


@pytest.fixture
def big(tmp_path) -> Path:
    source = tmp_path / "big"
    generate(source, files_per_universe=1, file_bytes=(3 << 20) + 1000, seed=11)
    return source


class TestMembers:
    def test_a_large_file_inflates_on_several_threads_and_arrives_whole(self, azurite, container, big, tmp_path,
                                                                      monkeypatch):
        upload.upload_directory(container, big, "m", member_bytes=256 << 10)
        threads: set[str] = set()
        real = gzmembers.inflate_member

        def spy(*args, **kwargs):
            threads.add(threading.current_thread().name)
            return real(*args, **kwargs)

        monkeypatch.setattr(gzmembers, "inflate_member", spy)
        result = stage_local(azurite, container, tmp_path, OPTIONS, prefix="m")
        assert data_files(tmp_path / "scratch" / "cosmo") == source_files(big)
        assert len(threads) == 2 and all(name.startswith("inflate") for name in threads)
        assert list(result.inputs[0].verified) == ["stored SHA-256 + gzip CRC-32"] or \
            list(result.inputs[0].verified) == ["Content-MD5 + gzip CRC-32"]

    def test_a_file_uploaded_as_one_stream_still_stages(self, azurite, container, big, tmp_path):
        """Blobs of earlier uploads (one gzip stream, no member index) take the one-stream path."""
        upload.upload_directory(container, big, "one", member_bytes=1 << 30)
        (blob,) = container.list_blobs(name_starts_with="one/", include=["metadata"])
        assert "amlhpc_members" not in blob.metadata
        stage_local(azurite, container, tmp_path, OPTIONS, prefix="one")
        assert data_files(tmp_path / "scratch" / "cosmo") == source_files(big)

    def test_an_index_that_does_not_add_up_is_ignored(self, azurite, container, big, tmp_path):
        upload.upload_directory(container, big, "lie", member_bytes=256 << 10)
        (name,) = [b.name for b in container.list_blobs(name_starts_with="lie/")]
        blob = container.get_blob_client(name)
        meta = blob.get_blob_properties().metadata
        sizes = gzmembers.decode_index(meta["amlhpc_members"])
        blob.set_blob_metadata({**meta, "amlhpc_members": gzmembers.encode_index([sizes[0] + 1, *sizes[1:]])})
        stage_local(azurite, container, tmp_path, OPTIONS, prefix="lie")
        assert data_files(tmp_path / "scratch" / "cosmo") == source_files(big)


class TestVerification:
    @pytest.mark.parametrize("member_bytes", [256 << 10, 1 << 30], ids=["members", "one-stream"])
    def test_bytes_flipped_on_the_wire_are_caught_and_fetched_again(self, azurite, container, big, tmp_path,
                                                                    member_bytes):
        upload.upload_directory(container, big, "flip", member_bytes=member_bytes)
        with FaultProxy(azurite.port, seed=5, corrupt=1.0, max_faults=1) as proxy:  # one flipped byte
            env = {contract.BLOB_CONNECTION_STRING: proxy.connection_string(azurite),
                   contract.SCRATCH: str(tmp_path / "scratch"), contract.RUN_ID: f"flip-{member_bytes}"}
            specs = staging.specs_from_json(spec_json(container.container_name, "local", prefix="flip"))
            result = staging.stage_inputs(specs, validated(0, 0, 1, 1), options=OPTIONS, env=env)
        assert proxy.counts["corrupt"] > 0
        assert data_files(tmp_path / "scratch" / "cosmo") == source_files(big)
        assert result.inputs[0].bytes_retried > 0

    def test_stored_bytes_that_differ_from_their_digest_fail_and_leave_nothing(self, azurite, container, tmp_path):
        payload = gzip.compress(b"the real content" * 500)
        put_blob(container, "dig/a.bin.gz", payload, metadata={"amlhpc_stored_sha256": hashlib.sha256(b"other").hexdigest()})
        container.get_blob_client("dig/a.bin.gz").set_http_headers(
            content_settings=_settings(content_encoding="gzip", content_md5=hashlib.md5(b"other").digest()))
        with pytest.raises(staging.StagingError, match=r"blob 'dig/a.bin.gz': (amlhpc_stored_sha256|Content-MD5) mismatch"):
            stage_local(azurite, container, tmp_path, prefix="dig")
        assert not (tmp_path / "scratch" / "cosmo" / "a.bin").exists() and leftovers(tmp_path) == []

    def test_a_blob_without_any_digest_is_checked_range_by_range_and_reported(self, azurite, container, tmp_path):
        """Put Block List by another tool stores no Content-MD5: the service's MD5 of each range checks the transfer."""
        from azure.storage.blob import BlobBlock

        data = bytes(range(256)) * 40_000  # 10 MB, plain
        blob = container.get_blob_client("nodigest/raw.bin")
        ids = []
        for i, start in enumerate(range(0, len(data), 4 << 20)):
            block = base64.b64encode(f"b{i:04d}".encode()).decode()
            blob.stage_block(block, data[start:start + (4 << 20)])
            ids.append(BlobBlock(block_id=block))
        blob.commit_block_list(ids)
        assert blob.get_blob_properties().content_settings.content_md5 is None
        options = staging.StageOptions(retry=blobio.RetrySettings.fast(), range_bytes=8 << 20)
        result = stage_local(azurite, container, tmp_path, options, prefix="nodigest")
        assert (tmp_path / "scratch" / "cosmo" / "raw.bin").read_bytes() == data
        assert result.inputs[0].verified == {"range MD5 (transfer only)": 1}


def _settings(**kwargs):
    from azure.storage.blob import ContentSettings

    return ContentSettings(**kwargs)
