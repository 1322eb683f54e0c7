"""Staging defects, one or more tests each: job identity of the markers, exit codes, fast
failure of waiting ranks, unusable scratch, stale files, colliding names, names with
newlines, option checks, concurrent stagers, deadlines, Retry-After, empty prefixes and a
dataset holding staging's own folder name.

Each test here failed on the code before its fix.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from amlhpc.jobs.data import upload
from amlhpc.jobs.runtime.base import contract, faultpoints
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.base.ranks import validated
from amlhpc.jobs.runtime.blob import blobio
from amlhpc.jobs.runtime.coord import nodebarrier
from amlhpc.jobs.runtime.coord.agree import Barrier, Channel
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from amlhpc.jobs.runtime.coord.nodebarrier import BarrierTimeout, NodeBarrier
from amlhpc.jobs.runtime.staging import stager as staging
from bench.dataset import generate
from tests.faultproxy import FaultProxy
from tests.test_staging import ROOT, data_files, put_blob, source_files, spec_json

FAST = staging.StageOptions(retry=blobio.RetrySettings.fast(), progress_interval_s=60)


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without launcher, job or staging variables."""
    drop = ("AMLHPC_", "OMPI_", "PMI_", "PMIX_", "HOROVOD_", "TORCHELASTIC_", "AZUREML_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def rank_env(rank: int, local_rank: int, world: int, local_size: int, **extra: str) -> dict[str, str]:
    return clean_env(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                     LOCAL_WORLD_SIZE=str(local_size), **extra)


def stager(env: dict[str, str], stage_json: str, *args: str, inherit: tuple[int, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "amlhpc.jobs.runtime.staging", "--stage-json", stage_json, "--fast-retries",
                             "--json", "-q", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, pass_fds=inherit)


def small_dataset(container, tmp_path: Path, prefix: str, files: int = 6, file_bytes: int = 16 << 10,
                  seed: int = 0) -> Path:
    source = tmp_path / f"src-{prefix}"
    generate(source, files_per_universe=files, file_bytes=file_bytes, seed=seed)
    upload.upload_directory(container, source, prefix, workers=2)
    return source


def in_process(azurite, container, tmp_path: Path, prefix: str, mode: str = "local", ranks=None,
               options=FAST, **env_extra: str) -> staging.StageResult:
    env = {contract.BLOB_CONNECTION_STRING: azurite.connection_string, contract.SCRATCH: str(tmp_path / "scratch"),
           contract.REPORT_DIR: str(tmp_path / "reports"), contract.RUN_ID: uuid.uuid4().hex, **env_extra}
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    specs = staging.specs_from_json(spec_json(container.container_name, mode, prefix=prefix))
    ranks = ranks or validated(0, 0, 1, 1)
    # Several nodes agree on what they stage through the job's store: this node's view of one.
    channel = Channel(MemoryStore(), node=ranks.node_index, nodes=ranks.node_count) if ranks.node_count > 1 else None
    return staging.stage_inputs(specs, ranks, shared_dir=shared, options=options, env=env, channel=channel)


def read_list(path: str) -> list[str]:
    from amlhpc.jobs.runtime.staging import filelist

    return filelist.read(path)


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


# ------------------------------------------------------------------ 1. markers keyed by the job's unique id


def torchrun_env(attempt: Path, local_rank: int) -> dict[str, str]:
    """What torchrun's agent gives a worker when started without --rdzv-id: the run id `none` and
    an error file in the agent's own attempt directory (tempfile.mkdtemp, one per launch)."""
    return {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_ERROR_FILE": str(attempt / str(local_rank) / "error.json")}


@pytest.mark.azurite
class TestJobIdentity:
    def run_job(self, azurite, container, tmp_path, prefix: str, attempt: Path | None = None, **ids: str) -> list[dict]:
        """One node, two ranks, to the end; their results."""
        common = {contract.BLOB_CONNECTION_STRING: azurite.connection_string, contract.SCRATCH: str(tmp_path / "node0"),
                  contract.REPORT_DIR: str(tmp_path / "reports"), **ids}
        procs = [stager(rank_env(r, r, 2, 2, **common, **(torchrun_env(attempt, r) if attempt else {})),
                        spec_json(container.container_name, "local", prefix=prefix), "--timeout-s", "60") for r in (0, 1)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
        return [json.loads(out) for out, _ in outs]

    def lone_waiter(self, azurite, container, tmp_path, prefix: str, attempt: Path | None = None,
                    **ids: str) -> subprocess.CompletedProcess:
        """Local rank 1 of the next job, started before its local rank 0 (which never comes)."""
        env = rank_env(1, 1, 2, 2, **{contract.BLOB_CONNECTION_STRING: azurite.connection_string,
                                      contract.SCRATCH: str(tmp_path / "node0"), **ids},
                       **(torchrun_env(attempt, 1) if attempt else {}))
        return subprocess.run([sys.executable, "-m", "amlhpc.jobs.runtime.staging", "--stage-json",
                               spec_json(container.container_name, "local", prefix=prefix), "--timeout-s", "3", "-q",
                               "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    def test_a_fixed_run_id_does_not_release_the_next_jobs_ranks(self, azurite, container, tmp_path):
        """AMLHPC_RUN_ID fixed by hand, Azure ML's AZUREML_RUN_ID unique per job: the job id wins."""
        small_dataset(container, tmp_path, "a")
        small_dataset(container, tmp_path, "b", seed=1)
        self.run_job(azurite, container, tmp_path, "a", AMLHPC_RUN_ID="fixed", AZUREML_RUN_ID="job-a")
        waiter = self.lone_waiter(azurite, container, tmp_path, "b", AMLHPC_RUN_ID="fixed", AZUREML_RUN_ID="job-b")
        assert waiter.returncode == ExitCode.STAGING_TIMEOUT, waiter.stderr
        assert "waited 3s for local rank 0" in waiter.stderr

    def test_torchruns_default_run_id_does_not_release_the_next_jobs_ranks(self, azurite, container, tmp_path):
        """torchrun sets TORCHELASTIC_RUN_ID=none for every job started without --rdzv-id."""
        small_dataset(container, tmp_path, "a")
        small_dataset(container, tmp_path, "b", seed=1)
        self.run_job(azurite, container, tmp_path, "a", tmp_path / "torchelastic_1" / "attempt_0")
        waiter = self.lone_waiter(azurite, container, tmp_path, "b", tmp_path / "torchelastic_2" / "attempt_0")
        assert waiter.returncode == ExitCode.STAGING_TIMEOUT, waiter.stderr

    def test_a_rerun_of_the_same_job_on_a_grown_dataset_never_gets_the_earlier_result(self, azurite, container,
                                                                                      tmp_path):
        """The review's case: job 1 staged 20 files; the dataset now has 30; job 2 (same inputs, torchrun's
        `none`) starts its local rank 1 before its local rank 0: it must wait, never take job 1's 20."""
        source = tmp_path / "grow"
        generate(source, files_per_universe=20, file_bytes=8 << 10, seed=5)
        upload.upload_directory(container, source, "grow", workers=2)
        first = self.run_job(azurite, container, tmp_path, "grow", tmp_path / "torchelastic_1" / "attempt_0")
        assert first[1]["inputs"][0]["files_total"] == 20
        generate(source, files_per_universe=10, file_bytes=8 << 10, seed=6, first_universe=30000)
        upload.upload_directory(container, source, "grow", workers=2)
        waiter = self.lone_waiter(azurite, container, tmp_path, "grow", tmp_path / "torchelastic_2" / "attempt_0")
        assert waiter.returncode == ExitCode.STAGING_TIMEOUT, (waiter.stdout, waiter.stderr)
        second = self.run_job(azurite, container, tmp_path, "grow", tmp_path / "torchelastic_3" / "attempt_0")
        assert [r["inputs"][0]["files_total"] for r in second] == [30, 30]

    def test_an_elastic_restart_is_another_launch(self, azurite, container, tmp_path):
        """torchrun restarting its workers keeps the run id and the log directory, not the attempt."""
        small_dataset(container, tmp_path, "a")
        self.run_job(azurite, container, tmp_path, "a", tmp_path / "torchelastic_1" / "attempt_0")
        waiter = self.lone_waiter(azurite, container, tmp_path, "a", tmp_path / "torchelastic_1" / "attempt_1")
        assert waiter.returncode == ExitCode.STAGING_TIMEOUT, waiter.stderr

    def test_without_any_way_to_tell_launches_apart_staging_refuses(self, azurite, container, tmp_path):
        small_dataset(container, tmp_path, "a")
        waiter = self.lone_waiter(azurite, container, tmp_path, "a", TORCHELASTIC_RUN_ID="none")
        assert waiter.returncode == ExitCode.USAGE, waiter.stderr
        assert "cannot tell this launch from an earlier one" in waiter.stderr
        assert "AMLHPC_LAUNCH_ID=$(cat /proc/sys/kernel/random/uuid)" in waiter.stderr

    def test_a_launch_id_from_the_launcher_is_enough(self, azurite, container, tmp_path):
        small_dataset(container, tmp_path, "a")
        self.run_job(azurite, container, tmp_path, "a", AMLHPC_LAUNCH_ID="launch-1")
        waiter = self.lone_waiter(azurite, container, tmp_path, "a", AMLHPC_LAUNCH_ID="launch-2")
        assert waiter.returncode == ExitCode.STAGING_TIMEOUT, waiter.stderr


class TestStaleMarkers:
    def test_an_earlier_launchs_result_is_ignored_however_recent(self, tmp_path):
        """Job 1's local rank 0 finished seconds ago (within any freshness window); job 2's waiter ignores it."""
        earlier = NodeBarrier(tmp_path, 5, run_id="default", generation="1" * 16)
        earlier.lead()
        earlier.succeed({"node_index": 0, "files": 20})
        leader = json.loads(earlier.leader_file.read_text())
        leader["pid"] = dead_pid()  # its process has exited, as a finished staging command's does
        earlier.leader_file.write_text(json.dumps(leader))
        with pytest.raises(BarrierTimeout):
            NodeBarrier(tmp_path, 0.5, run_id="default", generation="2" * 16).wait()
        # The same launch's ranks still find it after their leader exited (the command-per-step case).
        assert NodeBarrier(tmp_path, 0.5, run_id="default", generation="1" * 16).wait() == {"node_index": 0, "files": 20}

    def test_an_earlier_launchs_failure_does_not_fail_this_one(self, tmp_path):
        NodeBarrier(tmp_path, 5, generation="1" * 16).fail("job 1 broke")
        with pytest.raises(BarrierTimeout):
            NodeBarrier(tmp_path, 0.5, generation="2" * 16).wait()

    def test_an_earlier_launchs_node_markers_are_ignored(self):
        """The review's case: job 1's nodes all finished; job 2's node 0 must not release its ranks while
        job 2's node 1 has not finished. The nodes' barrier is on the launch's own store (node 0's):
        a new launch has a new, empty one, so nothing of job 1 is there to be taken for job 2's."""
        earlier = MemoryStore()
        for node in (0, 1):
            Barrier(Channel(earlier, node=node, nodes=2), "staging/k/cosmo/nodes", 2, 5).arrive()
        Barrier(Channel(earlier, node=0, nodes=2), "staging/k/cosmo/nodes", 2, 5).wait()
        now = Barrier(Channel(MemoryStore(), node=0, nodes=2, base_poll_s=0.01), "staging/k/cosmo/nodes", 2, 0.3)
        now.arrive()
        with pytest.raises(BarrierTimeout, match="node\\(s\\) 1 did not arrive"):
            now.wait()

    def test_nodes_that_listed_different_blobs_fail(self, monkeypatch, tmp_path):
        """Node 1 listed after the dataset changed: it fails, and so does node 0 at the barrier."""
        from types import SimpleNamespace

        from amlhpc.jobs.runtime.blob.blobhttp import Deadline

        store = MemoryStore()
        staged = SimpleNamespace(files_node=1, bytes_out=1)
        monkeypatch.setattr(staging, "_stage_input", lambda *args, **kwargs: staged)
        entries = {0: [SimpleNamespace(name="a", size=1, etag="1")], 1: [SimpleNamespace(name="a", size=2, etag="2")]}
        outcome: dict[int, BaseException | None] = {}

        def node(k: int) -> None:
            plan = SimpleNamespace(spec=SimpleNamespace(name="cosmo", prefix="cosmoflow/"), entries=entries[k])
            try:
                staging._stage_shared(plan, tmp_path, validated(k, 0, 2, 1), FAST, None, None, "key", Deadline(5),
                                      Channel(store, node=k, nodes=2, base_poll_s=0.01))
                outcome[k] = None
            except staging.StagingError as exc:
                outcome[k] = exc

        threads = [threading.Thread(target=node, args=(k,)) for k in (0, 1)]
        threads[0].start()
        threads[0].join(0.2)
        threads[1].start()
        for thread in threads:
            thread.join(10)
        assert "node 1 planned from a listing" in str(outcome[1]) and "node 0 from a listing" in str(outcome[1])
        assert "node 1 planned from a listing" in str(outcome[0])  # node 0 fails at the barrier with node 1's cause


# ------------------------------------------------------------------ 2. exit code 4


def test_a_timeout_exits_4(tmp_path, capsys):
    env = rank_env(1, 1, 2, 2, **{contract.SCRATCH: str(tmp_path / "scratch"), contract.RUN_ID: uuid.uuid4().hex,
                                  contract.STAGE_JSON: spec_json("datasets", "local")})
    assert staging.main(["--timeout-s", "1", "-q"], env=env) == ExitCode.STAGING_TIMEOUT
    assert "waited 1s for local rank 0" in capsys.readouterr().err


# ------------------------------------------------------------------ 3. waiters fail fast when rank 0 cannot set up


def run_node_in_threads(specs, env: dict[str, str], timeout_s: float) -> dict[int, tuple[float, BaseException | None]]:
    """Local ranks 0 and 1 of one node as threads: (seconds until they returned, what they raised)."""
    outcome: dict[int, tuple[float, BaseException | None]] = {}

    def rank(local_rank: int) -> None:
        started = time.monotonic()
        try:
            staging.stage_inputs(specs, validated(local_rank, local_rank, 2, 2), env=env,
                                 options=staging.StageOptions(timeout_s=timeout_s))
            outcome[local_rank] = (time.monotonic() - started, None)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome[local_rank] = (time.monotonic() - started, exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 30)
    return outcome


def test_waiters_fail_within_seconds_when_rank0_cannot_write_its_barrier(tmp_path, monkeypatch):
    """Disk full while local rank 0 records that it leads: the other ranks learn it at once."""
    real = nodebarrier.write_json_atomic

    def disk_full_for_the_leader(path, document):
        if Path(path).name == "leader.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, document)

    monkeypatch.setattr(nodebarrier, "write_json_atomic", disk_full_for_the_leader)
    env = {contract.SCRATCH: str(tmp_path / "scratch"), contract.RUN_ID: uuid.uuid4().hex,
           contract.BLOB_CONNECTION_STRING: "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=YQ==;"
                                            "BlobEndpoint=http://127.0.0.1:9/a;"}
    outcome = run_node_in_threads(staging.specs_from_json(spec_json("datasets", "local")), env, timeout_s=20)
    seconds, error = outcome[1]
    assert seconds < 5, f"local rank 1 waited {seconds:.1f}s"
    assert isinstance(error, staging.StagingError) and "No space left on device" in str(error)
    assert outcome[0][1] is not None


@pytest.mark.azurite
def test_scratch_that_is_a_file_fails_every_rank_at_once_with_exit_2(azurite, container, tmp_path):
    small_dataset(container, tmp_path, "a")
    not_a_dir = tmp_path / "scratch-file"
    not_a_dir.write_text("not a directory")
    common = {contract.BLOB_CONNECTION_STRING: azurite.connection_string, contract.SCRATCH: str(not_a_dir),
              contract.RUN_ID: uuid.uuid4().hex}
    started = time.monotonic()
    procs = [stager(rank_env(r, r, 2, 2, **common), spec_json(container.container_name, "local", prefix="a"),
                    "--timeout-s", "120") for r in (0, 1)]
    outs = [p.communicate(timeout=100) for p in procs]
    assert time.monotonic() - started < 30
    assert [p.returncode for p in procs] == [ExitCode.USAGE] * 2, [o[1] for o in outs]
    for _, err in outs:
        assert f"AMLHPC_SCRATCH: {not_a_dir} is a file" in err, err
        assert "Errno" not in err


# ------------------------------------------------------------------ 4. unusable scratch is bad input


@pytest.fixture
def readonly_dir(tmp_path):
    """A directory nobody may write: permissions for an ordinary user, a read-only mount for root."""
    path = tmp_path / "read-only"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("root without the right to mount a read-only filesystem; the injected test below covers it")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_read_only_scratch_is_bad_input(readonly_dir, tmp_path, capsys):
    env = {contract.SCRATCH: str(readonly_dir), contract.RUN_ID: uuid.uuid4().hex,
           contract.STAGE_JSON: spec_json("datasets", "local"),
           contract.BLOB_CONNECTION_STRING: "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=YQ==;"
                                            "BlobEndpoint=http://127.0.0.1:9/a;"}
    assert staging.main(["-q", "--fast-retries"], env=env) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"AMLHPC_SCRATCH: {readonly_dir} is not writable" in err and "Errno" not in err


def test_read_only_scratch_is_bad_input_injected(tmp_path, monkeypatch, capsys):
    """The same with the filesystem's answer injected, for machines where no read-only mount can be made."""
    from amlhpc.jobs.runtime.node import scratch

    target = tmp_path / "scratch"
    target.mkdir()
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(target)) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(scratch.os, "open", read_only)
    with pytest.raises(scratch.ScratchError, match=rf"AMLHPC_SCRATCH: {target} is not writable \(read-only file system\)"):
        scratch.check_writable(target, contract.SCRATCH)


# ------------------------------------------------------------------ 5. the data directory equals the dataset


@pytest.mark.azurite
class TestStaleFiles:
    @pytest.mark.parametrize("mode", ["replica", "shared"])
    def test_a_blob_deleted_between_runs_is_removed(self, azurite, container, tmp_path, mode):
        source = small_dataset(container, tmp_path, "d")
        first = in_process(azurite, container, tmp_path, "d", mode)
        data_dir = Path(first.inputs[0].data_dir)
        gone = sorted(source_files(source))[2]
        container.delete_blob(f"d/{gone}.gz")
        (source / gone).unlink()
        in_process(azurite, container, tmp_path, "d", mode)
        assert data_files(data_dir) == source_files(source)

    def test_a_new_node_count_leaves_only_this_nodes_share(self, azurite, container, tmp_path):
        source = small_dataset(container, tmp_path, "d", files=12)
        in_process(azurite, container, tmp_path, "d", ranks=validated(0, 0, 2, 1))
        result = in_process(azurite, container, tmp_path, "d", ranks=validated(0, 0, 3, 1))
        listed = read_list(result.inputs[0].file_lists["0"])
        staged = data_files(Path(result.inputs[0].data_dir))
        assert sorted(staged) == sorted(listed)
        assert all(staged[name] == source_files(source)[name] for name in staged)


# ------------------------------------------------------------------ 6. two blobs, one local path


@pytest.mark.azurite
class TestCollidingNames:
    @pytest.mark.parametrize(("first", "second"), [("c/a.bin", "c/a.bin.gz"), ("c/dir//b", "c/dir/b"),
                                                   ("c/x", "c/x/y")])
    def test_refused_naming_both(self, azurite, container, tmp_path, first, second):
        import gzip

        put_blob(container, first, b"one", gzip_encoded=False)
        put_blob(container, second, gzip.compress(b"two") if second.endswith(".gz") else b"two",
                 gzip_encoded=second.endswith(".gz"))
        with pytest.raises(staging.StageConfigError) as caught:
            in_process(azurite, container, tmp_path, "c")
        assert repr(first) in str(caught.value) and repr(second) in str(caught.value)
        assert not (tmp_path / "scratch" / "cosmo").exists() or not any((tmp_path / "scratch" / "cosmo").iterdir())


# ------------------------------------------------------------------ 7. names with newlines


@pytest.mark.azurite
def test_names_with_newlines_survive_the_file_lists(azurite, container, tmp_path):
    put_blob(container, "nl/new\nline.bin", b"first", gzip_encoded=False)
    put_blob(container, "nl/plain.bin", b"second", gzip_encoded=False)
    put_blob(container, "nl/tab\tand\rreturn.bin", b"third", gzip_encoded=False)
    result = in_process(azurite, container, tmp_path, "nl", ranks=validated(0, 0, 2, 2))
    lists = [read_list(result.inputs[0].file_lists[str(r)]) for r in (0, 1)]
    assert sorted(lists[0] + lists[1]) == ["new\nline.bin", "plain.bin", "tab\tand\rreturn.bin"]
    data_dir = Path(result.inputs[0].data_dir)
    assert (data_dir / "new\nline.bin").read_bytes() == b"first"


# ------------------------------------------------------------------ 8. options are checked


@pytest.mark.parametrize(("args", "named"), [
    (["--range-mib", "0"], "--range-mib"), (["--concurrency", "-1"], "--concurrency"),
    (["--file-workers", "0"], "--file-workers"), (["--timeout-s", "-5"], "--timeout-s"),
    (["--cap-mbps", "0"], "--cap-mbps"), (["--node-gbps", "-1"], "--node-gbps"),
])
def test_bad_options_exit_2_naming_the_option(tmp_path, capsys, args, named):
    env = {contract.SCRATCH: str(tmp_path), contract.RUN_ID: "x", contract.STAGE_JSON: spec_json("datasets", "local"),
           contract.BLOB_CONNECTION_STRING: "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=YQ==;"
                                            "BlobEndpoint=http://127.0.0.1:9/a;"}
    assert staging.main([*args, "-q", "--fast-retries"], env=env) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_bad_timeout_variable_exits_2(tmp_path, capsys):
    env = {contract.SCRATCH: str(tmp_path), contract.RUN_ID: "x", contract.STAGE_JSON: spec_json("datasets", "local"),
           contract.STAGE_TIMEOUT_S: "soon"}
    assert staging.main(["-q"], env=env) == ExitCode.USAGE
    assert "AMLHPC_STAGE_TIMEOUT_S" in capsys.readouterr().err


# ------------------------------------------------------------------ 9. two stagers on one scratch


@pytest.mark.azurite
def test_a_second_stager_on_the_same_scratch_is_refused_and_names_the_first(azurite, container, tmp_path):
    """The first stager is held at a named step while holding the lock (never raced by timing)."""
    source = small_dataset(container, tmp_path, "lock")
    log, release = tmp_path / "fired.log", tmp_path / "release"
    common = {contract.BLOB_CONNECTION_STRING: azurite.connection_string, contract.SCRATCH: str(tmp_path / "node0")}
    stage_json = spec_json(container.container_name, "local", prefix="lock")
    first = stager(clean_env(AMLHPC_RUN_ID="first", **common, **{
        faultpoints.ENV_POINTS: f"staging.after-lock=hold:{release}", faultpoints.ENV_LOG: str(log)}), stage_json)
    try:
        deadline = time.monotonic() + 120
        while faultpoints.fired_in_log(log) != ["staging.after-lock"]:
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() else "slow"
            time.sleep(0.05)
        second = subprocess.run([sys.executable, "-m", "amlhpc.jobs.runtime.staging", "--stage-json", stage_json, "-q"],
                                cwd=ROOT, env=clean_env(AMLHPC_RUN_ID="second", **common), capture_output=True,
                                text=True, timeout=60)
    finally:
        release.touch()
    assert second.returncode == ExitCode.STAGING
    assert f"pid {first.pid}" in second.stderr and "is staging input 'cosmo'" in second.stderr
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert data_files(tmp_path / "node0" / "cosmo") == source_files(source)


@pytest.mark.azurite
def test_a_rerun_in_shared_mode_never_trusts_the_earlier_jobs_node_markers(azurite, container, tmp_path):
    """The review's case end to end: job 1's two nodes filled the shared directory with 40 files; the
    dataset grew to 50; job 2 (same inputs, no unique id) starts only its node 0, which must not release
    its ranks on job 1's marker of node 1: it times out instead of exiting 0."""
    source = tmp_path / "grow"
    generate(source, files_per_universe=40, file_bytes=8 << 10, seed=7)
    upload.upload_directory(container, source, "shared-grow", workers=2)
    stage_json = spec_json(container.container_name, "shared", prefix="shared-grow")
    (tmp_path / "shared").mkdir()

    from amlhpc.jobs.runtime.coord.jobstore import reserve

    def node(index: int, timeout: str, listener) -> subprocess.Popen:
        env = rank_env(index, 0, 2, 1, **{contract.BLOB_CONNECTION_STRING: azurite.connection_string,
                                          contract.SHARED_DIR: str(tmp_path / "shared"),
                                          contract.REPORT_DIR: str(tmp_path / "reports"),
                                          "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1",
                                          "AMLHPC_COORD_PORT": str(listener.getsockname()[1])})
        if index == 0:
            env["AMLHPC_COORD_LISTEN_FD"] = str(listener.fileno())
        return stager(env, stage_json, "--timeout-s", timeout, inherit=(listener.fileno(),) if index == 0 else ())

    first = reserve(0, "127.0.0.1")
    job1 = [node(0, "120", first), node(1, "120", first)]
    first.close()
    assert [p.communicate(timeout=180) and p.returncode for p in job1] == [0, 0]
    generate(source, files_per_universe=10, file_bytes=8 << 10, seed=8, first_universe=30000)
    upload.upload_directory(container, source, "shared-grow", workers=2)
    alone = node(0, "12", reserve(0, "127.0.0.1"))
    out, err = alone.communicate(timeout=120)
    assert alone.returncode == ExitCode.STAGING_TIMEOUT, (out, err)
    assert "node(s) 1" in err


# ------------------------------------------------------------------ 10. deadline, Retry-After, empty prefix, own folder name


@pytest.mark.azurite
def test_a_server_that_drips_bytes_meets_the_deadline(azurite, container, tmp_path):
    small_dataset(container, tmp_path, "drip", files=2)
    with FaultProxy(azurite.port, seed=1, drip=1.0, drip_interval_s=0.3, max_per_request=1000) as proxy:
        env = clean_env(**{contract.BLOB_CONNECTION_STRING: proxy.connection_string(azurite),
                           contract.SCRATCH: str(tmp_path / "node0"), contract.RUN_ID: "drip"})
        started = time.monotonic()
        proc = stager(env, spec_json(container.container_name, "local", prefix="drip"), "--timeout-s", "4")
        try:
            _, err = proc.communicate(timeout=40)
        finally:
            proc.kill()
        assert proc.returncode == ExitCode.STAGING_TIMEOUT, err
        assert time.monotonic() - started < 30
        assert "deadline" in err and "4s" in err
    assert proxy.counts["drip"] > 0


@pytest.mark.azurite
class TestRetryAfter:
    @staticmethod
    def gaps(proxy) -> list[float]:
        """Seconds from each busy answer to the next request for the same path."""
        events = list(proxy.plan.events)
        out = []
        for i, (when, method, path, choice) in enumerate(events):
            if choice == "busy":
                later = [t for t, m, p, _ in events[i + 1:] if (m, p) == (method, path)]
                if later:
                    out.append(later[0] - when)
        return out

    def test_staging_waits_as_long_as_the_server_asks(self, azurite, container, tmp_path):
        small_dataset(container, tmp_path, "ra", files=1)
        with FaultProxy(azurite.port, seed=2, busy=1.0, max_per_request=1, busy_retry_after=2) as proxy:
            env = {contract.BLOB_CONNECTION_STRING: proxy.connection_string(azurite),
                   contract.SCRATCH: str(tmp_path / "scratch"), contract.RUN_ID: uuid.uuid4().hex}
            specs = staging.specs_from_json(spec_json(container.container_name, "local", prefix="ra"))
            staging.stage_inputs(specs, validated(0, 0, 1, 1), options=FAST, env=env)
        gaps = self.gaps(proxy)
        assert gaps and min(gaps) >= 1.9, gaps

    def test_the_sdk_clients_wait_as_long_as_the_server_asks(self, azurite, container):
        container.upload_blob("ra/blob", b"x" * 1000)
        with FaultProxy(azurite.port, seed=3, busy=1.0, max_per_request=1, busy_retry_after=2) as proxy:
            client = blobio.container_client(container.container_name, connection_string=proxy.connection_string(azurite),
                                             retry=blobio.RetrySettings.fast())
            assert client.download_blob("ra/blob").readall() == b"x" * 1000
        gaps = self.gaps(proxy)
        assert gaps and min(gaps) >= 1.9, gaps


@pytest.mark.parametrize("prefix", ["", "/"])
def test_an_empty_prefix_is_refused(prefix):
    with pytest.raises(staging.StageConfigError, match=r"\[0\]\.prefix: .*whole container"):
        staging.specs_from_json(json.dumps([{"name": "x", "container": "d", "prefix": prefix}]))


@pytest.mark.azurite
def test_a_dataset_holding_stagings_folder_name_stages(azurite, container, tmp_path):
    source = tmp_path / "own"
    (source / ".amlhpc-staging").mkdir(parents=True)
    (source / ".amlhpc-staging" / "state.bin").write_bytes(b"a user's file")
    (source / "data.bin").write_bytes(b"data" * 100)
    upload.upload_directory(container, source, "own")
    result = in_process(azurite, container, tmp_path, "own")
    assert data_files(Path(result.inputs[0].data_dir)) == source_files(source)


@pytest.mark.azurite
@pytest.mark.parametrize("point", ["barrier.after-lead", "barrier.before-result"])
def test_local_rank_0_killed_at_each_barrier_step_fails_its_waiters_and_a_new_launch_stages(azurite, container,
                                                                                           tmp_path, point):
    """SIGKILL of the stager at a named step of the node barrier: the waiting rank fails at once (never
    released, never left to time out), and the next launch on the same node stages everything."""
    source = small_dataset(container, tmp_path, "killed")
    log = tmp_path / "fired.log"
    common = {contract.BLOB_CONNECTION_STRING: azurite.connection_string, contract.SCRATCH: str(tmp_path / "node0"),
              "TORCHELASTIC_RUN_ID": "none"}
    stage_json = spec_json(container.container_name, "local", prefix="killed")

    def launch(launch_id: str, leader_faults: dict[str, str]) -> list[subprocess.Popen]:
        return [stager(rank_env(r, r, 2, 2, AMLHPC_LAUNCH_ID=launch_id, **common, **(leader_faults if r == 0 else {})),
                       stage_json, "--timeout-s", "120") for r in (0, 1)]

    first = launch("one", {faultpoints.ENV_POINTS: f"{point}=kill", faultpoints.ENV_LOG: str(log)})
    outs = [p.communicate(timeout=150) for p in first]
    assert first[0].returncode == -9 and faultpoints.fired_in_log(log) == [point]
    assert first[1].returncode == ExitCode.STAGING, outs[1][1]
    assert "exited without finishing staging" in outs[1][1]
    again = launch("two", {})
    results = [p.communicate(timeout=150) for p in again]
    assert [p.returncode for p in again] == [0, 0], [r[1] for r in results]
    assert data_files(tmp_path / "node0" / "cosmo") == source_files(source)
