"""The hang watchdog: the launcher stops a training command that stops making progress
(real processes and signals), and across nodes through heartbeats in Blob (Azurite)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.base import progress
from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.coord import nodestatus
from amlhpc.jobs.runtime.launch import watchdog

REPO = Path(__file__).resolve().parents[1]

# Reports a step every 0.2 s; after `stop_after` steps it either sleeps (a hang inside the
# training code) or keeps going until `total` steps.
TRAIN = r"""
import sys, time
from amlhpc.jobs.runtime.base import progress
stop_after, total = int(sys.argv[1]), int(sys.argv[2])
progress.report(0)
for step in range(1, total + 1):
    time.sleep(0.2)
    if step > stop_after:
        time.sleep(3600)
    progress.report(step)
"""


def env_for(tmp_path: Path, node: int, nodes: int, run_id: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMLHPC_", "RANK", "LOCAL_", "WORLD", "MASTER"))}
    env.update({"AMLHPC_RUN_ID": run_id, "AMLHPC_HEALTH": "off", "AMLHPC_PIN": "off",
                "AMLHPC_SCRATCH": str(tmp_path / f"node{node}" / "scratch"),
                "AMLHPC_REPORT_DIR": str(tmp_path / f"node{node}" / "reports"),
                "RANK": str(node), "LOCAL_RANK": "0", "WORLD_SIZE": str(nodes), "LOCAL_WORLD_SIZE": "1",
                "PYTHONPATH": str(REPO)})
    env.update(extra)
    return env


def start(env: dict[str, str], script: Path, stop_after: int, total: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "amlhpc.jobs.runtime.launch", "--term-grace", "2", "--",
                             sys.executable, str(script), str(stop_after), str(total)],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


class TestSettings:
    def test_parse_and_defaults(self):
        s = watchdog.parse_settings('{"hang_s": 1200}')
        assert (s.hang_s, s.startup_s, s.interval_s) == (1200.0, None, 60.0)
        assert watchdog.parse_settings('{"hang_s": 3, "check_s": 0.5}').interval_s == 0.5
        assert watchdog.parse_settings('{"hang_s": 3}').interval_s == 1.0
        assert watchdog.settings_from_env({}) is None

    def test_bad_values_are_named(self):
        with pytest.raises(RuntimeInputError) as info:
            watchdog.parse_settings('{"hang_s": 0, "startup_s": "soon", "hangs": 1}')
        text = info.value.render()
        assert "AMLHPC_WATCHDOG_JSON: hang_s: must be a positive number of seconds, got 0" in text
        assert "startup_s: must be a positive number of seconds, got 'soon'" in text and "hangs: unknown key" in text

    def test_bad_settings_stop_the_launcher_with_exit_2(self, tmp_path, script):
        env = env_for(tmp_path, 0, 1, "bad", AMLHPC_WATCHDOG_JSON='{"hang_s": -1}')
        proc = start(env, script, 1, 1)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 2 and "hang_s: must be a positive number" in out


class TestNodeWatch:
    settings = watchdog.WatchdogSettings(hang_s=10)

    def test_the_first_run_has_a_deadline_to_its_first_report(self):
        watch = watchdog.NodeWatch(self.settings, node=0, local_size=2, started=0.0)
        assert watch.verdict(299.0) is None, "3x hang_s, at least 5 minutes: a large model's first step takes minutes"
        assert "no rank on node 0 reported a first step within 300s of the start of the training" in watch.verdict(301.0)
        startup = watchdog.NodeWatch(watchdog.WatchdogSettings(hang_s=10, startup_s=30), 0, 2, 0.0)
        assert startup.verdict(29.0) is None
        assert "within 30s of the start of the training (watchdog.startup_s)" in startup.verdict(31.0)
        long = watchdog.NodeWatch(watchdog.WatchdogSettings(hang_s=1200), 0, 2, 0.0)
        assert long.verdict(3599.0) is None and long.verdict(3601.0) is not None

    def test_a_restart_that_never_reports_a_first_step_is_judged_within_its_deadline(self):
        deadline = watchdog.first_step_deadline(self.settings, generation=1, first_run_s=12.0)
        assert deadline.seconds == 36.0 and "3x the first run's 12s to its first step" in deadline.reason
        watch = watchdog.NodeWatch(self.settings, node=1, local_size=1, started=100.0, deadline=deadline, generation=1)
        assert watch.verdict(135.0) is None
        assert "reported a first step within 36s of the start of in-job restart 1" in watch.verdict(137.0)
        # floors: a fast first run gives no hair trigger; the recipe's startup_s wins over both
        assert watchdog.first_step_deadline(self.settings, 1, 2.0).seconds == watchdog.RESTART_FLOOR_S
        assert watchdog.first_step_deadline(watchdog.WatchdogSettings(hang_s=600), 1, 2.0).seconds == 600
        assert watchdog.first_step_deadline(watchdog.WatchdogSettings(hang_s=10, startup_s=5), 3, 60.0).seconds == 5
        # a first run that never got there gives a restart the first run's deadline
        assert watchdog.first_step_deadline(self.settings, 2, None).seconds == watchdog.FIRST_RUN_FLOOR_S

    def test_the_time_to_the_first_report_is_measured_and_the_deadline_ends_with_it(self):
        watch = watchdog.NodeWatch(self.settings, node=0, local_size=2, started=50.0,
                                   deadline=watchdog.FirstStepDeadline(30.0, "test"))
        watch.observe(1, progress.Progress(7, 1, first_step=7, resumed_from=6), 58.0)
        watch.observe(0, progress.Progress(7, 1, first_step=7, resumed_from=6), 59.0)
        assert watch.to_first_step_s == 8.0 and not watch.before_first_step
        assert watch.verdict(66.0) is None, "past its first step the run is judged by hang_s alone"

    def test_a_verdict_before_the_first_step_has_its_own_kind(self, tmp_path):
        guard = watchdog.Guard(settings=self.settings, node=0, local_rank=0, local_size=1, folder=tmp_path,
                               child_pid=0, term_grace_s=1.0, clock=lambda: 1000.0)
        guard.watch.started, guard.watch.deadline = 0.0, watchdog.FirstStepDeadline(30.0, "test")
        assert guard.check() == {"culprit": 0, "kind": watchdog.FIRST_STEP,
                                 "message": "no rank on node 0 reported a first step within 30s of the start of the "
                                            "training (test)"}
        watchdog.progress_path(tmp_path, 0).write_text(json.dumps({"step": 3, "beats": 1, "pid": os.getpid()}))
        guard.watch.started = 999.0
        assert guard.check() is None

    def test_no_rank_progressed(self):
        watch = watchdog.NodeWatch(self.settings, node=1, local_size=2, started=0.0)
        watch.observe(0, progress.Progress(5, 1, first_step=4, resumed_from=4), 1.0)
        watch.observe(1, progress.Progress(5, 1), 2.0)
        watch.observe(1, progress.Progress(5, 1), 9.0)  # same report again: not progress
        assert watch.verdict(11.0) is None
        assert watch.first_step == 4 and watch.step == 5
        assert "no rank on node 1 progressed for 10s (last step 5" in watch.verdict(12.5)

    def test_one_rank_stops_while_the_others_go_on(self):
        watch = watchdog.NodeWatch(self.settings, node=0, local_size=2, started=0.0)
        for t in range(0, 20):
            watch.observe(0, progress.Progress(t, t + 1), float(t))
        watch.observe(1, progress.Progress(3, 1), 3.0)
        assert "local rank 1 on node 0 stopped at step 3" in watch.verdict(19.0)


def beat(node, written, age_s=1.0, state="training"):
    return nodestatus.Heartbeat(node, 7, age_s, 0, f"host{node}", state, written)


class TestClockSteps:
    def test_a_wall_clock_stepped_back_does_not_blind_the_watchdog(self, tmp_path, monkeypatch):
        """The defect: reports were filtered by file mtime against the wall clock at the start; the
        wall clock stepped back 5 s after the start, so every report looked older than the
        command and was ignored (startup_s then judged a reporting node hung). Ages come from
        the monotonic clock, and the folder is the launch's own."""
        from amlhpc.jobs.runtime.launch.watchdog import Guard, WatchdogSettings

        now = [1000.0]
        guard = Guard(settings=WatchdogSettings(hang_s=30, startup_s=5), node=0, local_rank=0, local_size=1,
                      folder=tmp_path, child_pid=1, term_grace_s=1, clock=lambda: now[0])
        stepped = time.time() - 5  # the wall clock after the step: 5 s behind where it was at the start
        for step in range(1, 4):
            now[0] += 4
            monkeypatch.setenv("AMLHPC_PROGRESS_FILE", str(tmp_path / "rank-0.json"))
            progress.report(step)
            os.utime(tmp_path / "rank-0.json", (stepped, stepped))
            assert guard.check() is None, f"step {step}: a reporting node was judged"
        assert guard.watch.step == 3


class TestPeers:
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)

    def test_a_silent_node_is_named(self):
        beats = {0: beat(0, self.now), 1: beat(1, self.now - timedelta(seconds=30))}
        culprit, message, silent = watchdog.stalled_peer(0, beats, self.now, hang_s=20)
        assert culprit == 1 and "wrote no heartbeat for 30s" in message and silent

    def test_a_node_without_progress_is_named_in_service_time(self):
        # written 5 s ago with an age of 18 s: 23 s without progress by now
        beats = {1: beat(1, self.now - timedelta(seconds=5), age_s=18.0)}
        culprit, message, silent = watchdog.stalled_peer(0, beats, self.now, hang_s=20)
        assert culprit == 1 and "made no progress for 23s (step 7)" in message and not silent

    def test_a_peer_gone_quiet_is_judged_by_its_silence_not_its_last_progress(self):
        """A launcher frozen 0.5 s after its last step: by its last report the peer made no
        progress for 3.5 s > 3, but 3 s of that is silence. Calling it 'no progress' would make
        the other nodes wait for a restart answer it cannot give; once its silence passes the
        limit, it is named silent."""
        frozen = beat(1, self.now - timedelta(seconds=3), age_s=0.5)
        assert watchdog.stalled_peer(0, {1: frozen}, self.now, hang_s=3) is None
        culprit, message, silent = watchdog.stalled_peer(0, {1: frozen}, self.now + timedelta(seconds=0.5), hang_s=3)
        assert culprit == 1 and "wrote no heartbeat" in message and silent

    def test_healthy_and_ended_nodes_pass(self):
        beats = {1: beat(1, self.now, age_s=2.0), 2: beat(2, self.now - timedelta(hours=1), state="ended")}
        assert watchdog.stalled_peer(0, beats, self.now, hang_s=20) is None


class ThrottledBlob:
    """A container whose heartbeat writes take `write_s` of this node's clock (503s retried), its
    peer's heartbeat last landed at `peer_written`; service time runs with the node's clock."""

    def __init__(self, clock: list[float], start: datetime, peer_written: datetime):
        self.clock, self.start, self.peer_written, self.write_s = clock, start, peer_written, 0.0
        self.mine: dict | None = None

    def service_now(self) -> datetime:
        return self.start + timedelta(seconds=self.clock[0])

    def get_blob_client(self, name):
        blob = self

        class Client:
            def upload_blob(self, data, overwrite, metadata):
                blob.clock[0] += blob.write_s
                blob.mine = dict(metadata)
                return {"last_modified": blob.service_now()}
        return Client()

    def list_blobs(self, name_starts_with, include):
        from types import SimpleNamespace

        meta = {"step": "7", "age_ms": "500", "first_step": "0", "host": "host1", "state": "training",
                "busy_ms": "", "waiting": ""}
        return [SimpleNamespace(name=f"{name_starts_with}0", metadata=self.mine, last_modified=self.service_now()),
                SimpleNamespace(name=f"{name_starts_with}1", metadata=meta, last_modified=self.peer_written)]


class TestSlowBlob:
    """A peer's heartbeat that is late because Blob is slow is not a frozen launcher: the 503
    storm of the recovery benchmark's `throttle` scenario made node 0's heartbeats 11 s late
    against a 10 s hang_s, and node 1 ended a healthy job. Silence is judged past twice this
    node's own latest Blob time."""

    def guard(self, clock: list[float], blob: ThrottledBlob) -> watchdog.Guard:
        guard = watchdog.Guard(settings=watchdog.WatchdogSettings(hang_s=10, check_s=1), node=0, local_rank=0,
                               local_size=1, folder=Path("/nonexistent"), child_pid=0, term_grace_s=1,
                               shared=(blob, "exp", "run-1"), clock=lambda: clock[0], nodes=2)
        guard.watch.observe(0, progress.Progress(7, 1, 0), now=clock[0])  # this node progresses
        return guard

    @staticmethod
    def look_until_a_verdict(guard: watchdog.Guard, clock: list[float], looks: int = 20) -> dict | None:
        """Look once a second (this node progressing) until a verdict, at most `looks` times."""
        for _ in range(looks):
            clock[0] += 1.0
            guard.watch.observe(0, progress.Progress(int(clock[0]), 1, 0), now=clock[0])
            verdict = guard.check()
            if verdict:
                return verdict
        return None

    def test_a_peer_late_in_a_slow_blob_is_not_taken_for_frozen(self):
        start = datetime(2026, 11, 29, 17, 0, tzinfo=UTC)
        clock = [100.0]
        blob = ThrottledBlob(clock, start - timedelta(seconds=100), start - timedelta(seconds=1))
        guard = self.guard(clock, blob)
        assert guard.check() is None  # the first look: the peer wrote a second ago
        blob.write_s = 4.0  # this node's writes are retried through a 503 storm: 4 s each
        for _ in range(3):
            clock[0] += 1.0
            guard.watch.observe(0, progress.Progress(int(clock[0]), 1, 0), now=clock[0])
            assert guard.check() is None, "the peer's silence is within what a slow Blob explains"
        assert guard.blob_lag_s == 8.0
        assert (blob.service_now() - max(blob.peer_written, guard.first_beat)).total_seconds() > 10, \
            "past hang_s: judged frozen before"

    def test_a_peer_silent_past_the_slow_blobs_lag_is_still_named(self):
        start = datetime(2026, 11, 29, 17, 0, tzinfo=UTC)
        clock = [100.0]
        blob = ThrottledBlob(clock, start - timedelta(seconds=100), start - timedelta(seconds=1))
        guard = self.guard(clock, blob)
        blob.write_s = 2.0
        verdict = self.look_until_a_verdict(guard, clock)
        assert verdict and verdict["culprit"] == 1 and "wrote no heartbeat" in verdict["message"], verdict
        silent = (blob.service_now() - max(blob.peer_written, guard.first_beat)).total_seconds()
        assert 10 + 4.0 < silent <= 10 + 4.0 + 3.0, silent  # hang_s + the lag, within one look (3 s here)

    def test_a_healthy_blob_adds_nothing(self):
        start = datetime(2026, 11, 29, 17, 0, tzinfo=UTC)
        clock = [100.0]
        blob = ThrottledBlob(clock, start - timedelta(seconds=100), start - timedelta(seconds=1))
        guard = self.guard(clock, blob)
        verdict = self.look_until_a_verdict(guard, clock)
        assert guard.blob_lag_s == 0.0 and verdict and verdict["culprit"] == 1
        assert (blob.service_now() - max(blob.peer_written, guard.first_beat)).total_seconds() == 11.0, "hang_s + 1 look"


class TestStorePulse:
    """The job's store tells a peer late in Blob from a frozen one (liveness.py): a peer whose
    Blob heartbeat is silent past the limit but whose launcher still beats on the store is not
    named; one that beats on neither is named exactly when it was without the store."""

    @staticmethod
    def liveness(store, node: int, clock):
        from amlhpc.jobs.runtime.coord.agree import Channel
        from amlhpc.jobs.runtime.launch.liveness import StoreLiveness

        return StoreLiveness(Channel(store, node=node, nodes=2), node, 10 / 2, clock)

    def guard(self, clock: list[float], blob: ThrottledBlob, store) -> watchdog.Guard:
        guard = TestSlowBlob().guard(clock, blob)
        guard.liveness = self.liveness(store, 0, lambda: clock[0])
        return guard

    @staticmethod
    def look(guard: watchdog.Guard, clock: list[float], peer=None) -> dict | None:
        """One second on: the peer's pulse (when it lives), this node's pulse, then its look."""
        clock[0] += 1.0
        guard.watch.observe(0, progress.Progress(int(clock[0]), 1, 0), now=clock[0])
        if peer is not None:
            peer.pulse()
        guard.pulse()
        return guard.check()

    @classmethod
    def looks_until_a_verdict(cls, guard: watchdog.Guard, clock: list[float], looks: int = 20) -> dict | None:
        """Look once a second, the peer not pulsing, until a verdict, at most `looks` times."""
        for _ in range(looks):
            verdict = cls.look(guard, clock)
            if verdict:
                return verdict
        return None

    @staticmethod
    def silence(guard: watchdog.Guard, blob: ThrottledBlob) -> float:
        return (blob.service_now() - max(blob.peer_written, guard.first_beat)).total_seconds()

    def test_a_peer_silent_in_blob_but_beating_on_the_store_is_not_named_until_it_stops(self):
        from amlhpc.jobs.runtime.coord.memstore import MemoryStore

        start = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
        clock, store = [100.0], MemoryStore()
        blob = ThrottledBlob(clock, start - timedelta(seconds=100), start - timedelta(seconds=1))
        guard, peer = self.guard(clock, blob, store), self.liveness(store, 1, lambda: clock[0])
        assert guard.check() is None
        for _ in range(40):  # 40 s: the peer's heartbeat never lands in Blob, its pulse goes on
            assert self.look(guard, clock, peer) is None
        silent = self.silence(guard, blob)
        assert silent >= 40, "far past hang_s: named at once without the store"
        verdict = self.looks_until_a_verdict(guard, clock)  # the peer's launcher freezes: no pulse either
        assert verdict and verdict["culprit"] == 1 and verdict["peer_silent"], verdict
        assert 5 <= self.silence(guard, blob) - silent <= 6, "named once no change was seen for hang_s / 2"

    def test_a_frozen_peer_is_named_exactly_when_it_was_without_the_store(self):
        from amlhpc.jobs.runtime.coord.memstore import MemoryStore

        start = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
        clock, store = [100.0], MemoryStore()
        blob = ThrottledBlob(clock, start - timedelta(seconds=100), start - timedelta(seconds=1))
        self.liveness(store, 1, lambda: clock[0]).pulse()  # it beat once, then froze with its heartbeat
        guard = self.guard(clock, blob, store)
        verdict = self.looks_until_a_verdict(guard, clock)
        assert verdict and verdict["culprit"] == 1 and "wrote no heartbeat" in verdict["message"], verdict
        assert self.silence(guard, blob) == 11.0, "hang_s + 1 look, as TestSlowBlob.test_a_healthy_blob_adds_nothing"

    def test_a_store_that_stops_answering_leaves_the_blob_verdict(self):
        from amlhpc.jobs.runtime.coord.kvstore import StoreLost
        from amlhpc.jobs.runtime.coord.memstore import MemoryStore

        class Gone(MemoryStore):
            def add(self, key, amount):
                raise StoreLost("node 0 is gone")

        start = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
        clock = [100.0]
        blob = ThrottledBlob(clock, start - timedelta(seconds=100), start - timedelta(seconds=1))
        guard = self.guard(clock, blob, Gone())
        verdict = self.looks_until_a_verdict(guard, clock)
        assert verdict and verdict["culprit"] == 1 and guard.liveness.failed
        assert self.silence(guard, blob) == 11.0

    def test_a_healthy_job_reads_no_peers_pulse(self):
        """Scale: on a job whose heartbeats land, each node's pulse is one `add` per look, no reading."""
        from amlhpc.jobs.runtime.coord.memstore import MemoryStore

        calls = []

        class Counting(MemoryStore):
            def add(self, key, amount):
                calls.append((key, amount))
                return super().add(key, amount)

        start = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
        clock = [100.0]
        blob = ThrottledBlob(clock, start - timedelta(seconds=100), start - timedelta(seconds=1))
        guard = self.guard(clock, blob, Counting())
        for _ in range(3):  # the peer's heartbeat is at most 4 s old: under half of hang_s
            assert self.look(guard, clock) is None
        assert calls == [("watchdog/alive/0", 1)] * 3

    def test_the_pulse_beats_while_a_look_is_held_in_blob_and_stops_when_looks_stop(self):
        from amlhpc.jobs.runtime.coord.memstore import MemoryStore

        start = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
        clock, store = [100.0], MemoryStore()
        guard = self.guard(clock, ThrottledBlob(clock, start, start), store)
        assert guard.turning()  # just made: within hang_s of its start
        guard._look_began = clock[0]
        clock[0] += 60  # a look held a minute in Blob's retries
        guard.pulse()
        assert guard.turning() and store.peek("watchdog/alive/0") == b"1"
        guard._look_began, guard._look_ended = None, clock[0]
        clock[0] += 10.5  # no look for longer than hang_s: the look thread stopped
        guard.pulse()
        assert not guard.turning() and store.peek("watchdog/alive/0") == b"1", "no beat without looks"


class TestLauncher:
    """A training command that stops making progress, on one node."""

    def test_a_command_that_stops_reporting_is_stopped_with_exit_7(self, tmp_path, script):
        env = env_for(tmp_path, 0, 1, f"w-{uuid.uuid4().hex[:6]}", AMLHPC_WATCHDOG_JSON='{"hang_s": 2, "check_s": 0.3}')
        started = time.monotonic()
        proc = start(env, script, stop_after=3, total=1000)
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == ExitCode.HANG == 7, out
        assert time.monotonic() - started < 60
        assert "hang: no rank on node 0 progressed for" in out and "(last step 3;" in out
        report = json.loads((tmp_path / "node0" / "reports" / "launch-node000.json").read_text())
        assert report["exit_code"] == 7 and report["error"].startswith("hang: no rank on node 0")
        assert report["command_status"] == 128 + signal.SIGTERM  # stopped by the watchdog, not by itself

    def test_a_stopped_process_is_stopped_too(self, tmp_path, script):
        """A frozen command (SIGSTOP, as a hung GPU call looks): SIGCONT, then SIGTERM."""
        env = env_for(tmp_path, 0, 1, f"w-{uuid.uuid4().hex[:6]}", AMLHPC_WATCHDOG_JSON='{"hang_s": 2, "check_s": 0.3}')
        proc = start(env, script, stop_after=1000, total=1000)
        progress_file = next(_wait_for(lambda: list((tmp_path / "node0" / "scratch").rglob("rank-0.json")), 30))
        pid = json.loads(progress_file.read_text())["pid"]
        os.killpg(pid, signal.SIGSTOP)
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == ExitCode.HANG, out

    def test_progress_keeps_it_alive_and_silence_is_not_judged(self, tmp_path, script):
        settings = '{"hang_s": 1.5, "check_s": 0.3}'
        going = start(env_for(tmp_path, 0, 1, f"w-{uuid.uuid4().hex[:6]}", AMLHPC_WATCHDOG_JSON=settings),
                      script, stop_after=100, total=15)
        out, _ = going.communicate(timeout=90)
        assert going.returncode == 0, out
        silent = tmp_path / "silent.py"
        silent.write_text("import time; time.sleep(3)\n")  # never reports: never judged
        proc = subprocess.run([sys.executable, "-m", "amlhpc.jobs.runtime.launch", "--", sys.executable, str(silent)],
                              env=env_for(tmp_path, 0, 1, "silent", AMLHPC_WATCHDOG_JSON=settings), cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def _wait_for(probe, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            yield from found
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.mark.azurite
class TestAcrossNodes:
    def checkpoint_env(self, azurite, container, prefix):
        doc = {"container": container.container_name, "prefix": prefix, "keep": 2, "interval_s": 3600}
        return {"AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string, "AMLHPC_CHECKPOINT_JSON": json.dumps(doc)}

    def test_a_frozen_node_is_named_by_the_node_that_goes_on(self, tmp_path, script, azurite, container):
        """Node 1's launcher and training freeze (SIGSTOP on the whole node): it cannot stop itself;
        node 0 sees its heartbeat go silent in Blob and stops the job, naming node 1."""
        run_id = f"x-{uuid.uuid4().hex[:6]}"
        extra = {**self.checkpoint_env(azurite, container, "wd/run"),
                 "AMLHPC_WATCHDOG_JSON": '{"hang_s": 3, "check_s": 0.5}'}
        nodes = [start(env_for(tmp_path, n, 2, run_id, **extra), script, stop_after=10_000, total=10_000) for n in (0, 1)]
        try:
            _ = next(_wait_for(lambda: list(nodestatus.read_heartbeats(container, "wd/run", run_id)) == [0, 1] and [1], 60))
            frozen = nodes[1]
            os.kill(frozen.pid, signal.SIGSTOP)  # the launcher
            progress_file = next(_wait_for(lambda: list((tmp_path / "node1" / "scratch").rglob("rank-0.json")), 10))
            os.killpg(json.loads(progress_file.read_text())["pid"], signal.SIGSTOP)  # its training
            out, _ = nodes[0].communicate(timeout=90)
            assert nodes[0].returncode == ExitCode.HANG, out
            assert "node 1 (" in out and "wrote no heartbeat" in out
            ends = nodestatus.read_ends(container, "wd/run", run_id)
            assert list(ends) == [0], "the frozen node wrote no end record"
            assert ends[0]["exit_code"] == ExitCode.HANG and ends[0]["hang"]["culprit"] == 1
            assert ends[0]["first_step"] == 0 and ends[0]["last_step"] >= 1
        finally:
            for proc in nodes:
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                    proc.communicate(timeout=30)

    def test_a_node_killed_during_its_final_upload_leaves_its_end_record(self, tmp_path, script, azurite, container):
        """Azure ML stops a job's other processes once one node failed; a node stopped while its
        final upload waits (for a lost node's parts) must not read as a vanished host."""
        run_id = f"k-{uuid.uuid4().hex[:6]}"
        env = env_for(tmp_path, 0, 1, run_id, **self.checkpoint_env(azurite, container, "wd/killed"),
                      AMLHPC_WATCHDOG_JSON='{"hang_s": 5}', AMLHPC_FAULTPOINTS="launch.final-upload=kill")
        proc = start(env, script, stop_after=100, total=3)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, out
        end = nodestatus.read_ends(container, "wd/killed", run_id)[0]
        assert (end["exit_code"], end["final_upload"], end["last_step"]) == (0, "pending", 3)

    def test_end_record_of_a_clean_run(self, tmp_path, script, azurite, container):
        run_id = f"c-{uuid.uuid4().hex[:6]}"
        env = env_for(tmp_path, 0, 1, run_id, **self.checkpoint_env(azurite, container, "wd/clean"),
                      AMLHPC_WATCHDOG_JSON='{"hang_s": 5}')
        proc = start(env, script, stop_after=100, total=3)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        end = nodestatus.read_ends(container, "wd/clean", run_id)[0]
        assert (end["exit_code"], end["first_step"], end["last_step"], end["signals"]) == (0, 0, 3, [])
        assert end["final_upload"] == "done", "the record after the upload replaces the one before it"
        assert nodestatus.read_heartbeats(container, "wd/clean", run_id)[0].state == "ended"
