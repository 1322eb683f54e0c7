"""The rules for clusters, their SSH, the budget, price overrides and the managed-run controller."""

from __future__ import annotations

import math
import re
from datetime import date

from amlhpc.core import availability, pricing, skus
from amlhpc.core.errors import ProblemCollector
from amlhpc.infra import naming
from amlhpc.infra.config.models import (
    EMAIL_FORMAT,
    NAMESPACE,
    SSH_PUBLIC_KEY_FORMAT,
    SshConfig,
    _RawConfig,
)
from amlhpc.infra.config.problems import fix_command
from amlhpc.infra.config.services import CONTROLLER_SKU


def _check_clusters(found: ProblemCollector, stack: str, raw: _RawConfig, index: list[int] | None = None) -> None:
    """index: each cluster's position in the stack file (clusters with type errors are left out)."""
    seen: dict[str, int] = {}
    for i, cluster in zip(index if index is not None else range(len(raw.clusters)), raw.clusters, strict=True):
        path = f"{NAMESPACE}clusters[{i}]"
        name_problem = naming.check("cluster", cluster.name)
        if name_problem:
            found.add(f"{path}.name", f"cluster name {name_problem}", fix_command(stack, f"{path}.name", "gpu-a100"))
        key = cluster.name.lower()
        if key in seen:
            found.add(f"{path}.name", f"duplicate cluster name {cluster.name!r} (also clusters[{seen[key]}])",
                      "cluster names are unique in a workspace, case-insensitively")
        seen.setdefault(key, i)

        try:
            sku = skus.get(cluster.sku)
        except skus.UnknownSkuError as exc:
            near = f"did you mean {' or '.join(exc.suggestions)}? " if exc.suggestions else ""
            found.add(f"{path}.sku", f"unknown VM size {cluster.sku!r}",
                      f"{near}known sizes: {', '.join(skus.names())}")
            sku = None
        if sku is not None and not sku.azureml.amlcompute:
            runnable = ", ".join(s for s in skus.names() if skus.get(s).azureml.amlcompute and not skus.get(s).retired)
            found.add(f"{path}.sku", sku.azureml_problem,
                      f"choose a size AmlCompute runs ({runnable}); the catalog entry says how to run {sku.name} instead")
            sku = None

        if cluster.max_nodes < cluster.min_nodes:
            found.add(f"{path}.maxNodes", f"maxNodes {cluster.max_nodes} is below minNodes {cluster.min_nodes}",
                      fix_command(stack, f"{path}.maxNodes", str(cluster.min_nodes)))
        if cluster.min_nodes > 0 and not cluster.allow_idle_nodes:
            cost = ""
            if sku and sku.price:
                cost = f" (about ${cluster.min_nodes * sku.price.usd_per_hour * 24:,.0f}/day at {sku.price.region} on-demand)"
            found.add(f"{path}.minNodes", f"minNodes {cluster.min_nodes} keeps nodes running while idle{cost}",
                      f"set minNodes: 0, or opt in: {fix_command(stack, path + '.allowIdleNodes', 'true')}")
        if sku and cluster.max_nodes > 1 and not sku.infiniband and not cluster.allow_tcp_multi_node:
            ib = ", ".join(s for s in skus.names() if skus.get(s).infiniband)
            found.add(f"{path}.sku", f"{sku.name} has no InfiniBand, so {cluster.max_nodes} nodes would talk over TCP",
                      f"use an InfiniBand size ({ib}), set maxNodes: 1, or opt in: "
                      f"{fix_command(stack, path + '.allowTcpMultiNode', 'true')}")
        if cluster.ssh is not None:
            _check_ssh(found, stack, f"{path}.ssh", cluster.ssh)


def _check_ssh(found: ProblemCollector, stack: str, path: str, ssh: SshConfig) -> None:
    if ssh.password is not None:
        example_key = '"ssh-ed25519 AAAA..."'
        found.add(f"{path}.password", "password login is never enabled on cluster nodes",
                  f"remove the password and give a public key: {fix_command(stack, path + '.publicKey', example_key)}")
    key = (ssh.public_key or "").strip()
    if "PRIVATE KEY" in key:
        found.add(f"{path}.publicKey", "this is a private key; it must never be in a stack file",
                  "delete it from the file (and rotate it), then give the .pub line instead")
        return
    if ssh.on and not key:
        found.add(f"{path}.publicKey", "SSH is enabled but no public key is given (password login is not allowed)",
                  fix_command(stack, path + ".publicKey", '"$(cat ~/.ssh/id_ed25519.pub)"'))
    elif key and not SSH_PUBLIC_KEY_FORMAT.match(key):
        found.add(f"{path}.publicKey", f"{key[:24]!r}... is not an OpenSSH public key line",
                  "paste the whole line of your .pub file (ssh-ed25519 AAAA... or ssh-rsa AAAA...)")
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", ssh.admin_user) or ssh.admin_user in {"root", "admin", "administrator"}:
        found.add(f"{path}.adminUser", f"{ssh.admin_user!r} is not an allowed admin user name",
                  "use a lowercase Linux user name other than root/admin, e.g. azureuser")


FULL_SCALE_HOURS_PER_BUDGET = 1.0
"""A cluster is refused when it spends the stack's whole monthly budget in less than this many
hours at maxNodes (on-demand price). A budget is the stack's statement of what a month may
cost; a cluster that would use it up within an hour of running at full scale is three orders
of magnitude past it (a month has 730 hours): a typo in maxNodes or in the budget, not a plan.
Legitimate large clusters stay well inside it (64 x ND96isr_H100_v5 at $98/h needs a monthly
budget of $6,300 or more)."""


def _check_full_scale_cost(found: ProblemCollector, stack: str, raw: _RawConfig, index: list[int] | None) -> None:
    """A cluster whose full-scale hour costs more than the monthly budget (FULL_SCALE_HOURS_PER_BUDGET)."""
    if raw.budget is None:
        return
    budget = raw.budget.monthly_amount_usd
    for i, cluster in zip(index if index is not None else range(len(raw.clusters)), raw.clusters, strict=True):
        try:
            price = pricing.node_hour_price(cluster.sku, raw.prices)
        except skus.UnknownSkuError:
            continue  # reported by _check_clusters
        if price is None:
            continue
        per_hour = cluster.max_nodes * price.usd_per_hour
        if per_hour * FULL_SCALE_HOURS_PER_BUDGET <= budget:
            continue
        fits = int(budget / FULL_SCALE_HOURS_PER_BUDGET // price.usd_per_hour)
        minutes = budget / per_hour * 60
        found.add(f"{NAMESPACE}clusters[{i}].maxNodes",
                  f"{cluster.max_nodes:,} x {cluster.sku} at ${price.usd_per_hour:,.2f}/node-hour ({pricing.describe(price)}) "
                  f"is ${per_hour:,.0f} an hour at full scale: the stack's monthly budget of ${budget:,.0f} "
                  f"(aml-hpc:budget.monthlyAmountUsd) would be gone in {minutes:,.1f} minutes; a cluster that spends "
                  f"the month's budget within {FULL_SCALE_HOURS_PER_BUDGET:g} hour at full scale is refused as a typo",
                  (f"lower maxNodes to {fits:,} or fewer: {fix_command(stack, f'{NAMESPACE}clusters[{i}].maxNodes', str(fits))}; "
                   if fits >= 1 else "")
                  + f"or raise the budget to at least ${per_hour * FULL_SCALE_HOURS_PER_BUDGET:,.0f}: "
                  + fix_command(stack, f"{NAMESPACE}budget.monthlyAmountUsd", f"{math.ceil(per_hour * FULL_SCALE_HOURS_PER_BUDGET)}"))


def _check_budget(found: ProblemCollector, stack: str, raw: _RawConfig, index: list[int] | None = None) -> None:
    if raw.budget is None:
        return
    _check_full_scale_cost(found, stack, raw, index)
    path = f"{NAMESPACE}budget"
    if not raw.budget.alert_emails:
        found.add(f"{path}.alertEmails", "a budget needs at least one email to alert",
                  fix_command(stack, f"{path}.alertEmails[0]", "ml-platform@example.com"))
    for i, email in enumerate(raw.budget.alert_emails):
        if not EMAIL_FORMAT.match(email):
            found.add(f"{path}.alertEmails[{i}]", f"{email!r} is not an email address", "use name@domain")
    for i, pct in enumerate(raw.budget.thresholds_percent):
        if not 1 <= pct <= 1000:
            found.add(f"{path}.thresholdsPercent[{i}]", f"{pct} is outside 1-1000 percent", "use e.g. [50, 80, 100]")
    _check_budget_notifications(found, raw.budget.thresholds_percent, path)


def _check_budget_notifications(found: ProblemCollector, thresholds: list[int], path: str) -> None:
    """Azure takes at most five notifications per budget; the forecast alert is one of them."""
    from amlhpc.infra import quirks

    actual = len(set(thresholds))
    if actual + 1 > quirks.BUDGET_MAX_NOTIFICATIONS:
        found.add(f"{path}.thresholdsPercent",
                  f"{actual} thresholds plus the forecast alert make {actual + 1} notifications; an Azure budget "
                  f"takes at most {quirks.BUDGET_MAX_NOTIFICATIONS} notifications",
                  f"keep at most {quirks.BUDGET_MAX_NOTIFICATIONS - 1} thresholds, e.g. [50, 80, 95, 100]")


def _check_prices(found: ProblemCollector, raw: _RawConfig) -> None:
    for sku_name, price in raw.prices.items():
        if sku_name not in skus.CATALOG:
            near = skus.suggest(sku_name)
            found.add(f"{NAMESPACE}prices.{sku_name}", f"unknown VM size {sku_name!r}",
                      f"did you mean {' or '.join(near)}?" if near else f"known sizes: {', '.join(skus.names())}")
        if price <= 0:
            found.add(f"{NAMESPACE}prices.{sku_name}", f"price {price} must be positive", "use USD per node-hour")


def _check_cluster_regions(found: ProblemCollector, raw: _RawConfig, location: str, today: date) -> None:
    """A cluster's size must be offered in the stack's region (amlhpc/core/catalog/availability.toml)."""
    for i, cluster in enumerate(raw.clusters):
        try:
            size = skus.get(cluster.sku).name
        except skus.UnknownSkuError:
            continue  # reported by _check_clusters
        problem = availability.problem(size, location, today)
        if problem and not (cluster.allow_unlisted_region and not availability.retired(size, today)):
            found.add(f"{NAMESPACE}clusters[{i}].sku", *problem)
        low_priority = availability.low_priority_problem(size) if cluster.priority == "LowPriority" else None
        if low_priority:
            found.add(f"{NAMESPACE}clusters[{i}].priority", *low_priority)


def _check_managed_ssh(found: ProblemCollector, raw: _RawConfig) -> None:
    """Nodes in Azure ML's managed VNet have no public IP and no route from our VNet: SSH (and
    so `jobs beeond`) cannot reach them. Microsoft documents SSH into managed-network compute
    for compute instances only (`az ml compute connect-ssh`)."""
    if raw.network.isolation != "managed":
        return
    for i, cluster in enumerate(raw.clusters):
        if cluster.ssh is not None and cluster.ssh.on:
            found.add(f"{NAMESPACE}clusters[{i}].ssh", "nodes in a managed network cannot be reached by SSH: they have "
                      "no public IP and our VNet has no route into Azure ML's managed VNet",
                      "remove the ssh block, or use isolation: private (SSH from the jump box; docs/isolation.md)")


def _check_controller(found: ProblemCollector, stack: str, raw: _RawConfig) -> None:
    ctl, path = raw.controller, f"{NAMESPACE}controller"
    if not ctl.enabled:
        return
    problem = naming.check("cluster", ctl.name)
    if problem:
        found.add(f"{path}.name", f"cluster name {problem}", fix_command(stack, f"{path}.name", "jobs-controller"))
    if ctl.name.lower() in {c.name.lower() for c in raw.clusters}:
        found.add(f"{path}.name", f"{ctl.name!r} is also the name of one of aml-hpc:clusters",
                  "give the controller cluster a name of its own")
    if ctl.sku != CONTROLLER_SKU and ctl.usd_per_hour is None:
        found.add(f"{path}.usdPerHour", f"no price for {ctl.sku} (the reference price is for {CONTROLLER_SKU})",
                  fix_command(stack, f"{path}.usdPerHour", "<usd-per-node-hour>"))
