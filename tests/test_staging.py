"""amlhpc.jobs.runtime.staging.stager against a real Azurite: round trips on 1-3 simulated nodes, resume, bad blobs.

A simulated node is one or more separate processes (`python -m amlhpc.jobs.runtime.staging`) with
their own rank variables and their own scratch directory; a shared mount is a directory
all of them see. Data is generated in CosmoFlow's naming with compressible int16 volumes
(bench/dataset.py) and uploaded with `jobs data upload`'s code, so the blobs carry the
gzip encoding and metadata staging expects.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from amlhpc.jobs.data import upload
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.base.ranks import validated
from amlhpc.jobs.runtime.blob import blobio
from amlhpc.jobs.runtime.blob.fetch import BlobEntry, Gunzip, IntegrityError
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from amlhpc.jobs.runtime.coord.nodebarrier import BarrierFailed, BarrierTimeout, NodeBarrier
from amlhpc.jobs.runtime.staging import datadir, filelist
from amlhpc.jobs.runtime.staging import stager as staging
from bench.dataset import generate

ROOT = Path(__file__).resolve().parents[1]
FAST = staging.StageOptions(retry=blobio.RetrySettings.fast(), progress_interval_s=60)


# ------------------------------------------------------------------ helpers shared with the fault and kill tests


def make_dataset(root: Path, files: int = 64, file_bytes: int = 24 << 10, seed: int = 0) -> Path:
    """CosmoFlow-named files plus a nested directory, so paths below the prefix are kept."""
    source = root / "source"
    generate(source, universes=1, files_per_universe=files, file_bytes=file_bytes, seed=seed)
    generate(source / "validation", universes=1, files_per_universe=2, file_bytes=file_bytes // 2, seed=seed + 1,
             first_universe=20000)
    return source


def upload_dataset(container, source: Path, prefix: str = "cosmoflow") -> upload.UploadReport:
    return upload.upload_directory(container, source, prefix, workers=2)


def source_files(source: Path) -> dict[str, bytes]:
    return {p.relative_to(source).as_posix(): p.read_bytes() for p in sorted(source.rglob("*")) if p.is_file()}


def data_files(data_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(data_dir).as_posix(): p.read_bytes() for p in sorted(data_dir.rglob("*")) if p.is_file()}


def spec_json(container_name: str, mode: str, prefix: str = "cosmoflow", name: str = "cosmo", **extra) -> str:
    return json.dumps([{"name": name, "container": container_name, "prefix": prefix, "mode": mode, **extra}])


def node_env(azurite_or_cs, tmp: Path, node: int, local_rank: int, nodes: int, local_size: int, run_id: str,
             shared: bool) -> dict[str, str]:
    connection_string = azurite_or_cs if isinstance(azurite_or_cs, str) else azurite_or_cs.connection_string
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMLHPC_", "OMPI_", "PMI_", "HOROVOD_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    env.update({
        "RANK": str(node * local_size + local_rank), "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(nodes * local_size), "LOCAL_WORLD_SIZE": str(local_size),
        "AMLHPC_RUN_ID": run_id, contract.BLOB_CONNECTION_STRING: connection_string,
        contract.SCRATCH: str(tmp / f"node{node}"), contract.REPORT_DIR: str(tmp / "reports"),
        "PYTHONPATH": str(ROOT),
    })
    if shared:
        env[contract.SHARED_DIR] = str(tmp / "shared")
    return env


def launch_nodes(azurite_or_cs, tmp: Path, stage_json: str, nodes: int, local_size: int = 1,
                 extra_args: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    from amlhpc.jobs.runtime.coord.jobstore import reserve

    run_id = uuid.uuid4().hex[:8]
    shared = '"shared"' in stage_json
    if shared:
        (tmp / "shared").mkdir(exist_ok=True)
    procs = []
    listener = reserve(0, "127.0.0.1")  # the job's coordination store: bound once, node 0 inherits it
    for node in range(nodes):
        for local_rank in range(local_size):
            env = node_env(azurite_or_cs, tmp, node, local_rank, nodes, local_size, run_id, shared)
            env.update({"MASTER_ADDR": "127.0.0.1", "AMLHPC_COORD_PORT": str(listener.getsockname()[1])})
            inherit: tuple[int, ...] = ()
            if node == 0 and local_rank == 0:
                env["AMLHPC_COORD_LISTEN_FD"] = str(listener.fileno())
                inherit = (listener.fileno(),)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "amlhpc.jobs.runtime.staging", "--stage-json", stage_json, "--fast-retries", "--json",
                 "--print-env", "-q", "--timeout-s", "120", *extra_args],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pass_fds=inherit))
    listener.close()
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 180) -> list[tuple[int, dict, dict[str, str], str]]:
    """(exit code, result JSON, exported env, stderr) per process."""
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        doc, exported = {}, {}
        if proc.returncode == 0:
            json_text, _, env_text = out.partition("\nexport ")
            doc = json.loads(json_text)
            for line in ("export " + env_text).splitlines():
                if line.startswith("export "):
                    key, _, value = line[len("export "):].partition("=")
                    exported[key] = value.strip("'")
        results.append((proc.returncode, doc, exported, err))
    return results


# ------------------------------------------------------------------ unit level


class TestSpecs:
    def test_every_problem_is_named(self):
        with pytest.raises(staging.StageConfigError) as caught:
            staging.specs_from_json(json.dumps([{"name": "a b", "mode": "lcoal", "prefx": "x"}, {"name": "ok", "container": "d"}]))
        text = str(caught.value)
        assert "AMLHPC_STAGE_JSON: [0].name: 'a b' is not a valid input name" in text
        assert "[0].mode: 'lcoal' is not a staging mode" in text and "local, shared, replica" in text
        assert "[0].container: is required" in text
        assert "[0].prefx: unknown key" in text and "did you mean 'prefix'" in text

    def test_bad_json_and_duplicates(self):
        with pytest.raises(staging.StageConfigError, match="is not valid JSON"):
            staging.specs_from_json("[{")
        with pytest.raises(staging.StageConfigError, match="'a-b' is used twice"):
            staging.specs_from_json(json.dumps([{"name": "A_B", "container": "d"}, {"name": "a-b", "container": "d"}]))

    def test_account_url_never_shows_a_sas(self):
        with pytest.raises(staging.StageConfigError) as caught:
            staging.specs_from_json(json.dumps([{"name": "x", "container": "d", "account_url": "ftp://a/?sig=c2VjcmV0"}]))
        assert "c2VjcmV0" not in str(caught.value)

    def test_prefix_is_a_directory(self):
        (spec,) = staging.specs_from_json(json.dumps({"name": "x", "container": "d", "prefix": "/cosmo/"}))
        assert spec.normalized_prefix == "cosmo/" and spec.mode == "local"

    def test_from_env(self):
        assert staging.specs_from_env({}) == []
        env = {contract.STAGE_JSON: spec_json("d", "shared")}
        assert staging.specs_from_env(env)[0].mode == "shared"


class TestCommandLineErrors:
    def test_unreadable_spec_file(self, capsys):
        assert staging.main(["--stage-json", "@/nonexistent/stage.json"], env={}) == ExitCode.USAGE
        assert "--stage-json: @/nonexistent/stage.json: cannot read the file" in capsys.readouterr().err

    def test_nothing_to_stage(self, capsys):
        assert staging.main([], env={}) == ExitCode.USAGE
        assert "AMLHPC_STAGE_JSON: is not set: nothing to stage" in capsys.readouterr().err

    def test_bad_rank_variables(self, capsys):
        assert staging.main([], env={"RANK": "0"}) == ExitCode.USAGE
        assert "LOCAL_RANK" in capsys.readouterr().err


class TestEgressWarning:
    def test_warns_with_accounts_needed(self):
        spec = staging.StageSpec("cosmo", "d", egress_gbps=50)
        text = staging.egress_warning(spec, 4, 24.0, None)
        assert "4 nodes x 24 Gb/s = 96 Gb/s exceeds the storage account's egress of 50 Gb/s" in text
        assert "shard the dataset over 2 storage accounts" in text

    def test_silent_under_the_limit_or_when_capped(self):
        spec = staging.StageSpec("cosmo", "d", egress_gbps=50)
        assert staging.egress_warning(spec, 2, 24.0, None) is None
        assert staging.egress_warning(spec, 4, 24.0, cap_mbps=10_000) is None  # 4 x 10 Gb/s
        assert staging.egress_warning(staging.StageSpec("c", "d"), 100, 24.0, None) is None

    def test_node_rate_from_the_sku_json(self):
        assert staging.node_gbits_from_env({contract.SKU_JSON: json.dumps({"storage_nic_gbits_per_s": 24.0})}) == 24.0
        assert staging.node_gbits_from_env({contract.SKU_JSON: "not json"}) is None


class TestGunzip:
    def test_multi_member_streams(self):
        data = gzip.compress(b"a" * 1000) + gzip.compress(b"b" * 10)
        g = Gunzip("x")
        out = b"".join(g.feed(data[:7])) + b"".join(g.feed(data[7:])) + g.finish()
        assert out == b"a" * 1000 + b"b" * 10

    def test_truncated_stream(self):
        data = gzip.compress(os.urandom(5000))
        g = Gunzip("blob.gz")
        list(g.feed(data[:-10]))
        with pytest.raises(IntegrityError, match="blob 'blob.gz': gzip stream ends early"):
            g.finish()

    def test_bounded_output_pieces(self):
        """A very compressible range is handed out in pieces, not all at once."""
        data = gzip.compress(b"\0" * (40 << 20))
        pieces = list(Gunzip("z").feed(data))
        assert max(len(p) for p in pieces) <= 16 << 20
        assert sum(len(p) for p in pieces) == 40 << 20


class TestBlobEntry:
    def test_local_name_and_gzip(self):
        assert BlobEntry("p/a.tfrecord.gz", 1, content_encoding="gzip").local_name == "p/a.tfrecord"
        assert BlobEntry("p/a.tar.gz", 1).local_name == "p/a.tar.gz" and not BlobEntry("p/a.tar.gz", 1).gzip
        assert BlobEntry("p/a.bin", 1, content_encoding="gzip").gzip
        assert BlobEntry("p/a.bin", 1).local_name == "p/a.bin" and not BlobEntry("p/a.bin", 1).gzip

    def test_names_that_escape_are_rejected(self):
        with pytest.raises(datadir.PathProblems, match="'p/../../etc/passwd' has a '.' or '..' segment"):
            datadir.local_paths("p/", [BlobEntry("p/../../etc/passwd", 1)])

    def test_paths_below_the_prefix(self):
        entries = [BlobEntry("p/a.tfrecord.gz", 1, content_encoding="gzip"), BlobEntry("p/dir//b", 1),
                   BlobEntry("p/.amlhpc-staging/x", 1)]
        assert datadir.local_paths("p/", entries) == ["a.tfrecord", "dir/b", ".amlhpc-staging/x"]


class TestNodeBarrier:
    def test_waiter_gets_the_leaders_result(self, tmp_path):
        leader = NodeBarrier(tmp_path, 5, run_id="r1")
        leader.lead()
        leader.succeed({"node_index": 0})
        assert NodeBarrier(tmp_path, 5, run_id="r1").wait() == {"node_index": 0}

    def test_waiter_gets_the_leaders_failure(self, tmp_path):
        leader = NodeBarrier(tmp_path, 5, run_id="r1")
        leader.lead()
        leader.fail("blob 'x': checksum mismatch")
        with pytest.raises(BarrierFailed, match="checksum mismatch"):
            NodeBarrier(tmp_path, 5, run_id="r1").wait()

    def test_dead_leader_is_noticed(self, tmp_path):
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        (tmp_path / "leader.json").write_text(json.dumps({"pid": int(dead.stdout), "host": "h", "started": 1e12}))
        with pytest.raises(BarrierFailed, match=r"local rank 0 \(pid \d+ on h\) exited without finishing"):
            NodeBarrier(tmp_path, 5, run_id="r1").wait()

    def test_timeout(self, tmp_path):
        with pytest.raises(BarrierTimeout, match=r"waited 0s for local rank 0.*AMLHPC_STAGE_TIMEOUT_S"):
            NodeBarrier(tmp_path, 0.3, run_id="r1").wait()

    def test_stale_result_ignored_without_a_run_id(self, tmp_path):
        old = NodeBarrier(tmp_path, 5, clock=lambda: 1000.0)
        old.lead()
        old.succeed({"node_index": 0})
        (tmp_path / "leader.json").unlink()
        with pytest.raises(BarrierTimeout):
            NodeBarrier(tmp_path, 0.3, clock=lambda: 5000.0).wait()


# ------------------------------------------------------------------ round trips (simulated nodes = processes)


@pytest.fixture
def uploaded(tmp_path, container):
    source = make_dataset(tmp_path)
    report = upload_dataset(container, source)
    assert report.uploaded == 66
    return source


@pytest.mark.azurite
class TestRoundTripLocal:
    @pytest.mark.parametrize(("nodes", "local_size"), [(1, 1), (2, 2), (3, 1)])
    def test_every_byte_arrives_and_ranks_partition_the_files(self, azurite, container, uploaded, tmp_path, nodes, local_size):
        procs = launch_nodes(azurite, tmp_path, spec_json(container.container_name, "local"), nodes, local_size)
        results = finish(procs)
        assert [r[0] for r in results] == [0] * len(procs), [r[3] for r in results]
        expected = source_files(uploaded)

        union: dict[str, bytes] = {}
        listed: list[str] = []
        for node in range(nodes):
            data_dir = tmp_path / f"node{node}" / "cosmo"
            staged = data_files(data_dir)
            assert set(staged) & set(union) == set(), "a file was staged on two nodes"
            union.update(staged)
            node_lists = []
            for local_rank in range(local_size):
                code, doc, exported, _ = results[node * local_size + local_rank]
                assert exported[contract.data_dir_var("cosmo")] == str(data_dir)
                lines = filelist.read(exported[contract.file_list_var("cosmo")])
                assert lines == sorted(lines)
                node_lists.extend(lines)
                assert doc["node_index"] == node
            assert sorted(node_lists) == sorted(staged)  # the node holds exactly what its ranks read
            listed.extend(node_lists)
        assert union == expected  # byte-identical, nothing missing, nothing extra
        assert sorted(listed) == sorted(expected)  # every file read by exactly one rank
        counts = [len(filelist.read(r[2][contract.file_list_var("cosmo")])) for r in results]
        assert max(counts) - min(counts) <= 2

        reports = [json.loads((tmp_path / "reports" / f"staging-node{n}.json").read_text()) for n in range(nodes)]
        assert sum(r["inputs"][0]["files_node"] for r in reports) == 66
        balance = reports[0]["inputs"][0]["balance"]
        assert balance["max_bytes_per_node"] >= balance["mean_bytes_per_node"] > 0
        for r in reports:
            assert r["bytes_out"] == sum(len(v) for k, v in union.items() if k in data_files(Path(r["inputs"][0]["data_dir"])))
            assert r["mb_per_s"] > 0 and r["bytes_in"] < r["bytes_out"]  # gzip made it smaller on the wire

    def test_replica_gives_every_node_everything(self, azurite, container, uploaded, tmp_path):
        results = finish(launch_nodes(azurite, tmp_path, spec_json(container.container_name, "replica"), 2))
        assert [r[0] for r in results] == [0, 0], [r[3] for r in results]
        for node in range(2):
            assert data_files(tmp_path / f"node{node}" / "cosmo") == source_files(uploaded)
            assert contract.file_list_var("cosmo") not in results[node][2]


@pytest.mark.azurite
class TestRoundTripShared:
    @pytest.mark.parametrize(("nodes", "local_size"), [(1, 1), (2, 2), (3, 1)])
    def test_nodes_fill_one_directory_together(self, azurite, container, uploaded, tmp_path, nodes, local_size):
        results = finish(launch_nodes(azurite, tmp_path, spec_json(container.container_name, "shared"), nodes, local_size))
        assert [r[0] for r in results] == [0] * len(results), [r[3] for r in results]
        assert data_files(tmp_path / "shared" / "cosmo") == source_files(uploaded)
        assert not any((tmp_path / f"node{n}" / "cosmo").exists() for n in range(nodes))
        leaders = [results[n * local_size][1] for n in range(nodes)]
        assert sum(doc["inputs"][0]["files_downloaded"] for doc in leaders) == 66  # disjoint shares
        for r in results:
            assert r[2][contract.data_dir_var("cosmo")] == str(tmp_path / "shared" / "cosmo")

    def test_shared_without_a_mount_is_bad_input(self, azurite, container, tmp_path):
        env = node_env(azurite, tmp_path, 0, 0, 1, 1, "x", shared=False)
        done = subprocess.run([sys.executable, "-m", "amlhpc.jobs.runtime.staging", "--stage-json",
                               spec_json(container.container_name, "shared")], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        assert done.returncode == ExitCode.USAGE
        assert "AMLHPC_SHARED_DIR: is not set" in done.stderr and "beeond start" in done.stderr


# ------------------------------------------------------------------ resume and bad blobs (in process)


def stage_local(azurite, container, tmp_path, options=FAST, prefix="cosmoflow", ranks=None):
    env = {contract.BLOB_CONNECTION_STRING: azurite.connection_string, contract.SCRATCH: str(tmp_path / "scratch"),
           contract.REPORT_DIR: str(tmp_path / "reports"), "AMLHPC_RUN_ID": uuid.uuid4().hex}
    specs = staging.specs_from_json(spec_json(container.container_name, "local", prefix=prefix))
    return staging.stage_inputs(specs, ranks or validated(0, 0, 1, 1), options=options, env=env)


@pytest.mark.azurite
class TestResume:
    def test_second_run_downloads_nothing(self, azurite, container, uploaded, tmp_path):
        first = stage_local(azurite, container, tmp_path)
        assert first.inputs[0].files_downloaded == 66
        second = stage_local(azurite, container, tmp_path)
        assert (second.inputs[0].files_downloaded, second.inputs[0].files_skipped, second.bytes_in) == (0, 66, 0)

    def test_a_changed_or_deleted_file_is_fetched_again(self, azurite, container, uploaded, tmp_path):
        first = stage_local(azurite, container, tmp_path)
        data_dir = Path(first.inputs[0].data_dir)
        (data_dir / "univ_ics_2019-03_a10000_000.tfrecord").unlink()
        (data_dir / "univ_ics_2019-03_a10000_001.tfrecord").write_bytes(b"damaged")
        second = stage_local(azurite, container, tmp_path)
        assert second.inputs[0].files_downloaded == 2
        assert data_files(data_dir) == source_files(uploaded)

    def test_verify_existing_catches_same_size_damage(self, azurite, container, uploaded, tmp_path):
        first = stage_local(azurite, container, tmp_path)
        victim = Path(first.inputs[0].data_dir) / "univ_ics_2019-03_a10000_005.tfrecord"
        damaged = bytearray(victim.read_bytes())
        damaged[100] ^= 0xFF
        victim.write_bytes(bytes(damaged))
        assert stage_local(azurite, container, tmp_path).inputs[0].files_downloaded == 0  # size matches: trusted
        options = staging.StageOptions(retry=blobio.RetrySettings.fast(), verify_existing=True)
        assert stage_local(azurite, container, tmp_path, options).inputs[0].files_downloaded == 1
        assert victim.read_bytes() == (uploaded / victim.name).read_bytes()

    def test_report_warns_when_nodes_outpull_the_account(self, azurite, container, uploaded, tmp_path):
        """Node 0 of 3 on an A100 size (24 Gb/s each) against a 50 Gb/s account, capped by hand above its share:
        warned, with the shard count."""
        env = {contract.BLOB_CONNECTION_STRING: azurite.connection_string, contract.SCRATCH: str(tmp_path / "s"),
               contract.REPORT_DIR: str(tmp_path / "reports"), "AMLHPC_RUN_ID": "egress",
               contract.SKU_JSON: json.dumps({"name": "Standard_ND96asr_v4", "storage_nic_gbits_per_s": 24.0})}
        specs = staging.specs_from_json(spec_json(container.container_name, "local", egress_gbps=50))
        result = staging.stage_inputs(specs, validated(0, 0, 3, 1), options=replace(FAST, cap_mbps=30_000), env=env,
                                      channel=Channel(MemoryStore(), node=0, nodes=3))
        assert any("3 nodes x 24 Gb/s = 72 Gb/s exceeds" in w and "2 storage accounts" in w for w in result.warnings)
        report = json.loads((tmp_path / "reports" / "staging-node0.json").read_text())
        assert report["warnings"] == result.warnings
        assert abs(report["inputs"][0]["files_node"] - 22) <= 2  # about a third of 66 similar-sized files

    def test_changed_blob_is_fetched_again(self, azurite, container, uploaded, tmp_path):
        stage_local(azurite, container, tmp_path)
        changed = uploaded / "univ_ics_2019-03_a10000_007.tfrecord"
        changed.write_bytes(b"new content" * 100)
        upload_dataset(container, uploaded)
        again = stage_local(azurite, container, tmp_path)
        assert again.inputs[0].files_downloaded == 1
        assert (tmp_path / "scratch" / "cosmo" / changed.name).read_bytes() == changed.read_bytes()


def put_blob(container, name: str, data: bytes, *, gzip_encoded: bool = True, metadata: dict | None = None) -> None:
    from azure.storage.blob import ContentSettings

    container.upload_blob(name, data, overwrite=True, metadata=metadata or {},
                          content_settings=ContentSettings(content_encoding="gzip" if gzip_encoded else None))


def leftovers(tmp_path: Path) -> list[str]:
    staging_dir = tmp_path / "scratch" / ".amlhpc-staging" / "cosmo" / "partial"
    return sorted(p.name for p in staging_dir.iterdir()) if staging_dir.exists() else []


@pytest.mark.azurite
class TestBadBlobs:
    def test_corrupt_gzip_names_the_blob_and_leaves_nothing(self, azurite, container, tmp_path):
        good = gzip.compress(b"fine" * 1000)
        put_blob(container, "bad/ok.bin.gz", good)
        put_blob(container, "bad/broken.bin.gz", good[:10] + b"\x00garbage" * 50 + good[-8:])
        with pytest.raises(staging.StagingError) as caught:
            stage_local(azurite, container, tmp_path, prefix="bad")
        text = str(caught.value)
        assert "blob 'bad/broken.bin.gz': gzip data is corrupt" in text
        assert "1 of 2 files failed" in text
        assert sorted(p.name for p in (tmp_path / "scratch" / "cosmo").iterdir()) == ["ok.bin"]
        assert leftovers(tmp_path) == []

    def test_checksum_mismatch_names_the_blob_and_leaves_nothing(self, azurite, container, tmp_path):
        """With --sha256 the output is also checked against amlhpc_sha256."""
        payload = b"payload" * 1000
        put_blob(container, "sum/a.bin.gz", gzip.compress(payload),
                 metadata={"amlhpc_size": str(len(payload)), "amlhpc_sha256": "0" * 64})
        deep = staging.StageOptions(retry=blobio.RetrySettings.fast(), verify_sha256=True)
        with pytest.raises(staging.StagingError, match=r"(?s)blob 'sum/a.bin.gz': checksum mismatch.*"
                           r"python -m amlhpc.jobs data upload LOCAL_DIR --stack STACK --prefix sum --verify-stored"):
            stage_local(azurite, container, tmp_path, deep, prefix="sum")
        assert list((tmp_path / "scratch" / "cosmo").iterdir()) == []
        assert leftovers(tmp_path) == []

    def test_size_mismatch(self, azurite, container, tmp_path):
        put_blob(container, "size/a.bin.gz", gzip.compress(b"abc"), metadata={"amlhpc_size": "4"})
        with pytest.raises(staging.StagingError, match="size mismatch: got 3 bytes, metadata amlhpc_size says 4"):
            stage_local(azurite, container, tmp_path, prefix="size")

    def test_plain_blob_with_content_md5_is_checked(self, azurite, container, tmp_path):
        put_blob(container, "plain/raw.bin", b"raw bytes" * 100, gzip_encoded=False)
        result = stage_local(azurite, container, tmp_path, prefix="plain")
        assert (tmp_path / "scratch" / "cosmo" / "raw.bin").read_bytes() == b"raw bytes" * 100
        assert result.inputs[0].bytes_in == result.inputs[0].bytes_out

    def test_empty_prefix_is_bad_input(self, azurite, container, tmp_path):
        with pytest.raises(staging.StageConfigError, match=r"(?s)no blobs under http://127.0.0.1:\d+/amlhpcdev/t-[^/]+/nothing-here/\n.*jobs data upload"):
            stage_local(azurite, container, tmp_path, prefix="nothing-here")

    def test_missing_container(self, azurite, tmp_path):
        class Missing:
            container_name = "does-not-exist"

        with pytest.raises(staging.StageConfigError, match="'does-not-exist' does not exist"):
            stage_local(azurite, Missing, tmp_path)

    def test_unreachable_account_fails_after_retries(self, tmp_path):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed once we leave: nothing listens there
        env = {contract.BLOB_CONNECTION_STRING: "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=c2VjcmV0;"
                                                f"BlobEndpoint=http://127.0.0.1:{port}/a;",
               contract.SCRATCH: str(tmp_path / "s"), "AMLHPC_RUN_ID": "unreachable"}
        options = staging.StageOptions(retry=blobio.RetrySettings(total=2, connect=2, initial_backoff_s=0.01,
                                                                  max_backoff_s=0.02))
        with pytest.raises(staging.StagingError, match=r"listing http://127.0.0.1:\d+/a/data failed after retries"):
            staging.stage_inputs(staging.specs_from_json(spec_json("data", "local")), validated(0, 0, 1, 1),
                                 options=options, env=env)

    def test_malformed_connection_string_is_bad_input_without_the_secret(self, tmp_path):
        env = {contract.BLOB_CONNECTION_STRING: "garbage;AccountKey=c2VjcmV0", contract.SCRATCH: str(tmp_path / "s"),
               "AMLHPC_RUN_ID": "malformed"}
        with pytest.raises(staging.StageConfigError) as caught:
            staging.stage_inputs(staging.specs_from_json(spec_json("data", "local")), validated(0, 0, 1, 1),
                                 options=FAST, env=env)
        assert "malformed" in str(caught.value) and "c2VjcmV0" not in str(caught.value)

    def test_waiters_see_the_leaders_failure(self, azurite, container, tmp_path):
        """Local rank 1 of the node fails with local rank 0's message (exit 3), not a hang."""
        put_blob(container, "bad2/x.bin.gz", b"not gzip at all")
        results = finish(launch_nodes(azurite, tmp_path, spec_json(container.container_name, "local", prefix="bad2"), 1, 2))
        assert [r[0] for r in results] == [ExitCode.STAGING] * 2
        assert "blob 'bad2/x.bin.gz'" in results[0][3]
        assert "staging failed on this node's local rank 0" in results[1][3] and "bad2/x.bin.gz" in results[1][3]


@pytest.mark.azurite
class TestLargeBlob:
    def test_one_blob_in_parallel_ranges_decompressed_in_order(self, azurite, container, tmp_path):
        source = tmp_path / "big"
        generate(source, files_per_universe=1, file_bytes=3 << 20)
        upload.upload_directory(container, source, "big", block_bytes=64 << 10)
        options = staging.StageOptions(retry=blobio.RetrySettings.fast(), range_bytes=32 << 10, window=6)
        result = stage_local(azurite, container, tmp_path, options, prefix="big")
        assert data_files(tmp_path / "scratch" / "cosmo") == source_files(source)
        assert result.inputs[0].bytes_in > 10 * (32 << 10)  # many ranges, not one GET

    def test_bandwidth_cap_holds(self, azurite, container, tmp_path):
        """2 MiB of incompressible blobs through a 1 MB/s cap: the 1 MiB burst passes, the rest waits."""
        source = tmp_path / "capped"
        source.mkdir()
        for i in range(4):
            (source / f"part{i}.bin").write_bytes(os.urandom(512 << 10))
        upload.upload_directory(container, source, "capped")
        options = staging.StageOptions(retry=blobio.RetrySettings.fast(), cap_mbps=8.0)  # 1 MB/s
        result = stage_local(azurite, container, tmp_path, options, prefix="capped")
        stored = result.inputs[0].bytes_in
        assert stored > 2 << 20
        assert result.inputs[0].seconds >= (stored - (1 << 20)) / 1_000_000 * 0.95
        assert data_files(tmp_path / "scratch" / "cosmo") == source_files(source)
