"""Nothing a rehearsal starts outlives it: a real `jobs run cosmoflow --local` is interrupted
mid-training (SIGINT as Ctrl-C sends it, and SIGTERM) and afterwards no process of the run
is alive - Azurite, launchers, training commands, each in a session of its own - and no port
it listened on is still bound. A failing rank stops the others. Found through /proc: every
process of a run carries the run's AMLHPC_LOCAL_SESSION in its environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from amlhpc.jobs.local import processes, rehearsal
from amlhpc.jobs.runtime.base import contract
from tests.jobs_helpers import outputs_file

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads the process table from /proc (Linux)")


def session_processes(session: str) -> dict[int, str]:
    """Live processes whose environment carries AMLHPC_LOCAL_SESSION=session: pid -> command line."""
    found = {}
    marker = f"{processes.SESSION_VARIABLE}={session}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if marker not in Path(entry.path, "environ").read_bytes().split(b"\0"):
                continue
            state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z":
            found[int(entry.name)] = command
    return found


def listening_ports(pids) -> set[int]:
    """TCP ports in LISTEN state whose socket one of `pids` holds."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    return {port for port, inode in _listening() if inode in inodes}


def _listening() -> list[tuple[int, str]]:
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                rows.append((int(fields[1].rsplit(":", 1)[1], 16), fields[9]))
    return rows


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.mark.slow
@pytest.mark.parametrize("signum,nodes", [(signal.SIGINT, 1), (signal.SIGTERM, 2)], ids=["SIGINT", "SIGTERM"])
def test_interrupt_mid_training_leaves_nothing_behind(signum, nodes, tmp_path):
    session = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in (contract.BLOB_CONNECTION_STRING, "PYTHONPATH")}
    env.update({processes.SESSION_VARIABLE: session, "COLUMNS": "200", "AMLHPC_AZURITE_DIR": str(tmp_path / "azurite")})
    argv = [sys.executable, "-m", "amlhpc.jobs", "run", "cosmoflow", "--local", "--nodes", str(nodes), "--procs-per-node", "1",
            "--outputs", str(outputs_file("dev")), "--workdir", str(tmp_path / "work"), "--name", f"interrupt-{session[:6]}",
            "--set", "health=off", "--set", f"inputs.cosmoflow.path=interrupt/{session[:8]}",
            # long enough that the signal always lands while it trains
            "--set", "command=python -m amlhpc.jobs.workloads.cosmoflow.train --input cosmoflow --epochs 500 --batch-size 2 "
                     "--conv-size 4 --n-conv-layers 3 --fc1 16 --fc2 8 --workers 0 --log-every 1"]
    cli = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        for line in cli.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        def training():
            if cli.poll() is not None:
                raise AssertionError(f"the rehearsal ended early ({cli.returncode}):\n" + "".join(lines)[-3000:])
            running = session_processes(session)
            trainers = [pid for pid, cmd in running.items() if cmd.split()[1:3] == ["-m", "amlhpc.jobs.workloads.cosmoflow.train"]]
            return running if len(trainers) == nodes and any('"loss"' in line for line in lines) else None

        before = wait_for(training, 240, "both training processes to log a loss")
        commands = " | ".join(before.values())
        assert "azurite-blob" in commands
        assert sum(cmd.split()[1:3] == ["-m", "amlhpc.jobs.runtime.launch"] for cmd in before.values()) == nodes
        sessions = {os.getsid(pid) for pid in before if pid in session_processes(session)}
        assert len(sessions) >= 2 + 2 * nodes, "the CLI, Azurite, each launcher and each training command: sessions of their own"
        ports = listening_ports(before)
        assert ports, "Azurite and the rendezvous listen on ports"

        os.kill(cli.pid, signum)
        code = cli.wait(timeout=90)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
    reader.join(timeout=10)
    output = "".join(lines)
    assert code == 128 + signum, output[-3000:]
    assert f"rehearsal interrupted ({signal.Signals(signum).name})" in output
    assert session_processes(session) == {}, "every process of the run has exited"
    still = {port for port, _ in _listening()} & ports
    assert not still, f"ports still listening: {sorted(still)}"


def test_a_failing_rank_stops_the_others(tmp_path, monkeypatch):
    """Rank 1 fails at once; rank 0 (and the child it started in a session of its own) would
    run for minutes: after the failure grace both are stopped and the codes say so."""
    monkeypatch.setattr(rehearsal, "FAILURE_GRACE_S", 0.5)
    script = ('if [ "$RANK" = 1 ]; then exit 3; fi; '
              'setsid sleep 300 & echo child $!; exec sleep 300')
    plan = SimpleNamespace(distribution="pytorch", command=script)
    folders = [tmp_path / "node0", tmp_path / "node1"]
    for folder in folders:
        (folder / "scratch").mkdir(parents=True)
    seen: list[str] = []
    started = time.monotonic()
    with processes.supervised(grace_s=5):
        codes = rehearsal.run_processes(plan, folders, dict(os.environ), procs_per_node=1,
                                        sink=lambda proc, line: seen.append(line), timeout_s=120)
        child = int(next(line.split()[1] for line in seen if line.startswith("child ")))
    assert codes[1] == 3 and codes[0] == -signal.SIGTERM, codes
    assert time.monotonic() - started < 60
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1][:3], \
        "the grandchild in its own session was stopped by the supervisor"


def test_descendants_follow_parent_links_across_sessions():
    parent = subprocess.Popen(["bash", "-c", "setsid sleep 30 & wait"], start_new_session=True)
    try:
        def in_its_own_session() -> bool:
            # bash forks first and the child calls setsid after: until then it is in bash's session
            found = processes.descendants(parent.pid)
            return len(found) == 1 and os.getsid(found[0]) != os.getsid(parent.pid)

        wait_for(in_its_own_session, 10, "the grandchild in its own session")
        (grandchild,) = processes.descendants(parent.pid)
        assert grandchild in processes.descendants()
    finally:
        for pid in processes.descendants(parent.pid):
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()


def test_interrupted_carries_the_shell_exit_status():
    assert processes.Interrupted(signal.SIGINT).exit_code == 130
    assert processes.Interrupted(signal.SIGTERM).exit_code == 143
    assert isinstance(processes.Interrupted(signal.SIGTERM), KeyboardInterrupt)
