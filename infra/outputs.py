"""The stack outputs document: the contract between infra and jobs (docs/contracts.md §2).

Built from validated config (static facts) and component outputs (what Azure assigns).
Never holds a secret: keys, SAS tokens and connection strings are not outputs at all.
"""

from __future__ import annotations

from typing import Any

import pulumi

from infra import skus
from infra.config import ClusterConfig, StackConfig

REQUIRED_KEYS = (
    "stack", "kind", "environment", "subscriptionId", "resourceGroup", "location", "workspace",
    "workspaceId", "clusters", "datastores", "storage", "registry", "identity", "network",
    "budget", "expiresAt", "tags",
)


def cluster_entry(cluster: ClusterConfig) -> dict[str, Any]:
    """What jobs need to know about a cluster, from config and the SKU catalog."""
    sku = skus.get(cluster.sku)
    return {
        "sku": sku.name,
        "minNodes": cluster.min_nodes,
        "maxNodes": cluster.max_nodes,
        "priority": cluster.priority,
        "gpusPerNode": sku.gpus,
        "infiniband": sku.infiniband,
        "sshEnabled": bool(cluster.ssh and cluster.ssh.on),
        "idleMinutes": cluster.idle_minutes,
    }


def clusters_entry(cfg: StackConfig) -> dict[str, Any]:
    return {c.name: cluster_entry(c) for c in cfg.clusters}


def budget_entry(cfg: StackConfig) -> dict[str, Any] | None:
    if cfg.budget is None:
        return None
    return {"monthlyAmountUsd": cfg.budget.monthly_amount_usd, "alertEmails": list(cfg.budget.alert_emails)}


def expires_entry(cfg: StackConfig) -> str | None:
    return cfg.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ") if cfg.expires_at else None


def export(document: dict[str, Any]) -> None:
    """Export each top-level key, so `pulumi stack output --json` is the document."""
    missing = [k for k in REQUIRED_KEYS if k not in document]
    if missing:
        raise ValueError(f"outputs document is missing {missing}")
    for key, value in document.items():
        pulumi.export(key, value)
