"""Versioned checkpoints: the node-local tier (markers, verification, retention), the background
writer (training goes on while it writes, and what it writes is the state at save time),
sharded state (FSDP) saved by every rank and loaded into another world size, and the launcher's
restore from Blob of a node's own parts or, on another world size, of every part."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.checkpoint import CheckpointStore, tier
from amlhpc.jobs.runtime.checkpoint.snapshot import scan

REPO = Path(__file__).resolve().parents[1]


def make_version(root: Path, step: int, ranks: list[int], world: int, tag: str = "t0") -> Path:
    version = tier.versions_dir(root) / tier.version_name(step)
    for rank in ranks:
        folder = tier.rank_dir(version, rank)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "shard.bin").write_bytes(os.urandom(2000) + bytes([rank, step % 256]))
        tier.write_marker(version, rank, step=step, world=world, tag=tag)
    return version


class TestTier:
    def test_held_verify_and_corruption(self, tmp_path):
        make_version(tmp_path, 2, [0, 1], 4)
        make_version(tmp_path, 4, [0], 4)  # rank 1's part of step 4 never finished
        assert [v.name for v in tier.held(tmp_path, [0, 1])] == ["step-000000002"]
        (version,) = tier.held(tmp_path, [0, 1])
        assert version.verify([0, 1]) is None and version.world == 4 and version.tag == "t0"
        shard = tier.rank_dir(version.path, 1) / "shard.bin"
        mtime = shard.stat().st_mtime_ns
        shard.write_bytes(b"x" + shard.read_bytes()[1:])
        os.utime(shard, ns=(mtime + 10**9, mtime + 10**9))  # written a second later, as a real rewrite would be
        assert "rank-1/shard.bin does not match its marker (corrupt)" in version.verify([0, 1])
        os.utime(shard, ns=(mtime, mtime))  # the same bytes with the mtime of the save: only the full check sees it
        assert version.verify([0, 1]) is None
        assert "rank-1/shard.bin does not match its marker (corrupt)" in version.verify([0, 1], full=True)

    def test_retention_keeps_what_is_in_use(self, tmp_path):
        for step in (2, 4, 6, 8):
            make_version(tmp_path, step, [0, 1], 2)
        make_version(tmp_path, 10, [0], 2)  # being written
        gone = tier.prune_local(tmp_path, [0, 1], keep=2, protect={"step-000000002"})
        assert gone == ["step-000000004"]
        assert [v.name for v in tier.scan_versions(tmp_path)] == ["step-000000002", "step-000000006", "step-000000008",
                                                                   "step-000000010"]
        assert tier.discard_after(tmp_path, 6) == ["step-000000008", "step-000000010"]

    def test_a_marker_naming_another_rank_folder_is_ignored(self, tmp_path):
        version = make_version(tmp_path, 2, [0], 1)
        marker = json.loads(tier.marker_path(version, 0).read_text())
        marker["files"][0]["path"] = "rank-1/shard.bin"
        tier.marker_path(version, 0).write_text(json.dumps(marker))
        assert tier.held(tmp_path, [0]) == []


class TestBackgroundWriter:
    def test_saves_the_state_of_the_save_not_of_later_steps(self, tmp_path):
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer, load_version

        weight = torch.arange(1_000_000, dtype=torch.float32)
        writer = Checkpointer(tmp_path, 0, 1, "t0", background=True)
        stall = writer.save(1, {"w": weight}, {"step": 1})
        weight.mul_(-1)  # the training goes on and changes the tensor in place at once
        writer.wait()
        target = {"w": torch.zeros_like(weight)}
        load_version(tier.versions_dir(tmp_path) / "step-000000001", target, 0)
        assert torch.equal(target["w"], torch.arange(1_000_000, dtype=torch.float32))
        assert stall >= 0 and writer.saved == [1]

    def test_the_next_save_reuses_the_buffers_and_keeps_each_state(self, tmp_path, monkeypatch):
        """torch's stager copies the second save into the first one's CPU buffers (no new
        allocation) only after the first write is done: both versions hold their own values."""
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint import versioned
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer, load_version

        written = []
        real_write = versioned.Checkpointer._write

        def spy(self, version_dir, step, state, trainer):
            written.append(state["w"].data_ptr())
            real_write(self, version_dir, step, state, trainer)

        monkeypatch.setattr(versioned.Checkpointer, "_write", spy)
        weight = torch.ones(100_000)
        writer = Checkpointer(tmp_path, 0, 1, "t0", writers=2)
        writer.save(1, {"w": weight}, {"step": 1})
        weight.add_(1)
        writer.save(2, {"w": weight}, {"step": 2})
        weight.add_(1)
        writer.close()
        assert len(written) == 2 and written[0] == written[1] != weight.data_ptr(), "one staging buffer, reused"
        for step, value in ((1, 1.0), (2, 2.0)):
            target = {"w": torch.zeros(100_000)}
            load_version(tier.versions_dir(tmp_path) / tier.version_name(step), target, 0)
            assert torch.equal(target["w"], torch.full((100_000,), value)), step

    def test_saves_reuse_their_buffers_without_torchs_default_stager(self, tmp_path, monkeypatch):
        """torch 2.8 has no DefaultStager, and 2.11's drops its buffers after each stage and fails
        the next (pytorch/pytorch#183413): the background save does without it. With DefaultStager
        gone, three saves still copy into one set of buffers and each version keeps its values."""
        torch = pytest.importorskip("torch")
        from torch.distributed.checkpoint import staging

        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer, load_version

        monkeypatch.delattr(staging, "DefaultStager")
        monkeypatch.delattr(staging, "StagingOptions")
        weight, bias = torch.ones(50_000), torch.zeros(10)
        writer = Checkpointer(tmp_path, 0, 1, "t0", writers=2)
        pointers = []
        for step in (1, 2, 3):
            writer.save(step, {"w": weight, "b": bias}, {"step": step})
            pointers.append(writer._stager._stager._cached_storage_mapping[weight.untyped_storage()].data_ptr())
            weight.add_(1)
        writer.close()
        assert len(set(pointers)) == 1, "one CPU buffer for the weight across the three saves"
        for step in (1, 2, 3):
            target = {"w": torch.zeros(50_000), "b": torch.ones(10)}
            load_version(tier.versions_dir(tmp_path) / tier.version_name(step), target, 0)
            assert torch.equal(target["w"], torch.full((50_000,), float(step))) and not target["b"].any(), step

    def test_writer_threads_come_from_the_environment_and_bad_values_are_refused(self):
        from amlhpc.jobs.runtime.checkpoint import CheckpointError
        from amlhpc.jobs.runtime.checkpoint.versioned import WRITERS_VARIABLE, default_writers

        assert default_writers({WRITERS_VARIABLE: "3"}) == 3
        assert 1 <= default_writers({"LOCAL_WORLD_SIZE": "8"}) <= 8
        for bad in ("0", "-1", "four"):
            with pytest.raises(CheckpointError, match=f"{WRITERS_VARIABLE}=.*positive integer"):
                default_writers({WRITERS_VARIABLE: bad})

    def test_a_corrupt_file_is_found_by_the_parallel_check(self, tmp_path):
        """Every file is hashed (in parallel); one flipped byte in any of them is named."""
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

        Checkpointer(tmp_path, 0, 1, "t0", background=False, writers=4).save(
            1, {f"w{i}": torch.ones(50_000) * i for i in range(8)}, {"step": 1})
        version = tier.read_version(tier.versions_dir(tmp_path) / "step-000000001")
        files = [f["path"] for f in version.markers[0]["files"]]
        assert len(files) > 2 and version.verify([0], workers=4, full=True) is None
        victim = version.path / files[len(files) // 2]
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
        assert version.verify([0], workers=4, full=True) == (
            f"step-000000001: {files[len(files) // 2]} does not match its marker (corrupt)")

    def test_the_marker_holds_the_hashes_taken_while_writing_and_no_file_is_read_back(self, tmp_path, monkeypatch):
        """Every file's SHA-256 comes from the bytes on their way to the disk: with reading a file
        back made impossible the save still records each file, and each digest is the file's."""
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

        def no_read_back(*args, **kwargs):
            raise AssertionError("a checkpoint file was read back to hash it")

        monkeypatch.setattr(tier, "file_sha256", no_read_back)
        state = {**{f"w{i}": torch.randn(40_000) for i in range(6)}, "lr": 0.5, "name": "adam"}
        Checkpointer(tmp_path, 0, 1, "t0", writers=3).save(1, state, {"step": 1})  # background; close below
        Checkpointer(tmp_path, 0, 1, "t0", background=False, writers=3).save(2, state, {"step": 2})
        monkeypatch.undo()
        for step in (2,):
            version = tier.read_version(tier.versions_dir(tmp_path) / tier.version_name(step))
            entries = version.markers[0]["files"]
            assert {e["path"] for e in entries} >= {"rank-0/.metadata", "rank-0/trainer.json"} and len(entries) >= 4
            for entry in entries:
                path = version.path / entry["path"]
                assert (entry["sha256"], entry["size"], entry["mtimeNs"]) == (
                    tier.file_sha256(path), path.stat().st_size, path.stat().st_mtime_ns), entry["path"]

    def test_a_restart_reads_no_data_unless_a_file_changed_or_the_full_check_is_asked(self, tmp_path, monkeypatch):
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

        Checkpointer(tmp_path, 0, 1, "t0", background=False, writers=2).save(
            1, {f"w{i}": torch.ones(30_000) * i for i in range(4)}, {"step": 1})
        version = tier.read_version(tier.versions_dir(tmp_path) / "step-000000001")
        hashed: list[str] = []
        real = tier.file_sha256
        monkeypatch.setattr(tier, "file_sha256", lambda path: hashed.append(Path(path).name) or real(path))
        assert version.verify([0]) is None and hashed == [], "the quick check trusts the marker"
        assert version.verify([0], full=True) is None and len(hashed) == len(version.markers[0]["files"])
        hashed.clear()
        victim = tier.rank_dir(version.path, 0) / "trainer.json"
        victim.write_text('{"step": 7}')  # the same size, other bytes
        mtime = victim.stat().st_mtime_ns
        os.utime(victim, ns=(mtime + 10**9, mtime + 10**9))
        assert version.verify([0]) == "step-000000001: rank-0/trainer.json does not match its marker (corrupt)"
        assert hashed == ["trainer.json"], "only the file whose mtime moved is read"
        # A marker written before mtimes were recorded: every file is hashed.
        hashed.clear()
        for entry in version.markers[0]["files"]:
            entry.pop("mtimeNs")
        assert version.verify([0]) is not None and len(hashed) == len(version.markers[0]["files"])

    def test_a_copy_corrupted_in_place_fails_the_load_and_is_no_longer_offered(self, tmp_path):
        """A flipped byte with the size and mtime kept (the medium's corruption, not a writer's)
        passes the restart's quick check; the load hashes what it reads, refuses the copy, and
        sets its marker aside, so the node no longer holds the version."""
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint.errors import LocalCopyCorrupt
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer, load_version

        state = {f"w{i}": torch.arange(20_000, dtype=torch.float32) + i for i in range(3)}
        Checkpointer(tmp_path, 0, 1, "t0", background=False, writers=2).save(1, state, {"step": 1})
        version_dir = tier.versions_dir(tmp_path) / "step-000000001"
        target = {k: torch.zeros_like(v) for k, v in state.items()}
        assert load_version(version_dir, target, 0)["step"] == 1 and torch.equal(target["w2"], state["w2"])
        victim = max(tier.rank_dir(version_dir, 0).glob("*.distcp"), key=lambda p: p.stat().st_size)
        st = victim.stat()
        data = bytearray(victim.read_bytes())
        data[len(data) - 100] ^= 0x01
        victim.write_bytes(bytes(data))
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert tier.read_version(version_dir).verify([0]) is None, "the quick check cannot see it"
        with pytest.raises(LocalCopyCorrupt, match=f"rank-0/{victim.name} does not match its marker.*set aside"):
            load_version(version_dir, {k: torch.zeros_like(v) for k, v in state.items()}, 0)
        assert tier.held(tmp_path, [0]) == [] and (version_dir / "rank-0.json.corrupt").is_file()

    def test_a_metadata_file_corrupted_in_place_is_named_not_a_parse_error(self, tmp_path):
        """`.metadata` is read before the load starts: a flipped byte there is reported as the
        copy's corruption (and set aside), not as an unreadable checkpoint."""
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint.errors import LocalCopyCorrupt
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer, load_version

        state = {"w": torch.ones(1000)}
        Checkpointer(tmp_path, 0, 1, "t0", background=False).save(1, state, {"step": 1})
        version_dir = tier.versions_dir(tmp_path) / "step-000000001"
        victim = tier.rank_dir(version_dir, 0) / ".metadata"
        st = victim.stat()
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(LocalCopyCorrupt, match="rank-0/.metadata does not match its marker"):
            load_version(version_dir, {"w": torch.zeros(1000)}, 0)
        assert tier.held(tmp_path, [0]) == []

    def test_the_verify_setting_is_checked(self):
        from amlhpc.jobs.runtime.checkpoint import CheckpointError

        assert not tier.full_verify({}) and tier.full_verify({tier.VERIFY_VARIABLE: "full"})
        with pytest.raises(CheckpointError, match="AMLHPC_CHECKPOINT_VERIFY='all' is not one of quick, full"):
            tier.full_verify({tier.VERIFY_VARIABLE: "all"})

    def test_the_hashing_writer_refuses_to_seek(self, tmp_path):
        import io

        from amlhpc.jobs.runtime.checkpoint.versioned import HashingWriter

        with open(tmp_path / "f", "wb") as raw:
            writer = HashingWriter(raw)
            writer.write(b"abc")
            with pytest.raises(io.UnsupportedOperation):
                writer.seek(0)
            assert writer.tell() == 3 and writer.size == 3

    def test_a_failed_write_is_reported_by_the_next_save(self, tmp_path):
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint import CheckpointError
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

        (tmp_path / "versions").write_text("not a folder")
        writer = Checkpointer(tmp_path, 0, 1, "t0")
        writer.save(1, {"w": torch.ones(3)}, {"step": 1})
        with pytest.raises(CheckpointError, match="rank 0: writing a checkpoint failed"):
            writer.save(2, {"w": torch.ones(3)}, {"step": 2})


FSDP = r"""
import json, os, sys, torch, torch.distributed as dist
from pathlib import Path
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer, load_version
from amlhpc.jobs.workloads import common
import atexit  # runs after the workloads' own exit handler: what it left running
atexit.register(lambda: os.write(1, f"rank {os.environ['RANK']} gloo threads at exit: {common.gloo_threads() or None}\n".encode()))
mode, root = sys.argv[1], Path(sys.argv[2])
def main():  # the model and its meshes live in main's frame, gone before the exit handler
    common.init_distributed()  # as the workloads join, and leave at exit (tests/test_exit_teardown.py)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    def full(sd):
        return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).tolist() for k, v in sd.items() if hasattr(v, "shape")}
    if mode == "save":
        for _ in range(2):
            optim.zero_grad(); model(torch.randn(4, 10)).sum().backward(); optim.step()
        msd, osd = get_state_dict(model, optim)
        writer = Checkpointer(root, rank, world, "t0", background=True)
        writer.save(2, {"model": msd, "optim": osd}, {"step": 2})
        expected = {"model": full(msd), "exp_avg": {k: full(v) for k, v in osd["state"].items()}}
        if rank == 0:
            (root / "expected.json").write_text(json.dumps(expected))
        writer.wait()
    else:
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd}
        trainer = load_version(root / "versions" / "step-000000002", state, rank, world)
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        msd, osd = get_state_dict(model, optim)
        expected = json.loads((root / "expected.json").read_text())
        assert full(msd) == expected["model"], "model differs after resharding"
        assert {k: full(v) for k, v in osd["state"].items()} == expected["exp_avg"], "optimizer state differs"
        assert trainer["same_world"] is False and trainer["saved_world"] == 4
        optim.zero_grad(); model(torch.randn(4, 10)).sum().backward(); optim.step()
        print(f"rank {rank}: resharded 4 -> {world} ok")
    dist.destroy_process_group()
main()
"""


@pytest.mark.slow
def test_fsdp_state_saved_by_every_rank_loads_into_another_world_size(tmp_path):
    """FSDP2 (fully_shard) over gloo: 4 ranks each save their shards; 3 ranks load them (DCP
    reshards by chunk offsets): model and Adam state equal the 4-rank job's, element for element."""
    pytest.importorskip("torch")
    script = tmp_path / "fsdp.py"
    script.write_text(FSDP)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for mode, nproc in (("save", 4), ("load", 3)):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
                               str(script), mode, str(tmp_path / "ckpt")], env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        left = [line for line in proc.stdout.splitlines() if "gloo threads at exit" in line]
        assert len(left) == nproc and all(line.endswith(": None") for line in left), left  # nothing left to abort
    assert sorted(p.name for p in (tmp_path / "ckpt" / "versions" / "step-000000002").glob("rank-*.json")) == \
        [f"rank-{r}.json" for r in range(4)]
    assert proc.stdout.count("resharded 4 -> 3 ok") == 3


@pytest.mark.azurite
class TestRestoreFromBlob:
    def committed(self, container, tmp_path) -> tuple[CheckpointStore, Path]:
        """A version of a 4-rank job (2 nodes x 2) staged by both nodes and committed."""
        stores = [CheckpointStore(container, "job/versions", node=k) for k in (0, 1)]
        for node in (0, 1):
            version = make_version(tmp_path / f"node{node}", 6, [2 * node, 2 * node + 1], 4)
            files = tier.read_version(version).files([2 * node, 2 * node + 1])
            stores[node].stage(version, files, "000000006-t0")
        stores[0].commit("000000006-t0", 6, [0, 1], {"layout": "versions", "step": 6, "world": 4, "tag": "t0",
                                                     "local": "step-000000006", "nodes": 2})
        return stores[0], tmp_path

    def node(self, azurite, container, tmp_path: Path, node: int, local_size: int, world: int):
        from amlhpc.jobs.runtime.checkpoint import parse_settings
        from amlhpc.jobs.runtime.checkpoint.node import NodeCheckpoints

        settings = parse_settings(json.dumps({"container": container.container_name, "prefix": "job"}))
        return NodeCheckpoints(settings, node=node, nodes=world // local_size, local_size=local_size, world=world,
                               checkpoint_dir=tmp_path / f"restore-{node}-{world}",
                               environ={"AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string})

    def test_same_world_restores_the_nodes_own_parts(self, azurite, container, tmp_path):
        self.committed(container, tmp_path)
        node = self.node(azurite, container, tmp_path, 1, 2, 4)
        folder, resume = node.restore_at_start()
        assert folder is None and resume.name == "step-000000006"
        assert sorted(scan(resume)) == ["rank-2.json", "rank-2/shard.bin", "rank-3.json", "rank-3/shard.bin"]

    def test_another_world_restores_every_part(self, azurite, container, tmp_path):
        """Shrink-and-continue: a 3-rank job needs every rank's shards to reshard from."""
        self.committed(container, tmp_path)
        node = self.node(azurite, container, tmp_path, 0, 1, 3)
        _, resume = node.restore_at_start()
        assert sorted(p.name for p in resume.glob("rank-*.json")) == [f"rank-{r}.json" for r in range(4)]
        assert tier.read_version(resume).verify(range(4)) is None

