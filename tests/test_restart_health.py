"""A node that is broken when an in-job restart comes takes no part in it, and no node waits
forever for a process that will not die: the quick pre-restart health check
(amlhpc/jobs/runtime/health/quick.py) on fake NVML, sysfs and kernel log; the restart
agreement with one node failing it (through its fault point) on a MemoryStore; the bound on
the wait after SIGKILL (amlhpc/jobs/runtime/launch/reap.py) on a fake process handle and a
virtual clock, and in a real launcher through its fault point; and how the managed run's
classifier names those nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from amlhpc.jobs.managed.classify import classify
from amlhpc.jobs.managed.observation import Observation
from amlhpc.jobs.runtime.base import clock, faultpoints
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from amlhpc.jobs.runtime.health import quick
from amlhpc.jobs.runtime.health.tools import Tools
from amlhpc.jobs.runtime.launch import reap, restart
from tests.fake_nvml import FakeGpu, FakeNvml, NVMLError
from tests.fake_sysfs import ib_port
from tests.launcher_nodes import node_env, start_launchers
from tests.managed_fakes import end
from tests.virtual_clock import VirtualClock

REPO = Path(__file__).resolve().parents[1]
XID = "[Sat Nov 28 10:00:00 2026] NVRM: Xid (PCI:0000:0b:00): 79, pid=1234, GPU has fallen off the bus."


def tools(log: str = "") -> Tools:
    return Tools(run=lambda command, timeout: (0, log), read=lambda path: None, which=lambda name: None,
                 now=lambda: time.mktime(time.strptime("2026-11-28 10:05", "%Y-%m-%d %H:%M")))


def sysfs(tmp_path: Path, state: str = "4: ACTIVE", rate: str = "200 Gb/sec (4X HDR)") -> Path:
    root = tmp_path / "sys"
    for hca in range(2):
        ib_port(root, f"mlx5_ib{hca}", state=state if hca == 1 else "4: ACTIVE", rate=rate if hca == 1 else
                "200 Gb/sec (4X HDR)")
    return root


class LostGpu(FakeNvml):
    """GPU 1 fell off the bus: its handle still answers, any query NVML_ERROR_GPU_IS_LOST (15)."""

    def nvmlDeviceGetMemoryInfo(self, gpu):
        if gpu.bus_id.endswith("01:00.0"):
            raise NVMLError(15)
        return type("Memory", (), {"used": 0, "total": 1 << 30})()


def gpus() -> list[FakeGpu]:
    return [FakeGpu(f"00000000:0{i}:00.0") for i in range(2)]


class TestQuickCheck:
    def start(self, tmp_path, log: str = "") -> quick.Baseline:
        return quick.baseline(sysfs(tmp_path), nvml_module=FakeNvml(gpus()), tools=tools(log))

    def test_a_node_unchanged_since_the_start_is_healthy(self, tmp_path):
        start = self.start(tmp_path, XID)
        assert start.gpus == ("00000000:00:00.0", "00000000:01:00.0") and set(start.ports) == {"mlx5_ib0/1", "mlx5_ib1/1"}
        assert quick.before_restart(start, sysfs(tmp_path), nvml_module=FakeNvml(gpus()), tools=tools(XID)) == [], \
            "an XID already in the log at the start is not news"

    def test_a_gpu_off_the_bus_fails(self, tmp_path):
        start = self.start(tmp_path)
        failed = quick.before_restart(start, sysfs(tmp_path), nvml_module=LostGpu(gpus()), tools=tools())
        assert [r.check for r in failed] == ["gpu"] and "fell off the bus" in failed[0].detail

    def test_a_gpu_gone_from_nvml_fails(self, tmp_path):
        start = self.start(tmp_path)
        failed = quick.before_restart(start, sysfs(tmp_path), nvml_module=FakeNvml(gpus()[:1]), tools=tools())
        assert [r.check for r in failed] == ["gpu"] and "00000000:01:00.0 seen at the start are gone" in failed[0].detail

    def test_a_new_critical_xid_fails(self, tmp_path):
        start = self.start(tmp_path)
        failed = quick.before_restart(start, sysfs(tmp_path), nvml_module=FakeNvml(gpus()), tools=tools(XID))
        assert [r.check for r in failed] == ["xid"] and "Xid (PCI:0000:0b:00): 79" in failed[0].detail

    @pytest.mark.parametrize("state, rate, why", [("1: DOWN", "200 Gb/sec (4X HDR)", "now state DOWN"),
                                                  ("4: ACTIVE", "100 Gb/sec (4X EDR)", "trained down from 200 Gb/s")])
    def test_a_fabric_port_down_or_slower_fails(self, tmp_path, state, rate, why):
        start = self.start(tmp_path)
        later = sysfs(tmp_path / "later", state=state, rate=rate)
        failed = quick.before_restart(start, later, nvml_module=FakeNvml(gpus()), tools=tools())
        assert [(r.check, r.subject) for r in failed] == [("infiniband", "mlx5_ib1/1")] and why in failed[0].detail

    def test_what_cannot_be_read_is_skipped_on_a_cpu_machine(self, tmp_path):
        start = quick.baseline(tmp_path / "no-sys", nvml_module=FakeNvml([], init_error=9), tools=tools())
        assert quick.before_restart(start, tmp_path / "no-sys", nvml_module=FakeNvml([], init_error=9),
                                    tools=tools()) == []

    def test_the_fault_point_fails_the_check(self, tmp_path):
        start = quick.Baseline()
        with faultpoints.injected("restart.health-check", faultpoints.raising("GPU 3 off the bus"),
                                  when=lambda node: node == 1):
            assert quick.before_restart(start, tmp_path, node=0, tools=tools()) == []
            failed = quick.before_restart(start, tmp_path, node=1, tools=tools())
        assert [r.check for r in failed] == ["fault"] and "GPU 3 off the bus" in failed[0].detail


def version(step: int) -> dict:
    return {"name": f"step-{step:09d}", "step": step, "tag": "t0"}


class TestAgreement:
    """Three nodes restart after a failure; node 1's pre-restart check fails (fault point)."""

    def run(self, tmp_path, delays: dict[int, float]) -> tuple[dict[int, restart.Decision], list[int]]:
        store, applied, found = MemoryStore(), [], {}

        def check(node: int):
            failed = quick.before_restart(quick.Baseline(), tmp_path, node=node, tools=tools())
            return {"host": f"node{node}-host", "check": failed[0].check, "message": failed[0].detail} if failed else None

        def play(node: int) -> None:
            time.sleep(delays.get(node, 0.0))
            channel = Channel(store, node=node, nodes=3, base_poll_s=0.01)
            hooks = restart.Hooks(report=lambda: {"versions": [version(4)]},
                                  apply=lambda d: (applied.append(node), d)[1], check=lambda: check(node))
            c = restart.Coordinator(generation=0, node=node, nodes=3, local_size=1,
                                    records=restart.NodeRecords(tmp_path / f"node{node}", 0),
                                    shared=restart.JobAgreement(channel, 0), limit=2, agree_s=30.0, hooks=hooks)
            c.failure = {"node": 2, "local_rank": 0, "cause": "exit", "status": 1}
            found[node] = c._outcome({0: {"status": 1, "cause": "exit"}})

        with faultpoints.injected("restart.health-check", faultpoints.raising("Xid 79: GPU has fallen off the bus"),
                                  when=lambda node: node == 1):
            threads = [threading.Thread(target=play, args=(k,)) for k in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        return found, applied

    @pytest.mark.parametrize("late", [0, 1], ids=["the sick node first", "the sick node last"])
    def test_a_node_that_fails_its_check_never_gets_the_restart(self, tmp_path, late):
        """Before: there was no check; node 1 restarted on its broken GPU with the others."""
        found, applied = self.run(tmp_path, {late: 0.3})
        assert set(found) == {0, 1, 2} and applied == [], "no node applied a restart"
        assert {d.result for d in found.values()} == {"end"}
        assert {d.exit_code for d in found.values()} == {ExitCode.RESTART_HEALTH}
        for decision in found.values():
            assert decision.unhealthy is not None and decision.unhealthy["node"] == 1
            assert decision.unhealthy["host"] == "node1-host" and decision.unhealthy["check"] == "fault"
            assert "node 1 (node1-host) failed the health check before the in-job restart" in decision.reason

    def test_decide_ends_on_an_unhealthy_report(self):
        who = {"node": 2, "host": "h2", "check": "xid", "message": "Xid 79"}
        reports = {0: {"versions": [version(4)]}, 1: {"versions": [version(4)]}, 2: {"versions": [], "unhealthy": who}}
        decision = restart.decide(0, 2, 3, reports, {}, False)
        assert decision is not None and (decision.result, decision.exit_code) == ("end", ExitCode.RESTART_HEALTH)
        assert decision.unhealthy == who


# Two nodes; rank 0 fails its first run, rank 1 waits to be stopped; a restarted run only says it ran.
TRAIN = r"""
import os, sys, time
from pathlib import Path
shared, rank, gen = Path(sys.argv[1]), os.environ["RANK"], os.environ["AMLHPC_RESTART_GENERATION"]
(shared / f"ran-rank{rank}-g{gen}").write_text("1")
if gen == "0":
    if rank == "0":
        sys.exit(1)
    time.sleep(120)
"""


@pytest.mark.slow
@pytest.mark.azurite
def test_a_launcher_that_fails_its_pre_restart_check_ends_the_job_without_a_restart(tmp_path, azurite, container):
    """Real launchers of two nodes with in-job restarts on: node 0's training fails, node 1's
    check fails (its fault point, armed in node 1's launcher only): no node runs the command
    again, both end with exit 13, and each one's report names node 1 and the check."""
    script, shared = tmp_path / "train.py", tmp_path / "shared"
    script.write_text(TRAIN)
    shared.mkdir()

    def env_of(node: int) -> dict[str, str]:
        env = node_env(tmp_path, node, "r-health", "restart/health", azurite, container)
        if node == 1:
            env.update({faultpoints.ENV_POINTS: "restart.health-check=error",
                        faultpoints.ENV_LOG: str(tmp_path / "fired-1")})
        return env

    procs = start_launchers(2, env_of, [sys.executable, str(script), str(shared)])
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [ExitCode.RESTART_HEALTH] * 2, "\n".join(o[-3000:] for o in outs)
    assert sorted(p.name for p in shared.iterdir()) == ["ran-rank0-g0", "ran-rank1-g0"], "nobody ran it again"
    assert faultpoints.fired_in_log(tmp_path / "fired-1") == ["restart.health-check"]
    for node in range(2):
        report = json.loads((tmp_path / f"node{node}" / "reports" / f"launch-node{node:03d}.json").read_text())
        assert report["restarts"] == [] and report["exit_code"] == ExitCode.RESTART_HEALTH
        assert report["unhealthy"]["node"] == 1 and report["unhealthy"]["check"] == "fault"
        assert "node 1" in report["error"] and "failed the health check before the in-job restart" in report["error"]


class Stuck:
    """A process handle whose wait never returns (a process in uninterruptible sleep)."""

    pid = 4242

    def __init__(self, exits_after: int | None = None):
        self.calls, self.exits_after = 0, exits_after

    def wait(self, timeout=None):
        self.calls += 1
        if self.exits_after is not None and self.calls >= self.exits_after:
            return -9
        clock.sleep(timeout or 0)
        raise subprocess.TimeoutExpired("train", timeout)


@pytest.fixture
def virtual():
    v = VirtualClock()
    with clock.use(v):
        yield v


class TestKillWait:
    def test_a_process_that_outlives_its_sigkill_is_given_up_after_the_bound(self, virtual):
        """Before: `child.wait()` without a bound: the launcher waited forever."""
        kills, child = reap.Kills(), Stuck()
        kills.note("stopped for an in-job restart")
        with pytest.raises(reap.Unreaped) as raised:
            reap.wait(child, kills, bound_s=30.0)
        assert 30.0 < raised.value.waited_s <= 30.0 + 2 * reap.LOOK_S
        assert "pid 4242" in str(raised.value) and "stopped for an in-job restart" in str(raised.value)
        assert "uninterruptible sleep" in str(raised.value) and "the node is lost" in str(raised.value)

    def test_without_a_sigkill_the_wait_has_no_bound(self, virtual):
        child = Stuck(exits_after=10_000)  # 5,000 s of looks
        assert reap.wait(child, reap.Kills(), bound_s=30.0) == -9 and virtual.now >= 1000 + 4999

    def test_a_process_that_dies_within_the_bound_is_reaped(self, virtual):
        kills = reap.Kills()
        kills.note("grace")
        assert reap.wait(Stuck(exits_after=20), kills, bound_s=30.0) == -9

    def test_the_launcher_reports_the_node_lost(self, tmp_path):
        """A real launcher, a command that ignores SIGTERM, SIGKILL after --term-grace, and the
        `launch.reaped` fault point making the killed command one that never exits."""
        script = tmp_path / "train.py"
        script.write_text("import signal, time, pathlib, sys\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          "pathlib.Path(sys.argv[1]).write_text('1')\ntime.sleep(120)\n")
        ready = tmp_path / "ready"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AMLHPC_", "RANK", "LOCAL_", "WORLD", "MASTER"))}
        env.update({"AMLHPC_RUN_ID": "t-reap", "AMLHPC_REPORT_DIR": str(tmp_path / "reports"),
                    "AMLHPC_SCRATCH": str(tmp_path / "scratch"), "AMLHPC_HEALTH": "off",
                    faultpoints.ENV_POINTS: "launch.reaped=error", faultpoints.ENV_LOG: str(tmp_path / "fired")})
        proc = subprocess.Popen([sys.executable, "-m", "amlhpc.jobs.runtime.launch", "--term-grace", "0.5",
                                 "--kill-wait", "1", "--", sys.executable, str(script), str(ready)], env=env, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == ExitCode.NODE_LOST, out
        assert "did not exit" in out and "after SIGKILL (0.5s after SIGTERM)" in out and "the node is lost" in out
        assert faultpoints.fired_in_log(tmp_path / "fired") == ["launch.reaped"]
        report = json.loads((tmp_path / "reports" / "launch-node000.json").read_text())
        assert report["exit_code"] == ExitCode.NODE_LOST and report["lost"]["after"] == "0.5s after SIGTERM"


class TestClassified:
    RUNNING_THEN_FAILED = Observation("Failed", "UserError", "exit 13")

    def test_the_unhealthy_node_alone_is_distrusted(self):
        who = {"node": 1, "host": "node1-host", "check": "xid", "message": "Xid 79"}
        ends = {n: end(ExitCode.RESTART_HEALTH, node=n, unhealthy=who, error="node 1 failed the health check")
                for n in range(3)}
        verdict = classify(self.RUNNING_THEN_FAILED, ends, 3)
        assert verdict.cause == "health_gate" and verdict.retryable(("health_gate",))
        assert verdict.bad_nodes == ({"node": 1, "host": "node1-host", "why": "pre-restart health check (xid)"},)

    def test_a_node_with_an_unreaped_process_is_lost_and_distrusted(self):
        lost = {"node": 2, "pid": 77, "waited_s": 31.0, "after": "stopped for an in-job restart"}
        ends = {0: end(ExitCode.NODE_LOST, node=0), 1: end(ExitCode.NODE_LOST, node=1),
                2: end(ExitCode.NODE_LOST, node=2, lost=lost)}
        verdict = classify(self.RUNNING_THEN_FAILED, ends, 3)
        assert verdict.cause == "node_failure" and verdict.exit_code == ExitCode.NODE_LOST
        assert verdict.bad_nodes == ({"node": 2, "host": "node2-host", "why": "process not reaped after SIGKILL"},)
