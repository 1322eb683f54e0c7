"""amlhpc.jobs.workloads.synthetic: lockstep steps, checkpoints, resume and progress reports,
with real processes (two ranks over a local socket)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from amlhpc.jobs.local.azurite import free_port

REPO = Path(__file__).resolve().parent.parent


def start(tmp_path: Path, rank: int, world: int, port: int, *args: str, **env: str) -> subprocess.Popen:
    environ = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONPATH": str(REPO),
               "AMLHPC_CHECKPOINT_DIR": str(tmp_path / f"ckpt{rank}"),
               "AMLHPC_PROGRESS_FILE": str(tmp_path / f"progress-{rank}.json"), **env}
    return subprocess.Popen([sys.executable, "-m", "amlhpc.jobs.workloads.synthetic", "--step-s", "0", "--checkpoint-every", "5",
                             "--output-dir", str(tmp_path / "out"), *args], env=environ, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_ranks_in_lockstep_then_resume(tmp_path):
    port = free_port()
    ranks = [start(tmp_path, r, 2, port, "--steps", "12") for r in (0, 1)]
    outs = [p.communicate(timeout=60)[0] for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], outs
    assert sorted(p.name for p in (tmp_path / "ckpt0").iterdir()) == ["ckpt-000000005.json", "ckpt-000000010.json"]
    assert not (tmp_path / "ckpt1").exists() or not list((tmp_path / "ckpt1").iterdir()), "rank 0 writes"
    assert json.loads((tmp_path / "out" / "aml-hpc" / "metrics.json").read_text())["steps"] == 12
    assert json.loads((tmp_path / "progress-1.json").read_text())["step"] == 12

    again = start(tmp_path, 0, 1, free_port(), "--steps", "14", AMLHPC_RESUME_DIR=str(tmp_path / "ckpt0"))
    out, _ = again.communicate(timeout=60)
    assert again.returncode == 0 and "(step 10)" in out, out
    report = json.loads((tmp_path / "progress-0.json").read_text())
    assert (report["resumed_from"], report["first_step"], report["step"]) == (10, 10, 14)


def test_a_rank_that_goes_away_fails_the_others(tmp_path):
    port = free_port()
    hub = start(tmp_path, 0, 2, port, "--steps", "1000", "--step-s", "0.05")
    peer = start(tmp_path, 1, 2, port, "--steps", "1000", "--step-s", "0.05")
    deadline = time.monotonic() + 30
    progress = tmp_path / "progress-0.json"
    while time.monotonic() < deadline and not (progress.exists() and json.loads(progress.read_text())["step"] >= 2):
        time.sleep(0.05)  # both ranks are stepping together
    peer.kill()
    out, _ = hub.communicate(timeout=60)
    peer.communicate(timeout=10)
    assert hub.returncode == 1 and "a rank left" in out, out


def test_the_global_batch_is_kept_on_another_world_and_must_divide(tmp_path):
    """Resumed on one rank with the same --global-batch, it takes the whole batch itself; a
    batch the ranks cannot share is refused (exit 2)."""
    alone = start(tmp_path, 0, 1, free_port(), "--steps", "3", "--global-batch", "4")
    out, _ = alone.communicate(timeout=60)
    assert alone.returncode == 0, out
    summary = json.loads((tmp_path / "out" / "aml-hpc" / "metrics.json").read_text())
    assert (summary["world_size"], summary["global_batch"], summary["per_rank"]) == (1, 4, 4)
    odd = start(tmp_path, 0, 2, free_port(), "--steps", "3", "--global-batch", "3")  # refused before it meets a peer
    out, _ = odd.communicate(timeout=60)
    assert odd.returncode == 2 and "--global-batch 3 is not a multiple of the world size 2" in out, out
