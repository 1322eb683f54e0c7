"""Azure ML's limits a job meets at submit time, from the catalog's facts (skus.toml [[limit]]).

- An InfiniBand job above the node limit of a communication-enabled cluster on an RDMA-enabled
  family (and of one MPI run): Azure ML refuses it unless the Azure Machine Learning product
  team granted an exception, so the plan warns with the request to make
  (amlhpc.core.quota.rdma_cluster_request: the same words `infra plan` uses).
- Telemetry's metrics over the job's whole timeout against the metrics a run may keep: the
  count does not grow with the node count (amlhpc.jobs.runtime.node.telemetry.logged_values),
  but a short AMLHPC_TELEMETRY_INTERVAL_S over a long timeout can pass it.
- The fleet's checkpoint budget: this job's checkpoint cap plus the caps of the jobs already
  active on the same account must stay within the account's ingress (amlhpc/core/storage_load.py);
  each job alone caps at 90 % of it, so two at once would claim 1.8x.
- The managed runs' controller cluster: one node per managed run; a run submitted while every
  node supervises another waits in the queue with nobody watching its training.

Pure: the Azure calls that count active runs live in amlhpc.jobs.azure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from amlhpc.core import skus
from amlhpc.core.errors import Problem
from amlhpc.core.quota import rdma_cluster_request
from amlhpc.core.storage_load import CHECKPOINT_INGRESS_SHARE
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


def job_checkpoint_gbps(environment: Mapping[str, str], nodes: int) -> tuple[str, float] | None:
    """(account URL, Gb/s) a job's checkpoint upload may use together, from its environment, or None."""
    raw = environment.get(contract.CHECKPOINT_JSON)
    if not raw:
        return None
    try:
        spec = json.loads(raw)
        return str(spec["account_url"]), float(spec["cap_mbps"]) * nodes / 1000
    except (ValueError, KeyError, TypeError):
        return None


def checkpoint_budget_problem(job: str, nodes: int, job_gbps: float, active: list[tuple[str, float]],
                              ingress_gbps: float, account: str) -> Problem | None:
    """A Problem when this job's checkpoint cap and the active jobs' caps on the same account
    together pass its ingress, else None."""
    taken = sum(gbps for _, gbps in active)
    if job_gbps + taken <= ingress_gbps:
        return None
    free = ingress_gbps * CHECKPOINT_INGRESS_SHARE - taken
    lower = (f"--set checkpoint.cap_mbps={int(free * 1000 / nodes)} (what the active jobs leave, per node)"
             if free * 1000 / nodes >= 1 else "nothing: the active jobs take the whole share")
    names = ", ".join(f"{name} ({gbps:,.1f} Gb/s)" for name, gbps in active)
    return Problem(f"storage account {account}", "checkpoint.cap_mbps",
                   f"job {job}'s checkpoints may upload at {job_gbps:,.1f} Gb/s and the jobs already active on the "
                   f"account at {taken:,.1f} Gb/s ({names}): {job_gbps + taken:,.1f} Gb/s together is over the "
                   f"account's ingress of {ingress_gbps:g} Gb/s ({skus.cite(skus.STORAGE_ACCOUNT.source)})",
                   f"lower this job's cap: {lower}; or give the experiment a checkpoint account of its own; "
                   "or wait for an active job to end")
