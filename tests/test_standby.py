"""The warm standby (amlhpc/jobs/runtime/launch/standby.py): which commands get one, and a standby that becomes
the command - the new environment, the command's argv, its exit status - once activated."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from amlhpc.jobs.runtime.launch.standby import Standby, standby_command, worth_keeping

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


class TestWhereAStandbyIsKept:
    """`auto` keeps one only with 2 CPUs for each rank the machine runs: a node's local ranks on
    Azure; every simulated node's in a local rehearsal, which share one machine."""

    def test_the_rule_counts_the_ranks_on_the_machine(self):
        assert worth_keeping(96, 8) and worth_keeping(2, 1)
        assert not worth_keeping(2, 2) and not worth_keeping(None, 1)

    def test_a_rehearsal_of_two_one_rank_nodes_on_two_cpus_keeps_none(self, monkeypatch):
        from amlhpc.jobs.local import rehearsal

        monkeypatch.setattr(os, "cpu_count", lambda: 2)
        monkeypatch.delenv("AMLHPC_STANDBY", raising=False)
        assert rehearsal.rehearsal_environment({}, 2)["AMLHPC_STANDBY"] == "off"
        assert rehearsal.rehearsal_environment({"AMLHPC_STANDBY": "on"}, 2)["AMLHPC_STANDBY"] == "on", "asked for"
        monkeypatch.setattr(os, "cpu_count", lambda: 16)
        assert "AMLHPC_STANDBY" not in rehearsal.rehearsal_environment({}, 4), "the launcher's auto decides"


def test_a_rehearsals_ranks_share_the_machines_cpus_between_their_threads(monkeypatch):
    """torch starts an intra-op thread per CPU in every process; the simulated nodes' ranks
    share one machine, so each gets its share (at least one), unless the caller chose."""
    from amlhpc.jobs.local import rehearsal

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert rehearsal.rehearsal_environment({}, 2)["OMP_NUM_THREADS"] == "1"
    assert rehearsal.rehearsal_environment({}, 4)["OMP_NUM_THREADS"] == "1", "never none"
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert rehearsal.rehearsal_environment({}, 4)["OMP_NUM_THREADS"] == "4"
    assert rehearsal.rehearsal_environment({"OMP_NUM_THREADS": "3"}, 4)["OMP_NUM_THREADS"] == "3", "the job's own"
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert rehearsal.rehearsal_environment({}, 4)["OMP_NUM_THREADS"] == "6", "the user's own"


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


def _handed_while_importing(folder: Path, seconds: float):
    """A standby whose preload keeps the CPU busy for `seconds` (a torch import, shorter), handed
    the run at once: (the standby, its process now the command's), before it is ready."""
    (folder / "slowpreload.py").write_text(f"import time\nend = time.process_time() + {seconds!r}\n"
                                           "while time.process_time() < end:\n    pass\n")
    script = folder / "train.py"
    script.write_text("pass\n")
    ready = folder / "ready"
    command = [sys.executable, "-m", "amlhpc.jobs.runtime.launch.standby", "--preload", "slowpreload", "--ready-file",
               str(ready), "--", str(script)]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{folder}"}
    standby = Standby(command, env, ready_file=ready)
    child = standby.activate(env)
    assert child is not None and not ready.exists(), "handed the run before it was ready"
    return standby, child


def test_a_standby_handed_the_run_while_it_still_imports_is_waited_for_while_it_works(tmp_path):
    """A fault soon after the start hands the run to a standby still importing: it is ahead of a
    cold start, so the launcher waits while its CPU time advances, past the handover limit
    (0.5 s here, against 2 s of imports)."""
    standby, child = _handed_while_importing(tmp_path, 2.0)
    assert standby.took_it(within_s=0.5, preload_wait_s=60), "taken after its imports, not given up at 0.5 s"
    assert child.wait(timeout=60) == 0


def test_a_standby_that_stops_while_it_imports_is_given_up(tmp_path):
    """Stopped before it was ready (a frozen host's process): no CPU time advances, so the
    launcher gives up the handover limit after the handover and starts cold."""
    import signal
    import time

    standby, child = _handed_while_importing(tmp_path, 30.0)
    os.killpg(child.pid, signal.SIGSTOP)
    began = time.monotonic()
    assert not standby.took_it(within_s=0.5, preload_wait_s=60)
    assert time.monotonic() - began < 5, "given up within the limit and one CPU sample, not after its imports"
    standby.discard()
