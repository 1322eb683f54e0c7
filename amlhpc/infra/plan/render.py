"""The offline plan as text: resources grouped by component, cost, quota, outputs.

Laid out by amlhpc/infra/plan/text.py (80 columns, words never split, same bytes on every run).
Each Azure resource is one line `type  name` (the name qualified by its Azure parents,
`account/container`, so no two rows look alike), then the properties a reviewer checks and
its marks (protected, retained, replace-on-change fields...).
"""

from __future__ import annotations

from typing import Any

from amlhpc.core.permissions import MODEL
from amlhpc.infra.plan import STACK_REFERENCE, Plan
from amlhpc.infra.plan.mocks import RecordedResource, qualified_name
from amlhpc.infra.plan.render_reachability import reachability_lines
from amlhpc.infra.plan.text import DETAIL, INDENT, money, pair, price_fix, wrap


def role_name(role_definition_id: str) -> str:
    """A role assignment's role by name (the permission model's), else its GUID."""
    parts = str(role_definition_id or "").split("/")
    subscription = parts[2] if len(parts) > 2 and parts[1].lower() == "subscriptions" else ""
    role = MODEL.role_by_guid(parts[-1], subscription)
    return role.name if role else parts[-1]


def short_type(type_token: str) -> str:
    return type_token.removeprefix("azure-native:")


def _short_scope(scope: str) -> str:
    parts = str(scope).split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else str(scope)


def _last(resource_id: Any) -> str:
    return str(resource_id or "").rstrip("/").rsplit("/", 1)[-1]


def _on(flag: Any) -> str:
    return "on" if flag else "off"


def details(r: RecordedResource) -> str:
    """The few properties that matter for review, per resource type ("" when the type and
    name say it all)."""
    i: dict[str, Any] = r.inputs
    t = r.type
    if t == "azure-native:storage:StorageAccount":
        bits = [i.get("kind"), (i.get("sku") or {}).get("name"), i.get("minimumTlsVersion"),
                "https only" if i.get("enableHttpsTrafficOnly") else "HTTP ALLOWED",
                "no public blobs" if i.get("allowBlobPublicAccess") is False else "PUBLIC BLOBS",
                "shared key off" if i.get("allowSharedKeyAccess") is False else "shared key on",
                f"network {i.get('publicNetworkAccess')}"]
        return ", ".join(str(b) for b in bits if b)
    if t == "azure-native:machinelearningservices:Compute":
        props = (i.get("properties") or {}).get("properties") or {}
        scale = props.get("scaleSettings") or {}
        ssh = "SSH key" if props.get("userAccountCredentials") else "SSH off"
        ip = "public IP" if props.get("enableNodePublicIp") else "no public IP"
        nodes = f"{scale.get('minNodeCount') or 0}-{scale.get('maxNodeCount') or 0}"
        return (f"{props.get('vmSize')} x{nodes} {props.get('vmPriority')}, idle "
                f"{scale.get('nodeIdleTimeBeforeScaleDown')}, {ssh}, {ip}"
                + (", in subnet" if props.get("subnet") else ""))
    if t == "azure-native:keyvault:Vault":
        p = i.get("properties") or {}
        return (f"RBAC {_on(p.get('enableRbacAuthorization'))}, purge protection "
                f"{_on(p.get('enablePurgeProtection'))}, network {p.get('publicNetworkAccess')}")
    if t == "azure-native:containerregistry:Registry":
        return (f"{(i.get('sku') or {}).get('name')}, admin user "
                f"{'ON' if i.get('adminUserEnabled') else 'off'}, network {i.get('publicNetworkAccess')}")
    if t == "azure-native:machinelearningservices:Workspace":
        return f"network {i.get('publicNetworkAccess')}, identity {(i.get('identity') or {}).get('type')}"
    if t == "azure-native:machinelearningservices:Registry":
        regions = ", ".join(str(d.get("location")) for d in i.get("regionDetails") or [])
        return f"regions {regions}, network {i.get('publicNetworkAccess')}"
    if t == "azure-native:authorization:RoleAssignment":
        condition = ", with a condition" if i.get("condition") else ""
        return (f"{role_name(str(i.get('roleDefinitionId') or ''))} on {_short_scope(i.get('scope', ''))} "
                f"({i.get('principalType')}{condition})")
    if t == "azure-native:consumption:Budget":
        notes = i.get("notifications") or {}
        return f"${i.get('amount') or 0:,.0f}/month, alerts at {', '.join(sorted(notes))}"
    if t == "azure-native:machinelearningservices:Datastore":
        p = i.get("properties") or {}
        return (f"{p.get('accountName')}/{p.get('containerName')}, credentials "
                f"{(p.get('credentials') or {}).get('credentialsType')}")
    if t == "azure-native:machinelearningservices:EnvironmentVersion":
        return str((i.get("properties") or {}).get("image", ""))
    if t == "azure-native:storage:BlobContainer":
        return f"public access {i.get('publicAccess')}"
    if t == "azure-native:storage:BlobServiceProperties":
        blobs = i.get("deleteRetentionPolicy") or {}
        containers = i.get("containerDeleteRetentionPolicy") or {}
        return (f"soft delete: blobs {blobs.get('days') if blobs.get('enabled') else 'off'} days, "
                f"containers {containers.get('days') if containers.get('enabled') else 'off'} days")
    if t == "azure-native:network:VirtualNetwork":
        return ", ".join((i.get("addressSpace") or {}).get("addressPrefixes") or [])
    if t == "azure-native:network:Subnet":
        nsg = _last((i.get("networkSecurityGroup") or {}).get("id"))
        nat = _last((i.get("natGateway") or {}).get("id"))
        return ", ".join(b for b in (str(i.get("addressPrefix")), nsg and f"NSG {nsg}", nat and f"NAT {nat}") if b)
    if t == "azure-native:network:NetworkSecurityGroup":
        rules = i.get("securityRules") or []
        return "rules: " + ", ".join(f"{x.get('name')} ({x.get('access')} {x.get('direction')})" for x in rules)
    if t == "azure-native:network:PublicIPAddress":
        return f"{(i.get('sku') or {}).get('name')}, {i.get('publicIPAllocationMethod')}"
    if t == "azure-native:network:NatGateway":
        return f"{(i.get('sku') or {}).get('name')}, {len(i.get('publicIpAddresses') or [])} public IP"
    if t == "azure-native:network:PrivateEndpoint":
        conns = i.get("privateLinkServiceConnections") or [{}]
        target = _last(conns[0].get("privateLinkServiceId"))
        return f"{','.join(conns[0].get('groupIds') or [])} of {target}"
    if t == "azure-native:network:PrivateDnsZoneGroup":
        return "zones: " + ", ".join(_last(z.get("privateDnsZoneId")) for z in i.get("privateDnsZoneConfigs") or [])
    if t == "azure-native:privatedns:VirtualNetworkLink":
        return (f"to {_last((i.get('virtualNetwork') or {}).get('id'))}, auto-registration "
                f"{_on(i.get('registrationEnabled'))}")
    if t == "azure-native:operationalinsights:Workspace":
        return f"{(i.get('sku') or {}).get('name')}, retention {i.get('retentionInDays')} days"
    if t == "azure-native:applicationinsights:Component":
        return (f"{i.get('kind')}, ingestion {i.get('ingestionMode')}, public ingestion "
                f"{i.get('publicNetworkAccessForIngestion')}, query {i.get('publicNetworkAccessForQuery')}")
    if t == "azure-native:resources:ResourceGroup":
        return str(i.get("location"))
    return ""


def marks(r: RecordedResource) -> list[str]:
    """What a reviewer must know beyond the properties: deletion and replacement behaviour."""
    out = []
    if r.protect:
        out.append("protected")
    if r.retain_on_delete:
        out.append("retained")
    if r.replace_on_changes:
        fields = ", ".join(sorted(p.rsplit(".", 1)[-1] for p in r.replace_on_changes))
        out.append(f"replace on change of {fields}")
    if r.delete_before_replace:
        out.append("deleted before its replacement")
    if r.ignore_changes:
        out.append(f"ignores changes to {', '.join(sorted(r.ignore_changes))}")
    if r.secret_inputs:
        out.append(f"secret: {', '.join(r.secret_inputs)}")
    return out


def resource_lines(r: RecordedResource, indent: str = INDENT, sigil: str = "") -> list[str]:
    """A resource: `type  name`, its details, its marks."""
    lines = pair(f"{sigil}{short_type(r.type)}", qualified_name(r.type, r.inputs, r.name), indent)
    text = details(r)
    if text:
        lines += wrap(text, DETAIL)
    if marks(r):
        lines += wrap(f"[{'; '.join(marks(r))}]", DETAIL)
    return lines


def component_heading(name: str, head: RecordedResource | None) -> str:
    if not name:
        return "(outside any component)"
    return f"{name} ({head.type})" if head is not None else name


def render(plan: Plan) -> str:
    """The whole plan as text (ends with a newline)."""
    cfg = plan.config
    lines = wrap(f"aml-hpc plan: stack {cfg.stack} ({cfg.kind}) from {cfg.source}, location {cfg.location}")
    lines += wrap("Offline: the desired state under Pulumi mocks, not Azure's answer; ids are synthetic.")
    for ref in plan.of_type(STACK_REFERENCE):
        lines += wrap(f"Reads the deployed outputs of stack {ref.inputs.get('name')} (StackReference).")
    groups = plan.by_component()
    custom = plan.custom_resources()
    lines += ["", f"Resources: {len(custom)} in Azure, in {len([g for g in groups if g[2]])} components", ""]
    for name, head, members in groups:
        if not members:
            continue
        lines.append(component_heading(name, head))
        for r in members:
            lines += resource_lines(r)
    lines += [""] + cost_lines(plan) + [""] + failure_lines(plan) + [""] + quota_lines(plan) + [""] + outputs_lines(plan)
    lines += [""] + reachability_lines(plan)
    return "\n".join(lines) + "\n"


def cost_lines(plan: Plan) -> list[str]:
    cost = plan.cost
    lines = ["GPU cost at reference on-demand prices"]
    for c in cost.clusters:
        lines += pair(c.name, f"{c.sku}, {c.priority}, {c.min_nodes}-{c.max_nodes} nodes")
        if c.usd_per_node_hour is None:
            lines += wrap(f"UNPRICED: no reference price for {c.sku}, so no figure at all (not $0); "
                          f"{price_fix((c.sku,))}", DETAIL)
            continue
        lines += wrap(f"{money(c.usd_per_node_hour, '/node-hour')}: {money(c.full_scale_usd_per_hour, '/hour')} "
                      f"at full scale, {money(c.idle_usd_per_day, '/day')} idle", DETAIL)
        lines += wrap(f"price: {c.price_source}", DETAIL)
    if not cost.clusters:
        lines.append(f"{INDENT}no clusters")
    bound = "at least " if cost.unpriced else ""
    lines += wrap(f"Full scale: {bound}{money(cost.full_scale_usd_per_hour, '/hour')}; idle: {bound}"
                  f"{money(cost.idle_usd_per_day, '/day')} (nodes only: GPU and the runs' controller; low "
                  f"priority at on-demand prices, an upper bound)"
                  + (f"; unpriced: {', '.join(cost.unpriced)}" if cost.unpriced else ""))
    if cost.priced_elsewhere:
        lines += wrap(f"Prices: {' and '.join(cost.priced_elsewhere)} prices, not {cost.location}: the catalog "
                      f"holds one region's rows and Azure's prices differ by region; set aml-hpc:prices.<size> "
                      f"for {cost.location}'s figures")
    return lines


def failure_lines(plan: Plan) -> list[str]:
    """How often a job on each GPU cluster at full scale fails, by class (amlhpc/core/goodput.py)."""
    from amlhpc.core import goodput, skus

    lines = ["Failures of a job at full scale (Meta's Llama 3 rates per GPU-hour, by cause)"]
    shown = 0
    for c in plan.cost.clusters:
        gpus = skus.CATALOG[c.sku].gpus if c.sku in skus.CATALOG else 0
        if not gpus:
            continue
        shown += 1
        every = goodput.at_scale(c.max_nodes, gpus)
        total = 1 / sum(1 / h for h in every.values())
        lines += pair(c.name, f"{c.max_nodes} x {gpus} GPUs: a failure every {total:,.1f} h")
        lines += wrap(f"process faults every {every[goodput.PROCESS]:,.0f} h (an in-job restart), GPU faults every "
                      f"{every[goodput.DEVICE]:,.0f} h and host losses every {every[goodput.HOST]:,.0f} h (a new job, "
                      "restored from Blob); a recipe's checkpoint intervals: `python -m amlhpc.jobs estimate RECIPE`",
                      DETAIL)
    if not shown:
        lines.append(f"{INDENT}no GPU clusters")
    return lines


def quota_lines(plan: Plan) -> list[str]:
    lines = ["GPU quota needed (vCPUs at full scale)"]
    for q in plan.quota:
        lines.append(f"{INDENT}{q.quota_name} ({q.priority}): {q.vcpus} vCPUs")
        lines += wrap(f"families {', '.join(q.families)}; clusters {', '.join(q.clusters)}", DETAIL)
    if not plan.quota:
        lines.append(f"{INDENT}none")
    return lines


def outputs_lines(plan: Plan) -> list[str]:
    out = plan.outputs
    environments = ", ".join(sorted((out.get("registry") or {}).get("environments") or {})) or "none"
    text = (f"Outputs: workspace {out.get('workspace')}, clusters "
            f"{', '.join(out.get('clusters') or {}) or 'none'}, storage "
            f"{(out.get('storage') or {}).get('account')}, environments {environments}")
    if plan.secret_outputs:
        text += f"; SECRET outputs: {', '.join(plan.secret_outputs)}"
    return wrap(text, "", INDENT)
