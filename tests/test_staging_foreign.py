"""Another tool's blobs in staging: inflated only when they say they are gzip, sealed once and verified
after, kept when they cannot be checked; and the small defects of names, padding and data directories.

"Rot" here is real rot at rest: a byte flipped in Azurite's own extent file, so the blob's
etag, Content-MD5 and metadata stay as they were and only its bytes change.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from amlhpc.jobs.data import seal
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.base.ranks import validated
from amlhpc.jobs.runtime.blob import blobio
from amlhpc.jobs.runtime.staging import stager as staging

pytestmark = pytest.mark.azurite
FAST = staging.StageOptions(retry=blobio.RetrySettings.fast(), progress_interval_s=60)


def stage(azurite, container, tmp_path: Path, prefix: str, options=FAST, scratch: Path | None = None,
          **spec_extra) -> staging.StageResult:
    env = {contract.BLOB_CONNECTION_STRING: azurite.connection_string,
           contract.SCRATCH: str(scratch or tmp_path / "scratch"), contract.REPORT_DIR: str(tmp_path / "reports"),
           contract.RUN_ID: uuid.uuid4().hex}
    spec = {"name": "cosmo", "container": container.container_name, "prefix": prefix, "mode": "local", **spec_extra}
    specs = staging.specs_from_json(json.dumps([spec]))
    return staging.stage_inputs(specs, validated(0, 0, 1, 1), options=options, env=env)


def data(tmp_path: Path) -> Path:
    return tmp_path / "scratch" / "cosmo"


def put_block_list(container, name: str, payload: bytes, encoding: str | None = None) -> None:
    """As azcopy and the SDKs write a large file: staged blocks, one commit, no Content-MD5."""
    from azure.storage.blob import BlobBlock, ContentSettings

    blob = container.get_blob_client(name)
    ids = []
    for index, start in enumerate(range(0, len(payload), 64 << 10)):
        ids.append(f"{index:08d}")
        blob.stage_block(ids[-1], payload[start:start + (64 << 10)])
    blob.commit_block_list([BlobBlock(i) for i in ids], content_settings=ContentSettings(content_encoding=encoding))
    assert blob.get_blob_properties().content_settings.content_md5 is None


def rot(azurite, payload: bytes, at: int) -> None:
    """Flip one byte of `payload` where Azurite keeps it on disk (its etag and checksums do not change)."""
    marker = payload[at:at + 32]
    for path in (azurite.workdir).rglob("*"):
        if path.is_file() and path.stat().st_size >= len(payload):
            raw = path.read_bytes()
            where = raw.find(marker)
            if where >= 0 and raw.count(marker) == 1:
                flipped = bytearray(raw)
                flipped[where] ^= 0xFF
                path.write_bytes(bytes(flipped))
                return
    raise AssertionError("the payload was not found in Azurite's files")


def payload_of(size: int, seed: int) -> bytes:
    """Random bytes no other blob of the session's Azurite holds (so `rot` finds exactly these)."""
    return os.urandom(size)


# ------------------------------------------------------------------ .gz names


class TestGzipNames:
    def test_a_foreign_tar_gz_is_staged_as_stored(self, azurite, container, tmp_path):
        archive = gzip.compress(b"tar bytes" * 1000)
        container.upload_blob("f/archive.tar.gz", archive)
        result = stage(azurite, container, tmp_path, "f")
        assert (data(tmp_path) / "archive.tar.gz").read_bytes() == archive
        assert result.inputs[0].renamed == 0

    def test_a_gzip_encoded_blob_is_inflated_and_its_new_name_reported(self, azurite, container, tmp_path, caplog):
        from azure.storage.blob import ContentSettings

        container.upload_blob("f/archive.tar.gz", gzip.compress(b"tar bytes" * 1000),
                              content_settings=ContentSettings(content_encoding="gzip"))
        with caplog.at_level(logging.INFO, logger="amlhpc.staging"):
            result = stage(azurite, container, tmp_path, "f")
        assert (data(tmp_path) / "archive.tar").read_bytes() == b"tar bytes" * 1000
        assert result.inputs[0].renamed == 1
        assert "archive.tar.gz -> archive.tar" in caplog.text

    def test_the_user_may_ask_for_gz_names_to_be_inflated(self, azurite, container, tmp_path):
        container.upload_blob("f/archive.tar.gz", gzip.compress(b"tar bytes" * 1000))
        result = stage(azurite, container, tmp_path, "f", inflate="gz-names")
        assert (data(tmp_path) / "archive.tar").read_bytes() == b"tar bytes" * 1000
        assert result.inputs[0].renamed == 1

    def test_an_unknown_inflate_rule_is_bad_input(self):
        with pytest.raises(staging.StageConfigError, match=r"\[0\]\.inflate: 'always' is not an inflate rule"):
            staging.specs_from_json(json.dumps([{"name": "a", "container": "c", "prefix": "p", "inflate": "always"}]))


class TestNamesAndPadding:
    def test_a_blob_named_like_a_folder_that_holds_bytes_is_data(self, azurite, container, tmp_path):
        container.upload_blob("d/dirlike/", b"real bytes")
        container.upload_blob("d/folder/", b"")  # an empty folder marker stays out
        container.upload_blob("d/other.bin", b"x")
        result = stage(azurite, container, tmp_path, "d")
        assert sorted(p.name for p in data(tmp_path).iterdir()) == ["dirlike", "other.bin"]
        assert (data(tmp_path) / "dirlike").read_bytes() == b"real bytes"
        assert result.inputs[0].renamed == 1

    def test_zero_padding_after_the_last_member_is_accepted_as_gzip_does(self, azurite, container, tmp_path):
        from azure.storage.blob import ContentSettings

        padded = gzip.compress(b"padded" * 500) + bytes(4096)
        assert subprocess.run(["gzip", "-t"], input=padded).returncode == 0  # the reference: GNU gzip accepts it
        container.upload_blob("z/p.bin.gz", padded, content_settings=ContentSettings(content_encoding="gzip"))
        stage(azurite, container, tmp_path, "z")
        assert (data(tmp_path) / "p.bin").read_bytes() == b"padded" * 500

    def test_other_trailing_bytes_are_still_refused(self, azurite, container, tmp_path):
        from azure.storage.blob import ContentSettings

        container.upload_blob("z/g.bin.gz", gzip.compress(b"x" * 500) + bytes(10) + b"junk",
                              content_settings=ContentSettings(content_encoding="gzip"))
        with pytest.raises(staging.StagingError, match="trailing garbage"):
            stage(azurite, container, tmp_path, "z")


# ------------------------------------------------------------------ data directories staging cannot fill


@pytest.fixture
def mount_at(tmp_path):
    """Mount a small tmpfs (read-only or not) at a path; skipped where this user may not mount."""
    mounted: list[Path] = []

    def mount(path: Path, read_only: bool) -> None:
        path.mkdir(parents=True, exist_ok=True)
        options = ("ro," if read_only else "") + "size=4m"
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                               capture_output=True).returncode != 0:
            pytest.skip("cannot mount here; the injected tests below cover the same checks")
        mounted.append(path)

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


class TestDataDirectory:
    def test_a_read_only_data_directory_is_named_as_such(self, azurite, container, tmp_path, mount_at):
        container.upload_blob("r/a.bin", b"a")
        mount_at(data(tmp_path), read_only=True)
        with pytest.raises(staging.StageConfigError, match=r"data directory: .*cosmo is not writable \(a read-only"):
            stage(azurite, container, tmp_path, "r")

    def test_a_data_directory_on_another_filesystem_is_named_as_such(self, azurite, container, tmp_path, mount_at):
        container.upload_blob("r/a.bin", b"a")
        mount_at(data(tmp_path), read_only=False)
        with pytest.raises(staging.StageConfigError, match="is on another filesystem than"):
            stage(azurite, container, tmp_path, "r")

    def test_checks_injected(self, tmp_path, monkeypatch):
        """The same answers injected, for machines where no mount can be made."""
        dirs = staging._Dirs(tmp_path / "d", tmp_path / "s", tmp_path / "s" / "partial")
        dirs.data.mkdir()
        dirs.partial.mkdir(parents=True)
        monkeypatch.setattr(staging.os, "access", lambda path, mode: False)
        with pytest.raises(staging.StageConfigError, match="is not writable"):
            dirs.check("cosmo")
        monkeypatch.setattr(staging.os, "access", lambda path, mode: True)
        real_stat = os.stat
        monkeypatch.setattr(staging.os, "stat", lambda p: os.stat_result(
            (*real_stat(p)[:2], real_stat(p).st_dev + (1 if Path(p) == dirs.data else 0), *real_stat(p)[3:])))
        with pytest.raises(staging.StageConfigError, match="is on another filesystem"):
            dirs.check("cosmo")


# ------------------------------------------------------------------ sealed once, verified after


class TestSeal:
    def test_sealing_records_checksums_and_staging_then_checks_the_bytes_at_rest(self, azurite, container, tmp_path):
        payload = payload_of(300 << 10, 1)
        put_block_list(container, "s/raw.bin", payload)
        before = stage(azurite, container, tmp_path, "s")
        assert list(before.inputs[0].verified) == ["range MD5 (transfer only)"]
        report = seal.seal_prefix(container, "s")
        assert report.sealed == ["s/raw.bin"] and report.already == 0
        props = container.get_blob_client("s/raw.bin").get_blob_properties()
        assert bytes(props.content_settings.content_md5) == hashlib.md5(payload).digest()
        assert props.metadata["amlhpc_stored_sha256"] == hashlib.sha256(payload).hexdigest()
        assert "amlhpc_sealed" in props.metadata
        assert seal.seal_prefix(container, "s").already == 1  # once: a second run reads nothing
        fresh = stage(azurite, container, tmp_path / "again", "s")
        assert list(fresh.inputs[0].verified) == ["Content-MD5"] or list(fresh.inputs[0].verified) == ["stored SHA-256"]

    def test_a_sealed_blob_that_rots_is_refused_with_the_command_that_fixes_it(self, azurite, container, tmp_path):
        payload = payload_of(300 << 10, 2)
        put_block_list(container, "s/raw.bin", payload)
        seal.seal_prefix(container, "s")
        rot(azurite, payload, 100_000)
        with pytest.raises(staging.StagingError) as caught:
            stage(azurite, container, tmp_path, "s")
        text = str(caught.value)
        assert "blob 's/raw.bin'" in text and "mismatch" in text
        assert "python -m amlhpc.jobs data seal --stack STACK --prefix s --reseal s/raw.bin" in text
        assert not (data(tmp_path) / "raw.bin").exists()

    def test_a_gzip_encoded_sealed_blob_that_rots_is_refused(self, azurite, container, tmp_path):
        stored = gzip.compress(payload_of(200 << 10, 3), compresslevel=1)
        put_block_list(container, "g/x.bin.gz", stored, encoding="gzip")
        seal.seal_prefix(container, "g")
        rot(azurite, stored, len(stored) // 2)
        with pytest.raises(staging.StagingError, match="blob 'g/x.bin.gz'"):
            stage(azurite, container, tmp_path, "g")
        assert not (data(tmp_path) / "x.bin").exists()

    def test_a_blob_replaced_while_it_is_read_is_not_sealed(self, azurite, container, tmp_path):
        from amlhpc.jobs.runtime.base import faultpoints

        put_block_list(container, "s/raw.bin", payload_of(100 << 10, 4))
        replace = lambda **c: put_block_list(container, "s/raw.bin", payload_of(100 << 10, 5))  # noqa: E731
        with faultpoints.armed("seal.after-read", replace) as point, pytest.raises(seal.SealError, match="changed while"):
            seal.seal_prefix(container, "s")
        assert point.fired == 1
        assert container.get_blob_client("s/raw.bin").get_blob_properties().content_settings.content_md5 is None
        assert seal.seal_prefix(container, "s").sealed == ["s/raw.bin"]

    def test_a_seal_cut_between_its_two_writes_already_counts(self, azurite, container, tmp_path):
        from amlhpc.jobs.runtime.base import faultpoints

        payload = payload_of(100 << 10, 6)
        put_block_list(container, "s/raw.bin", payload)
        with faultpoints.armed("seal.between-writes", faultpoints.raising()) as point, pytest.raises(seal.SealError):
            seal.seal_prefix(container, "s")
        assert point.fired == 1
        assert seal.seal_prefix(container, "s").already == 1
        rot(azurite, payload, 50_000)
        with pytest.raises(staging.StagingError, match="Content-MD5 mismatch"):
            stage(azurite, container, tmp_path, "s")

    def test_reseal_refuses_the_uploaders_own_blobs(self, azurite, container, tmp_path):
        from amlhpc.jobs.data import upload

        source = tmp_path / "src"
        source.mkdir()
        (source / "a.bin").write_bytes(b"a" * 100)
        upload.upload_directory(container, source, "u", workers=1)
        with pytest.raises(seal.SealError, match="written by `jobs data upload`.*--verify-stored"):
            seal.seal_prefix(container, "u", reseal=["u/a.bin.gz"])


# ------------------------------------------------------------------ --verify-existing


class TestVerifyExisting:
    VERIFY = staging.StageOptions(retry=blobio.RetrySettings.fast(), progress_interval_s=60, verify_existing=True)

    def test_an_unsealed_blob_that_rots_never_replaces_the_good_copy(self, azurite, container, tmp_path, caplog):
        payload = payload_of(300 << 10, 7)
        put_block_list(container, "v/raw.bin", payload)
        stage(azurite, container, tmp_path, "v")
        rot(azurite, payload, 150_000)
        with caplog.at_level(logging.WARNING, logger="amlhpc.staging"):
            again = stage(azurite, container, tmp_path, "v", self.VERIFY)
        assert (data(tmp_path) / "raw.bin").read_bytes() == payload
        assert (again.inputs[0].files_downloaded, again.inputs[0].files_unverifiable) == (0, 1)
        assert "jobs data seal" in caplog.text

    def test_a_sealed_blob_that_rots_keeps_the_good_copy(self, azurite, container, tmp_path):
        payload = payload_of(300 << 10, 8)
        put_block_list(container, "v/raw.bin", payload)
        seal.seal_prefix(container, "v")
        stage(azurite, container, tmp_path, "v")
        rot(azurite, payload, 150_000)
        again = stage(azurite, container, tmp_path, "v", self.VERIFY)
        assert (data(tmp_path) / "raw.bin").read_bytes() == payload
        assert (again.inputs[0].files_downloaded, again.inputs[0].files_skipped) == (0, 1)

    def test_a_damaged_copy_of_a_sealed_blob_is_fetched_again(self, azurite, container, tmp_path):
        payload = payload_of(300 << 10, 9)
        put_block_list(container, "v/raw.bin", payload)
        seal.seal_prefix(container, "v")
        stage(azurite, container, tmp_path, "v")
        damaged = bytearray(payload)
        damaged[10] ^= 1
        (data(tmp_path) / "raw.bin").write_bytes(bytes(damaged))
        again = stage(azurite, container, tmp_path, "v", self.VERIFY)
        assert again.inputs[0].files_downloaded == 1
        assert (data(tmp_path) / "raw.bin").read_bytes() == payload


# ------------------------------------------------------------------ the advice for a refused blob fixes it


def test_the_command_staging_gives_for_a_rotted_upload_repairs_it(azurite, container, tmp_path):
    """A blob of `jobs data upload` whose stored bytes rot: staging refuses it and names `--verify-stored`;
    that upload (a plain re-run would skip it: size and mtime agree) repairs it; staging then passes."""
    import re
    import shlex

    from typer.testing import CliRunner

    from amlhpc.jobs.data import cli as data_cli
    from amlhpc.jobs.data import upload

    source = tmp_path / "src"
    source.mkdir()
    payload = payload_of(200 << 10, 10)  # incompressible: the stored bytes hold it nearly verbatim
    (source / "x.bin").write_bytes(payload)
    upload.upload_directory(container, source, "up", workers=1)
    stored = container.get_blob_client("up/x.bin.gz").download_blob(decompress=False).readall()
    rot(azurite, stored, len(stored) // 2)
    with pytest.raises(staging.StagingError) as caught:
        stage(azurite, container, tmp_path, "up")
    advice = re.search(r"python -m amlhpc.jobs data upload (.*?) \(it reads", str(caught.value))
    assert advice, str(caught.value)
    args = [a.replace("LOCAL_DIR", str(source)) for a in shlex.split(advice.group(1))]
    assert upload.upload_directory(container, source, "up", workers=1).unchanged == 1  # a plain re-run: skipped
    result = CliRunner().invoke(data_cli.app, ["upload", *args, "--connection-string-env", "AZ_CS", "--container",
                                               container.container_name], env={"AZ_CS": azurite.connection_string})
    assert result.exit_code == 0, result.output
    staged = stage(azurite, container, tmp_path / "after", "up")
    assert staged.inputs[0].files_downloaded == 1
    assert (tmp_path / "after" / "scratch" / "cosmo" / "x.bin").read_bytes() == payload
