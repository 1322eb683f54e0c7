"""A transport error on the job's store is not node 0 lost until the store stayed unreachable for
kvstore.RECONNECT_GRACE_S (amlhpc/jobs/runtime/coord: kvstore.call, jobstore.Reconnecting): one
reset of one node's connection, node 0 alive, is survived on a real store (ours and torch's
TCPStore, through a proxy that cuts the connection); a store gone past the grace is StoreLost
naming how long it tried, and the restart coordinator ends with exit 10. A retried `add` whose
first reply was lost counts twice: no barrier is passed on such an over-count. Time is the
runtime's clock seam, virtual here: the 30 s grace passes in no time."""

from __future__ import annotations

import contextlib
import gc
import socket
import threading
import time
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.base import clock
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.coord import jobstore, kvstore
from amlhpc.jobs.runtime.coord.agree import Barrier, Channel
from amlhpc.jobs.runtime.coord.kvstore import StoreLost
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from amlhpc.jobs.runtime.launch import restart
from tests.virtual_clock import VirtualClock


class Skipping(VirtualClock):
    """Real time, with every sleep skipped: what a call waits for in the kernel (a connection
    try) still counts against the grace."""

    def __init__(self):
        super().__init__()
        self.started = time.monotonic()

    def monotonic(self):
        return self.now + time.monotonic() - self.started


class Proxy:
    """A TCP relay in front of node 0's store whose connections can be cut (a reset on the
    path between one node and node 0, node 0 alive)."""

    def __init__(self, port: int):
        self.upstream = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", self.upstream))
            self.pairs.append((near, far))
            self.accepted += 1
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        for near, far in self.pairs:
            for s in (near, far):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        self.pairs.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def _backends() -> list[str]:
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return ["stdlib"]
    return ["stdlib", "torch"]


@pytest.fixture(params=_backends())
def node0(request):
    host = jobstore.serve(jobstore.Endpoint("127.0.0.1", 0, None, request.param), jobstore.reserve(0, "127.0.0.1"))
    yield host
    host.close()


@pytest.mark.parametrize("operation", ["publish", "count", "read", "decide"])
def test_one_reset_of_a_nodes_connection_is_survived(node0, operation):
    proxy = Proxy(node0.endpoint.port)
    node1 = jobstore.connect(jobstore.Endpoint("127.0.0.1", proxy.port, None, node0.backend), connect_timeout_s=10)
    try:
        assert isinstance(node1.store, jobstore.Reconnecting)
        channel = Channel(node1.store, node=1, nodes=2)
        channel.publish("before", {"n": 1})
        proxy.cut()  # node 0 lives; this node's connection is reset
        with clock.use(VirtualClock()) as virtual:
            if operation == "publish":
                channel.publish("after", {"n": 2})
            elif operation == "count":
                assert channel.count("counter") == 1
            elif operation == "read":
                assert channel.read("before") == {"n": 1}
            else:
                assert channel.decide("decision", {"by": 1}) == ({"by": 1}, True)
        assert channel.lost is None
        assert node1.store.reconnects == 1 and proxy.accepted == 2
        assert virtual.now - 1000.0 < kvstore.RECONNECT_GRACE_S
        assert Channel(node0.store, node=0, nodes=2).read("before") == {"n": 1}  # node 0 serves on, unaware
    finally:
        node1.close()
        proxy.close()


def test_a_store_gone_past_the_grace_is_lost_and_names_how_long_it_tried(node0, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(jobstore, "RECONNECT_TIMEOUT_S", 0.3)  # each try to connect again fails fast
    node1 = jobstore.connect(jobstore.Endpoint("127.0.0.1", node0.endpoint.port, None, node0.backend),
                             connect_timeout_s=10)
    channel = Channel(node1.store, node=1, nodes=2)
    channel.publish("x", {"ok": 1})
    node0.close()  # node 0's launcher is gone, the store with it (torch's server goes with its last reference)
    node0.store = None  # type: ignore[assignment]
    gc.collect()
    try:
        with clock.use(Skipping()) as skipping:
            with pytest.raises(StoreLost, match=r"stopped answering for (3\d|4\d)s \(\d+ tries") as lost:
                channel.count("c")
            assert skipping.monotonic() - 1000.0 >= kvstore.RECONNECT_GRACE_S
            assert "node 0's launcher, which hosts it, is gone" in str(lost.value)
            # The node's restart coordinator (on the node's channel, which knows the store is lost)
            # ends the node with exit 10, naming the cause.
            records = restart.NodeRecords(tmp_path, 0)
            coordinator = restart.Coordinator(
                generation=0, node=1, nodes=2, local_size=1, records=records,
                shared=restart.JobAgreement(channel, 0), limit=2, agree_s=30.0,
                hooks=restart.Hooks(report=lambda: {"versions": []}, apply=lambda d: d))
            coordinator.failure = {"node": 1, "local_rank": 0, "cause": "exit", "status": 1}
            decision = coordinator._outcome({0: {"status": 1, "cause": "exit"}})
        assert decision.result == "end" and decision.exit_code == ExitCode.NODE_LOST == 10
        assert "node 0 is gone" in decision.reason and "stopped answering for" in decision.reason
    finally:
        node1.close()


class LosesOneReply:
    """A store that applies the nth call of one operation and then loses its reply (a reset
    after the server wrote): the caller sees a transport error and tries again."""

    def __init__(self, store, operation: str, nth: int = 1):
        self.store, self.operation, self.left = store, operation, nth

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def call(*args):
            answer = method(*args)
            if name == self.operation:
                self.left -= 1
                if self.left == 0:
                    raise ConnectionResetError("Connection reset by peer (after the store applied the call)")
            return answer
        return call


def test_an_add_counted_twice_after_a_lost_reply_never_passes_a_barrier_early():
    store = MemoryStore()
    with clock.use(VirtualClock()):
        Barrier(Channel(LosesOneReply(store, "add"), node=0, nodes=3), "b", 3, 5.0).arrive()
        assert int(store.add("b/arrived", 0)) == 2  # node 0's add applied twice: one arrival, counted as two
        Barrier(Channel(store, node=1, nodes=3), "b", 3, 5.0).arrive()  # the count says 3 of 3; node 2 is not here
        assert not store.check(["b/outcome"]), "the barrier passed without node 2"
        Barrier(Channel(store, node=2, nodes=3), "b", 3, 5.0).arrive()
        Barrier(Channel(store, node=0, nodes=3, base_poll_s=0.01), "b", 3, 5.0).wait()  # passes now


def test_node_0_never_decides_a_restart_on_an_over_counted_report(tmp_path: Path):
    store = MemoryStore()
    with clock.use(VirtualClock()):
        lossy = restart.JobAgreement(Channel(LosesOneReply(store, "add"), node=1, nodes=3), 0)
        lossy.report(1, {"versions": []})
        node0 = restart.JobAgreement(Channel(store, node=0, nodes=3), 0)
        node0.report(0, {"versions": []})
        assert node0.reported() == 3 and not node0.all_reported(3)  # node 2 has not reported
        restart.JobAgreement(Channel(store, node=2, nodes=3), 0).report(2, {"versions": []})
        assert node0.all_reported(3)


def test_a_create_only_decision_retried_after_its_lost_reply_is_still_this_nodes():
    store = MemoryStore()
    with clock.use(VirtualClock()):
        channel = Channel(LosesOneReply(store, "compare_set"), node=1, nodes=2)
        assert channel.decide("d", {"by": 1}) == ({"by": 1}, True)
        assert Channel(store, node=0, nodes=2).decide("d", {"by": 0}) == ({"by": 1}, False)
