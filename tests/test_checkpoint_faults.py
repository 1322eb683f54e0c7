"""The checkpoint state machine under interleavings, against a real Azurite: at every named step
of an upload and a commit (amlhpc/jobs/runtime/base/faultpoints.py) a prune, a second writer, a
cancel and a kill land there, and afterwards the invariants hold:

- `latest` names a version whose every part is in Blob and restores byte for byte;
- every manifest's parts exist (nothing committed unrestorable, nothing committed pruned);
- once the next upload has run, no pending record and no orphan part is left.

Each test asserts that its fault point fired (faultpoints.injected fails the test otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.base import faultpoints
from amlhpc.jobs.runtime.checkpoint import (
    CheckpointStore,
    NotReady,
    PartMissing,
    PointerConflict,
    UploadCancelled,
)
from amlhpc.jobs.runtime.checkpoint.snapshot import scan

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.azurite

UPLOAD_POINTS = ["checkpoint.pending-written", "checkpoint.block-staged", "checkpoint.part-committed", "checkpoint.parts-recorded"]
COMMIT_POINTS = ["checkpoint.verified", "checkpoint.manifest-written", "checkpoint.pointer-written"]
STEPS = UPLOAD_POINTS + COMMIT_POINTS


def write(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def blobs(container, prefix: str) -> set[str]:
    return {b.name for b in container.list_blobs(name_starts_with=prefix)}


def assert_consistent(store: CheckpointStore, tmp_path: Path, expected: dict[str, bytes] | None) -> None:
    """The invariants: latest restores to `expected`; every manifest's parts exist."""
    present = blobs(store.container, store.data_prefix())
    for version in store.versions():
        manifest = store.manifest(version)
        missing = [f["blob"] for f in manifest.files if f["blob"] not in present]
        assert not missing, f"committed version {version} lost parts: {missing}"
    target = tmp_path / f"restore-{len(list(tmp_path.glob('restore-*')))}"
    restored = store.restore(target)
    assert (tree(target) if restored else None) == expected


def assert_clean(store: CheckpointStore) -> None:
    """No lease and no part that no manifest references."""
    assert store.pendings() == {}
    referenced = {f["blob"] for v in store.versions() for f in store.manifest(v).files}
    assert blobs(store.container, store.data_prefix()) == referenced


@pytest.fixture
def setup(container, tmp_path):
    """A stream with one committed version (v1) and a folder changed for v2 (multi-block parts)."""
    store = CheckpointStore(container, "run", block_bytes=64 << 10)
    source = write(tmp_path / "ckpt", {"model.pt": os.urandom(200_000), "meta.json": b'{"step": 1}'})
    store.upload(source, keep=1)
    v1 = tree(source)
    write(source, {"model.pt": os.urandom(300_000), "optim.pt": os.urandom(150_000), "meta.json": b'{"step": 2}'})
    return store, source, v1


class TestPruneDuringUpload:
    @pytest.mark.parametrize("point", STEPS)
    def test_prune_at_each_step_then_restore(self, setup, tmp_path, point):
        """The adversarial finding: a prune while v2 uploads deleted v2's parts, v2 was committed
        unrestorable and retention then dropped v1. Now v2 commits whole, restores, and keeps."""
        store, source, _ = setup
        other = CheckpointStore(store.container, "run")  # `checkpoint prune` by hand, keep=1
        pruned = []
        with faultpoints.injected(point, lambda **_: pruned.append(other.prune(1))):
            result = store.upload(source, keep=1)
        assert pruned and result.version
        assert_consistent(store, tmp_path, tree(source))
        write(source, {"meta.json": b'{"step": 3}'})
        store.upload(source, keep=1)  # the next upload and its retention pass
        assert_consistent(store, tmp_path, tree(source))
        assert_clean(store)

    @pytest.mark.parametrize("point", ["checkpoint.prune-listed", "checkpoint.prune-decided"])
    def test_an_upload_inside_a_prune(self, setup, tmp_path, point):
        """Prune reads data first, then leases, then manifests: an upload committed in between is kept."""
        store, source, _ = setup
        writer = CheckpointStore(store.container, "run", block_bytes=64 << 10)
        with faultpoints.injected(point, lambda **_: writer.upload(source, keep=5)):
            store.prune(1)
        assert_consistent(store, tmp_path, tree(source))


class TestSecondWriter:
    @pytest.mark.parametrize("point", STEPS)
    def test_another_writer_at_each_step(self, setup, tmp_path, point):
        """Two writers on one stream: whoever loses fails loudly; latest is exactly one folder."""
        store, source, _ = setup
        rival_folder = write(tmp_path / "rival", {"model.pt": os.urandom(120_000), "meta.json": b'{"rival": 1}'})
        rival = CheckpointStore(store.container, "run", block_bytes=64 << 10)
        rival_results = []
        with faultpoints.injected(point, lambda **_: rival_results.append(rival.upload(rival_folder, keep=3))):
            try:
                mine = store.upload(source, keep=3)
            except (PointerConflict, PartMissing) as exc:
                mine = exc
        assert rival_results and rival_results[0].version
        if isinstance(mine, PointerConflict):
            assert "two jobs are writing checkpoints under one prefix" in str(mine)
        elif isinstance(mine, PartMissing):  # the rival's retention took the parts it no longer saw leased
            assert "run/data/" in str(mine) and "not committed" in str(mine)
        else:  # already committed when the rival came: the rival's version is the newer one
            assert point == "checkpoint.pointer-written" and mine.version
        assert_consistent(store, tmp_path, tree(rival_folder))

    def test_block_ids_are_unique_per_session(self, container, tmp_path):
        """Two sessions write the same part: the blob is wholly the one that committed first,
        never a mix of blocks, and the other fails naming the conflict."""
        store_a = CheckpointStore(container, "s", block_bytes=64 << 10)
        store_b = CheckpointStore(container, "s", block_bytes=64 << 10, node=1)
        a = write(tmp_path / "a", {"x.pt": b"A" * 200_000})
        b = write(tmp_path / "b", {"x.pt": b"B" * 200_000})
        with faultpoints.injected("checkpoint.block-staged", lambda **_: store_b.stage(b, list(scan(b).values()), "000001-v")), \
                pytest.raises(PointerConflict, match="another writer committed s/data/000001-v/x.pt while this upload"):
            store_a.stage(a, list(scan(a).values()), "000001-v")
        assert container.download_blob("s/data/000001-v/x.pt").readall() == b"B" * 200_000
        assert [f["path"] for f in store_b.commit("000001-v", 1, [1], {}).files] == ["x.pt"]


class TestCancel:
    @pytest.mark.parametrize("point", STEPS)
    def test_cancel_at_each_step(self, setup, tmp_path, point):
        """A cancel (an in-job restart) commits nothing before the pointer; the next upload
        takes the leftovers over."""
        store, source, v1 = setup
        with faultpoints.injected(point, cancel), pytest.raises(UploadCancelled):
            store.upload(source, keep=1)
        committed = point == "checkpoint.pointer-written"
        assert_consistent(store, tmp_path, tree(source) if committed else v1)
        if point in UPLOAD_POINTS:
            assert store.pendings() == {}, "a cancelled upload withdraws its lease"
        write(source, {"meta.json": b'{"step": 4}'})
        store.upload(source, keep=1)
        assert_consistent(store, tmp_path, tree(source))
        assert_clean(store)


def cancel(**_context) -> None:
    """The launcher cancels the upload for an in-job restart, at this step."""
    raise UploadCancelled("upload cancelled by the fault point")


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "amlhpc.jobs.runtime.checkpoint", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
class TestKill:
    @pytest.mark.parametrize("point", STEPS)
    def test_sigkill_at_each_step(self, azurite, container, tmp_path, point):
        """The uploader dies at the step: latest is the previous version (or the new one once the
        pointer moved), both restorable; the re-run commits and leaves nothing behind."""
        settings = {"container": container.container_name, "prefix": "killed", "keep": 1}
        env = {**os.environ, "AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string,
               "AMLHPC_CHECKPOINT_JSON": json.dumps(settings)}
        source = write(tmp_path / "ckpt", {"a.bin": os.urandom(100_000)})
        assert _cli(env, "upload", str(source)).returncode == 0
        v1 = tree(source)
        write(source, {"a.bin": os.urandom(100_000), "b.bin": os.urandom(50_000)})
        killed = _cli({**env, "AMLHPC_FAULTPOINTS": f"{point}=kill"}, "upload", str(source))
        assert killed.returncode == -9, killed.stderr[-2000:]
        store = CheckpointStore(container, "killed")
        assert_consistent(store, tmp_path, tree(source) if point == "checkpoint.pointer-written" else v1)
        rerun = _cli(env, "upload", str(source))
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        assert_consistent(store, tmp_path, tree(source))
        if point != "checkpoint.pointer-written":
            assert json.loads(rerun.stdout)["version"] is not None
        assert_clean(store)


class TestMultiNodeCommit:
    def test_committed_only_when_every_node_staged(self, container, tmp_path):
        nodes = [CheckpointStore(container, "job/versions", node=k) for k in (0, 1)]
        parts = [write(tmp_path / f"n{k}", {f"rank-{k}/shard.distcp": os.urandom(10_000), f"rank-{k}.json": b"{}"})
                 for k in (0, 1)]
        nodes[0].stage(parts[0], list(scan(parts[0]).values()), "000000010-abc")
        with pytest.raises(NotReady, match="node.s. 1 have not staged"):
            nodes[0].commit("000000010-abc", 10, [0, 1], {"layout": "versions"})
        assert nodes[0].pointer() == (None, None)
        nodes[1].stage(parts[1], list(scan(parts[1]).values()), "000000010-abc")
        manifest = nodes[0].commit("000000010-abc", 10, [0, 1], {"layout": "versions"})
        assert sorted(f["path"] for f in manifest.files) == ["rank-0.json", "rank-0/shard.distcp", "rank-1.json",
                                                              "rank-1/shard.distcp"]
        assert nodes[0].pendings() == {}
        nodes[1].restore(tmp_path / "restored", select=lambda p: p.startswith("rank-1"))
        assert tree(tmp_path / "restored") == tree(parts[1])

    def test_a_part_deleted_before_the_commit_is_not_committed(self, container, tmp_path):
        store = CheckpointStore(container, "job/versions")
        part = write(tmp_path / "n0", {"rank-0/shard.distcp": os.urandom(10_000)})
        store.stage(part, list(scan(part).values()), "000000010-abc")
        container.delete_blob("job/versions/data/000000010-abc/rank-0/shard.distcp")
        with pytest.raises(PartMissing, match="not in Blob"):
            store.commit("000000010-abc", 10, [0], {})
        assert store.pointer() == (None, None) and store.versions() == []

    def test_a_stale_lease_is_dropped_by_prune(self, container, tmp_path):
        store = CheckpointStore(container, "s")
        store.upload(write(tmp_path / "a", {"x": b"1"}))
        part = write(tmp_path / "b", {"y": b"2"})
        store.stage(part, list(scan(part).values()), "000099-gone")  # an uploader that never came back
        assert store.prune(1) == ([], 0), "a live lease keeps its parts"
        expired = CheckpointStore(container, "s", stale_pending_s=0)
        assert expired.prune(1)[1] == 1
        assert_clean(store)


class TestFaultPoints:
    def test_unknown_names_and_actions_are_refused(self):
        with pytest.raises(KeyError, match="unknown fault point 'checkpoint.typo'"):
            faultpoints.arm("checkpoint.typo", faultpoints.crash)
        with pytest.raises(ValueError, match="the action must be kill, error"):
            faultpoints._env_action("checkpoint.verified", "explode", None)

    def test_a_point_never_reached_fails_the_test(self):
        with pytest.raises(AssertionError, match="never reached"), \
                faultpoints.injected("checkpoint.verified", faultpoints.raising()):
            pass
