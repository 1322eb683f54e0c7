"""Azure ML's and the container registry's limits against what a stack's clusters can do, at plan time.

Three checks, each a `LimitCheck` with the figure needed, the limit, its source and the fix:

- an InfiniBand (RDMA) cluster above Azure ML's node limit for a communication-enabled pool on
  an RDMA-enabled family (100 nodes; an exception is a technical support request to the Azure
  Machine Learning product team), with the request to make;
- the managed runs' controller cluster: one node per managed run, so its maxNodes is how many
  managed runs are supervised at once. Every GPU cluster can run at least one job at a time,
  so fewer controller nodes than GPU clusters leaves GPU clusters idle behind a queued controller;
  `jobs submit --managed` checks the runs actually active (amlhpc.jobs.plan.limits);
- image pulls: a node's pull is one registry read per layer plus the manifest, and a job's
  nodes start together, so the stack's clusters at full scale can pull at
  sum(maxNodes) x reads per pull within a minute, against the registry SKU's ReadOps per minute.
  The reads per pull counted here are a lower bound (our Dockerfile's layers, the manifest and
  the config; the base image's own layers come on top).

The limits are catalog facts (amlhpc/core/catalog/skus.toml [[limit]], each with its source
and date). Pure: the stack config in, checks out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amlhpc.core import skus
from amlhpc.core.quota import rdma_cluster_request
from amlhpc.core.storage_load import AccountLoad, ClusterDemand, account_load
from amlhpc.infra.config import NAMESPACE, StackConfig

TRAINING_DOCKERFILE = Path(__file__).resolve().parents[2] / "images" / "pytorch" / "Dockerfile"
"""The training image whose own layers count toward a pull's reads."""
_LAYER_INSTRUCTION = re.compile(r"^(RUN|COPY|ADD)\b", re.MULTILINE)
MANIFEST_READS = 2
"""The manifest and the image config blob, read once per pull besides the layers."""


@dataclass(frozen=True)
class LimitCheck:
    subject: str
    """What is checked: a cluster, the controller cluster, the registry."""
    limit: str
    """The catalog limit's subject.key."""
    needed: float
    allowed: float
    unit: str
    source: str
    """The limit's source, cited with its date."""
    fix: str
    """What to do when it is over (empty when within)."""

    @property
    def ok(self) -> bool:
        return self.needed <= self.allowed

    def to_json(self) -> dict[str, Any]:
        return {"subject": self.subject, "limit": self.limit, "needed": self.needed, "allowed": self.allowed,
                "unit": self.unit, "ok": self.ok, "source": self.source, "fix": "" if self.ok else self.fix}


def pull_reads(dockerfile: Path = TRAINING_DOCKERFILE) -> int:
    """Registry reads one node's pull takes at least: our image's layers plus the manifest and config."""
    try:
        layers = len(_LAYER_INSTRUCTION.findall(dockerfile.read_text()))
    except OSError:
        layers = 0
    return layers + MANIFEST_READS


def registry_sku(cfg: StackConfig) -> str:
    """The workspace registry's SKU as the program declares it (amlhpc/infra/components/workspace.py)."""
    return cfg.container_registry_sku


def checks(cfg: StackConfig, reads_per_pull: int | None = None) -> list[LimitCheck]:
    """Every limit check for the stack, in a stable order (clusters by their order in the stack file)."""
    out: list[LimitCheck] = []
    rdma = skus.limit("azureml", "rdma_cluster_nodes")
    gpu_nodes = 0
    for cluster in cfg.clusters:
        sku = skus.get(cluster.sku)
        gpu_nodes += cluster.max_nodes
        if sku.infiniband:
            out.append(LimitCheck(f"cluster {cluster.name}", "azureml.rdma_cluster_nodes", cluster.max_nodes,
                                  rdma.value, "nodes", skus.cite(rdma.source),
                                  rdma_cluster_request(cluster.name, sku, cluster.max_nodes, cfg.location)))
    ctl = cfg.controller
    if cfg.kind == "environment" and ctl.enabled and cfg.clusters:
        out.append(LimitCheck(
            f"controller cluster {ctl.name}", "controller.max_nodes", len(cfg.clusters), ctl.max_nodes,
            "concurrent managed runs", "one controller node per managed run (docs/managed-jobs.md)",
            f"raise aml-hpc:controller.maxNodes to at least {len(cfg.clusters)} in {cfg.source} (one per GPU "
            "cluster at least; a node costs only while its run is active) and deploy"))
    if gpu_nodes:
        sku_name = registry_sku(cfg)
        reads = reads_per_pull if reads_per_pull is not None else pull_reads()
        allowed = skus.limit("container_registry", f"read_ops_per_minute.{sku_name}")
        premium = skus.limit("container_registry", "read_ops_per_minute.Premium")
        needed = gpu_nodes * reads
        if sku_name != "Premium" and needed <= premium.value:
            fix = (f"make the registry Premium ({premium.value:,} reads/min; an update in place): "
                   f"pulumi config set {NAMESPACE}containerRegistry.sku Premium --stack {cfg.stack} and deploy, "
                   "or stagger the clusters' starts")
        else:
            fix = (f"even Premium's {premium.value:,} reads/min is below it: pull through a cache (an Azure ML "
                   "environment image cached on the nodes, or a registry replica per cluster group), or stagger "
                   "large jobs' starts")
        out.append(LimitCheck(f"registry ({sku_name})", f"container_registry.read_ops_per_minute.{sku_name}", needed,
                              allowed.value, f"reads/min at start ({gpu_nodes} nodes x at least {reads} reads per pull)",
                              skus.cite(allowed.source), fix))
    return out


def storage_load(cfg: StackConfig) -> list[AccountLoad]:
    """The stack's clusters at full scale on each of its storage accounts, against Azure's
    targets (amlhpc/core/storage_load.py): the dataset account with every role no account of its
    own takes, then the checkpoint accounts (each checkpoint striped over all of them), then the
    coordination account."""
    clusters = [ClusterDemand(c.name, c.max_nodes, skus.get(c.sku).storage_nic_gbits_per_s) for c in cfg.clusters]
    storage, names = cfg.storage, cfg.names
    checkpoint_accounts = names.checkpoint_storage
    coordination = storage.coordination_account and not cfg.is_experiment
    dataset_roles = ["datasets", *([] if checkpoint_accounts else ["checkpoints"]),
                     *([] if coordination else ["coordination"])]
    dataset = names.dataset_storage if not cfg.is_experiment else f"{cfg.environment}'s dataset account"
    loads = [account_load(dataset, dataset_roles, clusters, storage.ingress_gbps, storage.egress_gbps)]
    ingress = cfg.checkpoint_accounts.ingress_gbps if cfg.checkpoint_accounts else storage.ingress_gbps
    for name in checkpoint_accounts:
        loads.append(account_load(name, ("checkpoints",), clusters, ingress, skus.STORAGE_ACCOUNT.egress_gbits_per_s_default,
                                  stripes=len(checkpoint_accounts)))
    if coordination:
        loads.append(account_load(names.coordination_storage, ("coordination",), clusters, storage.ingress_gbps,
                                  storage.egress_gbps))
    return loads
