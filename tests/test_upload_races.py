"""Two uploads of one prefix, a crash at every step of an upload, and re-runs that repair, on real Azurite.

Each race is staged at named fault points (amlhpc.jobs.runtime.base.faultpoints), never by timing:
the first writer is held exactly at a step while the second one runs, and every test
asserts the points it armed fired. Whatever the order, a committed blob's stored bytes
agree with its Content-MD5 and amlhpc_stored_sha256 and inflate to one writer's file,
and at most one of the two uploads succeeds for that blob.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from amlhpc.jobs.data import remote, upload
from amlhpc.jobs.runtime.base import faultpoints

pytestmark = pytest.mark.azurite
ROOT = Path(__file__).resolve().parents[1]
SESSION_A, SESSION_B = "a" * 16, "b" * 16
BLOCK = 64 << 10
WAIT_S = 60.0
"""Only a bound on a wait that a broken test would otherwise hang on; no test relies on timing."""


def make_source(tmp_path: Path, label: str, size: int, seed: int) -> Path:
    """One file `x.bin`: half pseudo-random (so it stays large compressed), half zeros."""
    import random

    source = tmp_path / label
    source.mkdir()
    rng = random.Random(seed)
    (source / "x.bin").write_bytes(rng.randbytes(size // 2) + bytes(size - size // 2))
    return source


def assert_consistent(container, name: str, source: Path) -> None:
    """The stored bytes match every checksum recorded with them and inflate to `source`'s x.bin."""
    blob = container.get_blob_client(name)
    props = blob.get_blob_properties()
    stored = blob.download_blob(decompress=False).readall()
    meta = props.metadata
    assert bytes(props.content_settings.content_md5) == hashlib.md5(stored).digest()
    assert meta["amlhpc_stored_sha256"] == hashlib.sha256(stored).hexdigest()
    raw = gzip.decompress(stored)
    assert raw == (source / "x.bin").read_bytes()
    assert meta["amlhpc_sha256"] == hashlib.sha256(raw).hexdigest() and meta["amlhpc_size"] == str(len(raw))


def lost(result) -> bool:
    """The upload failed because another writer committed its blob first."""
    return isinstance(result, upload.UploadError) and result.report is not None and result.report.conflicts == ["x.bin"]


def run(container, source: Path, session: str, **kwargs) -> upload.UploadReport | upload.UploadError:
    try:
        return upload.upload_directory(container, source, "p", workers=1, block_bytes=BLOCK, session=session, **kwargs)
    except upload.UploadError as exc:
        return exc


def in_thread(target) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(target()), daemon=True)
    thread.start()
    return thread, out


def session_is(session: str):
    return lambda **context: context.get("session") == session


SIZES = {"one-put": 20 << 10, "multi-block": 600 << 10}


@pytest.mark.parametrize("size", list(SIZES))
class TestTwoWriters:
    def test_second_commits_while_the_first_is_about_to(self, container, tmp_path, size):
        """B runs whole while A holds every block staged, before its commit: B wins, A fails naming B."""
        a, b = make_source(tmp_path, "a", SIZES[size], 1), make_source(tmp_path, "b", SIZES[size], 2)
        results = {}

        def run_b(**context):
            results["b"] = run(container, b, SESSION_B)

        with faultpoints.armed("upload.before-commit", run_b, when=session_is(SESSION_A)) as point:
            results["a"] = run(container, a, SESSION_A)
        assert point.fired == 1
        assert isinstance(results["b"], upload.UploadReport) and results["b"].uploaded == 1
        assert lost(results["a"]), results["a"]
        assert f"upload {SESSION_B} by {remote.who()}" in str(results["a"]) and "x.bin" in str(results["a"])
        assert_consistent(container, "p/x.bin.gz", b)

    def test_first_commits_while_the_second_waits_after_listing(self, container, tmp_path, size):
        """B lists (no blob yet) and is held; A runs whole and commits; B then fails naming A."""
        a, b = make_source(tmp_path, "a", SIZES[size], 1), make_source(tmp_path, "b", SIZES[size], 2)
        listed, release = threading.Event(), threading.Event()

        def hold_b(**context):
            listed.set()
            assert release.wait(WAIT_S)

        with faultpoints.armed("upload.after-list", hold_b, when=session_is(SESSION_B)) as point:
            thread, b_result = in_thread(lambda: run(container, b, SESSION_B))
            assert listed.wait(WAIT_S)
            a_result = run(container, a, SESSION_A)
            release.set()
            thread.join(WAIT_S)
        assert point.fired == 1
        assert isinstance(a_result, upload.UploadReport) and a_result.uploaded == 1
        assert lost(b_result[0]), b_result
        assert f"upload {SESSION_A} by" in str(b_result[0])
        assert_consistent(container, "p/x.bin.gz", a)

    def test_a_rerun_of_the_loser_wins_cleanly(self, container, tmp_path, size):
        a, b = make_source(tmp_path, "a", SIZES[size], 1), make_source(tmp_path, "b", SIZES[size], 2)
        with faultpoints.armed("upload.before-commit", lambda **c: run(container, b, SESSION_B),
                               when=session_is(SESSION_A)) as point:
            assert lost(run(container, a, SESSION_A))
        assert point.fired == 1
        again = run(container, a, "c" * 16)
        assert isinstance(again, upload.UploadReport) and again.uploaded == 1
        assert_consistent(container, "p/x.bin.gz", a)


def test_second_commits_between_the_firsts_blocks(container, tmp_path):
    """A staged its first block; B runs whole (its commit discards A's uncommitted block); A's commit then fails."""
    a, b = make_source(tmp_path, "a", SIZES["multi-block"], 1), make_source(tmp_path, "b", SIZES["multi-block"], 2)
    results = {}
    with faultpoints.armed("upload.after-stage-block", lambda **c: results.setdefault("b", run(container, b, SESSION_B)),
                           when=session_is(SESSION_A)) as point:
        results["a"] = run(container, a, SESSION_A)
    assert point.fired == 1
    assert isinstance(results["b"], upload.UploadReport)
    assert lost(results["a"]), results["a"]
    assert_consistent(container, "p/x.bin.gz", b)


def test_block_ids_belong_to_their_session(container, tmp_path):
    source = make_source(tmp_path, "a", SIZES["multi-block"], 1)
    report = run(container, source, SESSION_A)
    committed, _ = container.get_blob_client("p/x.bin.gz").get_block_list("committed")
    ids = [base64.b64decode(block.id).decode() if not block.id.startswith("amlhpc") else block.id for block in committed]
    assert len(ids) > 3 and all(i.startswith(f"amlhpc-{SESSION_A}-") for i in ids), ids
    assert len({len(block.id) for block in committed}) == 1  # one length for every id of a blob
    assert report.session == SESSION_A


# ------------------------------------------------------------------ a crash at every step, then a re-run


CRASH_POINTS = [("upload.after-list", "one-put"), ("upload.before-commit", "one-put"),
                ("upload.after-commit", "one-put"), ("upload.after-stage-block", "multi-block"),
                ("upload.before-commit", "multi-block"), ("upload.after-commit", "multi-block")]


@pytest.mark.parametrize(("point_name", "size"), CRASH_POINTS)
def test_a_crash_at_each_step_leaves_the_old_blob_or_the_new_one_and_a_rerun_finishes(container, tmp_path,
                                                                                     point_name, size):
    old, new = make_source(tmp_path, "old", SIZES[size], 1), make_source(tmp_path, "new", SIZES[size], 2)
    assert isinstance(run(container, old, "0" * 16), upload.UploadReport)
    with faultpoints.armed(point_name, faultpoints.raising("crash")) as point:
        crashed = run(container, new, SESSION_A) if point_name != "upload.after-list" else None
        if crashed is None:
            with pytest.raises(faultpoints.FaultInjected):
                run(container, new, SESSION_A)
    assert point.fired == 1
    committed = point_name == "upload.after-commit"
    assert_consistent(container, "p/x.bin.gz", new if committed else old)
    again = run(container, new, SESSION_B)
    assert isinstance(again, upload.UploadReport) and again.uploaded == (0 if committed else 1), again
    assert_consistent(container, "p/x.bin.gz", new)
    assert run(container, new, "c" * 16).unchanged == 1


def test_a_crash_before_a_touched_files_metadata_is_refreshed(container, tmp_path):
    source = make_source(tmp_path, "a", SIZES["one-put"], 1)
    run(container, source, SESSION_A)
    path = source / "x.bin"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with faultpoints.armed("upload.before-refresh", faultpoints.raising("crash")) as point:
        assert isinstance(run(container, source, SESSION_B), upload.UploadError)
    assert point.fired == 1
    again = run(container, source, "c" * 16)
    assert (again.refreshed, again.uploaded) == (1, 0)
    assert run(container, source, "d" * 16).unchanged == 1


def test_sigkill_before_the_commit_then_the_command_again(azurite, container, tmp_path):
    """The real thing: the upload command killed by SIGKILL between its last Put Block and its commit."""
    source = tmp_path / "big"
    source.mkdir()
    (source / "x.bin").write_bytes(os.urandom(9 << 20))  # over one 8 MiB block even compressed
    log = tmp_path / "fired.log"
    env = {**os.environ, "AZ_CS": azurite.connection_string, "PYTHONPATH": str(ROOT),
           faultpoints.ENV_POINTS: "upload.before-commit=kill", faultpoints.ENV_LOG: str(log)}
    args = [sys.executable, "-m", "amlhpc.jobs", "data", "upload", str(source), "--stack", "dev", "--prefix", "p",
            "--connection-string-env", "AZ_CS", "--container", container.container_name]
    killed = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert killed.returncode == -9, killed.stderr
    assert faultpoints.fired_in_log(log) == ["upload.before-commit"]
    blob = container.get_blob_client("p/v1/x.bin.gz")
    assert not blob.exists()
    assert len(blob.get_block_list("uncommitted")[1]) == 2  # staged, never committed: invisible to readers
    assert container.get_blob_client("p/_versions/1.uploading").exists()
    assert not container.get_blob_client("p/_versions/1.json").exists()  # the version is not committed
    env.pop(faultpoints.ENV_POINTS)
    again = subprocess.run([*args, "--resume", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    assert_consistent(container, "p/v1/x.bin.gz", source)
    assert container.get_blob_client("p/_versions/1.json").exists()
    assert not container.get_blob_client("p/_versions/1.uploading").exists()


# ------------------------------------------------------------------ blobs of the earlier uploader


def mixed_legacy_blob(container, good: Path, other: Path) -> None:
    """What two uploads with the earlier fixed block ids left: the committer's checksums over the other's bytes."""
    from azure.storage.blob import BlobBlock, ContentSettings

    run(container, good, SESSION_A)
    blob = container.get_blob_client("p/x.bin.gz")
    props = blob.get_blob_properties()
    stored = gzip.compress((other / "x.bin").read_bytes())
    ids = []
    for index in range(0, len(stored), BLOCK):
        ids.append(base64.b64encode(f"amlhpc-{index // BLOCK:08d}".encode()).decode())
        blob.stage_block(ids[-1], stored[index:index + BLOCK])
    meta = {k: v for k, v in props.metadata.items() if k not in ("amlhpc_upload_id", "amlhpc_uploaded_by")}
    blob.commit_block_list([BlobBlock(i) for i in ids], metadata=meta, content_settings=ContentSettings(
        content_type="application/octet-stream", content_encoding="gzip",
        content_md5=props.content_settings.content_md5))


def test_a_rerun_repairs_an_earlier_uploaders_mixed_blob_without_rewrite(container, tmp_path):
    good, other = make_source(tmp_path, "good", SIZES["multi-block"], 1), make_source(tmp_path, "o", SIZES["multi-block"], 2)
    mixed_legacy_blob(container, good, other)
    report = run(container, good, SESSION_B)
    assert (report.uploaded, report.repaired, report.unchanged) == (1, 1, 0)
    assert_consistent(container, "p/x.bin.gz", good)
    assert run(container, good, "c" * 16).unchanged == 1


def test_an_earlier_uploaders_whole_blob_is_read_once_and_then_trusted(container, tmp_path):
    good = make_source(tmp_path, "good", SIZES["one-put"], 1)
    run(container, good, SESSION_A)
    blob = container.get_blob_client("p/x.bin.gz")
    meta = blob.get_blob_properties().metadata
    del meta["amlhpc_upload_id"], meta["amlhpc_uploaded_by"]
    blob.set_blob_metadata(meta)
    first = run(container, good, SESSION_B)
    assert (first.verified, first.uploaded, first.unchanged) == (1, 0, 0)
    assert blob.get_blob_properties().metadata["amlhpc_upload_id"] == f"verified-{SESSION_B}"
    second = run(container, good, "c" * 16)
    assert (second.verified, second.unchanged) == (0, 1)


def test_verify_stored_repairs_a_blob_whose_bytes_changed_after_upload(container, tmp_path):
    good, other = make_source(tmp_path, "good", SIZES["one-put"], 1), make_source(tmp_path, "o", SIZES["one-put"], 2)
    mixed_legacy_blob(container, good, other)
    blob = container.get_blob_client("p/x.bin.gz")
    blob.set_blob_metadata({**blob.get_blob_properties().metadata, "amlhpc_upload_id": SESSION_A})  # looks current
    assert run(container, good, SESSION_B).unchanged == 1  # size and mtime agree: nothing reads the bytes
    repaired = run(container, good, "c" * 16, verify_stored=True)
    assert (repaired.uploaded, repaired.repaired) == (1, 1)
    assert_consistent(container, "p/x.bin.gz", good)
