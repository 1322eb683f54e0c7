"""A launch never inherits an earlier launch's node-local records: the restart records
(stop.json, the exit records) and the restore and restart-outcome barriers carry the launch
generation (amlhpc/jobs/runtime/base/launchid.py), so a next launch with the same run id on the same
node is not SIGKILLed by the earlier one's stop request, nor released with its answers."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.coord.nodebarrier import BarrierTimeout, NodeBarrier
from amlhpc.jobs.runtime.launch import restart
from amlhpc.jobs.runtime.launch.launcher import Launcher, parse_options
from tests.launcher_nodes import REPO, node_env


def launcher(tmp_path: Path, launch_id: str) -> Launcher:
    env = {"AMLHPC_RUN_ID": "same-run", "AMLHPC_LAUNCH_ID": launch_id, "AMLHPC_SCRATCH": str(tmp_path),
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    return Launcher(parse_options(["--", "true"], env), env)


def test_records_and_barriers_are_per_launch(tmp_path):
    earlier, now = launcher(tmp_path, "launch-1"), launcher(tmp_path, "launch-2")
    assert earlier.launch != now.launch and earlier._dir("restart") != now._dir("restart")
    restart.NodeRecords(earlier._dir("restart"), 0).request_stop({"node": 0, "cause": "exit"})
    assert restart.NodeRecords(now._dir("restart"), 0).stop_requested() is None
    done = NodeBarrier(earlier._dir("restore"), 5, "same-run", generation=earlier.launch)
    done.lead()
    done.succeed({"checkpoint_dir": "/elsewhere", "version": "old", "resume": None})
    with pytest.raises(BarrierTimeout):
        NodeBarrier(now._dir("restore"), 0.3, "same-run", generation=now.launch).wait()


@pytest.mark.slow
@pytest.mark.azurite
def test_a_next_launch_is_not_stopped_by_the_earlier_ones_stop_request(tmp_path, azurite, container):
    """Launch 1 fails twice (one in-job restart, then spent): its stop requests stay on the node.
    Launch 2, same run id, same node, runs to its end (it was SIGKILLed within 1.5 s)."""
    prefix = f"gen/{uuid.uuid4().hex[:6]}"
    settings = {"local_restarts": 1}

    def launch(launch_id: str, command: str) -> subprocess.CompletedProcess:
        env = node_env(tmp_path, 0, "same-run", prefix, azurite, container, WORLD_SIZE="1", AMLHPC_LAUNCH_ID=launch_id)
        env["AMLHPC_CHECKPOINT_JSON"] = json.dumps({**json.loads(env["AMLHPC_CHECKPOINT_JSON"]), **settings})
        return subprocess.run([sys.executable, "-m", "amlhpc.jobs.runtime.launch", "--term-grace", "2", "--",
                               sys.executable, "-c", command], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=180)

    first = launch("launch-1", "import sys; sys.exit(3)")
    assert first.returncode == 11, first.stderr[-3000:]
    assert list((tmp_path / "node0" / "scratch").rglob("stop.json")), "launch 1 left its stop requests"
    second = launch("launch-2", "import time; time.sleep(3)")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "stopped for an in-job restart" not in second.stderr
