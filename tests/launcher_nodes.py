"""Real launchers of a job of several nodes on this machine: each node's environment (its own
scratch and report folders, checkpoints in Azurite, in-job restarts on) and the coordination
store as the rehearsal sets it (node 0 inherits the bound port)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def node_env(tmp_path: Path, node: int, run_id: str, prefix: str, azurite, container, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMLHPC_", "RANK", "LOCAL_", "WORLD", "MASTER"))}
    settings = {"container": container.container_name, "prefix": prefix, "keep": 2, "interval_s": 3600,
                "local_restarts": 2, "agree_s": 60}
    env.update({"AMLHPC_RUN_ID": run_id, "AMLHPC_HEALTH": "off", "AMLHPC_PIN": "off",
                "AMLHPC_SCRATCH": str(tmp_path / f"node{node}" / "scratch"),
                "AMLHPC_REPORT_DIR": str(tmp_path / f"node{node}" / "reports"),
                "RANK": str(node), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
                "PYTHONPATH": str(REPO), "AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string, "AMLHPC_STANDBY": "off",
                "AMLHPC_CHECKPOINT_JSON": json.dumps(settings)})
    env.update(extra)
    return env


def coordination(node: int, listener) -> tuple[dict[str, str], tuple[int, ...]]:
    """The job's coordination store as the rehearsal sets it: the port bound once, node 0 inherits it."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "AMLHPC_COORD_PORT": str(listener.getsockname()[1])}
    if node != 0:
        return env, ()
    return {**env, "AMLHPC_COORD_LISTEN_FD": str(listener.fileno())}, (listener.fileno(),)


def start_launchers(nodes: int, env_of: Callable[[int], dict[str, str]], command: list[str]) -> list[subprocess.Popen]:
    """One launcher per node running `command` (`env_of(node)`: the node's environment, see
    node_env), the coordination store's port reserved for them; their output in stdout."""
    from amlhpc.jobs.runtime.coord.jobstore import reserve

    listener = reserve(0, "127.0.0.1")
    procs = []
    for node in range(nodes):
        store_env, inherit = coordination(node, listener)
        procs.append(subprocess.Popen([sys.executable, "-m", "amlhpc.jobs.runtime.launch", "--term-grace", "2", "--",
                                       *command], env={**env_of(node), **store_env}, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, pass_fds=inherit))
    listener.close()
    return procs
