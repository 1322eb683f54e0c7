"""Nothing skipped in silence: symbolic links, loops, dangling links and special files in an upload."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from amlhpc.jobs.data import cli as data_cli
from amlhpc.jobs.data import walk


@pytest.fixture
def tree(tmp_path) -> Path:
    """data/: two files, a symlinked directory of five, a dangling link, a loop, a FIFO."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for i in range(5):
        (elsewhere / f"part-{i}.bin").write_bytes(bytes([i]) * 1000)
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.bin").write_bytes(b"a" * 100)
    (data / "sub" / "b.bin").write_bytes(b"b" * 100)
    (data / "linked").symlink_to(elsewhere, target_is_directory=True)
    (data / "sub" / "gone.bin").symlink_to(tmp_path / "no-such-file")
    (data / "sub" / "up").symlink_to(data, target_is_directory=True)
    os.mkfifo(data / "pipe")
    return data


class TestWalk:
    def test_links_are_followed_and_every_other_entry_is_named_with_its_reason(self, tree):
        found = walk.scan(tree)
        assert [f.rel for f in found.files] == ["a.bin", *(f"linked/part-{i}.bin" for i in range(5)), "sub/b.bin"]
        reasons = {s.rel: s.reason for s in found.skipped}
        assert set(reasons) == {"pipe", "sub/gone.bin", "sub/up"}
        assert reasons["pipe"].startswith("not a regular file")
        assert reasons["sub/gone.bin"].startswith("dangling symlink") and "no-such-file" in reasons["sub/gone.bin"]
        assert reasons["sub/up"].startswith("symlink loop")

    def test_a_link_that_points_at_itself(self, tmp_path):
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "self").symlink_to(tmp_path / "d" / "self")
        assert [(s.rel, s.reason.split(" (")[0]) for s in walk.scan(tmp_path / "d").skipped] == [("self", "symlink loop")]


runner = CliRunner()


@pytest.mark.azurite
class TestCommand:
    def upload(self, azurite, tree, *extra):
        return runner.invoke(data_cli.app, ["upload", str(tree), "--stack", "dev", "--prefix", "w", "--json",
                                            "--connection-string-env", "AZ_CS", "--container", "walk-test", *extra],
                             env={"AZ_CS": azurite.connection_string})

    def test_skips_fail_the_command_with_their_paths_and_reasons(self, azurite, tree, blob_service):
        result = self.upload(azurite, tree)
        assert result.exit_code == 1, result.output
        assert "skipping 3 entries" in result.output
        assert "3 entries not uploaded" in result.output
        for path in ("pipe: not a regular file", "sub/gone.bin: dangling symlink", "sub/up: symlink loop"):
            assert path in result.output
        report = json.loads(result.stdout[result.stdout.index("{"):])
        assert report["uploaded"] == 7 and len(report["skipped"]) == 3
        names = {b.name for b in blob_service.get_container_client("walk-test").list_blobs(name_starts_with="w/")}
        assert {f"w/v1/linked/part-{i}.bin.gz" for i in range(5)} <= names  # what the link points at went up

    def test_allow_skips_accepts_them_and_still_lists_them(self, azurite, tree):
        result = self.upload(azurite, tree, "--allow-skips")
        assert result.exit_code == 0, result.output
        assert "accepted (--allow-skips)" in result.output and "sub/up: symlink loop" in result.output


@pytest.mark.azurite
def test_the_seal_command_reports_what_it_sealed(azurite, blob_service):
    from azure.storage.blob import BlobBlock

    container = blob_service.create_container("seal-cli")
    blob = container.get_blob_client("foreign/big.bin")
    blob.stage_block("00000000", b"x" * 1000)
    blob.commit_block_list([BlobBlock("00000000")])
    container.upload_blob("foreign/small.bin", b"y" * 10)  # Put Blob: the service computed its Content-MD5
    args = ["seal", "--stack", "dev", "--prefix", "foreign", "--connection-string-env", "AZ_CS", "--container",
            "seal-cli", "--json"]
    result = runner.invoke(data_cli.app, args, env={"AZ_CS": azurite.connection_string})
    assert result.exit_code == 0, result.output
    assert "2 blob(s) under foreign/: 1 sealed" in result.output and "1 already had a checksum" in result.output
    assert json.loads(result.stdout[result.stdout.index("{"):])["sealed"] == 1
    missing = runner.invoke(data_cli.app, [*args, "--reseal", "foreign/nope.bin"], env={"AZ_CS": azurite.connection_string})
    assert missing.exit_code == 1 and "foreign/nope.bin: no such blob under foreign/" in missing.output
