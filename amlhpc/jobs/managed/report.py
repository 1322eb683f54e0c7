"""A managed run's history as rows and totals: every attempt (job, cluster, start, end,
cause, the checkpoint and step it resumed from, nodes - "3 of 4" when it shrank - and cost)
and what the run cost in all, then what the attempts found out about their nodes (nodes to
distrust, stragglers, evidence ignored) and why an attempt ran on fewer nodes. Plain strings, so `status` (a rich table), the controller's log and the
rehearsal's summary print the same thing.

The rules shown (limit, controller price) are the record's copy of the acting
controller's - for reading; the controller itself never reads them back."""

from __future__ import annotations

from datetime import datetime

from amlhpc.jobs.managed import stragglers
from amlhpc.jobs.managed.record import Record, now_utc, parse_time

COLUMNS = ("attempt", "job", "cluster", "started", "ended", "status", "cause", "resumed from", "steps", "nodes",
           "cost $")


def _time(text: str | None) -> str:
    when = parse_time(text)
    return when.strftime("%Y-%m-%d %H:%M:%S") if when else "-"


def rows(record: Record, now: datetime | None = None) -> list[tuple[str, ...]]:
    now = now or now_utc()
    out: list[tuple[str, ...]] = []
    for a in record.attempts:
        if a.resumed_version or a.first_step:
            resumed = f"{a.resumed_version or 'checkpoint'}" + (f" (step {a.first_step})" if a.first_step is not None else "")
        else:
            resumed = "start" if a.first_step in (None, 0) else f"step {a.first_step}"
        steps = f"{a.first_step if a.first_step is not None else '?'}..{a.last_step}" if a.last_step is not None else "-"
        usd = a.usd if a.usd is not None else (a.usd_per_hour or 0.0) * a.charged_hours(now)
        cause = a.cause or ("running" if a.state != "ended" else "-")
        if a.cause and a.retryable is not None and a.cause != "completed":
            later = a is not record.attempts[-1]
            cause += " (retried)" if a.retryable and later else " (retryable)" if a.retryable else " (not retried)"
        out.append((str(a.number), a.job, a.cluster or "-", _time(a.started_at), _time(a.ended_at), a.status or a.state,
                    cause, resumed, steps, _nodes(a.nodes, a.full_nodes), f"{usd:,.2f}"))
    return out


def _nodes(nodes: int, full: int) -> str:
    return f"{nodes} of {full}" if full and nodes < full else str(nodes)


def totals(record: Record, now: datetime | None = None) -> dict[str, float | None]:
    now = now or now_utc()
    policy = record.rules()
    attempts, controller = record.attempts_usd(now), record.controller_usd(policy.controller_usd_per_hour)
    return {"attempts_usd": attempts, "controller_usd": controller, "total_usd": attempts + controller,
            "limit_usd": policy.limit_usd}


def findings(record: Record) -> list[str]:
    """What each attempt found out about its nodes and its evidence, and what the next one inherits."""
    lines = []
    for a in record.attempts:
        if a.shrunk:
            lines.append(f"attempt {a.number} shrank to {a.nodes} of {a.full_nodes} nodes (the same global batch; "
                         f"a versioned checkpoint reshards): {a.shrunk}")
        for bad in a.bad_nodes:
            lines.append(f"attempt {a.number}: distrust {bad.get('host') or 'node ' + str(bad.get('node'))} "
                         f"({bad.get('why')})" + (f", Azure node id {bad['azure_node_id']}" if bad.get("azure_node_id") else ""))
        for named in a.stragglers:
            lines.append(f"attempt {a.number}: {stragglers.describe(named)} (named at step {named.get('step')})")
        for when in a.requeued_at:
            lines.append(f"attempt {a.number}: requeued by Azure ML at {_time(when)}")
        for why in a.ignored_evidence:
            lines.append(f"attempt {a.number}: {why}")
    for before, after in zip(record.attempts, record.attempts[1:], strict=False):
        if before.shrunk and not after.shrunk and after.full_nodes and after.nodes >= after.full_nodes:
            lines.append(f"attempt {after.number} grew back to {after.nodes} nodes")
        inherited = [stragglers.describe(s) for s in before.stragglers] + \
            [f"{b.get('host') or 'node ' + str(b.get('node'))} ({b.get('why')})" for b in before.bad_nodes]
        if inherited:
            lines.append(f"attempt {after.number} started after attempt {before.number} named: {'; '.join(inherited)}")
    return lines


def summary_lines(record: Record, now: datetime | None = None) -> list[str]:
    """The history as text: one line per attempt, then the totals, the outcome and the findings."""
    lines = [" | ".join(COLUMNS)]
    lines += [" | ".join(row) for row in rows(record, now)]
    t = totals(record, now)
    policy = record.rules()
    lines.append(f"total: ${t['total_usd']:,.2f} (attempts ${t['attempts_usd']:,.2f} + controller "
                 f"${t['controller_usd']:,.2f})" + (f"; limit ${policy.limit_usd:,.2f} ({policy.limit_source})"
                                                     if policy.limit_usd is not None else ""))
    lines.append(f"run {record.run}: {record.state}" + (f": {record.reason}" if record.reason else ""))
    return lines + findings(record)
