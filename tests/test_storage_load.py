"""A storage account's expected load against Azure's targets: the plan's view of a stack's
clusters at full scale, and the fleet budget `jobs submit` holds (the jobs' checkpoint caps
together within the account's ingress)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from amlhpc.core import skus
from amlhpc.core.errors import UserError
from amlhpc.core.storage_load import (
    CHECKPOINT_BLOCK_BYTES,
    CHECKPOINT_INGRESS_SHARE,
    STAGING_READ_BYTES,
    ClusterDemand,
    account_load,
    job_cap_gbps,
)
from amlhpc.infra.plan import limits as plan_limits
from amlhpc.jobs.azure import submit as submitter
from amlhpc.jobs.plan import limits as job_limits
from amlhpc.jobs.runtime.base import contract
from tests.test_azureml_limits import stack

ROLES = ("datasets", "checkpoints", "coordination")


def test_request_sizes_are_the_runtimes():
    from amlhpc.jobs.runtime.blob.fetch import MAX_PIECE_BYTES
    from amlhpc.jobs.runtime.checkpoint.store import BLOCK_BYTES

    assert (CHECKPOINT_BLOCK_BYTES, STAGING_READ_BYTES) == (BLOCK_BYTES, MAX_PIECE_BYTES)


class TestAccountLoad:
    def test_one_cluster_fits_its_checkpoint_share(self):
        load = account_load("a", ROLES, [ClusterDemand("nd", 8, 80.0)], ingress_gbps=25.0, egress_gbps=1000.0)
        assert load.checkpoint_caps_gbps == pytest.approx(25.0 * CHECKPOINT_INGRESS_SHARE)
        assert load.over() == []

    def test_two_clusters_claim_more_than_the_ingress(self):
        clusters = [ClusterDemand("a", 64, 80.0), ClusterDemand("b", 64, 80.0)]
        load = account_load("a", ROLES, clusters, ingress_gbps=25.0, egress_gbps=50.0)
        over = dict(load.over())
        assert load.checkpoint_caps_gbps == pytest.approx(2 * 25.0 * CHECKPOINT_INGRESS_SHARE)
        assert any(k.startswith("checkpoint caps 45.0 Gb/s together > ingress 25") for k in over)
        assert any(k.startswith("egress 10,240.0 Gb/s > 50") for k in over)
        fix = next(v for k, v in over.items() if k.startswith("checkpoint caps"))
        assert "aml-hpc:checkpointAccounts in an experiment stack per cluster" in fix
        assert "(2 accounts' worth of ingress is claimed here)" in fix

    def test_requests_follow_the_bytes(self):
        load = account_load("a", ("datasets",), [ClusterDemand("a", 100, 8.0)], ingress_gbps=25.0, egress_gbps=1000.0)
        assert load.ingress_gbps == 0 and load.egress_gbps == 800.0
        assert load.requests_per_s == pytest.approx(800e9 / 8 / STAGING_READ_BYTES)
        assert load.target_requests_per_s == skus.STORAGE_ACCOUNT.requests_per_s

    def test_a_job_never_sends_faster_than_its_nics(self):
        assert job_cap_gbps(2, 1.0, 25.0) == 2.0
        assert job_cap_gbps(10, 80.0, 25.0, cap_mbps=500) == 5.0


def test_the_plan_shows_the_stacks_account(tmp_path):
    cfg = stack([{"name": "nd-a", "sku": "Standard_ND96asr_v4", "maxNodes": 16},
                 {"name": "nd-b", "sku": "Standard_ND96asr_v4", "maxNodes": 16}])
    (load,) = plan_limits.storage_load(cfg)
    doc = load.to_json()
    assert doc["roles"] == list(ROLES) and doc["targets"]["requestsPerS"] == 20_000
    assert any(o["limit"].startswith("checkpoint caps") for o in doc["over"])


class TestFleetBudget:
    def env(self, cap_mbps, account="https://acct.blob.core.windows.net"):
        return {contract.CHECKPOINT_JSON: json.dumps({"account_url": account, "cap_mbps": cap_mbps})}

    def test_a_jobs_cap_from_its_environment(self):
        assert job_limits.job_checkpoint_gbps(self.env(1000), 8) == ("https://acct.blob.core.windows.net", 8.0)
        assert job_limits.job_checkpoint_gbps({}, 8) is None

    def test_a_striped_job_loads_each_account_with_its_share(self):
        spec = {"account_url": "https://ck1.blob.core.windows.net/", "cap_mbps": 1000, "accounts": ["ck1", "ck2", "ck3", "ck4"]}
        environment = {contract.CHECKPOINT_JSON: json.dumps(spec)}
        assert job_limits.job_checkpoint_gbps(environment, 8) == ("https://ck1.blob.core.windows.net/", 2.0)

    def test_within_the_ingress_passes_over_it_is_refused_with_the_cap_that_fits(self):
        assert job_limits.checkpoint_budget_problem("j", 8, 10.0, [("a", 10.0)], 25.0, "acct") is None
        problem = job_limits.checkpoint_budget_problem("j", 8, 22.5, [("a", 12.0)], 25.0, "acct")
        assert problem is not None and "34.5 Gb/s together" in problem.message and "a (12.0 Gb/s)" in problem.message
        assert "--set checkpoint.cap_mbps=1312" in problem.hint  # (22.5 - 12) Gb/s over 8 nodes

    def test_active_jobs_on_the_same_account_are_counted(self):
        jobs = [SimpleNamespace(name="a", status="Running", resources=SimpleNamespace(instance_count=4),
                                environment_variables=self.env(2000)),
                SimpleNamespace(name="b", status="Completed", resources=SimpleNamespace(instance_count=4),
                                environment_variables=self.env(2000)),
                SimpleNamespace(name="c", status="Queued", resources=SimpleNamespace(instance_count=2),
                                environment_variables=self.env(2000, "https://other.blob.core.windows.net"))]
        client = SimpleNamespace(jobs=SimpleNamespace(list=lambda: jobs))
        assert submitter.active_checkpoint_caps(client, "https://acct.blob.core.windows.net", "ws") == [("a", 8.0)]

    def test_submit_refuses_over_the_budget(self):
        from amlhpc.jobs.cli import main

        plan = SimpleNamespace(name="new", instance_count=8, environment_variables=self.env(2800), deepspeed=None)
        outputs = SimpleNamespace(workspace="ws", checkpoint_accounts=None, storage=SimpleNamespace(ingress_gbps=25.0, account="acct"))
        busy = SimpleNamespace(active_checkpoint_caps=lambda client, url, ws: [("old", 20.0), ("new", 22.4)])
        with pytest.raises(UserError) as raised:
            main._check_checkpoint_budget(busy, None, outputs, plan)
        assert "old (20.0 Gb/s)" in raised.value.problems[0].message and "new (" not in raised.value.problems[0].message
        idle = SimpleNamespace(active_checkpoint_caps=lambda client, url, ws: [])
        main._check_checkpoint_budget(idle, None, outputs, plan)
