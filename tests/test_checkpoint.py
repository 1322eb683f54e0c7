"""Checkpoints against a real Azurite: atomic versions, dedupe, retention, verified restores,
background uploads, and a SIGKILL mid-upload that leaves the previous version intact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amlhpc.jobs.runtime import checkpoint
from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.base.throttle import Throttle
from amlhpc.jobs.runtime.checkpoint import (
    BackgroundUploader,
    CheckpointError,
    CheckpointStore,
    FileChanged,
    PointerConflict,
    parse_settings,
)

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.azurite


def write(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def blobs(container, prefix: str) -> list[str]:
    return sorted(b.name for b in container.list_blobs(name_starts_with=prefix))


@pytest.fixture
def store(container):
    # Small blocks so a few hundred KiB exercise multi-block uploads.
    return CheckpointStore(container, "run-1", block_bytes=64 << 10)


class TestSettings:
    GOOD = {"account_url": "https://acct.blob.core.windows.net/", "container": "checkpoints", "prefix": "cosmoflow/run-1/",
            "keep": 2, "cap_mbps": 2300, "interval_s": 300}

    def test_good(self):
        settings = parse_settings(json.dumps(self.GOOD))
        assert (settings.prefix, settings.keep, settings.cap_mbps, settings.writers) == ("cosmoflow/run-1", 2, 2300, "rank0")
        assert settings.stream(3) == "cosmoflow/run-1" and settings.is_writer(0) and not settings.is_writer(1)

    def test_every_node_writes_its_own_stream(self):
        settings = parse_settings(json.dumps(self.GOOD | {"writers": "per_rank"}))
        assert settings.stream(3) == "cosmoflow/run-1/node-3" and settings.is_writer(3)

    def test_bad_values_are_all_named(self):
        bad = self.GOOD | {"container": "Checkpoints_1", "prefix": "a/../b", "keep": 0, "cap_mbps": "fast",
                           "writers": "some", "account_url": "ftp://x"}
        with pytest.raises(RuntimeInputError) as info:
            parse_settings(json.dumps(bad))
        problems = {p.path: p for p in info.value.problems}
        assert set(problems) == {"container", "prefix", "keep", "cap_mbps", "writers", "account_url"}
        assert "'Checkpoints_1' is not a valid container name" in problems["container"].message
        assert "lowercase" in problems["container"].hint
        assert problems["keep"].message == "must be >= 1, got 0"
        assert problems["cap_mbps"].message == "must be a number, got 'fast'"
        assert "AMLHPC_CHECKPOINT_JSON: writers:" in info.value.render()

    def test_a_secret_pasted_as_account_url_is_not_echoed(self):
        secret = "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=c2VjcmV0"
        with pytest.raises(RuntimeInputError) as info:
            parse_settings(json.dumps(self.GOOD | {"account_url": secret}))
        assert "AccountKey" not in info.value.render() and "account_url" in info.value.render()

    def test_not_json(self):
        with pytest.raises(RuntimeInputError, match="AMLHPC_CHECKPOINT_JSON: is not valid JSON"):
            parse_settings("checkpoints")

    def test_unset_means_no_checkpoints(self):
        assert checkpoint.settings_from_env({}) is None

    def test_ndv4_article_ingress_rule(self):
        """8 writers x 2300 Mb/s = 18.4 Gb/s fits a 20 Gb/s ingress; 8 x 3000 does not."""
        ok = parse_settings(json.dumps(self.GOOD | {"writers": "per_node", "ingress_gbps": 20}))
        assert ok.ingress_warning(8) is None
        over = parse_settings(json.dumps(self.GOOD | {"writers": "per_node", "cap_mbps": 3000, "ingress_gbps": 20}))
        assert "8 checkpoint writer(s) x 3000 Mb/s = 24 Gb/s exceeds the account ingress of 20 Gb/s" in over.ingress_warning(8)
        assert "below 2500" in over.ingress_warning(8)
        uncapped = parse_settings(json.dumps(self.GOOD | {"cap_mbps": 0, "ingress_gbps": 25}))
        assert uncapped.cap_mbps is None and "not capped" in uncapped.ingress_warning(4)


class TestUploadRestore:
    FILES = {"model.pt": os.urandom(300_000), "optim/state-0.pt": os.urandom(70_000), "empty.txt": b"",
             "meta/latest": b"step-100\n"}

    def test_round_trip(self, store, container, tmp_path):
        """Every file comes back byte for byte, with its mtime; blobs carry their checksum."""
        source = write(tmp_path / "ckpt", self.FILES)
        os.utime(source / "model.pt", ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
        result = store.upload(source, keep=3)
        assert result.version and result.uploaded_files == 4 and result.uploaded_bytes == 370_009
        pointer = json.loads(container.download_blob("run-1/latest").readall())
        assert pointer["version"] == result.version
        props = container.get_blob_client(f"run-1/data/{result.version}/model.pt").get_blob_properties()
        assert props.metadata["amlhpc_size"] == "300000" and len(props.metadata["amlhpc_sha256"]) == 64
        restored = store.restore(tmp_path / "restored")
        assert restored.version == result.version
        assert tree(tmp_path / "restored") == self.FILES
        assert (tmp_path / "restored" / "model.pt").stat().st_mtime_ns == 1_700_000_000_123_456_789

    def test_uploads_carry_the_digests_staging_checks(self, store, container, tmp_path):
        """The same scheme as `jobs data upload`: Content-MD5 of the whole blob (each block's MD5 was
        checked by the service) and the SHA-256 of the stored bytes, for every file, empty ones too."""
        import hashlib

        files = {**self.FILES, "empty.bin": b""}
        result = store.upload(write(tmp_path / "ckpt", files), keep=3)
        for rel, content in files.items():
            props = container.get_blob_client(f"run-1/data/{result.version}/{rel}").get_blob_properties()
            assert bytes(props.content_settings.content_md5) == hashlib.md5(content).digest(), rel
            assert props.metadata["amlhpc_stored_sha256"] == hashlib.sha256(content).hexdigest(), rel

    def test_temporary_names_are_not_uploaded(self, store, tmp_path):
        """A writer's `.x.tmp` (before its atomic rename) is never part of a version."""
        source = write(tmp_path / "ckpt", {"ckpt-000000100.pt": b"done", ".ckpt-000000200.pt.tmp": b"half"})
        store.upload(source)
        assert [f["path"] for f in store.latest().files] == ["ckpt-000000100.pt"]

    def test_nothing_to_restore(self, store, tmp_path):
        assert store.restore(tmp_path / "fresh") is None

    def test_unchanged_folder_makes_no_version(self, store, tmp_path):
        source = write(tmp_path / "ckpt", self.FILES)
        first = store.upload(source)
        again = store.upload(source)
        assert again.version is None and store.versions() == [first.version]

    def test_only_changed_files_are_uploaded(self, store, container, tmp_path):
        """A new file and an edited one travel; the rest point at the blobs already there."""
        source = write(tmp_path / "ckpt", self.FILES)
        first = store.upload(source)
        write(source, {"step-200.pt": b"new" * 1000, "meta/latest": b"step-200\n"})
        second = store.upload(source)
        assert (second.uploaded_files, second.reused_files) == (2, 3)
        manifest = store.latest()
        blob_of = {f["path"]: f["blob"] for f in manifest.files}
        assert blob_of["model.pt"] == f"run-1/data/{first.version}/model.pt"
        assert blob_of["meta/latest"] == f"run-1/data/{second.version}/meta/latest"
        store.restore(tmp_path / "restored")
        assert tree(tmp_path / "restored") == tree(source)

    def test_restored_folder_uploads_nothing_new(self, store, tmp_path):
        """Restore sets mtimes from the manifest, so resuming does not re-upload old files."""
        store.upload(write(tmp_path / "ckpt", self.FILES))
        store.restore(tmp_path / "resumed")
        assert store.upload(tmp_path / "resumed").version is None

    def test_keep_n_versions(self, store, container, tmp_path):
        """keep=2: the two newest manifests stay; data only they reference survives."""
        source = write(tmp_path / "ckpt", {"config.json": b"{}"})
        versions = []
        for step in range(4):
            write(source, {"weights.pt": f"step {step}".encode() * 100})
            if step:
                (source / f"step-{step - 1}.pt").unlink(missing_ok=True)
            write(source, {f"step-{step}.pt": os.urandom(1000)})
            versions.append(store.upload(source, keep=2).version)
        assert store.versions() == versions[-2:]
        referenced = sorted({f["blob"] for v in versions[-2:] for f in store._read_json(store.manifest_name(v))[0]["files"]})
        assert blobs(container, "run-1/data/") == referenced
        assert any(f"data/{versions[0]}/config.json" in b for b in referenced)  # unchanged since v1: kept
        store.restore(tmp_path / "restored")
        assert tree(tmp_path / "restored") == tree(source)

    def test_upload_respects_the_cap(self, container, tmp_path):
        """4 MiB at 16 Mb/s (2 MB/s) cannot finish faster than the cap allows, burst included."""
        source = write(tmp_path / "ckpt", {"a.pt": os.urandom(2 << 20), "b.pt": os.urandom(2 << 20)})
        throttle = Throttle.from_mbits_per_s(16)
        capped = CheckpointStore(container, "capped", throttle=throttle, block_bytes=256 << 10)
        result = capped.upload(source)
        floor = ((4 << 20) - throttle.burst) / throttle.rate
        assert result.seconds >= floor * 0.95, (result.seconds, floor)
        assert throttle.total_bytes == 4 << 20

    def test_sequence_counts_up(self, store, tmp_path):
        source = tmp_path / "ckpt"
        for i in range(3):
            write(source, {"a": bytes([i]) * 10})
            store.upload(source)
        assert [int(v.split("-")[0]) for v in store.versions()] == [1, 2, 3]


class HookThrottle(Throttle):
    """The bandwidth cap is where bytes pass, so a test can act 'during' an upload there."""

    def __init__(self, hook):
        super().__init__(None)
        self.hook, self.fired = hook, False

    def acquire(self, nbytes):
        if not self.fired:
            self.fired = True
            self.hook()
        return super().acquire(nbytes)


class TestAtomicity:
    def test_file_changed_during_upload_commits_nothing(self, container, tmp_path):
        source = write(tmp_path / "ckpt", {"model.pt": b"v1" * 1000})
        plain = CheckpointStore(container, "run-1")
        first = plain.upload(source)
        write(source, {"model.pt": b"v2" * 1000})
        racing = CheckpointStore(container, "run-1", throttle=HookThrottle(lambda: (source / "model.pt").write_bytes(b"v3" * 999)))
        with pytest.raises(FileChanged, match="model.pt changed"):
            racing.upload(source)
        assert plain.latest().version == first.version
        assert plain.versions() == [first.version]

    def test_second_writer_is_refused(self, container, tmp_path):
        """Two jobs on one prefix: the one that commits second fails instead of interleaving."""
        a = write(tmp_path / "a", {"x": b"a" * 100})
        b = write(tmp_path / "b", {"x": b"b" * 100})
        other = CheckpointStore(container, "run-1")
        other.upload(a)
        winner = []
        loser = CheckpointStore(container, "run-1", throttle=HookThrottle(lambda: winner.append(other.upload(b))))
        write(a, {"y": b"more"})
        with pytest.raises(PointerConflict, match="two jobs are writing checkpoints under one prefix"):
            loser.upload(a)
        assert other.latest().version == winner[0].version

    def test_corrupt_blob_fails_restore_and_leaves_no_partial_file(self, store, container, tmp_path):
        source = write(tmp_path / "ckpt", {"model.pt": os.urandom(200_000)})
        version = store.upload(source).version
        container.upload_blob(f"run-1/data/{version}/model.pt", os.urandom(200_000), overwrite=True)
        target = tmp_path / "restored"
        with pytest.raises(CheckpointError, match=f"run-1/data/{version}/model.pt does not match its manifest"):
            store.restore(target)
        assert list(target.rglob("*")) == []

    def test_missing_container_is_explained(self, blob_service, tmp_path):
        store = CheckpointStore(blob_service.get_container_client("no-such-container"), "p")
        with pytest.raises(CheckpointError, match="container 'no-such-container' does not exist"):
            store.restore(tmp_path / "restored")

    def test_pointer_to_missing_manifest_is_explained(self, store, container, tmp_path):
        version = store.upload(write(tmp_path / "ckpt", {"a": b"1"})).version
        container.delete_blob(f"run-1/manifests/{version}.json")
        with pytest.raises(CheckpointError, match="does not exist: the version was deleted by hand"):
            store.restore(tmp_path / "restored")


def _cli(env: dict, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "amlhpc.jobs.runtime.checkpoint", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


class TestKillMidUpload:
    def test_sigkill_leaves_previous_version_and_rerun_completes(self, azurite, container, tmp_path):
        """SIGKILL after the first file of version 2 is in: `latest` still names version 1,
        which restores intact; a re-run commits version 2 and clears the orphan parts."""
        settings = {"container": container.container_name, "prefix": "amlhpc/jobs/kill", "keep": 2, "cap_mbps": 8}
        env = {**os.environ, "AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string,
               "AMLHPC_CHECKPOINT_JSON": json.dumps(settings)}
        source = write(tmp_path / "ckpt", {"a.bin": b"v1-a" * 1000})
        first = _cli({**env, "AMLHPC_CHECKPOINT_JSON": json.dumps(settings | {"cap_mbps": 0})}, "upload", str(source))
        out, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
        v1 = json.loads(out)["version"]
        v1_files = tree(source)

        write(source, {"a.bin": b"v2-a" * 1000, "b.bin": os.urandom(3 << 20), "c.bin": os.urandom(3 << 20)})
        proc = _cli(env, "upload", str(source))  # capped at 8 Mb/s: ~6 s for 6 MiB
        deadline = time.monotonic() + 30
        seen = ""
        while "uploaded" not in seen and time.monotonic() < deadline:
            seen += proc.stderr.readline()
        assert "uploaded" in seen, seen
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()

        store = CheckpointStore(container, "amlhpc/jobs/kill")
        assert store.latest().version == v1
        orphans = [b for b in blobs(container, "amlhpc/jobs/kill/data/") if f"/{v1}/" not in b]
        assert orphans, "the kill should have left parts of the unfinished version"
        store.restore(tmp_path / "after-kill")
        assert tree(tmp_path / "after-kill") == v1_files

        rerun = _cli({**env, "AMLHPC_CHECKPOINT_JSON": json.dumps(settings | {"cap_mbps": 0})}, "upload", str(source))
        out, err = rerun.communicate(timeout=60)
        assert rerun.returncode == 0, err
        v2 = json.loads(out)["version"]
        assert v2 != v1 and store.latest().version == v2
        assert not set(orphans) & set(blobs(container, "amlhpc/jobs/kill/data/")), "orphans of the killed upload remain"
        store.restore(tmp_path / "after-rerun")
        assert tree(tmp_path / "after-rerun") == tree(source)


class TestCli:
    def test_list_and_bad_settings(self, azurite, container, tmp_path):
        env = {**os.environ, "AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string,
               "AMLHPC_CHECKPOINT_JSON": json.dumps({"container": container.container_name, "prefix": "p"})}
        proc = _cli(env, "list")
        out, _ = proc.communicate(timeout=60)
        assert json.loads(out) == {"latest": None, "versions": [], "pending": []}
        proc = _cli({**env, "AMLHPC_CHECKPOINT_JSON": '{"container": "x", "prefix": ""}'}, "list")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2
        assert "AMLHPC_CHECKPOINT_JSON: container: 'x' is not a valid container name" in err
        assert azurite.key not in err

    def test_unreachable_endpoint_is_one_line_with_the_fix(self, azurite, tmp_path):
        """No traceback: the endpoint, the cause and what to check; the key is never printed."""
        from amlhpc.jobs.local.azurite import free_port

        port = free_port()  # nothing listens there
        closed = azurite.connection_string.replace(f":{azurite.port}/", f":{port}/")
        assert closed != azurite.connection_string
        env = {**os.environ, "AMLHPC_BLOB_CONNECTION_STRING": closed,
               "AMLHPC_CHECKPOINT_JSON": json.dumps({"container": "checkpoints", "prefix": "p"})}
        for action in (["list"], ["restore", str(tmp_path / "r")], ["prune"]):
            proc = _cli(env, *action)
            _, err = proc.communicate(timeout=120)
            lines = [line for line in err.splitlines() if line.strip()]
            assert proc.returncode == 1, err
            assert "Traceback" not in err and len(lines) == 1, err
            assert lines[0].startswith(f"checkpoint: cannot reach the Blob endpoint http://127.0.0.1:{port}/"), err
            assert "AMLHPC_BLOB_CONNECTION_STRING for Azurite" in lines[0] and "--debug" in lines[0]
            assert azurite.key not in err
        proc = _cli(env, "list", "--debug")
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 1 and "Traceback" in err

    def test_unset_settings(self, tmp_path):
        env = {k: v for k, v in os.environ.items() if k != "AMLHPC_CHECKPOINT_JSON"}
        proc = _cli(env, "list")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2 and "AMLHPC_CHECKPOINT_JSON: is not set" in err


class TestBackground:
    def test_uploads_while_running_and_at_the_end(self, store, tmp_path):
        folder = tmp_path / "ckpt"
        uploader = BackgroundUploader(store, folder, interval_s=0.1, keep=5, settle_s=0.05)
        uploader.start()
        write(folder, {"step-1.pt": b"1" * 1000})
        deadline = time.monotonic() + 10
        while not uploader.results and time.monotonic() < deadline:
            time.sleep(0.05)
        assert uploader.results, "no background upload within 10 s"
        write(folder, {"step-2.pt": b"2" * 1000})
        final = uploader.finish()
        assert store.latest().version == final.version
        assert sorted(f["path"] for f in store.latest().files) == ["step-1.pt", "step-2.pt"]

    def test_restored_state_is_not_uploaded_again(self, store, tmp_path):
        store.upload(write(tmp_path / "src", {"a": b"x"}))
        store.restore(tmp_path / "ckpt")
        uploader = BackgroundUploader(store, tmp_path / "ckpt", interval_s=60, keep=3)
        uploader.mark_current()
        assert uploader.finish() is None
        assert len(store.versions()) == 1

    def test_storage_errors_do_not_stop_training_but_fail_the_end(self, blob_service, tmp_path):
        """A missing container: rounds log and retry; the final upload reports the failure."""
        broken = CheckpointStore(blob_service.get_container_client("no-such-container"), "p")
        uploader = BackgroundUploader(broken, write(tmp_path / "ckpt", {"a": b"1"}), interval_s=0.05, keep=3)
        uploader.start()
        time.sleep(0.3)
        with pytest.raises(CheckpointError, match="could not be uploaded: CheckpointError: container 'no-such-container'"):
            uploader.finish(attempts=2)
        assert uploader.errors
