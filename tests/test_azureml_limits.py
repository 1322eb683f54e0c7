"""Azure ML's limits at plan and submit time: the catalog's limits with their sources, the RDMA
cluster size and its support request, the controller cluster against concurrent managed runs,
telemetry's metric count against a run's limit at 1,000 nodes, and image pulls against the
registry SKU's reads per minute."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from amlhpc.core import skus
from amlhpc.core.catalog import facts
from amlhpc.core.errors import UserError
from amlhpc.infra.config import parse
from amlhpc.infra.plan import limits as plan_limits
from amlhpc.jobs import recipes
from amlhpc.jobs.azure import submit as submitter
from amlhpc.jobs.plan import build
from amlhpc.jobs.plan import limits as job_limits
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.node import telemetry
from tests.fake_nvml import FakeNvml, nd96asr_gpus
from tests.jobs_helpers import stack_outputs

ENV = {
    "azure-native:location": "eastus",
    "aml-hpc:owner": "team@example.com",
    "aml-hpc:budget": {"monthlyAmountUsd": 100_000_000, "alertEmails": ["team@example.com"]},
}


def stack(clusters, **extra):
    return parse("dev", {**ENV, "aml-hpc:clusters": clusters, **extra}, "Pulumi.dev.yaml")


def by_limit(checks, prefix):
    return [c for c in checks if c.limit.startswith(prefix)]


class TestCatalog:
    def test_every_limit_has_a_dated_source(self):
        for key in [("azureml", "rdma_cluster_nodes"), ("azureml", "metrics_per_run"), ("azureml", "metric_names_per_run"),
                    ("container_registry", "read_ops_per_minute.Standard"), ("container_registry", "read_ops_per_minute.Premium")]:
            found = skus.limit(*key)
            source = skus.SOURCES[found.source]
            assert source.as_of and source.url.startswith("https://learn.microsoft.com/"), key
        assert (skus.limit("azureml", "rdma_cluster_nodes").value, skus.limit("azureml", "metrics_per_run").value) == (100, 1_000_000)
        assert skus.limit("container_registry", "read_ops_per_minute.Standard").value == 3000
        assert skus.STORAGE_ACCOUNT.requests_per_s == 20_000

    def test_the_facts_list_names_them(self):
        listed = {(f.subject, f.key): f for f in facts.catalog_facts()}
        fact = listed[("azureml", "rdma_cluster_nodes")]
        assert fact.value == 100 and fact.as_of == "2026-01-27" and "quotas" in fact.title
        assert listed[("storage_account", "requests_per_s")].value == 20_000


class TestPlan:
    def test_an_rdma_cluster_above_100_nodes_is_flagged_with_the_request(self):
        cfg = stack([{"name": "nd-h100", "sku": "Standard_ND96isr_H100_v5", "maxNodes": 256},
                     {"name": "nd-small", "sku": "Standard_ND96asr_v4", "maxNodes": 100}])
        rdma = by_limit(plan_limits.checks(cfg, reads_per_pull=10), "azureml.rdma_cluster_nodes")
        assert [(c.subject, c.ok) for c in rdma] == [("cluster nd-h100", False), ("cluster nd-small", True)]
        fix = rdma[0].to_json()["fix"]
        assert "technical support request" in fix and "256 nodes" in fix and "Standard_ND96isr_H100_v5" in fix
        assert "eastus" in fix and rdma[1].to_json()["fix"] == ""

    def test_a_cluster_without_infiniband_is_not_an_rdma_pool(self):
        cfg = stack([{"name": "nc-a100", "sku": "Standard_NC24ads_A100_v4", "maxNodes": 1}])
        assert by_limit(plan_limits.checks(cfg, reads_per_pull=10), "azureml.rdma") == []

    def test_controller_nodes_against_the_gpu_clusters(self):
        clusters = [{"name": f"nd-{'abcde'[i]}", "sku": "Standard_ND96asr_v4", "maxNodes": 2} for i in range(5)]
        (ctl,) = by_limit(plan_limits.checks(stack(clusters), reads_per_pull=10), "controller")
        assert (ctl.needed, ctl.allowed, ctl.ok) == (5, 4, False) and "controller.maxNodes to at least 5" in ctl.fix
        (ctl,) = by_limit(plan_limits.checks(stack(clusters, **{"aml-hpc:controller": {"maxNodes": 8}}), reads_per_pull=10),
                          "controller")
        assert ctl.ok

    def test_image_pulls_at_scale_suggest_premium_then_a_cache(self):
        big = stack([{"name": "nd-h100", "sku": "Standard_ND96isr_H100_v5", "maxNodes": 400}])
        (pull,) = by_limit(plan_limits.checks(big, reads_per_pull=12), "container_registry")
        assert (pull.needed, pull.allowed, pull.ok) == (4800, 3000, False) and "make the registry Premium" in pull.fix
        assert f"pulumi config set aml-hpc:containerRegistry.sku Premium --stack {big.stack}" in pull.fix
        premium = stack([{"name": "nd-h100", "sku": "Standard_ND96isr_H100_v5", "maxNodes": 400}],
                        **{"aml-hpc:containerRegistry": {"sku": "Premium"}})
        (pull,) = by_limit(plan_limits.checks(premium, reads_per_pull=12), "container_registry")
        assert (pull.subject, pull.allowed, pull.ok) == ("registry (Premium)", 10000, True), "the fix it names works"
        huge = stack([{"name": "nd-h100", "sku": "Standard_ND96isr_H100_v5", "maxNodes": 1000}])
        (pull,) = by_limit(plan_limits.checks(huge, reads_per_pull=12), "container_registry")
        assert not pull.ok and "cache" in pull.fix

    def test_a_pull_reads_at_least_our_layers_and_the_manifest(self, tmp_path):
        dockerfile = tmp_path / "Dockerfile"
        dockerfile.write_text("FROM base\nRUN a\nCOPY b c\n# RUN not this\nADD d e\nENV X=1\n")
        assert plan_limits.pull_reads(dockerfile) == 3 + plan_limits.MANIFEST_READS
        assert plan_limits.pull_reads() > plan_limits.MANIFEST_READS  # the real training image


class TestSubmit:
    def test_an_rdma_job_above_100_nodes_warns_with_the_request(self):
        sku = skus.get("Standard_ND96isr_H100_v5")
        warning = job_limits.rdma_nodes_warning("nd-h100", sku, 128, "eastus")
        assert "128 nodes" in warning and "technical support request" in warning
        assert job_limits.rdma_nodes_warning("nd-h100", sku, 100, "eastus") == ""
        assert job_limits.rdma_nodes_warning("nc", skus.get("Standard_NC24ads_A100_v4"), 128, "eastus") == ""

    def test_plan_job_carries_the_warning(self):
        outputs = stack_outputs("prod")
        cluster = next(iter(outputs.clusters))
        wider = outputs.clusters[cluster].model_copy(update={"max_nodes": 200})
        outputs = outputs.model_copy(update={"clusters": {**outputs.clusters, cluster: wider}})
        plan = build.plan_job(recipes.load("cosmoflow"), outputs, cluster=cluster, nodes=150, allow_tcp=True)
        assert any("150 nodes on InfiniBand cluster" in w for w in plan.warnings), plan.warnings

    def test_telemetry_warns_only_when_the_interval_is_too_short_for_the_timeout(self):
        assert job_limits.telemetry_warning(21 * 24 * 3600, {}) == ""  # Azure ML's longest job at the default interval
        warning = job_limits.telemetry_warning(21 * 24 * 3600, {contract.TELEMETRY_INTERVAL_S: "1"})
        assert "1,000,000 per run" in warning and contract.TELEMETRY_INTERVAL_S in warning
        shortest = float(re.search(r"to (\d+) s or more", warning).group(1))
        assert telemetry.logged_values(21 * 24, shortest) <= 1_000_000

    def test_controller_capacity(self):
        assert job_limits.controller_problem(3, 4, "jobs-controller", "Pulumi.prod.yaml") is None
        problem = job_limits.controller_problem(4, 4, "jobs-controller", "Pulumi.prod.yaml")
        assert problem is not None and "at least 5" in problem.hint and problem.path == "aml-hpc:controller.maxNodes"

    def test_controller_load_counts_busy_nodes(self):
        nodes = [SimpleNamespace(node_state=s) for s in ("running", "idle", "preparing", "leaving")]
        client = SimpleNamespace(compute=SimpleNamespace(list_nodes=lambda cluster: nodes,
                                                         get=lambda cluster: SimpleNamespace(max_instances=4)))
        assert submitter.controller_load(client, "jobs-controller", "ws") == (2, 4)

    def test_submit_refuses_when_every_controller_node_is_busy(self):
        from amlhpc.jobs.cli import main

        busy = SimpleNamespace(controller_load=lambda client, cluster, workspace: (4, 4))
        outputs = SimpleNamespace(workspace="ws", environment="prod")
        with pytest.raises(UserError) as raised:
            main._check_controller_capacity(busy, None, outputs, "jobs-controller")
        assert "Pulumi.prod.yaml" in str(raised.value.problems[0].hint)
        free = SimpleNamespace(controller_load=lambda client, cluster, workspace: (3, 4))
        main._check_controller_capacity(free, None, outputs, "jobs-controller")


class Recorder:
    def __init__(self) -> None:
        self.values = 0
        self.names: set[str] = set()

    def log_metrics(self, metrics, step):
        self.values += len(metrics)
        self.names |= set(metrics)


def test_telemetry_metrics_do_not_grow_with_the_node_count(tmp_path):
    """1,000 nodes sampling every 30 s for 24 h: what the run receives stays under Azure ML's
    metrics per run and metric names per run; every node still writes its files."""
    nodes, hours = 1000, 24.0
    recorder = Recorder()
    samplers = [telemetry.Sampler(k, tmp_path / "reports", 30.0, sysfs=tmp_path / "sys", nvml_module=FakeNvml(nd96asr_gpus(8)),
                                  mlflow=recorder) for k in range(nodes)]
    for sampler in samplers:
        sampler.sample()
    per_sample = recorder.values  # one sample of every node
    samples = int(hours * 3600 / 30.0) + 2
    assert per_sample * samples <= telemetry.logged_values(hours) <= skus.limit("azureml", "metrics_per_run").value
    assert recorder.names <= set(telemetry.RUN_METRICS)
    assert len(telemetry.RUN_METRICS) <= skus.limit("azureml", "metric_names_per_run").value
    assert per_sample > 0 and len(list((tmp_path / "reports").glob("telemetry-node*.jsonl"))) == nodes
    summary = json.loads((tmp_path / "reports" / "telemetry-node999.summary.json").read_text())
    assert summary["samples"] == 1 and summary["gpus"] == 8
