"""The in-job restart agreement on the job's store (amlhpc/jobs/runtime/launch/restart.py), many nodes in
one process on a MemoryStore: one decision per generation that every node adopts, an end
proposed in a `finally`, a late node adopting what was decided without it; and what each
protocol costs one node per poll, counted at N = 8 to 1,000 (it must not grow with N)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.coord.agree import Barrier, Channel, _greeted_said_bye, farewell, greet
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from amlhpc.jobs.runtime.launch import restart


class Counting:
    """A store that counts the calls one node makes (each is one request to the store's server)."""

    def __init__(self, store):
        self.store, self.calls = store, Counter()

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def call(*args, **kwargs):
            self.calls[name] += 1
            return method(*args, **kwargs)
        return call

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def version(step: int) -> dict:
    return {"name": f"step-{step:09d}", "step": step, "tag": "t0"}


def coordinator(store, tmp_path: Path, node: int, nodes: int, *, report=None, agree_s: float = 30.0,
                failure: dict | None = None) -> restart.Coordinator:
    records = restart.NodeRecords(tmp_path / f"node{node}", 0)
    channel = Channel(store, node=node, nodes=nodes, base_poll_s=0.01)
    hooks = restart.Hooks(report=report or (lambda: {"versions": [version(4), version(2)]}),
                          apply=lambda decision: decision)
    c = restart.Coordinator(generation=0, node=node, nodes=nodes, local_size=1, records=records,
                            shared=restart.JobAgreement(channel, 0), limit=2, agree_s=agree_s, hooks=hooks)
    c.failure = failure or {"node": 1, "local_rank": 0, "cause": "exit", "status": 1}
    return c


def outcomes(coordinators, delays: dict[int, float] | None = None) -> dict[int, restart.Decision | BaseException]:
    found: dict[int, restart.Decision | BaseException] = {}

    def run(k: int, c: restart.Coordinator) -> None:
        time.sleep((delays or {}).get(k, 0.0))
        try:
            found[k] = _outcome(c)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            found[k] = exc

    threads = [threading.Thread(target=run, args=(k, c)) for k, c in enumerate(coordinators)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return found


def _outcome(c: restart.Coordinator) -> restart.Decision:
    """`run` past the watch: the node's commands have ended, the failure is known."""
    decision = None
    try:
        decision = c._outcome({0: {"status": 1, "cause": "exit"}})
        return decision
    finally:
        if decision is None:
            c._leave(f"the restart coordinator of node {c.node} failed")


class TestOneDecision:
    def test_every_node_adopts_the_same_restart(self, tmp_path):
        store = MemoryStore()
        nodes = 16
        found = outcomes([coordinator(store, tmp_path, k, nodes) for k in range(nodes)],
                         delays={k: 0.01 * (k % 5) for k in range(nodes)})
        decisions = {(d.result, d.source, d.version) for d in found.values()}
        assert decisions == {("restart", "local", "step-000000004")}

    def test_a_node_that_reports_after_the_deadline_adopts_the_end(self, tmp_path):
        """The issue's split: node 0 ended (a node lost) while the late ones restarted and hung at
        rendezvous. Node 0 decides once, for everybody: the late node ends as well."""
        store = MemoryStore()
        found = outcomes([coordinator(store, tmp_path, k, 3, agree_s=0.3) for k in range(3)], delays={2: 1.0})
        assert {d.result for d in found.values()} == {"end"}
        assert {d.exit_code for d in found.values()} == {ExitCode.NODE_LOST}
        assert "node(s) 2 did not answer the restart: lost" in found[2].reason

    def test_a_coordinator_that_fails_publishes_the_end_in_its_finally(self, tmp_path):
        """Node 1's report raises (its storage retries exhausted): the others end at once with its
        reason instead of waiting out agree_s."""
        store = MemoryStore()

        def broken():
            raise RuntimeError("storage retries exhausted")

        coordinators = [coordinator(store, tmp_path, k, 3, agree_s=600, report=broken if k == 1 else None)
                        for k in range(3)]
        started = time.monotonic()
        found = outcomes(coordinators)
        assert time.monotonic() - started < 20
        assert isinstance(found[1], RuntimeError)
        for k in (0, 2):
            assert found[k].result == "end" and "node 1 ended the job (the restart coordinator of node 1 failed)" in \
                found[k].reason

    def test_a_node_that_cannot_follow_the_restart_fails_the_next_generation(self, tmp_path):
        store = MemoryStore()
        coordinators = [coordinator(store, tmp_path, k, 2) for k in range(2)]
        coordinators[1].hooks = restart.Hooks(
            report=coordinators[1].hooks.report,
            apply=lambda d: restart.Decision("end", "restoring it from Blob failed", exit_code=ExitCode.RESTORE))
        found = outcomes(coordinators)
        assert found[0].result == "restart" and found[1].result == "end"
        following = restart.JobAgreement(Channel(store, node=0, nodes=2), 1)
        assert following.failure()["cause"] == "ended"
        assert following.decision().result == "end"


class TestGoodbye:
    """Node 0 hosts the store and keeps it up at its end until every node said goodbye; when it
    ends in failure, until every node that used the store did (not for one that never reached it)."""

    @staticmethod
    def hosting(store, nodes: int, wait_s: float, failing: bool) -> threading.Thread:
        host = Channel(store, node=0, nodes=nodes, base_poll_s=0.01)
        greet(host, "bye")
        thread = threading.Thread(target=farewell, args=(host, "bye"),
                                  kwargs={"hosting": True, "wait_s": wait_s, "failing": failing})
        thread.start()
        return thread

    def test_a_succeeding_host_waits_for_a_node_that_has_not_connected_yet(self):
        store = MemoryStore()
        host = self.hosting(store, 2, wait_s=30, failing=False)
        host.join(0.5)
        assert host.is_alive(), "node 1 may still connect and read what node 0 decided"
        late = Channel(store, node=1, nodes=2, base_poll_s=0.01)
        greet(late, "bye")
        farewell(late, "bye", hosting=False, wait_s=30)
        host.join(5)
        assert not host.is_alive()

    def test_a_failing_host_does_not_wait_for_a_node_that_never_greeted(self):
        store = MemoryStore()
        started = time.monotonic()
        host = self.hosting(store, 3, wait_s=30, failing=True)
        host.join(10)
        assert not host.is_alive() and time.monotonic() - started < 5

    def test_a_failing_host_waits_for_a_node_that_greeted_until_its_goodbye(self):
        store = MemoryStore()
        late = Channel(store, node=2, nodes=3, base_poll_s=0.01)
        greet(late, "bye")
        host = self.hosting(store, 3, wait_s=30, failing=True)
        host.join(0.5)
        assert host.is_alive()
        farewell(late, "bye", hosting=False, wait_s=30)
        host.join(5)
        assert not host.is_alive()

    def test_a_goodbye_counted_twice_does_not_release_the_failing_host(self):
        """A retried add counts twice: the counter says every greeted node left, node 1's own key
        says it did not."""
        store = MemoryStore()
        greet(Channel(store, node=1, nodes=3), "bye")
        Channel(store, node=2, nodes=3).count("bye/arrived")
        host = self.hosting(store, 3, wait_s=1.0, failing=True)
        host.join(0.5)
        assert host.is_alive()
        host.join(5)
        assert not host.is_alive()


N_VALUES = (8, 64, 512, 1000)


@pytest.mark.parametrize("nodes", N_VALUES)
def test_store_calls_per_node_per_poll_do_not_grow_with_n(nodes, tmp_path, capsys):
    """One node's calls per poll in each protocol, with N-1 other nodes' keys in the store."""
    shared = MemoryStore()
    # the rest of the job, already there: N reports, N barrier arrivals, N staged parts
    agreement = restart.JobAgreement(Channel(shared, node=0, nodes=nodes), 0)
    for k in range(1, nodes):
        agreement.report(k, {"versions": [version(2)]})
        Barrier(Channel(shared, node=k, nodes=nodes), "staging/x", nodes + 1, 1).arrive()
        greet(Channel(shared, node=k, nodes=nodes), "bye")
    counted: dict[str, int] = {}

    def per_poll(name: str, node: int, act) -> None:
        store = Counting(shared)
        act(Channel(store, node=node, nodes=nodes, base_poll_s=0.0))
        counted[name] = store.total

    per_poll("restart: watch for a failure", 3 % nodes,
             lambda ch: restart.JobAgreement(ch, 5).failure())
    per_poll("restart: wait for the decision (a node)", 3 % nodes,
             lambda ch: restart.JobAgreement(ch, 0).decision())
    per_poll("restart: decide (node 0, reports missing)", 0,
             lambda ch: restart.Coordinator(generation=0, node=0, nodes=nodes, local_size=1,
                                            records=restart.NodeRecords(tmp_path, 0),
                                            shared=restart.JobAgreement(ch, 0), limit=2, agree_s=600,
                                            hooks=restart.Hooks(lambda: {}, lambda d: d))._decide(float("inf")))
    per_poll("barrier: wait", 1, lambda ch: ch.has(ch.key("staging/x", "outcome")))
    # a failing node 0 at its end, every other node greeted and none gone yet: the outcome and two counters
    per_poll("goodbye: a failing node 0 waits", 0,
             lambda ch: ch.has(ch.key("bye", "outcome")) or _greeted_said_bye(ch, "bye", Barrier(ch, "bye", nodes, 1)))

    from amlhpc.jobs.runtime.checkpoint.uploader import VersionUploader

    def follower(ch) -> None:
        uploader = VersionUploader(SimpleNamespace(stream="s"), tmp_path / "f", [1], 1, nodes, 3600, 2, 2,
                                   channel=ch.scoped("ckpt", "u0"))
        uploader._seen = ch.count(ch.key("ckpt", "u0", "changes"), 0)  # up to date: a poll with nothing new
        ch.store.calls.clear()
        uploader._hear()

    per_poll("checkpoint: a node hears node 0 (nothing new)", 1, follower)

    def committer(ch) -> None:
        uploader = VersionUploader(SimpleNamespace(stream="s"), tmp_path / "c", [0], 0, nodes, 3600, 2, 2,
                                   channel=ch.scoped("ckpt", "u0"))
        uploader._parts["v"] = []
        uploader._ready_parts("v")

    per_poll("checkpoint: node 0 waits for the parts", 0, committer)
    with capsys.disabled():
        print(f"\nN={nodes}: " + "; ".join(f"{name}: {calls}" for name, calls in counted.items()))
    assert counted == {"restart: watch for a failure": 1, "restart: wait for the decision (a node)": 1,
                       "restart: decide (node 0, reports missing)": 1, "barrier: wait": 1, "goodbye: a failing node 0 waits": 3,
                       "checkpoint: a node hears node 0 (nothing new)": 1, "checkpoint: node 0 waits for the parts": 1}


class CountingContainer:
    """Blob as the watchdog's look sees it: N nodes' heartbeats in one listing; every call counted."""

    def __init__(self, nodes: int):
        from datetime import UTC, datetime

        self.calls, self.nodes, self.now = Counter(), nodes, datetime.now(UTC)

    def get_blob_client(self, name):
        container = self

        class Client:
            def upload_blob(self, *args, **kwargs):
                container.calls["upload_blob"] += 1
                return {"last_modified": container.now}
        return Client()

    def list_blobs(self, name_starts_with, include=None):
        self.calls["list_blobs"] += 1
        return [SimpleNamespace(name=f"{name_starts_with}{k}", metadata={"step": "5", "age_ms": "100"},
                                last_modified=self.now) for k in range(self.nodes)]


@pytest.mark.parametrize("nodes", N_VALUES)
def test_blob_requests_per_heartbeat_look_do_not_grow_with_n(nodes, tmp_path, capsys):
    """A node's look: one write of its heartbeat and one listing with metadata (a page holds
    5,000: one request up to N = 5,000), never a read per node; the looks are spaced so that
    all N listings stay under half a blob's 500 requests/s."""
    from amlhpc.jobs.runtime.launch.watchdog import Guard, WatchdogSettings

    container = CountingContainer(nodes)
    guard = Guard(settings=WatchdogSettings(hang_s=600, check_s=1.0), node=1, local_rank=0, local_size=1,
                  folder=tmp_path, child_pid=1, term_grace_s=1, shared=(container, "p", "run"), nodes=nodes)
    guard.check()
    with capsys.disabled():
        print(f"\nN={nodes}: heartbeat look: {dict(container.calls)}, every {guard.look_s:.1f} s "
              f"(all nodes: {nodes / guard.look_s:.0f} listings/s)")
    assert container.calls == Counter({"upload_blob": 1, "list_blobs": 1})
    assert nodes / guard.look_s <= 250 / 0.8  # the jitter may shorten one interval by 20 %


@pytest.mark.azurite
def test_the_end_records_are_read_in_one_listing(container):
    """The supervision reads every node's end record from one listing with metadata (each
    record is in its blob's metadata too), never a listing and a read per node."""
    from amlhpc.jobs.runtime.coord import nodestatus

    for node in range(5):
        nodestatus.write_end(container, "p", "run", node, {"node": node, "exit_code": 0, "error": None}, key="ab" * 16)
    reads = Counter()

    class Watched:
        def __getattr__(self, name):
            reads[name] += 1
            return getattr(container, name)

    ends = nodestatus.read_ends(Watched(), "p", "run")
    assert sorted(ends) == list(range(5)) and all(nodestatus.check_end("ab" * 16, "run", k, r) is None
                                                   for k, r in ends.items())
    assert reads == Counter({"list_blobs": 1})


class TestTheSameNodeAgain:
    """A node that hangs (or misses its first step) again in the next generation ends the job, on
    every node alike, with the hang's status: the managed run resubmits without it."""

    def run_generation_1(self, tmp_path, before: dict, now: dict) -> dict:
        store = MemoryStore()
        nodes = 2
        restart.JobAgreement(Channel(store, node=before["node"], nodes=nodes, base_poll_s=0.01), 0).publish_failure(before)
        restart.JobAgreement(Channel(store, node=now["node"], nodes=nodes, base_poll_s=0.01), 1).publish_failure(now)
        coordinators = []
        for node in range(nodes):
            channel = Channel(store, node=node, nodes=nodes, base_poll_s=0.01)
            hooks = restart.Hooks(report=lambda: {"versions": [version(4)]}, apply=lambda decision: decision)
            c = restart.Coordinator(generation=1, node=node, nodes=nodes, local_size=1,
                                    records=restart.NodeRecords(tmp_path / f"node{node}", 1),
                                    shared=restart.JobAgreement(channel, 1), limit=3, agree_s=30.0, hooks=hooks)
            c.failure = now
            coordinators.append(c)
        return outcomes(coordinators)

    def test_the_same_node_stopping_again_ends_the_job_for_a_new_attempt(self, tmp_path):
        found = self.run_generation_1(tmp_path, {"node": 1, "cause": "hang", "status": 143, "message": "no progress"},
                                      {"node": 1, "cause": "first-step", "status": 143, "message": "no first step"})
        assert {k: (d.result, d.exit_code) for k, d in found.items()} == {0: ("end", ExitCode.HANG), 1: ("end", ExitCode.HANG)}
        assert "node 1 stopped again in in-job restart 1 (first-step" in found[1].reason

    def test_the_culprit_counts_not_the_node_that_judged_the_hang(self, tmp_path):
        """Node 0's watchdog judged node 1's hang in generation 0 (node 0 was left waiting), node 1
        judged its own in generation 1: the same node stopped twice (the rehearsal
        `--fault hang@step=6,node=1 --fault hang@step=5,node=1,gen=1` restarted twice before)."""
        found = self.run_generation_1(tmp_path, {"node": 0, "culprit": 1, "cause": "hang", "status": 143},
                                      {"node": 1, "culprit": 1, "cause": "hang", "status": 143})
        assert {d.result for d in found.values()} == {"end"}
        assert "node 1 stopped again" in found[0].reason
        waiting = self.run_generation_1(tmp_path / "b", {"node": 0, "culprit": 1, "cause": "hang", "status": 143},
                                        {"node": 0, "culprit": 0, "cause": "hang", "status": 143})
        assert {d.result for d in waiting.values()} == {"restart"}

    def test_another_node_or_another_cause_restarts(self, tmp_path):
        other = self.run_generation_1(tmp_path / "a", {"node": 0, "cause": "hang", "status": 143},
                                      {"node": 1, "cause": "hang", "status": 143})
        assert {d.result for d in other.values()} == {"restart"}
        crash = self.run_generation_1(tmp_path / "b", {"node": 1, "cause": "exit", "status": 1},
                                      {"node": 1, "cause": "hang", "status": 143})
        assert {d.result for d in crash.values()} == {"restart"}
