"""A reshard restore reads by range: the node restores every part's small files, and each rank
fetches from Blob only the blocks of the data its load plan needs, each checked against the
part's block digests, shared with the node's other ranks (amlhpc.jobs.runtime.checkpoint.ranged)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.checkpoint import blocks, parse_settings, ranged, rows, tier
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError, LocalCopyCorrupt
from amlhpc.jobs.runtime.checkpoint.node import NodeCheckpoints
from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
STEP = 6
NAME = "000000006-t0"


def save(root: Path, world: int, state_of, monkeypatch, block_kib: int = 4) -> Path:
    """Every rank's part of version STEP (as `world` ranks on one machine would write it)."""
    from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

    monkeypatch.setenv(blocks.BLOCK_VARIABLE, str(block_kib))
    for rank in range(world):
        writer = Checkpointer(root, rank, world, "t0", background=False)
        writer.save(STEP, state_of(rank), {"step": STEP, "rank": rank})
    return tier.versions_dir(root) / tier.version_name(STEP)


def commit(container, version: Path, world: int) -> CheckpointStore:
    store = CheckpointStore(container, "job/versions", node=0)
    store.stage(version, tier.read_version(version).files(range(world)), NAME)
    store.commit(NAME, STEP, [0], {"layout": "versions", "step": STEP, "world": world, "tag": "t0",
                                   "local": version.name, "nodes": 1})
    return store


def node(azurite, container, root: Path, world: int) -> NodeCheckpoints:
    settings = parse_settings(json.dumps({"container": container.container_name, "prefix": "job"}))
    return NodeCheckpoints(settings, node=0, nodes=1, local_size=world, world=world, checkpoint_dir=root,
                           environ={"AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string})


def data_bytes(version: Path) -> int:
    return sum(p.stat().st_size for p in version.glob("rank-*/*" + blocks.DATA_SUFFIX))


class TestBlockDigests:
    def test_each_data_file_gets_the_digest_of_every_block_and_the_marker_lists_them(self, tmp_path, monkeypatch):
        version = save(tmp_path, 1, lambda r: {"w": torch.arange(5000.0)}, monkeypatch)
        listed = version / "rank-0" / blocks.BLOCKS_FILE
        block, files = blocks.parse(listed.read_bytes(), str(listed))
        assert block == 4096 and files
        for name, digests in files.items():
            data = (version / "rank-0" / name).read_bytes()
            assert digests == [hashlib.sha256(data[i:i + block]).hexdigest() for i in range(0, len(data), block)]
        marker = tier.read_version(version).markers[0]
        assert {e["path"] for e in marker["files"]} >= {"rank-0/blocks.json", "rank-0/trainer.json"}

    @pytest.mark.parametrize("value", ["0", "3", "70000", "1.5", "big"])
    def test_a_bad_block_size_is_named(self, value, tmp_path, monkeypatch):
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

        monkeypatch.setenv(blocks.BLOCK_VARIABLE, value)
        with pytest.raises(CheckpointError, match=f"AMLHPC_CHECKPOINT_BLOCK_KIB='{value}' is not a whole number of KiB"):
            Checkpointer(tmp_path, 0, 1, "t0")


def stored(tensor) -> bytes:
    """One stored item as DCP's writer makes it: `torch.save` of the tensor into its file."""
    import io

    out = io.BytesIO()
    torch.save(tensor, out)
    return out.getvalue()


class TestRowsOfAStoredChunk:
    """rows.layout: where a stored chunk's elements are, read from its first bytes alone, and
    every item that is not a plain row-major tensor of the expected shape left to DCP."""

    def test_the_elements_start_where_the_layout_says(self):
        tensor = torch.arange(6400.0).reshape(64, 100)
        item = stored(tensor)
        found = rows.layout(item[:rows.HEAD_BYTES], len(item), (64, 100), torch.float32)
        assert found is not None and found.row_bytes == 400
        start = found.data_offset + 10 * found.row_bytes
        assert item[start:start + 3 * found.row_bytes] == tensor[10:13].numpy().tobytes()

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64])
    def test_other_dtypes(self, dtype):
        tensor = torch.arange(300).to(dtype).reshape(30, 10)
        item = stored(tensor)
        found = rows.layout(item[:rows.HEAD_BYTES], len(item), (30, 10), dtype)
        assert found is not None
        data = bytearray(item[found.data_offset + 5 * found.row_bytes:found.data_offset + 7 * found.row_bytes])
        assert torch.equal(torch.frombuffer(data, dtype=dtype).reshape(2, 10), tensor[5:7])

    @pytest.mark.parametrize("case", ["transposed", "view", "0-d", "parameter", "dtype", "shape", "short"])
    def test_what_is_not_a_plain_chunk_goes_to_dcp(self, case):
        base = torch.arange(12.0).reshape(3, 4)
        tensor = {"transposed": base.t().contiguous().t(), "view": torch.arange(14.0)[2:].reshape(3, 4),
                  "0-d": torch.tensor(3.0), "parameter": torch.nn.Parameter(base)}.get(case, base)
        shape = {"0-d": (), "shape": (4, 3)}.get(case, (3, 4))
        dtype = torch.float64 if case == "dtype" else torch.float32
        item = stored(tensor)
        assert rows.layout(item[:rows.HEAD_BYTES], 100 if case == "short" else len(item), shape, dtype) is None

    @pytest.mark.parametrize("forged", [{"storage": 5}, {"size": ("3", "4")}, {"stride": (4.0, 1.0)},
                                        {"storage": ("storage", "FloatStorage", "0", "cpu")}])
    def test_a_pickle_that_is_not_a_tensors_goes_to_dcp_without_an_error(self, forged):
        """What the restricted unpickler returns is checked before it is used (a forged or
        unknown `data.pkl` parses, but is no plain tensor's)."""
        plain = {"storage": ("storage", "FloatStorage", "0", "cpu", 12), "storage_offset": 0, "size": (3, 4),
                 "stride": (4, 1)}
        assert rows._plain(rows._Rebuilt(plain), True, 64, 1000, (3, 4), torch.float32) == rows.Layout(
            64, (3, 4), torch.float32)  # the fields of a plain tensor's pickle
        assert rows._plain(rows._Rebuilt({**plain, **forged}), True, 64, 1000, (3, 4), torch.float32) is None

    def test_a_forged_pickle_sets_nothing_on_what_the_reader_shares(self):
        """BUILD on an allowed global (GLOBAL, a dict of attributes, BUILD): it reaches a function
        made for that read; the module's function and OrderedDict are untouched."""
        import collections

        for found in (b"torch._utils\n_rebuild_tensor_v2\n", b"collections\nOrderedDict\n"):
            forged = b"\x80\x02c" + found + b"}X\x04\x00\x00\x00evilK\x01sb."
            assert rows._unpickle(forged) == (None, len(forged))
        assert not hasattr(rows._rebuild_tensor_v2, "evil") and not hasattr(collections.OrderedDict, "evil")

    def test_a_damaged_head_goes_to_dcp(self):
        item = bytearray(stored(torch.arange(12.0).reshape(3, 4)))
        pickled = item.index(b"storage")
        item[pickled] ^= 0xFF  # the pickle no longer matches its CRC-32
        assert rows.layout(bytes(item[:rows.HEAD_BYTES]), len(item), (3, 4), torch.float32) is None
        big = bytearray(stored(torch.arange(12.0).reshape(3, 4)))
        at = big.index(b"little")
        big[at:at + 6] = b"bigend"  # another byte order, its descriptor's CRC-32 made to match
        rows.DESCRIPTOR.pack_into(big, at + 6, rows.DESCRIPTOR_SIGNATURE, zlib.crc32(b"bigend"), 6, 6)
        assert rows.layout(bytes(big[:rows.HEAD_BYTES]), len(big), (3, 4), torch.float32) is None


@pytest.mark.azurite
class TestReshardFromBlob:
    def test_the_node_restores_small_files_and_a_rank_fetches_only_its_source(self, azurite, container, tmp_path,
                                                                               monkeypatch):
        """Two ranks saved the same replicated state; one rank loads it: it reads rank 0's copy
        (the merged metadata prefers the lowest rank's), so rank 1's data is never fetched; a
        second rank of the node fetches nothing (the node's cache); the values are the saved ones."""
        from amlhpc.jobs.runtime.checkpoint.versioned import load_version

        saved = save(tmp_path / "saved", 2, lambda r: {"w": torch.arange(20_000.0), "b": torch.ones(300)}, monkeypatch)
        commit(container, saved, 2)
        _, version = node(azurite, container, tmp_path / "new", 1).restore_at_start()
        assert not list(version.glob("rank-*/*" + blocks.DATA_SUFFIX)), "no data file restored whole"
        assert (version / "rank-1" / ".metadata").exists() and tier.read_version(version).ranged
        assert "not held here" in tier.read_version(version).verify([0])  # an in-job restart will not trust it

        from amlhpc.jobs.runtime.blob.blobhttp import read_sas

        # as the launcher runs the training: the read-only SAS, never the connection string's key
        monkeypatch.delenv("AMLHPC_BLOB_CONNECTION_STRING", raising=False)
        monkeypatch.setenv("AMLHPC_BLOB_READ_SAS", read_sas({"AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string},
                                                             container.container_name))
        state = {"w": torch.zeros(20_000), "b": torch.zeros(300)}
        trainer = load_version(version, state, 0, 1)
        assert torch.equal(state["w"], torch.arange(20_000.0)) and torch.equal(state["b"], torch.ones(300))
        assert trainer["same_world"] is False and trainer["saved_world"] == 2
        rank0 = sum(p.stat().st_size for p in saved.glob("rank-0/*" + blocks.DATA_SUFFIX))
        assert 0 < trainer["fetched_bytes"] <= rank0 + 2 * 4096 and ranged.fetched_by_node(version) <= rank0
        assert data_bytes(saved) >= 2 * rank0 - 4096  # the old restore read both parts
        again = load_version(version, {"w": torch.zeros(20_000), "b": torch.zeros(300)}, 0, 1)
        assert again["fetched_bytes"] == 0  # the node's other ranks read the blocks already fetched

    def test_a_plan_asking_rows_of_a_chunk_fetches_those_rows_and_the_chunks_head(self, azurite, container,
                                                                                    tmp_path, monkeypatch):
        """Rows 150-159, columns 7-11 of a stored 200 x 100 chunk (80 KB): the item's first block
        (where its rows start) and the blocks of those rows are fetched, nothing else; a read of
        every row goes to DCP's reader as before."""
        from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

        from amlhpc.jobs.runtime.checkpoint import safeload

        saved_tensor = torch.arange(20_000.0).reshape(200, 100)
        saved = save(tmp_path / "saved", 2, lambda r: {"w": saved_tensor}, monkeypatch)
        commit(container, saved, 2)
        _, version = node(azurite, container, tmp_path / "new", 1).restore_at_start()
        monkeypatch.setenv("AMLHPC_BLOB_CONNECTION_STRING", azurite.connection_string)
        markers = tier.read_version(version).markers
        metadata = safeload.merged_metadata(version, sorted(markers), prefer=0)
        index = next(k for k, v in metadata.storage_data.items() if k.fqn == "w" and v.relative_path.startswith("rank-0/"))
        some = ReadItem(LoadItemType.TENSOR, index, torch.Size([0, 0]), index, torch.Size([150, 7]), torch.Size([10, 5]))
        every = ReadItem(LoadItemType.TENSOR, index, torch.Size([0, 0]), index, torch.Size([0, 0]), torch.Size([200, 100]))
        target, committed, passed = torch.zeros(10, 5), [], []

        class Planner:
            def resolve_tensor(self, item):
                return target

            def commit_tensor(self, item, tensor):
                committed.append(item)

        remote = ranged.RemoteFiles(version, markers)
        reads = rows.RowReads(metadata, remote, lambda plan, planner: passed.extend(plan.items))
        reads.read_data(LoadPlan([some, every]), Planner())
        assert torch.equal(target, saved_tensor[150:160, 7:12]) and committed == [some] and passed == [every]
        data = ranged.fetched_by_node(version)  # the data blocks (beside them: the part's digests)
        assert reads.by_rows == 1 and 4000 < data <= 3 * 4096, data  # the head block + 4,000 bytes of rows in 2

    def test_a_striped_version_under_azurite_reads_every_stripe_from_its_one_account(self, azurite, container,
                                                                                       tmp_path, monkeypatch):
        """Under a connection string every striped account is Azurite's one account (as the stores
        use it): the ranks read there, with the launcher's read-only SAS, not at the stripes'
        cloud endpoints."""
        from amlhpc.jobs.runtime.blob.blobhttp import read_sas
        from amlhpc.jobs.runtime.checkpoint.versioned import load_version

        saved = save(tmp_path / "saved", 2, lambda r: {"w": torch.arange(20_000.0) + r}, monkeypatch)
        store = CheckpointStore(container, "job/versions", node=0, stripes=[("ck0", container), ("ck1", container)])
        store.stage(saved, tier.read_version(saved).files(range(2)), NAME)
        manifest = store.commit(NAME, STEP, [0], {"layout": "versions", "step": STEP, "world": 2, "tag": "t0",
                                                  "local": saved.name, "nodes": 1})
        assert {e.get("account") for e in manifest.files} == {"ck0", "ck1"}
        settings = parse_settings(json.dumps({"container": container.container_name, "prefix": "job",
                                              "accounts": ["ck0", "ck1"]}))
        environ = {"AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string}
        checkpoints = NodeCheckpoints(settings, node=0, nodes=1, local_size=1, world=1, environ=environ,
                                      checkpoint_dir=tmp_path / "new")
        _, version = checkpoints.restore_at_start()
        urls = {f["url"] for f in json.loads((version / "remote.json").read_text())["files"].values()}
        assert urls == {azurite.blob_endpoint}, urls
        monkeypatch.delenv("AMLHPC_BLOB_CONNECTION_STRING", raising=False)
        monkeypatch.setenv("AMLHPC_BLOB_READ_SAS", read_sas(environ, container.container_name))
        state = {"w": torch.zeros(20_000)}
        load_version(version, state, 0, 1)
        assert torch.equal(state["w"], torch.arange(20_000.0))

    def test_ranks_loading_at_once_fetch_each_block_once_for_the_node(self, azurite, container, tmp_path, monkeypatch):
        """Four ranks of one node load together (threads; each opens its own lock): every block
        is fetched by one of them, under the file's lock, and all get the saved values."""
        from concurrent.futures import ThreadPoolExecutor

        from amlhpc.jobs.runtime.checkpoint.versioned import load_version

        saved = save(tmp_path / "saved", 2, lambda r: {"w": torch.arange(200_000.0)}, monkeypatch)
        commit(container, saved, 2)
        _, version = node(azurite, container, tmp_path / "new", 1).restore_at_start()
        monkeypatch.setenv("AMLHPC_BLOB_CONNECTION_STRING", azurite.connection_string)
        states = [{"w": torch.zeros(200_000)} for _ in range(4)]
        with ThreadPoolExecutor(4) as pool:
            trainers = list(pool.map(lambda state: load_version(version, state, 0, 1), states))
        assert all(torch.equal(state["w"], torch.arange(200_000.0)) for state in states)
        rank0 = sum(p.stat().st_size for p in saved.glob("rank-0/*" + blocks.DATA_SUFFIX))
        fetched, data = sum(t["fetched_bytes"] for t in trainers), ranged.fetched_by_node(version)
        listed = (saved / "rank-0" / blocks.BLOCKS_FILE).stat().st_size
        assert rank0 - 2 * 4096 <= data <= rank0, (data, rank0)  # each data block once for the node
        assert data < fetched <= data + 4 * listed  # beside them, each rank may fetch the digests before one kept them

    def test_a_block_changed_in_blob_fails_the_load_naming_it(self, azurite, container, tmp_path, monkeypatch):
        from amlhpc.jobs.runtime.checkpoint.versioned import load_version

        saved = save(tmp_path / "saved", 2, lambda r: {"w": torch.arange(20_000.0)}, monkeypatch)
        store = commit(container, saved, 2)
        entry = next(e for e in store.latest().files if e["path"].startswith("rank-0/") and e["path"].endswith(".distcp"))
        blob = container.get_blob_client(entry["blob"])
        data = bytearray(blob.download_blob().readall())
        data[5000] ^= 0xFF  # block 1 of 4 KiB
        _, version = node(azurite, container, tmp_path / "new", 1).restore_at_start()
        blob.upload_blob(bytes(data), overwrite=True)
        remote = json.loads((version / "remote.json").read_text())
        remote["files"][entry["path"]]["etag"] = None  # a rewrite that kept nothing to tell by (no If-Match)
        (version / "remote.json").write_text(json.dumps(remote))
        monkeypatch.setenv("AMLHPC_BLOB_CONNECTION_STRING", azurite.connection_string)
        with pytest.raises(LocalCopyCorrupt, match=r"block 1 read from .* does not match its digest"):
            load_version(version, {"w": torch.zeros(20_000)}, 0, 1)

    def test_a_rewritten_blob_is_refused_by_its_etag(self, azurite, container, tmp_path, monkeypatch):
        from amlhpc.jobs.runtime.checkpoint.versioned import load_version

        saved = save(tmp_path / "saved", 2, lambda r: {"w": torch.arange(20_000.0)}, monkeypatch)
        store = commit(container, saved, 2)
        entry = next(e for e in store.latest().files if e["path"].startswith("rank-0/") and e["path"].endswith(".distcp"))
        _, version = node(azurite, container, tmp_path / "new", 1).restore_at_start()
        blob = container.get_blob_client(entry["blob"])
        blob.upload_blob(blob.download_blob().readall(), overwrite=True)  # the same bytes, a new ETag
        monkeypatch.setenv("AMLHPC_BLOB_CONNECTION_STRING", azurite.connection_string)
        with pytest.raises(CheckpointError, match=f"reading {entry['path']} .* from Blob"):
            load_version(version, {"w": torch.zeros(20_000)}, 0, 1)


FSDP = r"""
import os, sys, torch, torch.distributed as dist
from pathlib import Path
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer, load_version
mode, root = sys.argv[1], Path(sys.argv[2])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
layers = [torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 960)]  # rows split 4 ways, then 3
model = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1])
mesh = init_device_mesh("cpu", (world,))
for module in [*layers, model]:
    fully_shard(module, mesh=mesh)
full = lambda sd: {k: v.full_tensor() for k, v in sd.items()}  # a collective: every rank
if mode == "save":
    msd = get_model_state_dict(model)
    Checkpointer(root, rank, world, "t0", background=False).save(6, {"model": msd}, {"step": 6})
    expected = full(msd)
    if rank == 0:
        torch.save(expected, root / "expected.pt")
else:
    if mode == "load-whole":  # the baseline: DCP's reader reads every saved chunk it needs whole
        from amlhpc.jobs.runtime.checkpoint import rows
        rows.read_by_rows = lambda *args: type("Whole", (), {"by_rows": 0})()
    node_dir = root / f"{mode}{rank}" / "versions" / "step-000000006"  # one rank a node: each node its own folder
    state = {"model": get_model_state_dict(model)}
    trainer = load_version(node_dir, state, rank, world)
    set_model_state_dict(model, state["model"])
    expected = torch.load(root / "expected.pt", weights_only=True)
    loaded = full(get_model_state_dict(model))
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in expected)
    print(f"rank {rank}: fetched {trainer['fetched_bytes']}, by rows {trainer['read_by_rows']}", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
# The work is done and checked: skip the interpreter's teardown, where torch's C++ objects are
# freed in no set order and a gloo rank can end in std::terminate ("terminate called without an
# active exception", SIGABRT, no Python frame on any thread: about 1 run in 10 with two busy
# CPUs beside it). The launcher reads a rank that dies after its work the same way
# (amlhpc.jobs.runtime.launch.completion); torchrun alone does not.
os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.azurite
def test_fsdp_shards_of_four_ranks_load_on_three_nodes_reading_a_little_more_than_the_state(
        azurite, container, tmp_path):
    """FSDP2 over gloo: 4 ranks save their shards; 3 nodes of one rank each restore it. Each node
    reads the rows of the saved chunks its new shard overlaps (rows.py): 1.007x the data in all,
    where whole chunks (the baseline, loaded again on 3 other nodes) read 1.5x and every part on
    every node 3x. The model equals the saved one, element for element, both ways."""
    script = tmp_path / "fsdp.py"
    script.write_text(FSDP)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", blocks.BLOCK_VARIABLE: "4",
           "AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string}

    def run(mode: str, nproc: int) -> str:
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                               "--standalone", str(script), mode, str(tmp_path)], env=env, capture_output=True,
                              text=True, timeout=600)
        # the head of stderr too: torchrun's failure summary alone fills the tail, and a rank's
        # own traceback comes before it
        assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[:6000]}\n...\n{proc.stderr[-3000:]}"
        return proc.stdout

    run("save", 4)
    saved = tier.versions_dir(tmp_path) / tier.version_name(STEP)
    commit(container, saved, 4)
    fetched = {}
    for mode in ("load", "load-whole"):  # by rows, and the whole chunks DCP reads (the baseline)
        for k in range(3):  # each node restores the small files into its own folder
            checkpoints = node(azurite, container, tmp_path / f"{mode}{k}", 3)
            checkpoints.node = k
            checkpoints.restore_at_start()
        out = run(mode, 3)
        assert out.count("fetched") == 3
        by_rows = [int(n) for n in re.findall(r"by rows (\d+)", out)]
        assert all(by_rows) if mode == "load" else not any(by_rows), out  # every node read some chunk by rows
        fetched[mode] = sum(ranged.fetched_by_node(tmp_path / f"{mode}{k}" / "versions" / saved.name) for k in range(3))
    total = data_bytes(saved)
    print(f"reshard 4 -> 3 nodes: fetched {fetched['load']} of {total} bytes ({fetched['load'] / total:.3f}x); whole "
          f"chunks {fetched['load-whole']} ({fetched['load-whole'] / total:.3f}x); every part on every node: 3.00x")
    # 1.007x here: the rows of the saved chunks each node's shard overlaps, plus each partly read
    # chunk's first block (where its rows start) and block edges; whole chunks 1.5x (each of the
    # two middle chunks read by two nodes)
    assert total <= fetched["load"] <= 1.1 * total, fetched  # every byte is some node's, within the bound
    assert fetched["load-whole"] >= 1.4 * total, fetched


def test_an_atomic_write_that_fails_leaves_no_temporary_and_the_old_file(tmp_path, monkeypatch):
    """The helper remote.json and the kept digests go through (coord.nodebarrier): a write that
    fails half way (a full disk) keeps the file as it was and leaves nothing beside it."""
    from amlhpc.jobs.runtime.coord import nodebarrier

    target = tmp_path / "remote.json"
    nodebarrier.write_bytes_atomic(target, b"old")

    def full(self, data):
        self.open("wb").write(data[:1])
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OSError, match="No space"):
        nodebarrier.write_bytes_atomic(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["remote.json"]
