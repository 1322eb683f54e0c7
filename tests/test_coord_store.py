"""The job's coordination store (amlhpc/jobs/runtime/coord): the standard-library TCPStore server and
client against torch's own, the typed API (decisions, barriers, counters) on any store, and
the port: reserved by binding once, never probed."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.base import clock
from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.coord import jobstore, kvstore
from amlhpc.jobs.runtime.coord.agree import Barrier, Channel
from amlhpc.jobs.runtime.coord.kvstore import StoreLost, StoreTimeout
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from amlhpc.jobs.runtime.coord.nodebarrier import BarrierFailed, BarrierTimeout
from amlhpc.jobs.runtime.coord.storewire import StoreClient, StoreServer

REPO = Path(__file__).resolve().parents[1]
torch_dist = pytest.importorskip("torch.distributed")
SHORT = timedelta(seconds=5)


def script(store) -> list:
    """One sequence of calls; every store must answer it the same."""
    answers = []
    store.set("a", b"1")
    answers.append(store.get("a"))
    answers.append(store.add("count", 5))
    answers.append(store.add("count", -2))
    answers.append(store.compare_set("a", b"1", b"2"))      # swapped
    answers.append(store.compare_set("a", b"1", b"3"))      # refused: answers the current value
    answers.append(store.compare_set("new", b"", b"x"))     # created
    answers.append(store.compare_set("new", b"", b"y"))     # exists: answers it
    answers.append(store.compare_set("gone", b"e", b"z"))   # missing with an expectation: answers it, sets nothing
    answers.append(store.check(["a", "new"]))
    answers.append(store.check(["a", "gone"]))
    answers.append(store.check([]))
    answers.append(store.multi_get(["a", "count", "new"]))
    answers.append(store.delete_key("new"))
    answers.append(store.delete_key("new"))
    answers.append(store.check(["new"]))
    try:
        store.wait(["never"], timedelta(milliseconds=200))
        answers.append("no timeout")
    except Exception:  # noqa: BLE001 - each store has its own timeout type
        answers.append("timeout")
    store.wait(["a"], SHORT)
    answers.append(store.add("count", 0))
    return [bytes(a) if isinstance(a, bytes | bytearray) else a for a in answers]


class Virtual:
    """The runtime's clock, virtual: sleeping advances it at once."""

    def __init__(self):
        self.now = 0.0

    def time(self):
        return self.now

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture
def stdlib_server():
    server = StoreServer(jobstore.reserve(0, "127.0.0.1")).start()
    yield server
    server.stop()


@pytest.fixture
def torch_server():
    return torch_dist.TCPStore("127.0.0.1", 0, None, True, timeout=SHORT, wait_for_workers=False, use_libuv=True)


class TestTheSameAnswersEverywhere:
    def test_hashstore_and_memorystore(self):
        assert script(MemoryStore()) == script(torch_dist.HashStore())

    def test_our_client_against_our_server(self, stdlib_server):
        assert script(StoreClient("127.0.0.1", stdlib_server.port, timeout=SHORT)) == script(torch_dist.HashStore())

    def test_torch_client_against_our_server(self, stdlib_server):
        client = torch_dist.TCPStore("127.0.0.1", stdlib_server.port, None, False, timeout=SHORT)
        assert script(client) == script(torch_dist.HashStore())

    def test_our_client_against_torch_server(self, torch_server):
        assert script(StoreClient("127.0.0.1", torch_server.port, timeout=SHORT)) == script(torch_dist.HashStore())

    def test_a_wait_is_answered_by_the_write_that_completes_it(self, stdlib_server):
        waiter = StoreClient("127.0.0.1", stdlib_server.port, timeout=SHORT)
        writer = torch_dist.TCPStore("127.0.0.1", stdlib_server.port, None, False, timeout=SHORT)
        done = threading.Event()
        thread = threading.Thread(target=lambda: (waiter.wait(["k1", "k2"], SHORT), done.set()))
        thread.start()
        writer.set("k1", b"x")
        assert not done.wait(0.2)
        writer.add("k2", 1)
        thread.join(5)
        assert done.is_set()

    def test_a_client_that_does_not_speak_the_protocol_is_dropped(self, stdlib_server):
        with socket.create_connection(("127.0.0.1", stdlib_server.port)) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
            sock.settimeout(5)
            assert sock.recv(10) == b""
        assert StoreClient("127.0.0.1", stdlib_server.port, timeout=SHORT).add("still", 1) == 1


class TestAgreement:
    def test_every_node_adopts_the_first_decision(self):
        store = MemoryStore()
        adopted: dict[int, tuple] = {}

        def node(k: int) -> None:
            channel = Channel(store, node=k, nodes=16)
            adopted[k] = channel.decide("restart/g0/decision", {"by": k})

        threads = [threading.Thread(target=node, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        documents = {json.dumps(doc) for doc, _ in adopted.values()}
        assert len(documents) == 1
        assert sum(mine for _, mine in adopted.values()) == 1

    def test_a_barrier_releases_every_party_once_all_arrived(self):
        store = torch_dist.HashStore()
        passed: list[int] = []

        def node(k: int) -> None:
            barrier = Barrier(Channel(store, node=k, nodes=4, base_poll_s=0.01), "staging/x", 4, timeout_s=10)
            barrier.arrive({"files": k})
            barrier.wait()
            passed.append(k)

        threads = [threading.Thread(target=node, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(passed) == [0, 1, 2, 3]

    def test_a_failure_fails_every_waiter_with_its_message(self):
        store = MemoryStore()
        first = Barrier(Channel(store, node=0, nodes=3, base_poll_s=0.01), "b", 3, timeout_s=10)
        first.arrive()
        Barrier(Channel(store, node=2, nodes=3), "b", 3, timeout_s=10).fail("disk full", "failed")
        with pytest.raises(BarrierFailed, match="node 2: disk full"):
            first.wait()

    def test_a_timeout_names_the_missing_nodes(self):
        store = MemoryStore()
        for k in (0, 2):
            Barrier(Channel(store, node=k, nodes=4), "b", 4, timeout_s=0.05).arrive()
        with pytest.raises(BarrierTimeout, match=r"node\(s\) 1, 3 did not arrive"):
            Barrier(Channel(store, node=0, nodes=4, base_poll_s=0.01), "b", 4, timeout_s=0.05).wait()

    def test_a_store_that_stops_answering_is_lost(self, stdlib_server):
        channel = Channel(StoreClient("127.0.0.1", stdlib_server.port, timeout=SHORT), node=1, nodes=2)
        channel.publish("x", {"ok": 1})
        stdlib_server.stop()
        with clock.use(Virtual()), pytest.raises(StoreLost, match="node 0's launcher, which hosts it, is gone"):
            for _ in range(3):  # tried again for kvstore.RECONNECT_GRACE_S, on the runtime's clock
                channel.count("x-count")

    def test_torch_client_losing_its_server_is_lost_too(self):
        server = torch_dist.TCPStore("127.0.0.1", 0, None, True, timeout=SHORT, wait_for_workers=False)
        client = torch_dist.TCPStore("127.0.0.1", server.port, None, False, timeout=SHORT)
        channel = Channel(client, node=1, nodes=2)
        channel.count("c")
        del server
        with clock.use(Virtual()), pytest.raises(StoreLost):
            for _ in range(3):
                channel.count("c")

    def test_await_key_times_out_on_the_runtimes_clock(self):
        with clock.use(Virtual()) as virtual:
            with pytest.raises(StoreTimeout):
                Channel(MemoryStore(), node=0, nodes=1000).await_key("never", 600)
            assert virtual.now >= 600  # ten minutes waited in no time


class TestEndpoint:
    def test_the_default_port_is_the_one_above_master_port(self):
        where = jobstore.endpoint({"MASTER_ADDR": "10.0.0.4", "MASTER_PORT": "6105"})
        assert (where.host, where.port, where.listen_fd) == ("10.0.0.4", 6106, None)
        assert jobstore.endpoint({"AZ_BATCH_MASTER_NODE": "10.0.0.5:6105", "AMLHPC_COORD_PORT": "7000"}).port == 7000
        assert jobstore.endpoint({}) is None

    def test_the_grace_is_the_jobs_setting_and_travels_with_the_connection(self):
        assert jobstore.endpoint({"MASTER_ADDR": "h"}).grace_s == kvstore.RECONNECT_GRACE_S
        assert jobstore.endpoint({"MASTER_ADDR": "h", "AMLHPC_COORD_GRACE_S": "7"}).grace_s == 7.0
        listener = jobstore.reserve(0, "127.0.0.1")
        where = jobstore.Endpoint("127.0.0.1", listener.getsockname()[1], backend="stdlib", grace_s=7.0)
        host = jobstore.serve(where, listener)
        try:
            node = jobstore.connect(where, connect_timeout_s=10)
            assert node.store.grace_s == 7.0
            node.close()
        finally:
            host.close()

    @pytest.mark.parametrize("name, value", [("AMLHPC_COORD_PORT", "70000"), ("AMLHPC_COORD_PORT", "x"),
                                             ("AMLHPC_COORD_STORE", "redis"), ("AMLHPC_COORD_LISTEN_FD", "-1"),
                                             ("AMLHPC_COORD_GRACE_S", "0"), ("AMLHPC_COORD_GRACE_S", "ten")])
    def test_bad_settings_are_named(self, name, value):
        with pytest.raises(RuntimeInputError, match=name):
            jobstore.endpoint({"MASTER_ADDR": "h", name: value})


class TestPorts:
    """The defect: the health gate's port was probed at the start and bound after staging; an
    outgoing connection of staging took it in between (EADDRINUSE). Ports are now bound once."""

    def test_a_reserved_port_is_never_given_to_an_outgoing_connection(self):
        listener = jobstore.reserve(0)
        port = listener.getsockname()[1]
        with socket.socket() as outgoing:
            with pytest.raises(OSError) as refused:
                outgoing.bind(("127.0.0.1", port))  # what the kernel would do picking a local port for a connect
            assert refused.value.errno == errno.EADDRINUSE
        listener.close()

    def test_a_probed_port_can_be_taken_before_it_is_bound(self):
        """The old way, for contrast: the port is free when probed, an outgoing connection takes
        it, and the listener that comes later cannot bind."""
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        target = jobstore.reserve(0, "127.0.0.1")
        with socket.socket() as outgoing:
            outgoing.bind(("127.0.0.1", port))
            outgoing.connect(target.getsockname())
            with pytest.raises(jobstore.CoordinationUnavailable, match=f"port {port} on node 0 is in use.*AMLHPC_COORD_PORT"):
                jobstore.serve(jobstore.Endpoint("127.0.0.1", port, backend="stdlib"))
        target.close()

    def test_by_default_another_node_reaches_torchs_server_without_importing_torch(self):
        """auto: node 0 serves with torch's TCPStore; node 1's launcher connects with our client
        (the same protocol) and never imports torch."""
        listener = jobstore.reserve(0, "127.0.0.1")
        port = listener.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
               "AMLHPC_COORD_PORT": str(port), "AMLHPC_COORD_LISTEN_FD": str(listener.fileno()),
               "AMLHPC_COORD_STORE": "auto"}
        serve = ("from amlhpc.jobs.runtime.coord import jobstore\n"
                 "js = jobstore.open_for_node(__import__('os').environ, 0, 2, 2)\n"
                 "print(js.backend, flush=True)\n"
                 "js.store.wait(['done'])\nprint('served', js.store.get('from-node-1').decode(), flush=True)\n")
        node0 = subprocess.Popen([sys.executable, "-c", serve], env=env, pass_fds=[listener.fileno()],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        listener.close()
        connect = ("import sys\nfrom amlhpc.jobs.runtime.coord import jobstore\n"
                   "js = jobstore.open_for_node(__import__('os').environ, 1, 2, 2)\n"
                   "js.store.set('from-node-1', b'hello')\nassert js.store.add('n', 2) == 2\n"
                   "js.store.set('done', b'1')\nprint(js.backend, 'torch' in sys.modules, flush=True)\n")
        client_env = {k: v for k, v in env.items() if k != "AMLHPC_COORD_LISTEN_FD"}
        node1 = subprocess.run([sys.executable, "-c", connect], env=client_env, capture_output=True, text=True,
                               timeout=60)
        out = node0.communicate(timeout=60)[0]
        assert node1.returncode == 0, node1.stderr
        assert node1.stdout.split() == ["stdlib", "False"], node1.stdout
        assert node0.returncode == 0 and out.split()[:1] == ["torch"] and "served hello" in out, out

    @pytest.mark.parametrize("backend", ["torch", "stdlib"])
    def test_node_0_serves_on_a_socket_handed_down_and_another_process_connects(self, backend, tmp_path):
        """The rehearsal's way: the socket is bound before any rank starts and inherited by
        node 0's process; node 1 is another process."""
        listener = jobstore.reserve(0, "127.0.0.1")
        port = listener.getsockname()[1]
        serve = ("import sys, time\nfrom amlhpc.jobs.runtime.coord import jobstore\n"
                 "js = jobstore.open_for_node(__import__('os').environ, 0, 2, 2)\n"
                 "print(js.backend, js.serving, flush=True)\n"
                 "js.store.wait(['done'])\nprint('served', js.store.get('from-node-1').decode(), flush=True)\n")
        env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
               "AMLHPC_COORD_PORT": str(port), "AMLHPC_COORD_LISTEN_FD": str(listener.fileno()),
               "AMLHPC_COORD_STORE": backend}
        node0 = subprocess.Popen([sys.executable, "-c", serve], env=env, pass_fds=[listener.fileno()],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        listener.close()  # node 0 holds it now
        client_env = {k: v for k, v in env.items() if k != "AMLHPC_COORD_LISTEN_FD"}
        node1 = jobstore.open_for_node(client_env, 1, 2, 2)
        assert node1.backend == backend and not node1.serving
        node1.store.set("from-node-1", b"hello")
        node1.store.set("done", b"1")
        out = node0.communicate(timeout=60)[0]
        assert node0.returncode == 0, out
        assert f"{backend} True" in out and "served hello" in out
