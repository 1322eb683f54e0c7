"""`jobs data upload`: gzip-encoded blobs with contract metadata, resumable, on real Azurite."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from amlhpc.jobs.data import cli as data_cli
from amlhpc.jobs.data import upload
from amlhpc.jobs.runtime.blob import gzmembers
from bench.dataset import generate

pytestmark = pytest.mark.azurite
FIXTURES = Path(__file__).parent / "fixtures" / "outputs"


@pytest.fixture
def dataset(tmp_path) -> Path:
    source = tmp_path / "data"
    generate(source, files_per_universe=12, file_bytes=48 << 10)
    (source / "val").mkdir()
    (source / "val" / "empty.bin").write_bytes(b"")
    (source / "val" / "notes.txt").write_text("hello\n")
    return source


def blob_bytes(container, name: str) -> bytes:
    return container.download_blob(name, decompress=False).readall()


class TestUploadDirectory:
    def test_blobs_are_gzip_with_contract_metadata(self, container, dataset):
        report = upload.upload_directory(container, dataset, "cosmo/v1", workers=2)
        assert (report.files, report.uploaded, report.unchanged) == (14, 14, 0)
        assert report.ratio > 3  # CosmoFlow-like volumes compress about 4-5x
        names = sorted(b.name for b in container.list_blobs())
        assert "cosmo/v1/univ_ics_2019-03_a10000_000.tfrecord.gz" in names
        assert "cosmo/v1/val/empty.bin.gz" in names and len(names) == 14
        for path in [dataset / "univ_ics_2019-03_a10000_003.tfrecord", dataset / "val" / "empty.bin"]:
            name = "cosmo/v1/" + path.relative_to(dataset).as_posix() + ".gz"
            props = container.get_blob_client(name).get_blob_properties()
            assert props.content_settings.content_encoding == "gzip"
            raw = path.read_bytes()
            stored = blob_bytes(container, name)
            assert props.metadata == {"amlhpc_size": str(len(raw)), "amlhpc_sha256": hashlib.sha256(raw).hexdigest(),
                                      "amlhpc_mtime": str(path.stat().st_mtime_ns),
                                      "amlhpc_ctime": str(path.stat().st_ctime_ns),
                                      "amlhpc_inode": f"{path.stat().st_dev}:{path.stat().st_ino}",
                                      "amlhpc_stored_sha256": hashlib.sha256(stored).hexdigest(),
                                      "amlhpc_upload_id": report.session, "amlhpc_uploaded_by": upload.remote.who()}
            assert bytes(props.content_settings.content_md5) == hashlib.md5(stored).digest()
            assert gzip.decompress(stored) == raw

    def test_large_file_goes_up_in_blocks_committed_at_once(self, container, tmp_path):
        source = tmp_path / "big"
        generate(source, files_per_universe=1, file_bytes=2 << 20)
        upload.upload_directory(container, source, "big", block_bytes=64 << 10)
        (path,) = source.iterdir()
        blob = container.get_blob_client(f"big/{path.name}.gz")
        committed, uncommitted = blob.get_block_list("all")
        assert len(committed) > 3 and not uncommitted
        stored = blob_bytes(container, blob.blob_name)
        assert gzip.decompress(stored) == path.read_bytes()
        # Put Block List stores no digest of its own: the uploader records the whole stream's MD5.
        assert bytes(blob.get_blob_properties().content_settings.content_md5) == hashlib.md5(stored).digest()

    def test_large_file_is_independent_gzip_members_with_an_index(self, container, tmp_path):
        source = tmp_path / "members"
        generate(source, files_per_universe=1, file_bytes=(5 << 20) + 12345)
        upload.upload_directory(container, source, "m", member_bytes=1 << 20, block_bytes=256 << 10)
        (path,) = source.iterdir()
        raw = path.read_bytes()
        props = container.get_blob_client(f"m/{path.name}.gz").get_blob_properties()
        stored = blob_bytes(container, f"m/{path.name}.gz")
        assert gzip.decompress(stored) == raw  # still one valid gzip file for any reader
        assert props.metadata["amlhpc_member_bytes"] == str(1 << 20)
        sizes = gzmembers.decode_index(props.metadata["amlhpc_members"])
        assert len(sizes) == 6 and sum(sizes) == len(stored) == props.size
        offset = 0
        for index, size in enumerate(sizes):  # each member stands alone, with its own trailer
            assert gzip.decompress(stored[offset:offset + size]) == raw[index << 20:(index + 1) << 20]
            offset += size

    def test_small_files_get_no_member_index(self, container, dataset):
        upload.upload_directory(container, dataset, "s", member_bytes=1 << 20)
        for item in container.list_blobs(include=["metadata"]):
            assert "amlhpc_members" not in item.metadata

    def test_rewrite_uploads_unchanged_files_again(self, container, dataset):
        upload.upload_directory(container, dataset, "r")
        again = upload.upload_directory(container, dataset, "r", rewrite=True)
        assert (again.uploaded, again.unchanged) == (14, 0)

    def test_rerun_uploads_nothing(self, container, dataset):
        upload.upload_directory(container, dataset, "d")
        again = upload.upload_directory(container, dataset, "d")
        assert (again.uploaded, again.unchanged, again.refreshed, again.bytes_stored) == (0, 14, 0, 0)

    def test_touched_file_only_refreshes_metadata(self, container, dataset):
        upload.upload_directory(container, dataset, "d")
        touched = dataset / "univ_ics_2019-03_a10000_004.tfrecord"
        os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
        again = upload.upload_directory(container, dataset, "d")
        assert (again.uploaded, again.refreshed) == (0, 1)
        meta = container.get_blob_client(f"d/{touched.name}.gz").get_blob_properties().metadata
        assert meta["amlhpc_mtime"] == str(touched.stat().st_mtime_ns)
        assert upload.upload_directory(container, dataset, "d").refreshed == 0  # now skipped without hashing

    def test_changed_content_is_uploaded_again(self, container, dataset):
        upload.upload_directory(container, dataset, "d")
        changed = dataset / "univ_ics_2019-03_a10000_002.tfrecord"
        changed.write_bytes(b"different" * 500)
        again = upload.upload_directory(container, dataset, "d")
        assert again.uploaded == 1
        assert gzip.decompress(blob_bytes(container, f"d/{changed.name}.gz")) == changed.read_bytes()

    def test_remote_only_blobs_are_reported_not_deleted(self, container, dataset):
        container.upload_blob("d/old.bin.gz", gzip.compress(b"old"))
        report = upload.upload_directory(container, dataset, "d")
        assert report.remote_only == ["d/old.bin.gz"]
        assert container.get_blob_client("d/old.bin.gz").exists()

    def test_zlib_levels(self, container, tmp_path):
        source = tmp_path / "z"
        generate(source, files_per_universe=1, file_bytes=64 << 10)
        report = upload.upload_directory(container, source, "z", level=6)
        (path,) = source.iterdir()
        assert gzip.decompress(blob_bytes(container, f"z/{path.name}.gz")) == path.read_bytes()
        assert report.ratio > 3
        assert upload.compressor_name(6) == "zlib level 6"

    def test_level_out_of_range(self):
        with pytest.raises(ValueError, match="outside 0-9"):
            upload.compressor(10)

    def test_bandwidth_cap(self, container, tmp_path):
        from amlhpc.jobs.runtime.base.throttle import Throttle

        source = tmp_path / "capped"
        source.mkdir()
        (source / "x.bin").write_bytes(os.urandom(3 << 20))
        cap = Throttle.from_mbits_per_s(16)  # 2 MB/s, 1 MiB burst
        report = upload.upload_directory(container, source, "capped", throttle=cap)
        assert report.seconds >= (report.bytes_stored - (1 << 20)) / 2e6 * 0.95
        assert cap.total_bytes == report.bytes_stored


class TestDecide:
    def test_actions(self):
        local = upload.LocalFile("a", Path("a"), 10, 5, 7, "1:2")
        meta = {"amlhpc_size": "10", "amlhpc_sha256": "ab", "amlhpc_mtime": "5", "amlhpc_stored_sha256": "cd",
                "amlhpc_ctime": "7", "amlhpc_inode": "1:2", "amlhpc_upload_id": "0123456789abcdef"}

        def blob(encoding="gzip", md5=None, **changes):
            merged = {k: v for k, v in {**meta, **changes}.items() if v is not None}
            return upload.RemoteBlob("p/a.gz", 3, "e", encoding, merged, md5)

        assert upload.decide(local, None) == "upload"
        assert upload.decide(local, blob()) == "skip"
        assert upload.decide(local, blob(amlhpc_mtime="6")) == "check"
        assert upload.decide(local, blob(amlhpc_size="11")) == "upload"
        assert upload.decide(local, blob(encoding=None)) == "upload"
        assert upload.decide(local, blob(), verify_stored=True) == "verify"
        # An older uploader's blob (fixed block ids: it may hold another upload's blocks): its stored bytes are read.
        assert upload.decide(local, blob(amlhpc_upload_id=None)) == "verify"
        # Nothing to check its stored bytes with: uploaded again.
        assert upload.decide(local, blob(amlhpc_upload_id=None, amlhpc_stored_sha256=None)) == "upload"
        assert upload.decide(local, blob(amlhpc_upload_id=None, amlhpc_stored_sha256=None, md5="x==")) == "verify"


runner = CliRunner()


def invoke(*args, env=None):
    return runner.invoke(data_cli.app, ["upload", *map(str, args)], env=env)


class TestCommandLine:
    def test_uploads_to_azurite_and_never_prints_the_key(self, azurite, dataset):
        result = invoke(dataset, "--stack", "dev", "--prefix", "cosmo", "--connection-string-env", "AZ_CS",
                        "--container", "cli-upload", "--json", env={"AZ_CS": azurite.connection_string})
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout[result.stdout.index("{"):])
        assert report["uploaded"] == 14
        assert azurite.key not in result.output
        assert "AccountKey" not in result.output
        assert report["version"] == 1 and report["manifest"] == "cosmo/_versions/1.json"
        again = invoke(dataset, "--stack", "dev", "--prefix", "cosmo", "--connection-string-env", "AZ_CS",
                       "--container", "cli-upload", "--json", env={"AZ_CS": azurite.connection_string})
        second = json.loads(again.stdout[again.stdout.index("{"):])
        assert second["unchanged"] == 14 and second["version"] == 1 and second["version_unchanged"]

    def test_container_from_the_outputs_file(self, azurite, dataset, blob_service):
        result = invoke(dataset, "--stack", "dev", "--prefix", "from-outputs", "--connection-string-env", "AZ_CS",
                        "--outputs", FIXTURES / "dev.json", env={"AZ_CS": azurite.connection_string})
        assert result.exit_code == 0, result.output
        assert blob_service.get_container_client("datasets").get_blob_client(
            "from-outputs/v1/univ_ics_2019-03_a10000_000.tfrecord.gz").exists()

    def test_azure_target_comes_from_the_stack_outputs(self, dataset, mocker):
        made = mocker.patch.object(data_cli.blobio, "container_client", side_effect=RuntimeError("stop here"))
        mocker.patch.object(data_cli.credentials, "credential", return_value="credential")
        with pytest.raises(RuntimeError, match="stop here"):
            data_cli.resolve_target("dev", outputs_file=FIXTURES / "dev.json", offline=False,
                                    connection_string_env=None, container=None)
        args, kwargs = made.call_args
        assert args == ("datasets",)
        assert kwargs["account_url"] == "https://amlhpcdevds4abd2.blob.core.windows.net/"
        assert kwargs["credential"] == "credential"

    def test_bad_options_are_all_named(self, tmp_path):
        result = invoke(tmp_path / "missing", "--stack", "dev", "--prefix", "a/../b", "--level", "12", "--workers", "0")
        assert result.exit_code == 2
        text = result.output
        assert "LOCAL_DIR" in text and "does not exist" in text
        assert "--prefix" in text and "not a clean blob path" in text
        assert "--level" in text and "12 is outside 0-9" in text
        assert "--workers" in text and "0 is below 1" in text

    def test_member_size_is_checked(self, tmp_path):
        (tmp_path / "d").mkdir()
        result = invoke(tmp_path / "d", "--stack", "dev", "--prefix", "p", "--member-mib", "0")
        assert result.exit_code == 2 and "--member-mib" in result.output and "outside 1-4096" in result.output

    def test_unset_connection_string_variable(self, dataset):
        result = invoke(dataset, "--stack", "dev", "--prefix", "p", "--connection-string-env", "NOPE_NOT_SET", env={})
        assert result.exit_code == 2
        assert "environment variable NOPE_NOT_SET is not set or empty" in result.output

    def test_offline_alone_has_nowhere_to_upload(self, dataset):
        result = invoke(dataset, "--stack", "dev", "--prefix", "p", "--offline")
        assert result.exit_code == 2
        assert "--offline" in result.output and "--connection-string-env" in result.output

    def test_empty_directory(self, tmp_path, azurite):
        (tmp_path / "empty").mkdir()
        result = invoke(tmp_path / "empty", "--stack", "dev", "--prefix", "p", "--connection-string-env", "AZ_CS",
                        env={"AZ_CS": azurite.connection_string})
        assert result.exit_code == 2 and "holds no files" in result.output

    def test_failures_exit_1_and_name_the_file(self, azurite, dataset, mocker):
        real = upload._FileUploader.upload

        def flaky(self, local, name, seen):
            if local.rel.endswith("_005.tfrecord"):
                raise upload.UploadError(f"{local.rel}: changed while it was being uploaded; re-run")
            return real(self, local, name, seen)

        mocker.patch.object(upload._FileUploader, "upload", flaky)
        result = invoke(dataset, "--stack", "dev", "--prefix", "f", "--connection-string-env", "AZ_CS",
                        "--container", "cli-fail", env={"AZ_CS": azurite.connection_string})
        assert result.exit_code == 1
        assert "1 of 14 files failed" in result.output and "_005.tfrecord: changed while" in result.output
