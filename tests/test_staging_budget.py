"""Staging's cap, timeout and replica refusal, derived from the bytes and the account's egress."""

from __future__ import annotations

import logging

import pytest

from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.base.ranks import validated
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from amlhpc.jobs.runtime.staging import budget
from amlhpc.jobs.runtime.staging import stager as staging

PB = 10**15


def derive(mode: str, nodes: int, node_bytes: int, *, egress: float | None = 60.0, cap=None, timeout=10800.0,
           given=False, nic=None) -> budget.Budget:
    return budget.derive([budget.InputLoad("cosmo", mode, egress, node_bytes)], nodes, node_gbits=nic, cap_mbps=cap,
                         timeout_s=timeout, timeout_given=given)


def test_the_per_node_cap_is_the_accounts_egress_over_the_nodes():
    planned = derive("local", 1000, PB // 1000)
    assert planned.cap_mbps == pytest.approx(60.0)  # 60 Gb/s / 1,000 nodes = 60 Mb/s each
    assert derive("local", 1000, PB // 1000, cap=25.0).cap_mbps == 25.0  # a cap given stays


def test_a_petabyte_gets_a_timeout_from_its_bytes_and_says_so():
    planned = derive("local", 1000, PB // 1000)
    expected = PB * 8 / 60e9  # 1 PB at 60 Gb/s: ~37 h, whatever the node count
    assert planned.expected_s == pytest.approx(expected)
    assert planned.timeout_s == pytest.approx(2 * expected) and planned.timeout_s > 3 * 3600
    assert any("staging timeout 74.1 h" in line for line in planned.lines)


def test_a_timeout_given_is_kept_and_a_small_dataset_keeps_the_default():
    assert derive("local", 1000, PB // 1000, timeout=7200.0, given=True).timeout_s == 7200.0
    assert derive("local", 8, 10**9).timeout_s == 10800.0


def test_replica_mode_is_refused_when_it_cannot_finish():
    refused = derive("replica", 64, PB)
    assert refused.refusals and "replica mode pulls the whole dataset on each of 64 nodes" in refused.refusals[0].message
    assert "use mode 'local'" in refused.refusals[0].hint
    assert not derive("replica", 4, 10**11).refusals  # 100 GB on 4 nodes at 15 Gb/s each: a minute


def test_without_an_egress_nothing_is_derived():
    planned = derive("local", 8, PB, egress=None)
    assert (planned.cap_mbps, planned.timeout_s, planned.expected_s) == (None, 10800.0, None)


def test_the_node_nic_bounds_the_rate():
    planned = derive("local", 2, 10**12, nic=8.0)  # 30 Gb/s share, an 8 Gb/s NIC
    assert planned.expected_s == pytest.approx(10**12 * 8 / 8e9)


@pytest.mark.azurite
def test_the_stager_derives_its_cap_and_refuses_replica(azurite, container, tmp_path, caplog):
    from tests.test_staging import FAST, make_dataset, spec_json, upload_dataset

    upload_dataset(container, make_dataset(tmp_path, files=4))
    env = {contract.BLOB_CONNECTION_STRING: azurite.connection_string, contract.SCRATCH: str(tmp_path / "s"),
           contract.REPORT_DIR: str(tmp_path / "r"), "AMLHPC_RUN_ID": "budget", "AMLHPC_LAUNCH_ID": "l0"}
    specs = staging.specs_from_json(spec_json(container.container_name, "local", egress_gbps=50))
    with caplog.at_level(logging.INFO, logger="amlhpc.staging"):
        result = staging.stage_inputs(specs, validated(0, 0, 4, 1), options=FAST, env=env,
                                      channel=Channel(MemoryStore(), node=0, nodes=4))
    assert result.budget["cap_mbps"] == pytest.approx(12_500.0) and not result.warnings
    assert "per-node cap 12,500 Mb/s = the account's egress / 4 node(s)" in caplog.text
    # A 1 kb/s account: every node pulling the whole dataset cannot finish within the minute given.
    minute = {**env, contract.STAGE_TIMEOUT_S: "60"}
    replica = staging.specs_from_json(spec_json(container.container_name, "replica", egress_gbps=1e-6))
    with pytest.raises(staging.StageConfigError, match="replica mode pulls the whole dataset on each of 4 nodes"):
        staging.stage_inputs(replica, validated(0, 0, 4, 1), options=FAST, env=minute,
                             channel=Channel(MemoryStore(), node=0, nodes=4))
