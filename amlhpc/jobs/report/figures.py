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


def _lines(key: str, title: str, series: Sequence[Series], x_label: str, y_label: str, note: str = "",
           markers: Sequence[Series] = ()) -> Plot:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.0))
    drawn: dict[str, list[tuple[float, float]]] = {}
    for i, s in enumerate(series):
        for j, segment in enumerate(s.segments):
            xs, ys = zip(*segment, strict=True) if segment else ((), ())
            gid = f"{key}-{i}-{j}"
            # one colour per series; a series that starts again (a new attempt) in the next colours
            colour = PALETTE[(i + j * len(series)) % len(PALETTE)]
            label = s.label if len(s.segments) == 1 else f"{s.label}, attempt {j + 1}"
            (line,) = ax.plot(xs, ys, color=colour, linewidth=1.6, marker="." if len(segment) < 40 else None,
                              label=label)
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
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    if len(series) + len(markers) > 1 or any(len(s.segments) > 1 for s in series):
        ax.legend(loc="best", frameon=False)
    return Plot(key, title, _svg(fig, key), note, drawn)


def _missing(key: str, title: str, why: str) -> Plot:
    return Plot(key, title, None, why)


def _restarts(series: Series | None) -> str:
    if series is None or len(series.segments) < 2:
        return ""
    return (f" The steps go back {len(series.segments) - 1} time(s): each later segment is an attempt that started "
            "again, from a checkpoint or from the beginning.")


def loss(r: RunRecords) -> Plot:
    if r.loss is None and r.epoch_loss is None:
        return _missing("loss", "Loss", "not recorded: no `loss` in rank 0's metric lines (std_log_process_0.txt)")
    return _lines("loss", "Loss", [r.loss] if r.loss else [], "step", "loss",
                  "Rank 0's metric lines; dots per step, circles the mean of each epoch." + _restarts(r.loss),
                  markers=[r.epoch_loss] if r.epoch_loss else [])


def throughput(r: RunRecords) -> Plot:
    if r.throughput is None:
        return _missing("throughput", "Throughput", "not recorded: no tokens_per_s, samples_per_s or throughput in the "
                        "metric lines")
    return _lines("throughput", "Throughput", [r.throughput], "step", r.throughput_unit,
                  f"`{r.throughput.label}` from rank 0's metric lines (all ranks together).")


def mfu(r: RunRecords) -> Plot:
    if r.mfu is None:
        return _missing("mfu", "Model FLOPs utilisation", "not recorded: the training logs no `mfu` (a recipe that counts "
                        "its FLOPs against the catalog's peak logs it per step)")
    return _lines("mfu", "Model FLOPs utilisation", [r.mfu], "step", "MFU %", "`mfu` from rank 0's metric lines.")


def step_time(r: RunRecords) -> Plot:
    if not r.step_times:
        return _missing("step-time", "Step time per node", "not recorded: no `step_time_s` in the metric lines of any "
                        "rank")
    series = [r.step_times[node] for node in sorted(r.step_times)]
    return _lines("step-time", "Step time per node", series, "step", "seconds per step",
                  "A node slower than the others holds every step back (a straggler).")


def _no_gpu(r: RunRecords) -> str:
    why = f" ({r.gpus_absent})" if r.gpus_absent else ""
    return f"No GPU was sampled on these nodes{why}: each node's host, from the same telemetry samples."


def _device_plot(r: RunRecords, key: str, gpu: dict[str, Series], host: dict[str, Series], titles: tuple[str, str],
                 units: tuple[str, str], missing: str) -> Plot:
    """The GPUs' series where telemetry sampled any, else each node's host's, titled so."""
    if gpu:
        return _lines(key, titles[0], [gpu[k] for k in sorted(gpu)], "seconds", units[0])
    if host:
        return _lines(key, titles[1], [host[k] for k in sorted(host)], "seconds", units[1], _no_gpu(r))
    return _missing(key, titles[0], f"not recorded: no node telemetry (telemetry*.jsonl) with {missing}")


def gpu_util(r: RunRecords) -> Plot:
    return _device_plot(r, "gpu-util", r.gpu_util, r.host_cpu, ("GPU utilisation", "Host CPU utilisation"),
                        ("utilisation %", "CPU busy %"), "GPU utilisation or host CPU figures")


def gpu_memory(r: RunRecords) -> Plot:
    return _device_plot(r, "gpu-memory", r.gpu_memory, r.host_memory, ("GPU memory", "Host memory"),
                        ("GiB used", "GiB used"), "GPU memory or host memory figures")


def timeline(r: RunRecords) -> Plot:
    """Each node's launcher phases, end to end, as horizontal bars."""
    if not r.phases:
        return _missing("timeline", "Staging and launch timeline", "not recorded: no launcher report (launch-node*.json)")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 0.6 + 0.45 * len(r.phases)))
    drawn: dict[str, list[tuple[float, float]]] = {}
    seen = set()
    for row, node in enumerate(r.phases):
        start = 0.0
        for phase, seconds in node.phases.items():
            colour = PHASE_COLOURS.get(phase, "#57606a")
            bars = ax.barh(row, seconds, left=start, height=0.6, color=colour,
                           label=phase if phase not in seen else None)
            bars.patches[0].set_gid(f"timeline-n{node.node}-{phase}")
            drawn[f"timeline-n{node.node}-{phase}"] = [(start, start + seconds)]
            seen.add(phase)
            start += seconds
    ax.set_yticks(range(len(r.phases)), [f"node {p.node}" for p in r.phases])
    ax.invert_yaxis()
    ax.set_xlabel("seconds from launch")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(r.phases) < 3 else -0.15), ncol=6, frameon=False)
    return Plot("timeline", "Staging and launch timeline", _svg(fig, "timeline"),
                "Seconds per launcher phase from each node's report, laid end to end in the order the launcher runs "
                "them (the report keeps durations, not start times).", drawn)


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
    total, steps = 0.0, [(0.0, 0.0)]
    for a in r.attempts:
        start = (a.started - origin).total_seconds() / 3600 * per_hour
        end = ((a.ended or a.started) - origin).total_seconds() / 3600 * per_hour
        colour = "#1a7f37" if a.outcome.startswith(("succeeded", "Completed")) else "#d1242f"
        patch = bars.barh(0, max(end - start, 1e-6), left=start, height=0.6, color=colour).patches[0]
        patch.set_gid(f"attempts-bar-{a.number}")
        drawn[f"attempts-bar-{a.number}"] = [(start, end)]
        if a.usd is not None:
            steps += [(end, total), (end, total + a.usd)]
            total += a.usd
    bars.set_yticks([])
    bars.set_ylabel("attempts")
    if len(steps) > 1:
        xs, ys = zip(*steps, strict=True)
        (line,) = cost.plot(xs, ys, color="#1f6feb", linewidth=1.8, drawstyle="default")
        line.set_gid("attempts-cost")
        drawn["attempts-cost"] = steps
    cost.set_ylabel("cumulative $")
    cost.set_xlabel(f"{unit} since the first attempt started")
    note = f"Cost from {r.cost_basis}." if r.cost_basis else "No cost recorded for these attempts."
    return Plot("attempts", "Attempts and cost", _svg(fig, "attempts"), note, drawn)


PLOTS = (loss, throughput, mfu, step_time, gpu_util, gpu_memory, timeline, attempts)
"""Every plot of the page, in its order."""


def all_plots(r: RunRecords) -> list[Plot]:
    return [make(r) for make in PLOTS]
