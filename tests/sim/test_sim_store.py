"""The simulated rendezvous store has torch.distributed's Store semantics: the same calls
against torch's in-process HashStore and against amlhpc.sim.store give the same answers;
blocking calls park on virtual time and are released by the write that completes them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from amlhpc.sim.store import StoreServer
from amlhpc.sim.world import World


def _calls(store) -> list:
    """Each call's answer, or the error's class name and message."""
    out = []

    def say(fn):
        try:
            out.append(fn())
        except Exception as exc:  # noqa: BLE001 - compared
            out.append((type(exc).__name__, str(exc)))
    store.set_timeout(timedelta(seconds=0.05))
    say(lambda: store.compare_set("decision", "", "restart@3"))
    say(lambda: store.compare_set("decision", "", "end"))
    say(lambda: store.compare_set("decision", "restart@3", "restart@4"))
    say(lambda: store.compare_set("missing", "old", "new"))
    say(lambda: store.get("decision"))
    say(lambda: store.add("arrived", 1))
    say(lambda: store.add("arrived", 5))
    say(lambda: store.add("arrived", -2))
    say(lambda: store.get("arrived"))
    say(lambda: store.check(["decision", "arrived"]))
    say(lambda: store.check(["decision", "nobody"]))
    say(lambda: store.get("nobody"))
    say(lambda: store.wait(["decision", "nobody"], timedelta(seconds=0.05)))
    say(lambda: store.set("blob", b"\x00\xff"))
    say(lambda: store.add("blob", 1))
    say(lambda: store.multi_get(["decision", "blob"]))
    say(lambda: store.multi_set(["m1", "m2"], ["1", b"2"]))
    say(lambda: store.multi_get(["m1", "m2"]))
    say(lambda: store.append("log", "a"))
    say(lambda: store.append("log", b"b"))
    say(lambda: store.get("log"))
    say(lambda: store.num_keys())
    say(lambda: store.delete_key("log"))
    say(lambda: store.delete_key("log"))
    say(lambda: store.num_keys())
    say(lambda: sorted(store.list_keys()))
    say(lambda: store.queue_push("q", "first"))
    say(lambda: store.queue_push("q", "second"))
    say(lambda: store.queue_len("q"))
    say(lambda: store.queue_pop("q"))
    say(lambda: store.queue_len("q"))
    return out


@pytest.mark.torch
def test_the_fake_answers_as_torchs_hashstore():
    torch_dist = pytest.importorskip("torch.distributed")
    real = _calls(torch_dist.HashStore())
    with World(seed=3) as world:
        server = StoreServer(world.sim)
        simulated = world.call(lambda: _calls(server.client()))
    assert simulated == real
    assert ("DistStoreError", "Wait timeout") in real


def test_a_blocked_get_is_released_by_the_set_and_a_wait_times_out_on_virtual_time():
    with World(seed=4) as world:
        server = StoreServer(world.sim)
        got: list = []

        def reader():
            store = server.client(timeout=timedelta(seconds=600))
            got.append((store.get("go"), world.now))

        def writer():
            world.sim.sleep(120.0)
            server.client().set("go", "now")

        def late():
            store = server.client(timeout=timedelta(seconds=30))
            try:
                store.wait(["never"])
            except RuntimeError as exc:
                got.append((str(exc), world.now))
        world.spawn("reader", reader)
        world.spawn("writer", writer)
        world.spawn("late", late)
        world.run()
    assert sorted(got, key=lambda item: item[1])[0][0] == "Wait timeout"
    value, when = next(item for item in got if item[0] == b"now")
    assert 120.0 < when < 120.1  # released by the set, not by polling
    assert server.ops["get"] == 1 and server.ops["wait"] == 1


def test_calls_queue_at_the_servers_rate_and_a_dead_host_fails_every_call():
    with World(seed=5) as world:
        host = world.node("node-0")
        server = StoreServer(world.sim, host=host, ops_per_s=1000.0)
        done: list = []
        for k in range(50):
            world.spawn(f"n{k}", lambda: done.append((server.client().add("arrived", 1), world.now)))
        world.run()
        assert max(n for n, _ in done) == 50
        assert max(t for _, t in done) >= 50 / 1000.0  # 50 calls one after another at 1,000/s
        world.sim.kill(host)
        failed: list = []

        def after():
            try:
                server.client().get("arrived")
            except RuntimeError as exc:
                failed.append(str(exc))
        world.spawn("after", after)
        world.run()
    assert failed and "Connection reset" in failed[0]
