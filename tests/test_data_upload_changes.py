"""`jobs data upload`: change detection beyond size and mtime, Azure's name limits before any byte
moves, names that are not UTF-8, and leftover blocks of another uploader named with their remedy."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from amlhpc.jobs.data import cli as data_cli
from amlhpc.jobs.data import upload, versions
from amlhpc.jobs.data.walk import LocalFile, scan

runner = CliRunner()


def rewrite_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    """What rsync -a or tar -x does to a changed file: new bytes, the old size and mtime."""
    before = path.stat()
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns


def remote(**metadata: str) -> upload.RemoteBlob:
    base = {"amlhpc_size": "5", "amlhpc_sha256": "x", "amlhpc_mtime": "1", "amlhpc_ctime": "2",
            "amlhpc_inode": "3:4", "amlhpc_upload_id": "s", "amlhpc_stored_sha256": "y"}
    return upload.RemoteBlob("p/f.gz", 9, "e", "gzip", {**base, **metadata})


class TestDecide:
    local = LocalFile("f", Path("f"), 5, 1, 2, "3:4")

    def test_same_size_mtime_ctime_and_inode_is_skipped(self):
        assert upload.decide(self.local, remote()) == "skip"

    @pytest.mark.parametrize("changed", [{"amlhpc_ctime": "9"}, {"amlhpc_inode": "3:5"}, {"amlhpc_ctime": ""}])
    def test_another_change_time_or_inode_is_hashed(self, changed):
        assert upload.decide(self.local, remote(**changed)) == "check"

    def test_checksum_hashes_even_an_unchanged_looking_file(self):
        assert upload.decide(self.local, remote(), checksum=True) == "check"


@pytest.mark.azurite
class TestSameSizeSameMtime:
    def test_a_rewritten_file_is_uploaded_again(self, container, tmp_path):
        source = tmp_path / "d"
        source.mkdir()
        (source / "a.bin").write_bytes(b"first version of a")
        (source / "b.bin").write_bytes(b"b stays as it is")
        upload.upload_directory(container, source, "p", workers=1)
        rewrite_keeping_size_and_mtime(source / "a.bin", b"other version of a")
        again = upload.upload_directory(container, source, "p", workers=1)
        assert (again.uploaded, again.unchanged) == (1, 1)
        stored = container.download_blob("p/a.bin.gz").readall()
        assert stored == b"other version of a"  # the SDK inflates Content-Encoding: gzip
        third = upload.upload_directory(container, source, "p", workers=1)
        assert (third.uploaded, third.unchanged) == (0, 2)

    def test_a_rewritten_file_makes_a_new_version(self, container, tmp_path):
        source = tmp_path / "d"
        source.mkdir()
        (source / "a.bin").write_bytes(b"first version of a")
        assert versions.upload_version(container, source, "ds", workers=1).version == 1
        rewrite_keeping_size_and_mtime(source / "a.bin", b"other version of a")
        second = versions.upload_version(container, source, "ds", workers=1)
        assert second.version == 2 and not second.unchanged

    def test_a_copy_with_new_times_and_the_same_bytes_is_the_same_version(self, container, tmp_path):
        source = tmp_path / "d"
        source.mkdir()
        (source / "a.bin").write_bytes(b"same bytes")
        versions.upload_version(container, source, "ds", workers=1)
        copy = tmp_path / "copy"
        copy.mkdir()
        (copy / "a.bin").write_bytes(b"same bytes")  # another inode, other times
        again = versions.upload_version(container, copy, "ds", workers=1)
        assert again.unchanged and again.version == 1

    def test_checksum_mode_hashes_every_file_and_keeps_the_unchanged(self, container, tmp_path):
        source = tmp_path / "d"
        source.mkdir()
        (source / "a.bin").write_bytes(b"aaaa")
        upload.upload_directory(container, source, "p", workers=1)
        report = upload.upload_directory(container, source, "p", workers=1, checksum=True)
        assert (report.uploaded, report.unchanged, report.refreshed) == (0, 1, 0)


@pytest.mark.azurite
class TestNames:
    @pytest.mark.parametrize(("name", "problem"), [
        ("/".join(c * 250 for c in "vwxyz") + ".bin", "characters, over Azure's 1,024"),
        ("/".join(["d"] * 254) + "/f.bin", "257 path segments, over Azure's 254"),  # below ds/v1/
        ("bell\x07.bin", "control character U+0007"),
    ])
    def test_names_azure_refuses_are_named_before_any_byte_moves(self, azurite, container, tmp_path, name, problem):
        source = tmp_path / "d"
        path = source / name
        path.parent.mkdir(parents=True)
        path.write_bytes(b"data")
        (source / "ok.bin").write_bytes(b"fine")
        result = runner.invoke(data_cli.app, ["upload", str(source), "--stack", "dev", "--prefix", "ds",
                                              "--connection-string-env", "AZ_CS", "--container",
                                              container.container_name], env={"AZ_CS": azurite.connection_string})
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert problem in text and "nothing was uploaded" in text
        assert not list(container.list_blobs())  # not even the version's marker

    def test_a_name_that_is_not_utf8_is_a_skipped_entry(self, azurite, container, tmp_path):
        source = tmp_path / "d"
        source.mkdir()
        (source / "ok.bin").write_bytes(b"fine")
        with open(os.path.join(os.fsencode(source), b"bad\xff.bin"), "wb") as f:
            f.write(b"latin-1 name")
        walked = scan(source)
        assert [f.rel for f in walked.files] == ["ok.bin"]
        assert [(s.rel, s.reason.split(" (")[0]) for s in walked.skipped] == [("bad\\xff.bin", "name not UTF-8")]
        result = runner.invoke(data_cli.app, ["upload", str(source), "--stack", "dev", "--prefix", "ds", "--json",
                                              "--connection-string-env", "AZ_CS", "--container",
                                              container.container_name], env={"AZ_CS": azurite.connection_string})
        assert result.exit_code == 1, result.output
        assert "bad\\xff.bin: name not UTF-8" in result.output and "is not committed" in result.output
        report = json.loads(result.stdout[result.stdout.index("{"):])
        assert report["skipped"][0]["path"] == "bad\\xff.bin" and report["uploaded"] == 1


def test_leftover_blocks_of_another_length_are_named_with_cause_and_remedy(tmp_path):
    """Azure answers Put Block with 400 InvalidBlobOrBlock when the blob holds uncommitted blocks whose
    ids have another length (Azurite does not enforce it): the failure says why and what to do."""
    from azure.core.exceptions import HttpResponseError

    class Blob:
        blob_name = "ds/v1/big.bin.gz"

        def stage_block(self, *args, **kwargs):
            error = HttpResponseError(message="The specified blob or block content is invalid.")
            error.status_code, error.error_code = 400, "InvalidBlobOrBlock"
            raise error

    uploader = upload._FileUploader(None, 1, None, upload.UNLIMITED, upload.Progress(), "s")  # type: ignore[arg-type]
    with pytest.raises(upload.UploadError) as caught:
        uploader._stage(Blob(), upload.block_id("s", 0), b"x")
    text = str(caught.value)
    assert "uncommitted blocks whose ids have another length" in text and "7 days" in text
    assert "Upload the dataset as a new version" in text
