"""The run report as one self-contained HTML page: inline CSS and inline SVG plots, no
script, nothing fetched, so it opens from a file, an email or a CI artifact as it is."""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape

from amlhpc.core.version import __version__
from amlhpc.jobs.report.figures import Plot
from amlhpc.jobs.report.records import RunRecords

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{background:#0d1117;color:#f0f6fc;padding:20px 32px}
header h1{margin:0 0 4px;font-size:22px}
header p{margin:0;color:#9198a1}
main{max-width:1120px;margin:0 auto;padding:24px 32px}
@media (max-width:600px){main{padding:16px 12px}header{padding:16px 12px}}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(480px,100%),1fr));gap:18px}
.records{display:grid;grid-template-columns:minmax(0,1fr);gap:18px}
section{background:#fff;border:1px solid #d1d9e0;border-radius:8px;padding:14px 16px;min-width:0}
.scroll{overflow-x:auto;max-width:100%}
section h2{font-size:15px;margin:0 0 8px}
section svg{width:100%;height:auto}
.note{color:#59636e;font-size:12.5px;margin:6px 0 0}
.missing{border-style:dashed;background:#fbfcfd}
.missing .note{font-size:13.5px}
table{border-collapse:collapse;font-size:12.5px;width:100%}
td,th{border-bottom:1px solid #eaeef2;padding:4px 8px;text-align:left;vertical-align:top}
th{color:#59636e;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#1a7f37;font-weight:600}.bad{color:#d1242f;font-weight:600}
footer{color:#59636e;font-size:12px;padding:8px 32px 32px;max-width:1120px;margin:0 auto}
code{font-size:12px}
"""


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{escape(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>'


def _section(plot: Plot) -> str:
    if plot.svg is None:
        return (f'<section class="missing" id="{plot.key}"><h2>{escape(plot.title)}</h2>'
                f'<p class="note">{escape(plot.note)}</p></section>')
    note = f'<p class="note">{escape(plot.note)}</p>' if plot.note else ""
    return f'<section id="{plot.key}"><h2>{escape(plot.title)}</h2>{plot.svg}{note}</section>'


def _outcome(r: RunRecords) -> str:
    if not r.outcome:
        return ""
    good = r.outcome.startswith(("succeeded", "Completed"))
    return f' - <span class="{"ok" if good else "bad"}">{escape(r.outcome)}</span>'


def render(r: RunRecords, plots: list[Plot], now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    facts = []
    if r.summary:
        facts.append(("training summary (metrics.json)", _table(
            ["key", "value"], [[k, f"{v:,.6g}" if isinstance(v, float) else str(v)] for k, v in sorted(r.summary.items())])))
    if r.attempts:
        facts.append(("attempts", _table(
            ["#", "job", "started (UTC)", "ended (UTC)", "nodes", "outcome", "cost $"],
            [[str(a.number), a.name, a.started.strftime("%Y-%m-%d %H:%M:%S"),
              a.ended.strftime("%Y-%m-%d %H:%M:%S") if a.ended else "running", str(a.nodes), a.outcome,
              f"{a.usd:,.2f}" if a.usd is not None else "-"] for a in r.attempts], {0, 4, 6})))
    if r.staging:
        several = len({s.attempt for s in r.staging}) > 1
        lead = ["attempt"] if several else []
        facts.append(("staged data per node" + (" and attempt" if several else ""), _table(
            [*lead, "node", "input", "files", "MB in", "MB out", "seconds", "MB/s out"],
            [[*([str(s.attempt)] if several else []), str(s.node), s.input, str(s.files), f"{s.bytes_in / 1e6:,.1f}",
              f"{s.bytes_out / 1e6:,.1f}", f"{s.seconds:,.2f}",
              f"{s.bytes_out / 1e6 / s.seconds:,.1f}" if s.seconds > 0 else "-"]
             for s in r.staging], {i + len(lead) for i in (0, 2, 3, 4, 5, 6)} | ({0} if several else set()))))
    if r.phases:
        several = len({p.attempt for p in r.phases}) > 1
        lead = ["attempt"] if several else []
        phases = list(dict.fromkeys(k for p in r.phases for k in p.phases))
        facts.append(("launcher phases, seconds" + (", per attempt" if several else ""), _table(
            [*lead, "node", "host", *(k.replace("_", " ") for k in phases), "exit"],
            [[*([str(p.attempt)] if several else []), str(p.node), p.host,
              *(f"{p.phases[k]:,.2f}" if k in p.phases else "-" for k in phases),
              str(p.exit_code) if p.exit_code is not None else "-"] for p in r.phases],
            {i + len(lead) for i in (0, *range(2, len(phases) + 3))} | ({0} if several else set()))))
    recorded = sum(1 for p in plots if p.svg is not None)
    tables = "".join(f"<section><h2>{escape(title)}</h2>{html}</section>" for title, html in facts)
    problems = "".join(f"<li>{escape(p)}</li>" for p in r.problems)
    sources = ", ".join(f"<code>{escape(s)}</code>" for s in sorted(set(r.sources))) or "none"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>{escape(r.run)} - aml-hpc run report</title><style>{STYLE}</style></head>
<body><header><h1>{escape(r.run)}{_outcome(r)}</h1>
<p>aml-hpc run report: {recorded} of {len(plots)} plots recorded; written {now.strftime("%Y-%m-%d %H:%M UTC")}
from {escape(str(r.folder))}</p></header>
<main><div class="grid">{"".join(_section(p) for p in plots)}</div>
<h2>Records</h2><div class="records">{tables}</div>
{f"<h2>Records that could not be read</h2><ul>{problems}</ul>" if problems else ""}
</main><footer>Read from: {sources}. Plots show what the run recorded and nothing else. aml-hpc {__version__}.</footer>
</body></html>
"""
