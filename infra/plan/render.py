"""Human-readable offline plan: resources with their key properties and marks, cost, quota."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from infra import quirks
from infra.plan import Plan
from infra.plan.mocks import RecordedResource, physical_name

_ROLE_NAMES = {
    quirks.ROLE_STORAGE_BLOB_DATA_READER: "Storage Blob Data Reader",
    quirks.ROLE_STORAGE_BLOB_DATA_CONTRIBUTOR: "Storage Blob Data Contributor",
    quirks.ROLE_ACR_PULL: "AcrPull",
}


def _short_scope(scope: str) -> str:
    parts = str(scope).split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else str(scope)


def details(r: RecordedResource) -> str:
    """The few properties that matter for review, per resource type."""
    i: dict[str, Any] = r.inputs
    t = r.type.split(":")[-1]
    if r.type == "azure-native:storage:StorageAccount":
        bits = [i.get("kind"), (i.get("sku") or {}).get("name"), i.get("minimumTlsVersion"),
                "https only" if i.get("enableHttpsTrafficOnly") else "HTTP ALLOWED",
                "no public blobs" if i.get("allowBlobPublicAccess") is False else "PUBLIC BLOBS",
                "shared key off" if i.get("allowSharedKeyAccess") is False else "shared key on",
                f"network {i.get('publicNetworkAccess')}"]
        return ", ".join(str(b) for b in bits if b)
    if r.type == "azure-native:machinelearningservices:Compute":
        props = (i.get("properties") or {}).get("properties") or {}
        scale = props.get("scaleSettings") or {}
        ssh = "SSH key" if props.get("userAccountCredentials") else "SSH off"
        ip = "public IP" if props.get("enableNodePublicIp") else "no public IP"
        nodes = f"{int(scale.get('minNodeCount') or 0)}-{int(scale.get('maxNodeCount') or 0)}"
        return (f"{props.get('vmSize')} x{nodes} "
                f"{props.get('vmPriority')}, idle {scale.get('nodeIdleTimeBeforeScaleDown')}, {ssh}, {ip}"
                + (", in subnet" if props.get("subnet") else ""))
    if r.type == "azure-native:keyvault:Vault":
        p = i.get("properties") or {}
        return (f"RBAC {'on' if p.get('enableRbacAuthorization') else 'off'}, purge protection "
                f"{'on' if p.get('enablePurgeProtection') else 'off'}, network {p.get('publicNetworkAccess')}")
    if r.type == "azure-native:containerregistry:Registry":
        return (f"{(i.get('sku') or {}).get('name')}, admin user {'ON' if i.get('adminUserEnabled') else 'off'}, "
                f"network {i.get('publicNetworkAccess')}")
    if r.type == "azure-native:machinelearningservices:Workspace":
        return f"network {i.get('publicNetworkAccess')}, identity {(i.get('identity') or {}).get('type')}"
    if r.type == "azure-native:authorization:RoleAssignment":
        guid = str(i.get("roleDefinitionId", "")).rsplit("/", 1)[-1]
        return f"{_ROLE_NAMES.get(guid, guid)} on {_short_scope(i.get('scope', ''))} ({i.get('principalType')})"
    if r.type == "azure-native:consumption:Budget":
        notes = i.get("notifications") or {}
        return f"${i.get('amount'):,.0f}/month, alerts at {', '.join(sorted(notes))}"
    if r.type == "azure-native:machinelearningservices:Datastore":
        p = i.get("properties") or {}
        return f"{p.get('accountName')}/{p.get('containerName')}, credentials {(p.get('credentials') or {}).get('credentialsType')}"
    if r.type == "azure-native:machinelearningservices:EnvironmentVersion":
        return str((i.get("environmentVersionProperties") or {}).get("image", ""))
    if r.type in ("azure-native:network:Subnet", "azure-native:network:VirtualNetwork"):
        return str(i.get("addressPrefix") or (i.get("addressSpace") or {}).get("addressPrefixes"))
    if r.type == "azure-native:network:PrivateEndpoint":
        conns = i.get("privateLinkServiceConnections") or [{}]
        return f"sub-resource {','.join(conns[0].get('groupIds') or [])}"
    if r.type == "azure-native:resources:ResourceGroup":
        return str(i.get("location"))
    return t


def marks(r: RecordedResource) -> str:
    out = []
    if r.protect:
        out.append("protected")
    if r.retain_on_delete:
        out.append("retained")
    if r.replace_on_changes:
        out.append(f"replace-on-change({len(r.replace_on_changes)})")
    if r.delete_before_replace:
        out.append("delete-first")
    if r.secret_inputs:
        out.append(f"secret:{','.join(r.secret_inputs)}")
    return " ".join(out)


def _component_of(plan: Plan, r: RecordedResource) -> str:
    by_urn = {x.urn: x for x in plan.resources}
    parent = by_urn.get(r.parent or "")
    while parent is not None and parent.parent in by_urn:
        parent = by_urn[parent.parent]
    return parent.name if parent is not None else ""


def render(plan: Plan, console: Console | None = None) -> None:
    console = console or Console()
    cfg = plan.config
    console.print(f"[bold]aml-hpc plan[/bold] stack [bold]{cfg.stack}[/bold] ({cfg.kind}) from {cfg.source}, "
                  f"location {cfg.location}")
    console.print("[dim]Offline: the desired state under Pulumi mocks, not Azure's answer; ids are synthetic.[/dim]")

    custom = plan.custom_resources()
    table = Table(title=f"Resources ({len(custom)})", show_lines=False)
    for col in ("component", "type", "name", "key properties", "marks"):
        table.add_column(col, overflow="fold")
    for r in custom:
        table.add_row(_component_of(plan, r), r.type.removeprefix("azure-native:"),
                      physical_name(r.type, r.inputs, r.name), details(r), marks(r))
    console.print(table)

    cost = plan.cost
    ctable = Table(title="GPU cost (reference on-demand prices)")
    for col in ("cluster", "size", "priority", "nodes", "$/node-h", "full scale $/h", "idle $/day", "price source"):
        ctable.add_column(col, overflow="fold")
    def money(v: float | None) -> str:
        return "n/a" if v is None else f"{v:,.2f}"

    for c in cost.clusters:
        ctable.add_row(c.name, c.sku, c.priority, f"{c.min_nodes}-{c.max_nodes}", money(c.usd_per_node_hour),
                       money(c.full_scale_usd_per_hour), money(c.idle_usd_per_day), c.price_source)
    console.print(ctable)
    console.print(f"Full scale: [bold]${cost.full_scale_usd_per_hour:,.2f}/hour[/bold]; idle: "
                  f"[bold]${cost.idle_usd_per_day:,.2f}/day[/bold] (GPU nodes only; low priority at on-demand, an upper bound)"
                  + (f"; unpriced: {', '.join(cost.unpriced)}" if cost.unpriced else ""))

    qtable = Table(title="GPU quota needed (vCPUs at full scale)")
    for col in ("quota", "priority", "vCPUs", "families", "clusters"):
        qtable.add_column(col)
    for q in plan.quota:
        qtable.add_row(q.quota_name, q.priority, str(q.vcpus), ", ".join(q.families), ", ".join(q.clusters))
    console.print(qtable)
    env_names = ", ".join(sorted((plan.outputs.get("registry") or {}).get("environments") or {})) or "none"
    console.print(f"Outputs: workspace [bold]{plan.outputs.get('workspace')}[/bold], clusters "
                  f"{', '.join(plan.outputs.get('clusters') or {}) or 'none'}, storage "
                  f"{(plan.outputs.get('storage') or {}).get('account')}, environments {env_names}"
                  + (f"; SECRET outputs: {plan.secret_outputs}" if plan.secret_outputs else ""))
