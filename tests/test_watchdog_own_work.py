"""The watchdog's view of a rank's own work (amlhpc/jobs/runtime/launch/watchdog.py): each step's own-work
time whichever report it samples, the node's median of its slowest rank, whether the node
waits for its peers, and which node a hang started on when every node stopped."""

from __future__ import annotations

from datetime import UTC, datetime

from amlhpc.jobs.runtime.base.progress import Progress
from amlhpc.jobs.runtime.coord.nodestatus import Heartbeat
from amlhpc.jobs.runtime.launch import watchdog


def watch() -> watchdog.NodeWatch:
    return watchdog.NodeWatch(watchdog.WatchdogSettings(hang_s=60), node=0, local_size=2, started=0.0)


def test_busy_is_the_slowest_ranks_median_whichever_report_is_sampled():
    w = watch()
    beats = 0
    for step, busy0, busy1 in ((1, 0.10, 0.30), (2, 0.11, 0.31), (3, 0.50, 0.29)):
        beats += 1
        w.observe(0, Progress(step - 1, beats, 0, None, waiting=step, busy_s=busy0), now=step)  # waiting on `step`
        w.observe(1, Progress(step, beats, 0, None, waiting=None, busy_s=busy1), now=step)  # finished `step`
    assert w.busy_s == 0.30, "rank 1's median (0.29, 0.30, 0.31); one slow step of rank 0 is not its median"
    assert w.all_waiting is False, "rank 1 is working"
    w.observe(1, Progress(3, 9, 0, None, waiting=4, busy_s=0.3), now=4)
    w.observe(0, Progress(3, 9, 0, None, waiting=4, busy_s=0.1), now=4)
    assert w.all_waiting is True


def test_a_training_that_does_not_say_is_not_judged_on_it():
    w = watch()
    w.observe(0, Progress(5, 1), now=1)
    assert w.busy_s is None and w.all_waiting is None


def beat(node: int, waiting: bool | None) -> Heartbeat:
    return Heartbeat(node, 12, 70.0, 0, f"node{node}-host", "training", datetime(2026, 1, 1, tzinfo=UTC), 0.1, waiting)


def test_the_node_not_waiting_is_where_the_hang_started():
    assert watchdog._stopped_in_own_work(0, True, {1: beat(1, False)})[0] == 1, "node 0 waits for node 1"
    assert watchdog._stopped_in_own_work(1, False, {0: beat(0, True)})[0] == 1, "node 1 names itself"
    assert watchdog._stopped_in_own_work(0, True, {1: beat(1, None)}) is None, "node 1 does not say"
    assert watchdog._stopped_in_own_work(0, False, {1: beat(1, False), 2: beat(2, True)}) is None, "two are working"


def test_a_peer_just_under_the_limit_while_this_node_waits_is_judged_at_the_next_look():
    """Both nodes stopped on one collective; the peer's report came a moment later, so it
    reads 55 s against a 60 s limit (looks every 10 s). Blaming this node now would name
    the wrong culprit by a race; the next look sees both past the limit."""
    settings = watchdog.WatchdogSettings(hang_s=60)
    assert settings.interval_s == 10
    assert watchdog._peers_stopped_with_us(True, [55.0], settings) is True
    assert watchdog._peers_stopped_with_us(True, [55.0, 41.0], settings) is True
    assert watchdog._peers_stopped_with_us(True, [55.0, 12.0], settings) is False, "a peer that progressed lately goes on"
    assert watchdog._peers_stopped_with_us(False, [55.0], settings) is False, "this node's ranks are working: its own hang"
    assert watchdog._peers_stopped_with_us(None, [55.0], settings) is False, "the training does not say it waits"
    assert watchdog._peers_stopped_with_us(True, [], settings) is False, "no peer goes on: judged now"


def test_a_peer_past_the_limit_while_this_node_nearly_is_judged_at_the_next_look():
    """The frozen node's own watchdog reads its waiting peer's age from one-second service
    times: the peer shows 10.4 s against a 10 s limit while this node's own is 9.6 s. Naming
    the peer now blamed the node that waits (the managed hang rehearsal, 3 runs of 6); the
    next look judges both past the limit and names the node not waiting."""
    settings = watchdog.WatchdogSettings(hang_s=10)
    assert round(settings.interval_s, 2) == 1.67
    assert watchdog._stopping_with_peer(9.6, False, settings) is True
    assert watchdog._stopping_with_peer(2.0, False, settings) is False, "this node goes on: the peer alone stopped"
    assert watchdog._stopping_with_peer(None, False, settings) is False, "before this node's first step"
    assert watchdog._stopping_with_peer(9.6, True, settings) is False, "a silent peer is named at once"
