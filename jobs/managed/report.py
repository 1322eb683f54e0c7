"""A managed run's history as rows and totals: every attempt (job, start, end, cause, the
checkpoint and step it resumed from, nodes, cost) and what the run cost in all. Plain
strings, so `status` (a rich table), the controller's log and the rehearsal's summary
print the same thing."""

from __future__ import annotations

from datetime import datetime

from jobs.managed.record import Record, now_utc, parse_time

COLUMNS = ("attempt", "job", "started", "ended", "status", "cause", "resumed from", "steps", "nodes", "cost $")


def _time(text: str | None) -> str:
    when = parse_time(text)
    return when.strftime("%Y-%m-%d %H:%M:%S") if when else "-"


def rows(record: Record, now: datetime | None = None) -> list[tuple[str, ...]]:
    now = now or now_utc()
    policy = record.rules()
    out = []
    for a in record.attempts:
        if a.resumed_version or a.first_step:
            resumed = f"{a.resumed_version or 'checkpoint'}" + (f" (step {a.first_step})" if a.first_step is not None else "")
        else:
            resumed = "start" if a.first_step in (None, 0) else f"step {a.first_step}"
        steps = f"{a.first_step if a.first_step is not None else '?'}..{a.last_step}" if a.last_step is not None else "-"
        usd = a.usd if a.usd is not None else policy.attempt_usd(a.hours(now))
        cause = a.cause or ("running" if a.state != "ended" else "-")
        if a.cause and a.retryable is not None and a.cause != "completed":
            later = a is not record.attempts[-1]
            cause += " (retried)" if a.retryable and later else " (retryable)" if a.retryable else " (not retried)"
        out.append((str(a.number), a.job, _time(a.started_at), _time(a.ended_at), a.status or a.state, cause, resumed,
                    steps, str(a.nodes), f"{usd:,.2f}"))
    return out


def totals(record: Record, now: datetime | None = None) -> dict[str, float | None]:
    now = now or now_utc()
    policy = record.rules()
    attempts, controller = record.attempts_usd(now), record.controller_usd(now)
    return {"attempts_usd": attempts, "controller_usd": controller, "total_usd": attempts + controller,
            "limit_usd": policy.limit_usd}


def summary_lines(record: Record, now: datetime | None = None) -> list[str]:
    """The history as text: one line per attempt, then the totals and the outcome."""
    lines = [" | ".join(COLUMNS)]
    lines += [" | ".join(row) for row in rows(record, now)]
    t = totals(record, now)
    limit = record.rules()
    lines.append(f"total: ${t['total_usd']:,.2f} (attempts ${t['attempts_usd']:,.2f} + controller "
                 f"${t['controller_usd']:,.2f})" + (f"; limit ${limit.limit_usd:,.2f} ({limit.limit_source})"
                                                     if limit.limit_usd is not None else ""))
    lines.append(f"run {record.run}: {record.state}" + (f": {record.reason}" if record.reason else ""))
    for a in record.attempts:
        for bad in a.bad_nodes:
            lines.append(f"attempt {a.number}: distrust {bad.get('host') or 'node ' + str(bad.get('node'))} "
                         f"({bad.get('why')})" + (f", Azure node id {bad['azure_node_id']}" if bad.get("azure_node_id") else ""))
    return lines
