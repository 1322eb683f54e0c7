"""Producing the stack outputs document (the model is amlhpc.core.outputs, shared with jobs).

Entries that come from validated config are built through the model itself, so their keys
are the model's; entries that carry Pulumi Outputs are assembled by amlhpc/infra/program.py and
checked here against the model's keys before they are exported. Never holds a secret:
keys, SAS tokens and connection strings are not outputs at all.
"""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

import pulumi
from pydantic import BaseModel

from amlhpc.core import skus
from amlhpc.core.outputs import BudgetOut, ClusterOut, PriceOut, StackOutputs, keys
from amlhpc.infra.config import ClusterConfig, StackConfig


def cluster_entry(cluster: ClusterConfig) -> dict[str, Any]:
    """What jobs need to know about a cluster, from config and the SKU catalog."""
    sku = skus.get(cluster.sku)
    return ClusterOut(sku=sku.name, min_nodes=cluster.min_nodes, max_nodes=cluster.max_nodes,
                      priority=cluster.priority, gpus_per_node=sku.gpus, infiniband=sku.infiniband,
                      ssh_enabled=bool(cluster.ssh and cluster.ssh.on), idle_minutes=cluster.idle_minutes).document()


def clusters_entry(cfg: StackConfig) -> dict[str, Any]:
    return {c.name: cluster_entry(c) for c in cfg.clusters}


def budget_entry(cfg: StackConfig) -> dict[str, Any] | None:
    if cfg.budget is None:
        return None
    return BudgetOut(monthly_amount_usd=cfg.budget.monthly_amount_usd, alert_emails=list(cfg.budget.alert_emails)).document()


def prices_entry(cfg: StackConfig) -> dict[str, Any]:
    """Price per node-hour of each size the stack's clusters use (amlhpc.core.pricing's rule)."""
    return {name: PriceOut.of(price).document() for name, price in cfg.price_table().items()}


def expires_entry(cfg: StackConfig) -> str | None:
    return cfg.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ") if cfg.expires_at else None


def inherited(key: str, entry: Any) -> Any:
    """An environment's outputs entry as an experiment stack re-exports it.

    A StackReference hands nested values over without the keys whose value is null (the
    SDK's `deserialize_properties` treats None as absent: pulumi/runtime/rpc.py), so an
    environment's `registry.mlRegistry: null` or `network.subnetId: null` would arrive
    missing and the experiment's outputs would fail the model. The model's nullable keys
    come back as null; everything else is passed on as the environment exported it.
    """
    model = _entry_model(key)
    if model is None or not isinstance(entry, dict):
        return entry
    restored = dict(entry)
    for name, field in model.model_fields.items():
        alias = field.alias or name
        if alias not in restored and _admits_none(field.annotation):
            restored[alias] = None
    return restored


def _entry_model(key: str) -> type[BaseModel] | None:
    """The model of a top-level entry (its Optional unwrapped), when it is one."""
    field = next((f for n, f in StackOutputs.model_fields.items() if (f.alias or n) == key), None)
    if field is None:
        return None
    candidates = get_args(field.annotation) or (field.annotation,)
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def _admits_none(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def check_keys(document: dict[str, Any]) -> None:
    """The top-level keys must be exactly the model's (a rename on either side fails here)."""
    expected = keys(StackOutputs)
    missing, unknown = sorted(expected - set(document)), sorted(set(document) - expected)
    if missing or unknown:
        raise ValueError(f"outputs document does not match amlhpc.core.outputs.StackOutputs: missing {missing}, unknown {unknown}")


def export(document: dict[str, Any]) -> None:
    """Export each top-level key, so `pulumi stack output --json` is the document."""
    check_keys(document)
    for key, value in document.items():
        pulumi.export(key, value)
