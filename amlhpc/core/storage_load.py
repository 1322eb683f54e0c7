"""What a stack's clusters ask of a storage account, against Azure's targets for it.

One rule for `infra plan` (every cluster at maxNodes) and `jobs submit` (the jobs' checkpoint
caps together), so both say the same:

- Checkpoints: each job caps its upload at CHECKPOINT_INGRESS_SHARE of the account's ingress,
  shared by its nodes (amlhpc/jobs/plan/build.py), and no node sends faster than its storage
  NIC. Every cluster runs at least one job at a time, so the caps add up per cluster: two
  clusters checkpointing at once already claim 1.8x the account's ingress. The jobs' caps
  together must stay within the ingress (the fleet budget).
- Staging: every node reads its inputs at its storage NIC's rate (the launcher passes no egress
  cap), so a cluster at full scale asks nodes x NIC of the account's egress.
- Striping: a stack with checkpoint accounts of its own stripes each checkpoint over all of
  them (stack output checkpointAccounts), so a job's cap is CHECKPOINT_INGRESS_SHARE of each
  account's ingress, times the accounts (never more than its nodes' NICs), and each account
  takes an equal share of it.
- Requests: the bytes above in the request sizes the runtime uses (checkpoint blocks of
  CHECKPOINT_BLOCK_BYTES, staged reads of STAGING_READ_BYTES; tests/test_storage_load.py holds
  them to the runtime's constants), plus the coordination records (heartbeats, failure
  records, leads, supervision) at COORDINATION_REQUESTS_PER_NODE_S per node on the account
  holding the coordination role. Data traffic is kept under half the target so that the
  coordination records are never starved where they share an account with it.

Targets are the catalog's (skus.toml [storage_account]: 20,000 requests/s; ingress and egress
as the stack file sets them, Azure's defaults otherwise), each with its source and date.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from amlhpc.core import skus

CHECKPOINT_INGRESS_SHARE = 0.9
"""Checkpoint writers together stay under 90 % of the account's ingress (the NDv4 performance article: 8 x 2300
Mb/s = 18.4 of 20 Gb/s)."""
CHECKPOINT_INTERVAL_SHARE = 0.9
"""A checkpoint's bytes are planned to upload in 90 % of its interval: the rest is node 0 announcing it, the
nodes' phases (each starts up to one block's time at its cap after node 0: coord/pacing.py) and
the commit. With the whole interval, a 405B state on 4 accounts committed in 605 s of 600
(`python -m bench.scale_data --accounts 4`: 576 s of bytes, 24 s of phases)."""
CHECKPOINT_BLOCK_BYTES = 8 << 20
"""One Put Block of a checkpoint upload (amlhpc/jobs/runtime/checkpoint/store.py BLOCK_BYTES)."""
STAGING_READ_BYTES = 16 << 20
"""The largest ranged read of staging (amlhpc/jobs/runtime/blob/fetch.py MAX_PIECE_BYTES): requests are a lower bound."""
CHECKPOINT_BYTES_PER_PARAM = 16
"""A training checkpoint's bytes per model parameter: bf16 weights, fp32 master weights and Adam's two fp32 moments."""
MAX_CHECKPOINT_ACCOUNTS = 16
"""Checkpoint accounts one stack may declare (names keep their 24 characters up to two digits)."""
COORDINATION_REQUESTS_PER_NODE_S = 0.61
"""A training node's steady Blob requests for coordination: bench/RESULTS.md, "Scale benchmark" (64 nodes,
32-39 requests/s on the account in the simulated Azure; 39 / 64). It does not grow with the node count."""
REQUEST_HEADROOM = 0.5
"""Data traffic may use half the request target: the rest is the coordination records' (not modelled)."""


@dataclass(frozen=True)
class ClusterDemand:
    """One cluster at full scale, as the load model sees it."""

    name: str
    nodes: int
    nic_gbps: float
    """The size's storage NIC (skus.toml storage_nic_gbits_per_s)."""


@dataclass(frozen=True)
class AccountLoad:
    """Expected load on one account against its targets."""

    account: str
    roles: tuple[str, ...]
    ingress_gbps: float
    egress_gbps: float
    requests_per_s: float
    checkpoint_caps_gbps: float
    """The jobs' checkpoint caps together (one job per cluster at least)."""
    target_ingress_gbps: float
    target_egress_gbps: float
    target_requests_per_s: float
    source: str = field(default_factory=lambda: skus.cite(skus.STORAGE_ACCOUNT.source))

    def over(self) -> list[tuple[str, str]]:
        """(what passes which limit, the fix) for every target this load passes."""
        found = []
        if self.checkpoint_caps_gbps > self.target_ingress_gbps:
            found.append((f"checkpoint caps {self.checkpoint_caps_gbps:,.1f} Gb/s together > ingress {self.target_ingress_gbps:g} Gb/s",
                          f"every job claims {CHECKPOINT_INGRESS_SHARE:.0%} of each account it checkpoints to, so "
                          "clusters that checkpoint at once need accounts of their own: aml-hpc:checkpointAccounts in "
                          "an experiment stack per cluster (its jobs then stripe over its own accounts), or lower "
                          f"checkpoint.cap_mbps so the caps add up to the ingress ({self.accounts_for_caps()} accounts' "
                          "worth of ingress is claimed here)"))
        if self.ingress_gbps > self.target_ingress_gbps:
            found.append((f"ingress {self.ingress_gbps:,.1f} Gb/s > {self.target_ingress_gbps:g} Gb/s",
                          "the jobs' checkpoint uploads: accounts of their own per cluster, lower caps, or checkpoints "
                          "less often"))
        if self.egress_gbps > self.target_egress_gbps:
            found.append((f"egress {self.egress_gbps:,.1f} Gb/s > {self.target_egress_gbps:g} Gb/s",
                          "stage with a per-node cap (egress / nodes), or serve datasets from more accounts"))
        if self.requests_per_s > self.target_requests_per_s * REQUEST_HEADROOM:
            found.append((f"{self.requests_per_s:,.0f} requests/s > {REQUEST_HEADROOM:.0%} of {self.target_requests_per_s:,.0f}",
                          "the coordination records need the rest: move checkpoints (aml-hpc:checkpointAccounts) or "
                          "the coordination records (aml-hpc:storage.coordinationAccount: true) to accounts of their own"))
        return found

    def accounts_for_caps(self) -> int:
        """Accounts of this ingress that would hold the jobs' checkpoint caps together."""
        return max(1, math.ceil(self.checkpoint_caps_gbps / (self.target_ingress_gbps * CHECKPOINT_INGRESS_SHARE)))

    def to_json(self) -> dict[str, Any]:
        return {"account": self.account, "roles": list(self.roles), "ingressGbps": round(self.ingress_gbps, 3),
                "egressGbps": round(self.egress_gbps, 3), "requestsPerS": round(self.requests_per_s, 1),
                "checkpointCapsGbps": round(self.checkpoint_caps_gbps, 3),
                "targets": {"ingressGbps": self.target_ingress_gbps, "egressGbps": self.target_egress_gbps,
                            "requestsPerS": self.target_requests_per_s},
                "over": [{"limit": what, "fix": fix} for what, fix in self.over()], "source": self.source}


def job_cap_gbps(nodes: int, nic_gbps: float, ingress_gbps: float, cap_mbps: float | None = None,
                 accounts: int = 1) -> float:
    """What one job's checkpoint upload may use together: its nodes at the per-node cap (the
    recipe's, else the share of the ingress of the `accounts` it stripes over), never more than their NICs."""
    per_node = cap_mbps / 1000 if cap_mbps else ingress_gbps * CHECKPOINT_INGRESS_SHARE * accounts / nodes
    return min(per_node, nic_gbps) * nodes


def account_load(account: str, roles: Iterable[str], clusters: Iterable[ClusterDemand], ingress_gbps: float,
                 egress_gbps: float, stripes: int = 1) -> AccountLoad:
    """The load of `clusters` at full scale on one account holding `roles` (datasets, checkpoints,
    coordination); `stripes`: the checkpoint accounts each checkpoint is striped over (this one among them)."""
    roles = tuple(roles)
    ingress = egress = caps = coordination = 0.0
    for cluster in clusters:
        cap = job_cap_gbps(cluster.nodes, cluster.nic_gbps, ingress_gbps, accounts=stripes) / stripes
        if "checkpoints" in roles:
            caps += cap
            ingress += cap
        if "datasets" in roles:
            egress += cluster.nodes * cluster.nic_gbps
        if "coordination" in roles:
            coordination += cluster.nodes * COORDINATION_REQUESTS_PER_NODE_S
    requests = ingress * 1e9 / 8 / CHECKPOINT_BLOCK_BYTES + egress * 1e9 / 8 / STAGING_READ_BYTES + coordination
    return AccountLoad(account, roles, ingress, egress, requests, caps, ingress_gbps, egress_gbps,
                       skus.STORAGE_ACCOUNT.requests_per_s)


def checkpoint_accounts_needed(checkpoint_bytes: float, interval_s: float, ingress_gbps: float) -> int:
    """Accounts a checkpoint is striped over so that it commits within its interval: its bytes
    in CHECKPOINT_INTERVAL_SHARE of the interval at CHECKPOINT_INGRESS_SHARE of each account's
    ingress, size / (interval x 0.9 x 0.9 x ingress), rounded up (a 405B model at 16 bytes per
    parameter, 600 s, 25 Gb/s: 6.48 TB / 1.52 TB = 5)."""
    per_account = interval_s * CHECKPOINT_INTERVAL_SHARE * CHECKPOINT_INGRESS_SHARE * ingress_gbps * 1e9 / 8
    return max(1, math.ceil(checkpoint_bytes / per_account))
