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

from amlhpc.jobs.workloads import common  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# Registered before the workload's own exit handler, so it runs after the teardown.
PROBE = (
    "import atexit, os\n"
    "from amlhpc.jobs.workloads import common\n"
    "atexit.register(lambda: os.write(1, f'rank {os.environ.get(\"RANK\")} gloo threads at exit: '\n"
    "                                   f'{common.gloo_threads() or None}\\n'.encode()))\n"
)


def run_two_ranks(script: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           str(script)], cwd=script.parent, env=env, capture_output=True, text=True, timeout=180)


def threads_at_exit(proc: subprocess.CompletedProcess) -> list[str]:
    """What PROBE printed on each rank, sorted by rank."""
    return sorted(line for line in proc.stdout.splitlines() if "gloo threads at exit" in line)


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
    proc = run_two_ranks(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert threads_at_exit(proc) == ["rank 0 gloo threads at exit: None", "rank 1 gloo threads at exit: None"], proc.stdout
    assert "still running after destroy_process_group" not in proc.stderr


def test_no_gloo_thread_outlives_fsdp_when_the_training_destroys_the_group_itself(tmp_path):
    """FSDP2 over a device mesh, and the training's own `dist.destroy_process_group()` at its
    end: the mesh still holds the group, so the exit handler releases it all the same (the abort
    a fresh-clone `make test` met in tests/test_checkpoint_versions.py's FSDP script)."""
    script = tmp_path / "fsdp.py"
    script.write_text(PROBE + (
        "import torch, torch.distributed as dist\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "def main():\n"  # as the workloads do: the model lives in main's frame
        "    d = common.init_distributed()\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))\n"
        "    mesh = init_device_mesh('cpu', (d.world,))\n"
        "    for layer in (model[0], model[1], model):\n"
        "        fully_shard(layer, mesh=mesh)\n"
        "    model(torch.ones(2, 8)).sum().backward()\n"
        "    dist.destroy_process_group()\n"
        "main()\n"
        "assert common.gloo_threads(), 'the meshes keep the destroyed group and its threads'\n"
    ))
    proc = run_two_ranks(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert threads_at_exit(proc) == ["rank 0 gloo threads at exit: None", "rank 1 gloo threads at exit: None"], proc.stdout


# Rank 0 starts an all-reduce whose completion runs a Python callback on a gloo worker thread,
# and exits. An object of __main__ is freed while the interpreter tears its modules down (after
# the exit handlers, finalization under way): it tells rank 1 to join the all-reduce now, then
# waits, the GIL released, for the callback. Rank 1 joins on that word, or after 3 s when rank 0
# never gets there because its teardown waits for the collective, as it should.
LATE_WORK = """
import os, sys, time, torch
from pathlib import Path
import torch.distributed as dist
from amlhpc.jobs.workloads import common
folder, rank = Path(sys.argv[1]), int(os.environ["RANK"])
finalizing, ran = folder / "rank0-finalizing", folder / "callback-ran"

class Finalizing:
    def __del__(self):
        finalizing.write_text("1")
        deadline = time.monotonic() + 10
        while not ran.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

d = common.init_distributed()
torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))  # as a workload does
if rank == 0:
    keeper = Finalizing()
    dist.all_reduce(torch.ones(4), async_op=True).get_future().then(lambda f: ran.write_text("1"))
    sys.exit(0)
deadline = time.monotonic() + 3
while not finalizing.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
dist.all_reduce(torch.ones(4))
"""


def test_a_gloo_thread_that_needs_python_late_does_not_abort_the_rank(tmp_path):
    """The abort itself, made to happen: a gloo worker thread that needs the GIL once the
    interpreter is finalizing is ended with pthread_exit, which std::terminate's a C++ thread
    ("terminate called without an active exception", SIGABRT). With the group freed in the exit
    handler, the work and its callback finish while the interpreter is whole: rank 0 exits 0."""
    script = tmp_path / "late.py"
    script.write_text(LATE_WORK)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           str(script), str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert "terminate called" not in proc.stderr and proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "callback-ran").exists()


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
