"""The job's coordination at scale, measured by bench.scale on the real code in the simulated
Azure: what each node asks per second must not grow with the node count, and a 1,000-node job
stays within the issue's budget on Azure's published targets (Microsoft Learn, "Scalability and
performance targets for Blob storage": 500 requests/s per blob; "... for standard storage
accounts": 20,000 requests/s per account): at most 250 requests/s on any blob (half the
target) and 2,000 requests/s on the account (a tenth), with the polls of the job's store,
not of Blob, carrying the coordination."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import scale

BLOB_BUDGET_RPS = 250
ACCOUNT_BUDGET_RPS = 2_000


@pytest.fixture(scope="module")
def steady(tmp_path_factory) -> dict[int, dict]:
    root = Path(tmp_path_factory.mktemp("scale"))
    return {n: scale.job_store_steady(n, 0, root / str(n), window_s=4.0, check_s=2.0, warmup_s=1.0)
            for n in (8, 64, 1000)}


def test_what_each_node_asks_per_second_does_not_grow_with_the_node_count(steady):
    small = steady[8]
    for n in (64, 1000):
        assert steady[n]["store_ops_per_node_s"] <= 1.1 * small["store_ops_per_node_s"], (n, steady[n], small)
        assert steady[n]["blob_requests_per_node_s"] <= 1.1 * small["blob_requests_per_node_s"], (n, steady[n], small)
    assert small["store_ops_per_node_s"] > 0 and small["blob_requests_per_node_s"] > 0  # the nodes do poll


def test_a_1000_node_job_stays_within_its_share_of_azures_targets(steady):
    big = steady[1000]
    assert big["hot_blob_rps"] <= BLOB_BUDGET_RPS, big
    assert big["account_rps"] <= ACCOUNT_BUDGET_RPS, big
    assert big["throttled"] == 0, big
    assert big["hot_blob_rps"] >= 100, big  # the heartbeat listing is measured, not absent


def test_a_1000_node_start_reads_a_versioned_datasets_manifest_within_the_blob_budget(tmp_path, monkeypatch):
    """Every node resolves the dataset's version at the start (a listing of `_versions/`, the
    manifest): in read slots the manifest blob stays within budget and each node asks the same
    two requests at any N; all at once (no slots, the baseline in the same run) it passes the
    blob's 500/s target."""
    from amlhpc.jobs.runtime.coord import pacing

    paced = scale.job_store_start(1000, 0, tmp_path / "paced", files=200)
    assert paced["resolved"] == 1000 and paced["requests"] == 2 * 1000 + 1, paced  # + the manifest's upload
    assert paced["manifest_rps"] <= BLOB_BUDGET_RPS and paced["hot_blob_rps"] <= BLOB_BUDGET_RPS, paced
    assert paced["account_rps"] <= ACCOUNT_BUDGET_RPS and paced["throttled"] == 0, paced
    monkeypatch.setattr(pacing, "read_slot_s", lambda node: 0.0)
    together = scale.job_store_start(1000, 0, tmp_path / "together", files=200)
    assert together["manifest_rps"] > 500, together


def test_each_node_reads_the_manifest_parts_of_its_share_whatever_the_node_count(tmp_path):
    """A version of 20,000 files in 80 parts (250 rows each here; PART_ROWS in a real upload):
    the bytes a node reads at the start fall as the node count grows, each part blob is read by
    about N / parts + 1 nodes, and every file is in one node's share (bench.scale asserts it).
    The baseline in the same run, the same files in one inline manifest, costs every node the
    whole listing at any N."""
    parts = scale.PARTS_FILES // scale.PARTS_ROWS
    inline = scale.job_store_start(8, 0, tmp_path / "inline", files=scale.PARTS_FILES)
    runs = {n: scale.job_store_start(n, 0, tmp_path / str(n), files=scale.PARTS_FILES, part_rows=scale.PARTS_ROWS)
            for n in (8, 64, 512, 1000)}
    assert all(run["parts"] == parts == 80 and run["resolved"] == n for n, run in runs.items()), runs
    for n, run in runs.items():
        assert run["bytes_read_per_node"] <= runs[8]["bytes_read_per_node"], (n, run)
        assert run["parts_read_per_node"] <= parts / n + 2, (n, run)
        assert run["part_reads_max"] <= n / parts + 2, (n, run)
        assert run["manifest_rps"] <= BLOB_BUDGET_RPS and run["account_rps"] <= ACCOUNT_BUDGET_RPS, (n, run)
    assert runs[1000]["bytes_read_per_node"] * 20 < inline["bytes_read_per_node"], (runs[1000], inline)


def test_a_seed_replays_the_same_figures(steady, tmp_path):
    """The pacing's jitter draws from the `random` module: the world seeds it, so a rerun of one
    seed is the same run (unseeded, one node's looks moved and the rates with them)."""
    assert scale.job_store_steady(8, 0, tmp_path, window_s=4.0, check_s=2.0, warmup_s=1.0) == steady[8]


@pytest.mark.parametrize("failing", [False, True], ids=["ends", "host-fails-a-node-absent"])
def test_the_store_host_stays_until_the_last_goodbye_and_not_longer_at_any_size(failing, tmp_path):
    """The launchers' goodbye at a job's end (agree.greet, agree.farewell), every node finishing
    within 30 s: node 0, which hosts the job's store, returns within two of its polls after the
    last node's goodbye (never before it: a node still reading its last answers would lose the
    store), whatever the size; failing, with one node that never reached the store, it waits for
    the nodes that did, not its whole BYE_WAIT_S; and what each node asks of the store does not
    grow with the node count."""
    from amlhpc.jobs.runtime.coord import agree, pacing

    runs = {n: scale.job_store_end(n, 0, tmp_path, failing=failing) for n in (8, 64, 1000)}
    for n, run in runs.items():
        assert run["returned"] == run["expected"], (n, run)
        two_polls = 2 * pacing.store_poll_s(agree.BASE_POLL_S, n) * (1 + pacing.JITTER)
        assert 0 <= run["host_after_last_s"] <= two_polls, (n, run, two_polls)
        assert run["host_after_last_s"] < run["wait_s"] / 10, (n, run)
    assert runs[1000]["store_ops_per_node"] <= 1.1 * runs[8]["store_ops_per_node"], runs
