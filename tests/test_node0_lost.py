"""Losing node 0 ends the job with a clear cause: its launcher hosts the job's coordination store,
so when it dies (its host lost, the process killed) every other node's launcher stops its
training at once and exits 10 (ExitCode.NODE_LOST) saying node 0 is gone, as losing any host
ends an Azure ML job (the managed run resubmits it). Two launchers of two simulated nodes,
coordinating through a real TCPStore across processes, and the local rehearsal the same way."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.coord import kvstore
from amlhpc.jobs.runtime.coord.jobstore import reserve
from tests.test_managed_rehearsal import world  # noqa: F401,F811 - the fixture: the rehearsal's containers and snapshot

REPO = Path(__file__).resolve().parents[1]
TRAIN = ("import sys, time\nfrom amlhpc.jobs.runtime.base import progress\n"
         "for step in range(1, 600):\n    progress.report(step)\n    print('step', step, flush=True)\n    time.sleep(0.2)\n")


def launcher(tmp_path: Path, node: int, run_id: str, listener, script: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMLHPC_", "RANK", "LOCAL_", "WORLD", "MASTER"))}
    env.update({"AMLHPC_RUN_ID": run_id, "AMLHPC_HEALTH": "off", "AMLHPC_PIN": "off", "AMLHPC_STANDBY": "off",
                "AMLHPC_SCRATCH": str(tmp_path / f"node{node}"), "AMLHPC_REPORT_DIR": str(tmp_path / f"reports{node}"),
                "RANK": str(node), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
                "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
                "AMLHPC_COORD_PORT": str(listener.getsockname()[1]), "AMLHPC_COORD_GRACE_S": "5"})
    inherit: tuple[int, ...] = ()
    if node == 0:
        env["AMLHPC_COORD_LISTEN_FD"] = str(listener.fileno())
        inherit = (listener.fileno(),)
    return subprocess.Popen([sys.executable, "-m", "amlhpc.jobs.runtime.launch", "--term-grace", "2", "--",
                             sys.executable, str(script)], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, pass_fds=inherit, start_new_session=True)


def test_a_killed_node_0_ends_the_other_nodes_with_exit_10(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    listener = reserve(0, "127.0.0.1")
    run_id = f"lost-{uuid.uuid4().hex[:6]}"
    nodes = [launcher(tmp_path, k, run_id, listener, script) for k in (0, 1)]
    listener.close()
    lines: list[str] = []
    training = threading.Event()

    def pump() -> None:
        assert nodes[1].stdout is not None
        for line in nodes[1].stdout:
            lines.append(line)
            if line.startswith("step 3"):
                training.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert training.wait(120), "".join(lines)
        os.killpg(nodes[0].pid, signal.SIGKILL)  # node 0's host is gone: its launcher, and the store, with it
        killed_at = time.monotonic()
        assert nodes[1].wait(timeout=120) == ExitCode.NODE_LOST, "".join(lines)
        assert time.monotonic() - killed_at < 30, "node 1 noticed within its grace (5 s) and its next looks"
    finally:
        for proc in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(10)
    text = "".join(lines)
    assert "node 0 is gone" in text and "coordination store stopped answering" in text, text
    assert "the job ends" in text and "Traceback" not in text
    # The grace is checked after each try, and a try to connect waits up to its own timeout:
    # 5 s of grace end well before the default's 30 s.
    waited = re.search(r"stopped answering for (\d+)s", text)
    assert waited and int(waited.group(1)) < kvstore.RECONNECT_GRACE_S, f"AMLHPC_COORD_GRACE_S=5 not kept: {text}"


@pytest.mark.slow
@pytest.mark.azurite
def test_the_rehearsal_ends_with_node_0s_loss_named(world):  # noqa: F811 - the imported fixture
    """`jobs run --local`'s processes coordinate through node 0's TCPStore; node 0's processes are
    killed mid-training: node 1's launcher says node 0 is gone and exits 10, within the grace the
    rehearsal gives the others (as Azure ML ends a job that lost a host)."""
    from amlhpc.jobs.local import rehearsal
    from tests.test_managed_rehearsal import PROCS, common, plan

    name = f"lost-{uuid.uuid4().hex[:6]}"
    _, _, job = plan(name, "command=python -m amlhpc.jobs.workloads.synthetic --steps 600 --step-s 0.1 --checkpoint-every 50")
    lines: list[str] = []
    procs: list = []

    def kill_node_0() -> None:
        for proc in procs:
            if proc.node == 0:
                os.killpg(proc.process.pid, signal.SIGKILL)

    def sink(proc, line: str) -> None:
        lines.append(f"n{proc.node}: {line}")
        if proc.node == 1 and "starting: " in line:
            threading.Timer(2.0, kill_node_0).start()

    kwargs = {**common(world, world["root"] / name, lines), "sink": sink}
    result = rehearsal.rehearse(job, started=procs.extend, stop_grace_s=60, **kwargs)
    text = "\n".join(lines)
    assert result.exit_codes[1 * PROCS] == ExitCode.NODE_LOST, text[-4000:]
    assert "n1: [launch rank 1] the job ends: node 0 is gone" in text, text[-4000:]


def test_node_0_whose_store_port_is_taken_stops_at_once_with_exit_2(tmp_path):
    """The port is bound as node 0's first act: one in use is named with the variable that moves
    it, before staging or anything else ran (never an EADDRINUSE in the middle of the job)."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AMLHPC_", "RANK", "LOCAL_", "WORLD", "MASTER"))}
        env.update({"AMLHPC_RUN_ID": "taken", "AMLHPC_SCRATCH": str(tmp_path), "AMLHPC_REPORT_DIR": str(tmp_path),
                    "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "PYTHONPATH": str(REPO),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "AMLHPC_COORD_PORT": str(port),
                    "AMLHPC_STAGE_JSON": '[{"name": "d", "container": "c", "prefix": "p", "mode": "local"}]'})
        done = subprocess.run([sys.executable, "-m", "amlhpc.jobs.runtime.launch", "--", "true"], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert f"port {port} on node 0 is in use" in done.stderr and "AMLHPC_COORD_PORT" in done.stderr
    assert "staging" not in done.stderr.lower() and "Traceback" not in done.stderr
