"""Azure ML's limits a job meets at submit time, from the catalog's facts (skus.toml [[limit]]).

- An InfiniBand job above the node limit of a communication-enabled cluster on an RDMA-enabled
  family (and of one MPI run): Azure ML refuses it unless the Azure Machine Learning product
  team granted an exception, so the plan warns with the request to make
  (amlhpc.core.quota.rdma_cluster_request: the same words `infra plan` uses).
- Telemetry's metrics over the job's whole timeout against the metrics a run may keep: the
  count does not grow with the node count (amlhpc.jobs.runtime.node.telemetry.logged_values),
  but a short AMLHPC_TELEMETRY_INTERVAL_S over a long timeout can pass it.
- The managed runs' controller cluster: one node per managed run; a run submitted while every
  node supervises another waits in the queue with nobody watching its training.

Pure: the Azure calls that count active runs live in amlhpc.jobs.azure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from amlhpc.core import skus
from amlhpc.core.errors import Problem
from amlhpc.core.quota import rdma_cluster_request
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.node import telemetry


def rdma_nodes_warning(cluster: str, sku: skus.Sku, nodes: int, location: str) -> str:
    """A warning when an InfiniBand job is larger than Azure ML's default limit, else ""."""
    found = skus.limit("azureml", "rdma_cluster_nodes")
    if not sku.infiniband or nodes <= found.value:
        return ""
    return (f"{nodes} nodes on InfiniBand cluster {cluster!r}: Azure ML allows {found.value} nodes in a communication-"
            f"enabled cluster on an RDMA-enabled family and in one MPI run ({skus.cite(found.source)}) unless the "
            f"product team granted an exception; if it has not, {rdma_cluster_request(cluster, sku, nodes, location)}")


def telemetry_warning(timeout_s: int, environment: Mapping[str, str]) -> str:
    """A warning when telemetry could log more metric values than a run keeps over the job's timeout, else ""."""
    interval = telemetry.interval_from_env(environment)
    values = telemetry.logged_values(timeout_s / 3600, interval)
    limit = skus.limit("azureml", "metrics_per_run")
    if values <= limit.value:
        return ""
    shortest = math.ceil(len(telemetry.RUN_METRICS) * timeout_s / (limit.value - 2 * len(telemetry.RUN_METRICS)))
    return (f"telemetry would log up to {values:,} metric values over the job's {timeout_s / 3600:g} h timeout "
            f"({contract.TELEMETRY_INTERVAL_S}={interval:g}) and Azure ML keeps {limit.value:,} per run "
            f"({skus.cite(limit.source)}): set {contract.TELEMETRY_INTERVAL_S} to {shortest} s or more "
            "(the per-node files keep every sample whatever the interval)")


def controller_problem(active_runs: int, max_nodes: int, cluster: str, stack_file: str) -> Problem | None:
    """A Problem when the controller cluster has no free node for one more managed run, else None."""
    if active_runs < max_nodes:
        return None
    return Problem(f"controller cluster {cluster!r}", "aml-hpc:controller.maxNodes",
                   f"{active_runs} managed run(s) are active and the cluster scales to {max_nodes} node(s), one per "
                   "run: this run's controller would wait in the queue while its training runs unwatched",
                   f"raise aml-hpc:controller.maxNodes in {stack_file} (at least {active_runs + 1}) and deploy, or "
                   "wait for a managed run to end")
