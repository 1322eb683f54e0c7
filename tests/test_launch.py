"""The in-job launcher as Azure ML runs it: real processes, real Azurite, simulated nodes
(their own scratch and rank variables), real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from amlhpc.jobs.local.azurite import free_port
from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.checkpoint import CheckpointStore
from amlhpc.jobs.runtime.launch import launcher as launch
from tests.fake_sysfs import build_nd96asr_sysfs

REPO = Path(__file__).resolve().parents[1]

# A training command for the tests: records what it was given, writes a checkpoint, and
# behaves as asked on SIGTERM (exit cleanly, or ignore it).
TRAIN = r"""
import json, os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1]); behaviour = sys.argv[2]
rank = os.environ.get("RANK", "0")
ckpt = os.environ.get("AMLHPC_CHECKPOINT_DIR")
resume = os.environ.get("AMLHPC_RESUME_DIR")
seen = {k: v for k, v in os.environ.items() if k.startswith(("AMLHPC_", "CUDA_"))}
seen["resumed"] = sorted(p.name for p in Path(resume).iterdir()) if resume else None
seen["affinity"] = sorted(os.sched_getaffinity(0))
for key in ("AMLHPC_FILE_LIST_DS",):
    if key in os.environ:
        seen["file_list"] = json.loads(Path(os.environ[key]).read_text())  # staging's JSON file list
(out / f"seen-{rank}.json").write_text(json.dumps(seen))
if ckpt and behaviour != "no-ckpt":
    tmp = Path(ckpt) / f".shard-{rank}.pt.tmp"
    tmp.write_text(f"weights of rank {rank} after run {behaviour}")
    os.replace(tmp, Path(ckpt) / f"shard-{rank}.pt")
if behaviour in ("term-ok", "term-ignore"):
    if behaviour == "term-ok":
        signal.signal(signal.SIGTERM, lambda *a: (out.joinpath(f"sigterm-{rank}").write_text("1"), sys.exit(0)))
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (out / f"ready-{rank}").write_text("1")
    time.sleep(60)
sys.exit(int(behaviour) if behaviour.isdigit() else 0)
"""


@pytest.fixture
def train_script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMLHPC_", "RANK", "LOCAL_", "WORLD", "MASTER"))}
    env.update({"AMLHPC_RUN_ID": f"t-{uuid.uuid4().hex[:8]}", "AMLHPC_REPORT_DIR": str(tmp_path / "reports"),
                "AMLHPC_SCRATCH": str(tmp_path / "scratch"), "AMLHPC_HEALTH": "off", "AMLHPC_PIN": "auto"})
    env.update(extra)
    return env


def rank_env(env: dict, rank: int, local: int, world: int, tmp_path: Path) -> dict:
    node = rank // local
    return {**env, "RANK": str(rank), "LOCAL_RANK": str(rank % local), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(local), "AMLHPC_SCRATCH": str(tmp_path / f"node{node}" / "scratch"),
            "AMLHPC_REPORT_DIR": str(tmp_path / f"node{node}" / "reports")}


def start(env: dict, *args: str, cwd: Path = REPO) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "amlhpc.jobs.runtime.launch", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def checkpoint_env(azurite, container, prefix: str, **settings) -> dict[str, str]:
    doc = {"container": container.container_name, "prefix": prefix, "keep": 3, "interval_s": 3600, **settings}
    return {"AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string, "AMLHPC_CHECKPOINT_JSON": json.dumps(doc)}


class TestOptions:
    def test_flag_wins_over_environment(self):
        options = launch.parse_options(["--health", "warn", "--", "python", "t.py"], {"AMLHPC_HEALTH": "gate"})
        assert (options.health, options.pin, options.command) == ("warn", "auto", ["python", "t.py"])

    def test_environment_and_defaults(self):
        options = launch.parse_options(["--", "t"], {"AMLHPC_HEALTH": "gate", "AMLHPC_PIN": "off", "AMLHPC_REPORT_DIR": "r"})
        assert (options.health, options.pin, options.report_dir) == ("gate", "off", Path("r"))
        assert launch.parse_options(["--", "t"], {}).health == "off"

    def test_missing_command(self):
        with pytest.raises(RuntimeInputError, match="no training command: put it after `--`"):
            launch.parse_options(["--health", "gate"], {})
        with pytest.raises(RuntimeInputError, match="nothing after `--`"):
            launch.parse_options(["--"], {})

    def test_bad_environment_values_are_named(self):
        with pytest.raises(RuntimeInputError) as info:
            launch.parse_options(["--term-grace", "0", "--", "t"], {"AMLHPC_HEALTH": "strict", "AMLHPC_PIN": "numa"})
        text = info.value.render()
        assert "AMLHPC_HEALTH: must be one of gate, warn, off, got 'strict'" in text
        assert "AMLHPC_PIN: must be one of auto, off, got 'numa'" in text
        assert "--term-grace: must be a positive number of seconds" in text

    def test_exit_status(self):
        assert launch.exit_status(0) == 0 and launch.exit_status(7) == 7
        assert launch.exit_status(-signal.SIGKILL) == 137 and launch.exit_status(-signal.SIGTERM) == 143


class TestBadInput:
    def test_bad_settings_exit_2_before_anything_runs(self, tmp_path, train_script):
        env = base_env(tmp_path, AMLHPC_SKU_JSON='{"name": "x"}', AMLHPC_CHECKPOINT_JSON='{"prefix": "p"}',
                       AMLHPC_STAGE_JSON='[{"name": "ds"}]')
        code, out = finish(start(env, "--", sys.executable, str(train_script), str(tmp_path), "0"))
        assert code == 2
        assert "AMLHPC_SKU_JSON: gpus: is missing" in out
        assert "AMLHPC_CHECKPOINT_JSON: container:" in out
        assert "AMLHPC_STAGE_JSON: [0].container: is required" in out
        assert not list(tmp_path.glob("seen-*"))

    def test_bad_rank_variables(self, tmp_path, train_script):
        env = {**base_env(tmp_path), "RANK": "3", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        code, out = finish(start(env, "--", "true"))
        assert code == 2 and "RANK: 3 is outside 0..1 (WORLD_SIZE=2)" in out

    def test_command_not_found(self, tmp_path):
        code, out = finish(start(base_env(tmp_path), "--", "no-such-trainer-xyz"))
        assert code == 127 and "command not found: no-such-trainer-xyz" in out


class TestRunAndCheckpoint:
    def test_exit_code_environment_and_secret(self, azurite, container, tmp_path, train_script):
        """The command's status comes back; it sees its checkpoint folder, never the account key."""
        env = base_env(tmp_path, **checkpoint_env(azurite, container, "runs/a"))
        code, out = finish(start(env, "--max-clocks", "--", sys.executable, str(train_script), str(tmp_path), "7"))
        assert code == 7, out
        assert "--max-clocks: no GPU clocks changed (NVML unavailable or no GPU)" in out
        seen = json.loads((tmp_path / "seen-0.json").read_text())
        assert "AMLHPC_BLOB_CONNECTION_STRING" not in seen and azurite.key not in json.dumps(seen)
        sas = dict(part.split("=", 1) for part in seen["AMLHPC_BLOB_READ_SAS"].split("&"))
        assert sas["sp"] == "rl" and sas["sr"] == "c", "read and list, the container only: never a write"
        assert seen["AMLHPC_CHECKPOINT_DIR"].startswith(str(tmp_path / "scratch"))
        assert "AMLHPC_RESUME_DIR" not in seen and seen["resumed"] is None
        assert azurite.key not in out
        # Exit 7 still uploads what the command wrote: a failed run's checkpoint is the one to resume from.
        store = CheckpointStore(container, "runs/a")
        assert [f["path"] for f in store.latest().files] == ["shard-0.pt"]
        report = json.loads((tmp_path / "reports" / "launch-node000.json").read_text())
        assert report["command_status"] == 7 and report["exit_code"] == 7 and report["uploaded_versions"]

    def test_preemption_sigterm_uploads_then_resume(self, azurite, container, tmp_path, train_script):
        """SIGTERM to the launcher reaches the command; its last checkpoint is uploaded on the
        way out; the next run with the same prefix starts from it (AMLHPC_RESUME_DIR)."""
        env = base_env(tmp_path, **checkpoint_env(azurite, container, "runs/preempt"))
        proc = start(env, "--", sys.executable, str(train_script), str(tmp_path), "term-ok")
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready-0").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "ready-0").exists(), proc.stdout.read() if proc.poll() is not None else "not ready"
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc)
        assert code == 0, out
        assert (tmp_path / "sigterm-0").exists()
        assert "SIGTERM received: forwarding it to the training command" in out
        first = CheckpointStore(container, "runs/preempt").latest()
        assert first is not None and [f["path"] for f in first.files] == ["shard-0.pt"]

        again = base_env(tmp_path, **checkpoint_env(azurite, container, "runs/preempt"))  # a new run id: new node folder
        code, out = finish(start(again, "--", sys.executable, str(train_script), str(tmp_path), "no-ckpt"))
        assert code == 0, out
        seen = json.loads((tmp_path / "seen-0.json").read_text())
        assert seen["resumed"] == ["shard-0.pt"]
        assert seen["AMLHPC_RESUME_DIR"] == seen["AMLHPC_CHECKPOINT_DIR"]
        assert f"resuming from checkpoint {first.version}" in out
        resumed = Path(seen["AMLHPC_RESUME_DIR"]) / "shard-0.pt"
        assert resumed.read_text() == "weights of rank 0 after run term-ok"

    def test_command_ignoring_sigterm_is_killed_after_the_grace(self, tmp_path, train_script):
        proc = start(base_env(tmp_path), "--term-grace", "0.5", "--", sys.executable, str(train_script), str(tmp_path),
                     "term-ignore")
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready-0").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc)
        assert code == 128 + signal.SIGKILL
        assert "did not exit 0.5s after the stop signal: SIGKILL" in out

    def test_command_dies_with_the_launcher(self, tmp_path):
        """SIGKILL of the launcher (OOM killer) takes the training with it: no orphan holding GPUs."""
        pid_file = tmp_path / "pid"
        proc = start(base_env(tmp_path), "--", sys.executable, "-c",
                     f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)")
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        proc.kill()
        proc.wait()
        proc.stdout.close()
        deadline = time.monotonic() + 10
        state = "?"
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                state = "gone"
            if state in ("gone", "Z", "X"):
                break
            time.sleep(0.05)
        assert state in ("gone", "Z", "X"), f"training process {child} is still running ({state})"

    def test_final_upload_failure_after_success_exits_6(self, azurite, blob_service, tmp_path, train_script):
        """Training succeeded but its checkpoint cannot be stored: not a silent success."""
        name = f"gone-{uuid.uuid4().hex[:8]}"
        container = blob_service.create_container(name)
        env = base_env(tmp_path, **checkpoint_env(azurite, container, "p"))
        script = tmp_path / "delete_then_train.py"
        script.write_text(
            "import os, sys, runpy\n"
            "from azure.storage.blob import BlobServiceClient\n"
            f"BlobServiceClient.from_connection_string(sys.argv[1]).delete_container({name!r})\n"
            "sys.argv = [sys.argv[2], *sys.argv[3:]]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
        code, out = finish(start(env, "--", sys.executable, str(script), azurite.connection_string, str(train_script),
                                 str(tmp_path), "0"))
        assert code == 6, out
        assert "final checkpoint" in out and "could not be uploaded" in out

    def test_restore_failure_exits_5(self, azurite, container, tmp_path, train_script):
        store = CheckpointStore(container, "runs/broken")
        store.upload(_write(tmp_path / "src", {"a.pt": b"x" * 100}))
        version = store.latest().version
        container.delete_blob(f"runs/broken/data/{version}/a.pt")
        env = base_env(tmp_path, **checkpoint_env(azurite, container, "runs/broken"))
        code, out = finish(start(env, "--", sys.executable, str(train_script), str(tmp_path), "0"))
        assert code == 5 and f"runs/broken/data/{version}/a.pt is missing" in out
        assert not (tmp_path / "seen-0.json").exists()


def _write(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


class TestSimulatedNodes:
    def test_sharded_checkpoints_two_ranks_one_node(self, azurite, container, tmp_path, train_script):
        """writers per_rank: local rank 0 waits for rank 1's command before the final upload,
        so both shards are in one version; a re-run restores both on the node."""
        env = base_env(tmp_path, **checkpoint_env(azurite, container, "runs/zero", writers="per_rank"))
        procs = [start(rank_env(env, r, 2, 2, tmp_path), "--", sys.executable, str(train_script), str(tmp_path), "0")
                 for r in range(2)]
        results = [finish(p) for p in procs]
        assert [c for c, _ in results] == [0, 0], results
        latest = CheckpointStore(container, "runs/zero/node-0").latest()
        assert sorted(f["path"] for f in latest.files) == ["shard-0.pt", "shard-1.pt"]
        seen = [json.loads((tmp_path / f"seen-{r}.json").read_text()) for r in range(2)]
        assert seen[0]["AMLHPC_CHECKPOINT_DIR"] == seen[1]["AMLHPC_CHECKPOINT_DIR"]

        rerun = base_env(tmp_path, **checkpoint_env(azurite, container, "runs/zero", writers="per_rank"))
        procs = [start(rank_env(rerun, r, 2, 2, tmp_path), "--", sys.executable, str(train_script), str(tmp_path),
                       "no-ckpt") for r in range(2)]
        assert [finish(p)[0] for p in procs] == [0, 0]
        assert [json.loads((tmp_path / f"seen-{r}.json").read_text())["resumed"] for r in range(2)] == \
            [["shard-0.pt", "shard-1.pt"]] * 2

    def test_staging_two_nodes_each_gets_its_share(self, azurite, container, tmp_path, train_script):
        """2 nodes x 1 rank: each node's local rank 0 stages its byte-balanced share; the
        command gets its data dir and file list; together the ranks read every file once."""
        for i in range(6):
            container.upload_blob(f"ds/univ_ics_2019-03_a{i:05d}_000.tfrecord", bytes([i]) * (1000 + i))
        spec = [{"name": "ds", "container": container.container_name, "prefix": "ds", "mode": "local"}]
        # the nodes agree on the dataset version through node 0's job store, as on Azure ML (MASTER_ADDR)
        env = base_env(tmp_path, AMLHPC_BLOB_CONNECTION_STRING=azurite.connection_string,
                       AMLHPC_STAGE_JSON=json.dumps(spec), MASTER_ADDR="127.0.0.1", MASTER_PORT="1",
                       AMLHPC_COORD_PORT=str(free_port()))
        procs = [start(rank_env(env, r, 1, 2, tmp_path), "--", sys.executable, str(train_script), str(tmp_path), "0")
                 for r in range(2)]
        results = [finish(p) for p in procs]
        assert [c for c, _ in results] == [0, 0], results
        seen = [json.loads((tmp_path / f"seen-{r}.json").read_text()) for r in range(2)]
        lists = [s["file_list"] for s in seen]
        assert sorted(lists[0] + lists[1]) == [f"univ_ics_2019-03_a{i:05d}_000.tfrecord" for i in range(6)]
        assert not set(lists[0]) & set(lists[1])
        for r, s in enumerate(seen):
            data_dir = Path(s["AMLHPC_DATA_DIR_DS"])
            assert data_dir.is_relative_to(tmp_path / f"node{r}")
            for name in s["file_list"]:
                i = int(name.split("_a")[1][:5])
                assert (data_dir / name).read_bytes() == bytes([i]) * (1000 + i)
        report = json.loads((tmp_path / "node1" / "reports" / "launch-node001.json").read_text())
        assert report["staged_bytes"] > 0 and "staging" in report["phases"]


@pytest.mark.torch
class TestHealthGate:
    def test_failing_gate_stops_before_training(self, tmp_path, train_script):
        """GPUs on the PCI bus that CUDA cannot use: exit 3, the command never starts."""
        broken = build_nd96asr_sysfs(tmp_path / "sys")
        env = base_env(tmp_path, AMLHPC_HEALTH="gate")
        code, out = finish(start(env, "--sysfs", str(broken), "--", sys.executable, str(train_script), str(tmp_path), "0"))
        assert code == 3, out
        assert "health gate failed" in out and "CUDA sees none" in out
        assert not (tmp_path / "seen-0.json").exists()
        assert (tmp_path / "reports" / "health" / "health-summary.json").exists()

    def test_cpu_machine_passes_the_gate(self, tmp_path, train_script):
        env = base_env(tmp_path, AMLHPC_HEALTH="gate")
        code, out = finish(start(env, "--", sys.executable, str(train_script), str(tmp_path), "0"))
        assert code == 0, out
        assert (tmp_path / "seen-0.json").exists()
