"""Seeded exploration over every scenario: 336 seeds in all, each run's invariants checked. A
violation passes only when amlhpc.sim.known names its defect (the defects the code has
today, each with its own expected-failure test in test_sim_defects.py); one it cannot name
is a new finding and fails here with the seed that replays it. Then one run at 1,000 nodes,
and the replay itself: a seed's run, trace included, is the same every time."""

from __future__ import annotations

import pytest

from amlhpc.sim import explore, known
from amlhpc.sim.__main__ import main
from amlhpc.sim.explore import run, scenarios
from amlhpc.sim.scenario import Violation

SEEDS = {  # scenario: (seeds, nodes); small worlds, so that the sweep stays within seconds
    "checkpoint-commit": (16, 2), "folder-upload": (24, None), "prune-race": (20, None),
    "restart-agreement": (40, None), "launch-records": (20, None), "watchdog-clock": (30, None),
    "heartbeats": (16, 4), "hang-culprit": (40, None), "revival": (30, None), "staging": (8, 2), "upload-sessions": (20, None),
    "restore-pin": (60, None), "heartbeats-throttled": (12, None),
}


def test_the_sweep_covers_every_scenario_with_200_seeds_or_more():
    assert set(SEEDS) == set(scenarios())
    assert sum(seeds for seeds, _ in SEEDS.values()) >= 200


@pytest.mark.parametrize("scenario", sorted(SEEDS))
def test_every_violation_a_sweep_finds_is_a_known_defect(scenario):
    seeds, nodes = SEEDS[scenario]
    unknown, found = [], set()
    for seed in range(seeds):
        outcome = run(scenario, seed, size=nodes, keep_trace=False)
        if outcome.ok:
            continue
        defect = known.cause(outcome)
        if defect is None:
            unknown.append(f"seed {seed}: " + "; ".join(str(v) for v in outcome.violations))
        else:
            found.add(defect)
    assert not unknown, (f"new finding(s) in {scenario}; replay with `python -m amlhpc.sim explore {scenario} "
                         f"--seed N{f' --nodes {nodes}' if nodes else ''}`:\n" + "\n".join(unknown))


def test_the_hang_culprit_sweep_finds_a_waiting_node_named_without_the_next_look_rule(monkeypatch):
    """The sweep above passes because of watchdog._stopping_with_peer: without it, a node names a
    waiting peer whose age, read from whole-second service times, passed the limit first (the
    managed hang rehearsal's failure, "node 0 (vm) made no progress for 10s")."""
    from amlhpc.jobs.runtime.launch import watchdog

    monkeypatch.setattr(watchdog, "_stopping_with_peer", lambda *args, **kwargs: False)
    wrong = [seed for seed in range(SEEDS["hang-culprit"][0])
             if any(v.kind == "wrong-culprit" for v in run("hang-culprit", seed, keep_trace=False).violations)]
    assert len(wrong) >= 3, wrong


def test_the_throttled_heartbeats_sweep_ends_healthy_jobs_without_the_store_pulse(monkeypatch):
    """The sweep above passes because a peer silent in Blob is asked about on the job's store
    (amlhpc.jobs.runtime.launch.liveness): without that, the 503 storm ends healthy jobs as a hang
    (the recovery benchmark's `throttle` scenario did, 4 runs of 10), and the storm is long enough
    to: the slow node's heartbeat stays silent in the service past hang_s in every seed."""
    from amlhpc.jobs.runtime.launch import liveness

    seeds = range(SEEDS["heartbeats-throttled"][0])
    for seed in seeds[:3]:
        metrics = run("heartbeats-throttled", seed, keep_trace=False).metrics
        assert metrics["verdicts"] == 0 and metrics["max_heartbeat_silence_s"] > 1.5 * metrics["hang_s"], metrics
    monkeypatch.setattr(liveness.StoreLiveness, "alive", lambda self, node: False)
    ended = [seed for seed in seeds
             if any(v.kind == "false-hang" for v in run("heartbeats-throttled", seed, keep_trace=False).violations)]
    assert len(ended) >= len(seeds) // 2, ended


def test_the_restore_pin_sweep_finds_foreign_and_replayed_pointers_without_the_trust_rule(monkeypatch):
    """The restore-pin sweep passes because of checkpoint/trust.py: an attempt that followed `latest`
    as found would restore another job's version, or a replayed older one."""
    from amlhpc.jobs.runtime.checkpoint import trust

    monkeypatch.setattr(trust.RestoreTrust, "choose", lambda self, pointer: dict(pointer) if pointer else
                        self.pin.pointer())
    kinds = [v.kind for seed in range(SEEDS["restore-pin"][0])
             for v in run("restore-pin", seed, keep_trace=False).violations]
    assert kinds.count("restored-foreign") >= 3 and "restored-stale" in kinds, kinds


def test_1000_nodes_look_at_each_others_heartbeats_through_blob():
    outcome = run("heartbeats", 1, size=1000, keep_trace=False,
                  settings={"hang_s": 600.0, "check_s": 10.0, "looks": 1})
    assert outcome.ok, outcome.report(trace=False)
    assert outcome.metrics["heartbeats"] == 1000
    assert outcome.requests == 2000  # one look of 1,000 nodes: a heartbeat and one listing each
    assert outcome.metrics["peak_account_rps"] >= 1000  # the look's 2,000 requests land within a second
    # the store pulse beside it (liveness.py): one `add` per node per look, no peer's pulse read
    assert outcome.metrics["store_calls_per_node_max"] == 1, outcome.metrics


def test_a_seed_replays_exactly_with_its_trace():
    first, second = (run("restart-agreement", 19) for _ in range(2))
    assert first.trace == second.trace and len(first.trace) > 20
    assert first.violations == second.violations
    assert run("restart-agreement", 20).trace != first.trace


def test_the_command_replays_a_seed_and_sweeps_a_range(capsys, monkeypatch):
    assert main(["explore", "staging", "--seed", "14"]) == 0  # a fixed defect's run (known.FIXED)
    capsys.readouterr()
    # no defect remains to replay, so one run's outcome carries a planted violation: the command
    # must fail on it and print it with the run's trace
    real = explore.run

    def planted(*args, **kwargs):
        outcome = real(*args, **kwargs)
        outcome.violations.append(Violation("split-decision", "planted by the test"))
        return outcome

    monkeypatch.setattr(explore, "run", planted)
    assert main(["explore", "restart-agreement", "--seed", "19"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION split-decision: planted by the test" in out and "trace:" in out
    monkeypatch.setattr(explore, "run", real)
    assert main(["explore", "upload-sessions", "--seeds", "0-2"]) == 0
    assert "3 seed(s), 0 broke an invariant" in capsys.readouterr().out
    assert main(["list"]) == 0 and "checkpoint-commit" in capsys.readouterr().out


def test_the_command_refuses_bad_input_with_one_clear_line(capsys):
    assert main(["explore", "nosuch", "--seed", "1"]) == 2
    assert "no scenario 'nosuch'" in capsys.readouterr().err
    assert main(["explore", "revival", "--seeds", "9-3"]) == 2
    assert main(["explore", "revival", "--seed", "1", "--nodes", "0"]) == 2
