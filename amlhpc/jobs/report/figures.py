"""The run report's plots: matplotlib (Agg) drawn to SVG that the page inlines, so it opens
offline with no script and no CDN.

Each plot is a `Plot`: its SVG, or None and a note saying what would record it. Text stays
text in the SVG (`svg.fonttype: none`: axis labels and ticks are searchable and tests can
read them), each drawn series carries an id (`<g id="...">`), and the SVG carries no date or
random ids, so the same records give the same page.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field

from amlhpc.jobs.report.records import LAUNCH_PHASES, RunRecords, Series

PALETTE = ("#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7e8c", "#57606a")
PHASE_COLOURS = dict(zip(LAUNCH_PHASES, ("#1f6feb", "#1a7f37", "#8c959f", "#9a6700", "#8250df", "#bf3989"), strict=True))


@dataclass
class Plot:
    key: str
    title: str
    svg: str | None
    note: str = ""
    """Why it is empty (what records it), or how to read it."""
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """What was drawn, by series id: the points of each line (tests compare them with the records)."""


def require_matplotlib() -> None:
    """The report draws with matplotlib, an optional dependency (`aml-hpc[report]`): a UserError
    naming the extra when it is not installed, before any record is read."""
    import importlib.util

    from amlhpc.core import invocation
    from amlhpc.core.errors import Problem, UserError

    if importlib.util.find_spec("matplotlib") is None:
        fix = invocation.either("run `make bootstrap`: it installs the report extra",
                                "install the report extra: `uv tool install 'aml-hpc[report]'` (or `pip install "
                                "'aml-hpc[report]'` in the tool's environment)")
        raise UserError([Problem("jobs report", "", "the run report draws its plots with matplotlib, which is not "
                                 "installed", fix)], "matplotlib missing")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    matplotlib.rcParams.update({"svg.fonttype": "none", "font.size": 9,
                                "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
                                "grid.alpha": 0.3, "figure.dpi": 100})
    import matplotlib.pyplot as plt

    return plt


def _svg(fig, key: str) -> str:
    """The figure as an SVG element; its ids (clip paths, markers) salted with the plot's key,
    so the plots of one page never share an id."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": f"aml-hpc-{key}"}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    _pyplot().close(fig)
    text = buffer.getvalue()
    return _own_ids(text[text.index("<svg"):], key)


def _own_ids(svg: str, key: str) -> str:
    """Every id of the SVG (matplotlib's figure_1, axes_1, clip paths, markers) prefixed with
    the plot's key, and every reference to one with it: ids are unique on the page."""
    import re

    ids = {i for i in re.findall(r'\bid="([^"]+)"', svg) if not i.startswith(f"{key}-")}
    if not ids:
        return svg
    pattern = re.compile(r'(\bid="|#)(' + "|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True)) + r')(?=[")])')
    return pattern.sub(lambda m: f"{m.group(1)}{key}-{m.group(2)}", svg)


LINESTYLES = ("-", "--", ":", "-.")
"""A series keeps its colour in every attempt; each later attempt is drawn in the next style."""
SPAN_COLOURS = ("#eaeef2", "#fff8c5")
"""Attempts shaded on a time axis, alternating."""


def _attempt_spans(r: RunRecords) -> list[tuple[int, float, float]]:
    """(attempt, start, end) on the time axes (seconds from the first telemetry sample)."""
    if r.time_origin is None:
        return []
    return [(a.number, a.started.timestamp() - r.time_origin, (a.ended or a.started).timestamp() - r.time_origin)
            for a in r.attempts]


def _mark_spans(ax, spans: list[tuple[int, float, float]]) -> None:
    """Shade each attempt on a time axis and label it at the top."""
    if len(spans) < 2:
        return
    for k, (number, start, end) in enumerate(spans):
        ax.axvspan(start, end, color=SPAN_COLOURS[k % 2], alpha=0.7, zorder=0, linewidth=0)
        ax.text(start, 1.0, f" attempt {number}", transform=ax.get_xaxis_transform(), va="bottom", ha="left",
                fontsize=8, color="#57606a")


def _mark_starts(ax, series: Sequence[Series]) -> None:
    """A dashed line where each later attempt's steps begin on a step axis, labelled."""
    seen: dict[int, float] = {}
    for s in series:
        for attempt, segment in zip(s.attempts, s.segments, strict=True):
            if attempt is not None and segment and attempt > 1:
                seen[attempt] = min(seen.get(attempt, segment[0][0]), segment[0][0])
    for attempt, x in sorted(seen.items()):
        ax.axvline(x, color="#8c959f", linestyle="--", linewidth=0.9, zorder=0)
        ax.text(x, 1.0, f" attempt {attempt}", transform=ax.get_xaxis_transform(), va="bottom", ha="left",
                fontsize=8, color="#57606a")


def _lines(key: str, title: str, series: Sequence[Series], x_label: str, y_label: str, note: str = "",
           markers: Sequence[Series] = (), spans: list[tuple[int, float, float]] | None = None) -> Plot:
    """Lines of `series` (a gap between segments, never a line across it), `markers` as
    circles; on a step axis (`spans` None) integer ticks and each attempt's first step
    marked, on a time axis each attempt shaded."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.0))
    drawn: dict[str, list[tuple[float, float]]] = {}
    several = any(len({a for a in s.attempts if a is not None}) > 1 for s in (*series, *markers))
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        for j, segment in enumerate(s.segments):
            xs, ys = zip(*segment, strict=True) if segment else ((), ())
            gid = f"{key}-{i}-{j}"
            attempt = s.attempts[j] if j < len(s.attempts) else None
            style = LINESTYLES[((attempt or 1) - 1) % len(LINESTYLES)] if several else "-"
            (line,) = ax.plot(xs, ys, color=colour, linewidth=1.6, linestyle=style,
                              marker="." if len(segment) < 40 else None, label=s.label if j == 0 else None)
            line.set_gid(gid)
            drawn[gid] = list(segment)
    for i, s in enumerate(markers):
        for j, segment in enumerate(s.segments):
            xs, ys = zip(*segment, strict=True) if segment else ((), ())
            gid = f"{key}-m{i}-{j}"
            (line,) = ax.plot(xs, ys, linestyle="none", marker="o", markersize=6, color=PALETTE[(i + 3) % len(PALETTE)],
                              label=s.label if j == 0 else None)
            line.set_gid(gid)
            drawn[gid] = list(segment)
    if spans is None:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        _mark_starts(ax, [*series, *markers])
    else:
        _mark_spans(ax, spans)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    if len(series) + len(markers) > 1:
        ax.legend(loc="best", frameon=False)
    return Plot(key, title, _svg(fig, key), note, drawn)


def _missing(key: str, title: str, why: str) -> Plot:
    return Plot(key, title, None, why)


def _restarts(series: Series | None) -> str:
    """What the segments of a step series say about the run's attempts."""
    if series is None or len(series.segments) < 2:
        return ""
    attempts = sorted({a for a in series.attempts if a is not None})
    back = sum(1 for a, b in zip(series.segments, series.segments[1:], strict=False) if a and b and b[0][0] <= a[-1][0])
    text = ""
    if len(attempts) > 1:
        text += (f" {len(attempts)} attempts, each its own line (a dashed rule where each later one starts; no line "
                 "joins them).")
    if back:
        text += (f" The steps go back {back} time(s): each later segment is an attempt that started again, from a "
                 "checkpoint or from the beginning.")
    return text


def loss(r: RunRecords) -> Plot:
    if r.loss is None and r.epoch_loss is None:
        return _missing("loss", "Loss", "not recorded: no `loss` in rank 0's metric lines (std_log_process_0.txt)")
    drawn = []
    if r.loss is not None:
        dotted = any(len(segment) < 40 for segment in r.loss.segments)
        drawn.append("a line per step" + (" with a dot at each" if dotted else ""))
    if r.epoch_loss is not None:
        drawn.append("a circle for the mean of each epoch")
    return _lines("loss", "Loss", [r.loss] if r.loss else [], "step", "loss",
                  f"Rank 0's metric lines: {' and '.join(drawn)}." + _restarts(r.loss or r.epoch_loss),
                  markers=[r.epoch_loss] if r.epoch_loss else [])


def throughput(r: RunRecords) -> Plot:
    if r.throughput is None:
        return _missing("throughput", "Throughput", "not recorded: no tokens_per_s, samples_per_s or throughput in the "
                        "metric lines")
    return _lines("throughput", "Throughput", [r.throughput], "step", r.throughput_unit,
                  f"`{r.throughput.label}` from rank 0's metric lines (all ranks together)." + _restarts(r.throughput))


def mfu(r: RunRecords) -> Plot:
    if r.mfu is None:
        return _missing("mfu", "Model FLOPs utilisation", "not recorded: the training logs no `mfu` (a recipe that counts "
                        "its FLOPs against the catalog's peak logs it per step)")
    return _lines("mfu", "Model FLOPs utilisation", [r.mfu], "step", "MFU %",
                  "`mfu` from rank 0's metric lines" + _denominator(r) + _restarts(r.mfu))


def _denominator(r: RunRecords) -> str:
    """What MFU is a fraction of: one peak for the run, or - in a run recorded before the peak
    was kept across attempts - each attempt's own, which makes their MFU incomparable."""
    peaks = {(round(p.tflops, 9), p.source) for p in r.peaks}
    if not peaks:
        return "."
    if len({t for t, _ in peaks}) == 1:
        tflops, source = next(iter(peaks))
        return f", against one peak for the whole run: {tflops:,.4g} TFLOP/s ({source})."
    shown = "; ".join(f"attempt {p.attempt}: {p.tflops:,.4g} TFLOP/s" for p in r.peaks)
    return (f". Warning: the peak was measured again by a later attempt ({shown}), so MFU jumps where the attempts "
            "meet without the training changing; compare step times instead (later runs keep one peak per run).")


def step_time(r: RunRecords) -> Plot:
    if not r.step_times:
        return _missing("step-time", "Step time per node", "not recorded: no `step_time_s` in the metric lines of any "
                        "rank")
    series = [r.step_times[node] for node in sorted(r.step_times)]
    return _lines("step-time", "Step time per node", series, "step", "seconds per step",
                  "A node slower than the others holds every step back (a straggler)." + _restarts(series[0]))


def _no_gpu(r: RunRecords) -> str:
    why = f" ({r.gpus_absent})" if r.gpus_absent else ""
    return f"No GPU was sampled on these nodes{why}: each node's host, from the same telemetry samples."


def _device_plot(r: RunRecords, key: str, gpu: dict[str, Series], host: dict[str, Series], titles: tuple[str, str],
                 units: tuple[str, str], missing: str) -> Plot:
    """The GPUs' series where telemetry sampled any, else each node's host's, titled so."""
    spans = _attempt_spans(r)
    note = " Each attempt is shaded; a line stops where sampling stopped (between attempts)." if len(spans) > 1 else ""
    if gpu:
        return _lines(key, titles[0], [gpu[k] for k in sorted(gpu)], "seconds", units[0], note.strip(), spans=spans)
    if host:
        return _lines(key, titles[1], [host[k] for k in sorted(host)], "seconds", units[1], _no_gpu(r) + note,
                      spans=spans)
    return _missing(key, titles[0], f"not recorded: no node telemetry (telemetry*.jsonl) with {missing}")


def gpu_util(r: RunRecords) -> Plot:
    return _device_plot(r, "gpu-util", r.gpu_util, r.host_cpu, ("GPU utilisation", "Host CPU utilisation"),
                        ("utilisation %", "CPU busy %"), "GPU utilisation or host CPU figures")


def gpu_memory(r: RunRecords) -> Plot:
    return _device_plot(r, "gpu-memory", r.gpu_memory, r.host_memory, ("GPU memory", "Host memory"),
                        ("GiB used", "GiB used"), "GPU memory or host memory figures")


def timeline(r: RunRecords) -> Plot:
    """Each node's launcher phases, end to end, as horizontal bars: a row per node of each attempt."""
    if not r.phases:
        return _missing("timeline", "Staging and launch timeline", "not recorded: no launcher report (launch-node*.json)")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 0.6 + 0.45 * len(r.phases)))
    drawn: dict[str, list[tuple[float, float]]] = {}
    seen = set()
    attempts = {p.attempt for p in r.phases}
    several = len(attempts) > 1
    for row, node in enumerate(r.phases):
        start = 0.0
        prefix = f"timeline-a{node.attempt}-n{node.node}" if several else f"timeline-n{node.node}"
        for phase, seconds in node.phases.items():
            colour = PHASE_COLOURS.get(phase, "#57606a")
            bars = ax.barh(row, seconds, left=start, height=0.6, color=colour,
                           label=phase if phase not in seen else None)
            bars.patches[0].set_gid(f"{prefix}-{phase}")
            drawn[f"{prefix}-{phase}"] = [(start, start + seconds)]
            seen.add(phase)
            start += seconds
    labels = [f"attempt {p.attempt} · node {p.node}" if several else f"node {p.node}" for p in r.phases]
    ax.set_yticks(range(len(r.phases)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from launch")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(r.phases) < 3 else -0.15), ncol=6, frameon=False)
    every = f" A row per node of each of the {len(attempts)} attempts." if several else ""
    return Plot("timeline", "Staging and launch timeline", _svg(fig, "timeline"),
                "Seconds per launcher phase from each node's report, laid end to end in the order the launcher runs "
                "them (the report keeps durations, not start times)." + every, drawn)


def attempts(r: RunRecords) -> Plot:
    """The attempts as bars over time, and the cost they add up to."""
    if not r.attempts:
        return _missing("attempts", "Attempts and cost", "not recorded: no attempts.jsonl (a rehearsal writes it) and no "
                        "managed run record (supervision.json)")
    plt = _pyplot()
    fig, (bars, cost) = plt.subplots(2, 1, figsize=(7.2, 3.6), sharex=True, height_ratios=(1, 2))
    origin = min(a.started for a in r.attempts)
    span_h = max(((a.ended or a.started) - origin).total_seconds() for a in r.attempts) / 3600
    unit, per_hour = ("hours", 1.0) if span_h >= 2 else ("minutes", 60.0)
    drawn: dict[str, list[tuple[float, float]]] = {}
    total, points = 0.0, []
    for a in r.attempts:
        start = (a.started - origin).total_seconds() / 3600 * per_hour
        end = ((a.ended or a.started) - origin).total_seconds() / 3600 * per_hour
        colour = "#1a7f37" if a.outcome.startswith(("succeeded", "Completed")) else "#d1242f"
        patch = bars.barh(0, max(end - start, 1e-6), left=start, height=0.6, color=colour).patches[0]
        patch.set_gid(f"attempts-bar-{a.number}")
        drawn[f"attempts-bar-{a.number}"] = [(start, end)]
        bars.text(start, 0.42, f"{a.number}: {a.outcome}", va="bottom", ha="left", fontsize=8, color="#1f2328",
                  clip_on=False)
        if a.usd is not None:
            # an attempt costs as it runs: the total rises through it and stays flat between attempts
            points += [(start, total), (end, total + a.usd)]
            total += a.usd
    bars.set_yticks([])
    bars.set_ylim(-0.5, 1.3)
    bars.set_ylabel("attempts")
    if points:
        xs, ys = zip(*points, strict=True)
        (line,) = cost.plot(xs, ys, color="#1f6feb", linewidth=1.8, drawstyle="default")
        line.set_gid("attempts-cost")
        drawn["attempts-cost"] = points
    cost.set_ylabel("cumulative $")
    cost.set_xlabel(f"{unit} since the first attempt started")
    note = (f"Each attempt's bar, labelled with its number and outcome (green: succeeded); the cost below rises "
            f"through each attempt and stays flat between them. Cost from {r.cost_basis}." if r.cost_basis else
            "Each attempt's bar, labelled with its number and outcome. No cost recorded for these attempts.")
    return Plot("attempts", "Attempts and cost", _svg(fig, "attempts"), note, drawn)


PLOTS = (loss, throughput, mfu, step_time, gpu_util, gpu_memory, timeline, attempts)
"""Every plot of the page, in its order."""


def all_plots(r: RunRecords) -> list[Plot]:
    return [make(r) for make in PLOTS]
