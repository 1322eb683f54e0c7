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
- The checkpoint within its interval: a DeepSpeed recipe gives the model's size, so its
  checkpoint (CHECKPOINT_BYTES_PER_PARAM per parameter) must upload within checkpoint.interval_s
  at 90 % of the ingress of the accounts the stack stripes over (stack output checkpointAccounts);
  otherwise every round skips versions and the recovery point is older than the interval.
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
from amlhpc.core.storage_load import (
    CHECKPOINT_BYTES_PER_PARAM,
    CHECKPOINT_INGRESS_SHARE,
    CHECKPOINT_INTERVAL_SHARE,
    checkpoint_accounts_needed,
)
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
    """(first account's URL, Gb/s on each account) a job's checkpoint upload may use together, from
    its environment, or None. A job striped over several accounts spreads its parts evenly over
    them, so each account carries its share of the job's cap."""
    raw = environment.get(contract.CHECKPOINT_JSON)
    if not raw:
        return None
    try:
        spec = json.loads(raw)
        stripes = max(1, len(spec.get("accounts") or []))
        return str(spec["account_url"]), float(spec["cap_mbps"]) * nodes / 1000 / stripes
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
    split = math.ceil(job_gbps / (ingress_gbps * CHECKPOINT_INGRESS_SHARE))
    return Problem(f"storage account {account}", "checkpoint.cap_mbps",
                   f"job {job}'s checkpoints may upload at {job_gbps:,.1f} Gb/s and the jobs already active on the "
                   f"account at {taken:,.1f} Gb/s ({names}): {job_gbps + taken:,.1f} Gb/s together is over the "
                   f"account's ingress of {ingress_gbps:g} Gb/s ({skus.cite(skus.STORAGE_ACCOUNT.source)})",
                   f"lower this job's cap: {lower}; or give the job's clusters checkpoint accounts of their own "
                   f"(an experiment stack with aml-hpc:checkpointAccounts: {{count: {split}}}, deployed, and the job "
                   "submitted on it); or wait for an active job to end")


def job_checkpoint_fit(job: str, params: int, environment: Mapping[str, str], accounts: int,
                       stack: str) -> Problem | None:
    """checkpoint_fit_problem with the interval and the ingress the job's checkpoint settings carry."""
    try:
        spec = json.loads(environment.get(contract.CHECKPOINT_JSON) or "")
        interval_s, ingress_gbps = int(spec["interval_s"]), float(spec["ingress_gbps"])
    except (ValueError, KeyError, TypeError):
        return None
    return checkpoint_fit_problem(job, params, interval_s, accounts, ingress_gbps, stack)


def checkpoint_fit_problem(job: str, params: int, interval_s: int, accounts: int, ingress_gbps: float,
                           stack: str) -> Problem | None:
    """A Problem when a checkpoint of `params` parameters cannot commit within its interval
    (its bytes in 90 % of it, at 90 % of the ingress of the `accounts` it is striped over), else None."""
    size = params * CHECKPOINT_BYTES_PER_PARAM
    needed = checkpoint_accounts_needed(size, interval_s, ingress_gbps)
    if needed <= accounts:
        return None
    upload_s = math.ceil(size * 8 / (accounts * CHECKPOINT_INGRESS_SHARE * ingress_gbps * 1e9))
    fits_s = math.ceil(upload_s / CHECKPOINT_INTERVAL_SHARE)
    where = "its own account" if accounts == 1 else f"{accounts} accounts"
    return Problem(f"job {job}", "checkpoint.interval_s",
                   f"a checkpoint of {params:,} parameters x {CHECKPOINT_BYTES_PER_PARAM} bytes ({size / 1e12:,.2f} TB) "
                   f"takes {upload_s:,} s to upload at {CHECKPOINT_INGRESS_SHARE:.0%} of the ingress of {where} "
                   f"({ingress_gbps:g} Gb/s each, {skus.cite(skus.STORAGE_ACCOUNT.source)}) and the interval is "
                   f"{interval_s} s, of which {CHECKPOINT_INTERVAL_SHARE:.0%} is for the bytes (the rest: the nodes' "
                   f"phases and the commit): rounds would skip versions and the recovery point would be ~{fits_s:,} s old",
                   f"stripe it over {needed} accounts: aml-hpc:checkpointAccounts: {{count: {needed}}} in Pulumi.{stack}.yaml "
                   f"(an experiment stack of its own if {stack} is an environment), deployed; or "
                   f"--set checkpoint.interval_s={fits_s}")
