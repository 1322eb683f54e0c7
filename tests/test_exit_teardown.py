"""A workload's process group goes away with its threads before the interpreter finalizes.

A gloo group's worker threads stop when the group object is freed, not when
destroy_process_group() returns; a group still alive as the interpreter finalizes could
abort a rank that had finished its training (SIGABRT, exit 134). These tests look at the
threads themselves (Linux /proc/self/task), which is deterministic, rather than waiting for
the abort, which is a race (bench/exit_abort.py counts that)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from jobs.workloads import common  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# Registered before the workload's own exit handler, so it runs after the teardown.
PROBE = (
    "import atexit, os\n"
    "from jobs.workloads import common\n"
    "atexit.register(lambda: os.write(1, f'rank {os.environ.get(\"RANK\")} gloo threads at exit: '\n"
    "                                   f'{common.gloo_threads() or None}\\n'.encode()))\n"
)


def test_no_gloo_thread_outlives_a_ddp_workload(tmp_path):
    """Two ranks wrap a model in DDP (which imports torch.distributed.nn.functional, whose
    default arguments would hold the group) and train a step: at exit, no gloo thread is left."""
    script = tmp_path / "ddp.py"
    script.write_text(PROBE + (
        "import torch\n"
        "def main():\n"  # as the workloads do: the model lives in main's frame
        "    d = common.init_distributed()\n"
        "    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))\n"
        "    model(torch.ones(2, 8)).sum().backward()\n"
        "    assert common.gloo_threads(), 'the group runs gloo threads while it is alive'\n"
        "main()\n"
    ))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(line for line in proc.stdout.splitlines() if "gloo threads at exit" in line) == [
        "rank 0 gloo threads at exit: None", "rank 1 gloo threads at exit: None"], proc.stdout
    assert "still running after destroy_process_group" not in proc.stderr


def test_a_group_held_by_a_default_argument_is_named(tmp_path):
    """A function defined after the group exists with `group=dist.group.WORLD` keeps it (and its
    threads) alive past destroy_process_group: the teardown says so and names the function."""
    script = tmp_path / "held.py"
    script.write_text(PROBE + (
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo', init_method=f'file://{os.environ[\"STORE\"]}', rank=0, world_size=1)\n"
        "def keeps(group=dist.group.WORLD):\n"
        "    return group\n"
        "common._leave_process_group()\n"
    ))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RANK": "0", "STORE": str(tmp_path / "store")}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "still running after destroy_process_group: __main__.keeps holds the group" in proc.stderr
    assert "rank 0 gloo threads at exit: ['gloo_tcp_loop', 'pt_gloo_runloop'" in proc.stdout


def test_gloo_threads_reads_thread_names(tmp_path):
    for task, name in (("100", "python"), ("101", "pt_gloo_runloop"), ("102", "gloo_tcp_loop"), ("103", "pt_gloo_runloop")):
        (tmp_path / task).mkdir()
        (tmp_path / task / "comm").write_text(name + "\n")
    (tmp_path / "104").mkdir()  # a thread that ended while we looked: no comm file
    assert common.gloo_threads(tmp_path) == ["gloo_tcp_loop", "pt_gloo_runloop", "pt_gloo_runloop"]
    assert common.gloo_threads(tmp_path / "absent") == []
