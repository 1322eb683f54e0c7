"""The warm standby (amlhpc/jobs/runtime/launch/standby.py): which commands get one, and a standby that becomes
the command - the new environment, the command's argv, its exit status - once activated."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from amlhpc.jobs.runtime.launch.standby import Standby, standby_command

REPO = Path(__file__).resolve().parents[1]


class TestWhichCommands:
    def test_python_module_and_script_commands(self):
        assert standby_command(["python", "-m", "pkg.train", "--x", "1"]) == [
            "python", "-m", "amlhpc.jobs.runtime.launch.standby", "--", "-m", "pkg.train", "--x", "1"]
        assert standby_command(["python3", "-u", "train.py", "a"], Path("/r")) == [
            "python3", "-u", "-m", "amlhpc.jobs.runtime.launch.standby", "--ready-file", "/r", "--", "train.py", "a"]

    def test_anything_else_starts_cold(self):
        for command in (["bash", "run.sh"], ["python", "-c", "print(1)"], ["python", "-m"], ["python"], []):
            assert standby_command(command) is None, command


def test_a_standby_becomes_the_command(tmp_path):
    """It waits until activated, then runs the script with the new environment only, the command's
    argv, and exits with the script's status."""
    seen = tmp_path / "seen.json"
    script = tmp_path / "train.py"
    script.write_text("import json, os, sys\n"
                      f"open({str(seen)!r}, 'w').write(json.dumps({{'argv': sys.argv, 'gen': os.environ.get('GEN'), "
                      "'old': 'OLD' in os.environ}))\n"
                      "sys.exit(int(os.environ['CODE']))\n")
    ready = tmp_path / "ready"
    command = [sys.executable, "-m", "amlhpc.jobs.runtime.launch.standby", "--preload", "json", "--ready-file", str(ready), "--",
               str(script), "a", "b"]
    standby = Standby(command, {**os.environ, "PYTHONPATH": str(REPO), "OLD": "1"})
    while not ready.exists():
        assert standby.alive, "the standby died before it was ready"
    assert not seen.exists(), "nothing of the command runs before it is activated"
    child = standby.activate({"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "GEN": "1", "CODE": "7"})
    assert child is not None and child.wait(timeout=60) == 7
    import json

    assert json.loads(seen.read_text()) == {"argv": [str(script), "a", "b"], "gen": "1", "old": False}


def test_a_discarded_standby_exits_without_running_the_command(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    command = [sys.executable, "-m", "amlhpc.jobs.runtime.launch.standby", "--preload", "", "--", str(script)]
    standby = Standby(command, {**os.environ, "PYTHONPATH": str(REPO)})
    standby.discard()
    assert not marker.exists() and not standby.alive


def test_a_stopped_standby_is_noticed_and_the_command_starts_cold(tmp_path):
    """A standby that does not take the run (stopped, as every process of a frozen host is) is
    killed, the launcher's standbys say why, and the restart starts the command cold."""
    import signal

    from amlhpc.jobs.runtime.launch import launcher

    ran = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    ready = tmp_path / "standby" / "rank-0-g1.ready"
    standbys = launcher._Standbys([sys.executable, str(script)])
    standbys._standby = Standby(standby_command(standbys.argv, ready), {**os.environ, "PYTHONPATH": str(REPO)},
                                ready_file=ready)
    while not ready.exists():
        assert standbys._standby.alive, "the standby died before it was ready"
    pid = standbys._standby.process.pid
    os.killpg(pid, signal.SIGSTOP)
    standbys.start_s = 0.5
    child = standbys.take({**os.environ, "PYTHONPATH": str(REPO)})
    assert child is None, "a cold start follows"
    assert f"the warm standby (pid {pid}) did not take the run" in (standbys.note or "")
    assert not ran.exists(), "the stopped standby never ran the command"
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, "the stopped standby is killed, not left behind"


def test_a_live_standby_takes_the_run_and_says_so(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    ready = tmp_path / "ready"
    standby = Standby(standby_command([sys.executable, str(script)], ready), {**os.environ, "PYTHONPATH": str(REPO)},
                      ready_file=ready)
    while not ready.exists():
        assert standby.alive
    child = standby.activate({**os.environ, "PYTHONPATH": str(REPO)})
    assert child is not None and standby.took_it(within_s=30) and child.wait(timeout=60) == 0
