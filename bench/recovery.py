"""Recovery benchmark: what each failure costs a managed run, measured on the rehearsal.

    python -m bench.recovery [--out bench/out] [--update-results] [--only preempt,hang,restart,...] [--repeats N]
                             [--rerun-of PUBLISHED/recovery.json]

Every scenario is a managed rehearsal (amlhpc.jobs.local.managed) of the synthetic lockstep
training (amlhpc.jobs.workloads.synthetic: 2 simulated nodes, one rank each) under the real
supervision, with Azurite as Blob, and one fault injected at a step or a controller phase:

- preempt: node 1 preempted at step FAULT_STEP (SIGTERM, SIGKILL after the grace);
- host-loss: node 1's processes SIGKILLed at step FAULT_STEP (no word, no final upload);
  host-loss-writer: the same on node 0, whose rank 0 writes the checkpoints (the work since
  its last periodic upload is lost);
- hang: node 1's training frozen at step FAULT_STEP (the watchdog must stop it);
- nccl: NCCL told to use sockets on node 1 (the launcher's preflight stops the job);
- throttle: the first attempt's Blob behind a proxy answering 503 ServerBusy;
- kill-<phase>: the controller killed at each phase of its loop (the revival check must
  replace it); `ended` and `backoff` come after a preemption, so there is one to end;
- straggler: node 1's own work per step 3x longer (it must be named, the others never);
- budget: a limit the run cannot meet at $1 per node-second (the controller must stop it
  before spent plus the cost to the next checkpoint passes the limit);
- baseline: the same run undisturbed (the reference for every other figure).

For each: time to detect (the fault to the controller's seeing the end; the controller's
death to its replacement's first look; the slowing to the straggler's naming), time from
the end of the attempt to the next attempt's first step, steps lost, and the cost of the
time lost at the recipe's Azure price - next to what the same failure costs without
supervision. The goodput model (amlhpc/core/goodput.py) is checked against the measured losses.
`restart` (bench/restart.py): an in-job restart - warm standby ready, standby as it comes, no
standby (cold) - against a resubmitted attempt, each path apart.

Every scenario runs `--repeats` times (at least MIN_RUNS, 5, to publish), the scenarios
interleaved (repeat 1 of each, then repeat 2, ...: a drifting load does not favour one), each
round in a world of its own (a new Azurite, the stack planned and the code snapshot taken again,
as a rerun would); each figure is the median of its runs with their spread (lowest-highest), each run with the load
average when it started, and the git commit is recorded. The checks must hold on every run.
Results: `--out` (recovery.md, recovery.json); `--update-results` also replaces this
benchmark's section of bench/RESULTS.md (between its two markers), keeping the rest of the file.
`--rerun-of` a published run's recovery.json: this run checks it: the section keeps the published
figures and adds, for each figure both runs have, this run's median, whether it falls inside
the published spread (bench/spread.py `reproduces`), how many would fall outside with nothing
changed, and an exact rank test of each figure's move; the exit status is 1 when a figure moved
beyond chance.
Run it on a quiet machine: the figures follow the load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.machine import azurite_version, describe_machine, loadavg
from bench.spread import MIN_RUNS, Series, check_rerun, commit, rerun_summary, rerun_table, text

RESULTS = Path(__file__).with_name("RESULTS.md")
SECTION = "# Recovery benchmark"
BEGIN, END = "<!-- bench.recovery: begin -->", "<!-- bench.recovery: end -->"
STEPS, STEP_S, CHECKPOINT_EVERY, FAULT_STEP = 60, 0.3, 5, 40
UPLOAD_INTERVAL_S, HANG_S = 10, 10
TRAIN = f"python -m amlhpc.jobs.workloads.synthetic --steps {STEPS} --step-s {STEP_S} --checkpoint-every {CHECKPOINT_EVERY}"
STRAGGLER_STEPS = 100
"""The straggler's run: the rule counts a node's heartbeats a window of 20 steps apart once it has
a full window, 3 in a row, so it names a slow node from step ~60; 60 steps ended before that."""
NODES = 2
LIMIT_USD = 30.0
"""The budget scenario: $1 per node-second on 2 nodes; the run needs 20 s of training alone, so it cannot finish within it."""
KILL_PHASES = ("claim", "claimed", "submitted", "watch", "ended", "backoff", "record-write")
SCENARIOS = ("baseline", "preempt", "host-loss", "host-loss-writer", "hang", "nccl", "throttle", *(f"kill-{p}" for p in KILL_PHASES),
             "straggler", "budget")
FIGURES = ("detect_s", "restart_s", "steps_lost", "lost_s", "cost_lost_usd", "seconds")
"""A run's figures that become a series over the repeats (median and spread)."""
PARTS = (*SCENARIOS, "restart")
COMPARED = {"detect_s": "detect s", "restart_s": "end -> next first step s", "lost_s": "lost s"}
"""The figures of a scenario that a rerun checks (steps lost and cost follow from them)."""


def _seconds(start: datetime | str | None, end: datetime | str | None) -> float | None:
    if start is None or end is None:
        return None
    start = datetime.fromisoformat(start) if isinstance(start, str) else start
    end = datetime.fromisoformat(end) if isinstance(end, str) else end
    return (end - start).total_seconds()


class Bench:
    """Azurite, the planned recipe and the code snapshot, shared by the scenarios."""

    def __init__(self, server, root: Path):
        from amlhpc.jobs import recipes
        from amlhpc.jobs.local import rehearsal
        from amlhpc.jobs.plan import build
        from amlhpc.jobs.plan.outputs import load

        self.server, self.root = server, root
        self.outputs = load("dev", offline=True).outputs
        self.recipe = recipes.load("cosmoflow", recipes.parse_overrides(
            [f"command={TRAIN}", "health=off", "inputs={}", f"checkpoint.interval_s={UPLOAD_INTERVAL_S}",
             f"watchdog.hang_s={HANG_S}"]))
        base = build.plan_job(self.recipe, self.outputs, nodes=NODES, processes_per_node=1, name="bench-snapshot")
        self.snapshot = build.snapshot(base.code_dirs)
        self.containers = list(self.outputs.storage.containers.values())
        rehearsal.ensure_containers(self.containers, server.connection_string)
        self.price = base.estimate.usd_per_node_hour
        self.timeout_h = base.timeout_s / 3600
        self.expected_h = base.estimate.hours

    def rehearse(self, name: str, faults: list, **kwargs: Any):
        from amlhpc.jobs.local import managed
        from amlhpc.jobs.managed import render
        from amlhpc.jobs.plan import build

        run = f"bench-{name}-{uuid.uuid4().hex[:6]}"
        recipe = self.recipe.model_copy(update={"command": kwargs.pop("command")}) if "command" in kwargs else self.recipe
        plan = build.plan_job(recipe, self.outputs, nodes=NODES, processes_per_node=1, name=run)
        lines: list[str] = []
        done = managed.rehearse_managed(
            render.plan_managed(recipe, self.outputs, plan), snapshot=self.snapshot, workdir=self.root / run,
            procs_per_node=1, blob_endpoint=kwargs.pop("blob_endpoint", self.server.blob_endpoint),
            connection_string=self.server.connection_string, containers=self.containers,
            sink=lambda proc, line: lines.append(f"n{proc.node}: {line}"), echo=lambda line: lines.append(line),
            faults=faults, timeout_s=600, **kwargs)
        return done, lines


def measure(name: str, done, bench: Bench, baseline_s: float | None) -> dict[str, Any]:
    """The figures of one scenario from its record and its local jobs."""
    record = done.record
    jobs = list(done.service.jobs.values())
    attempts = record.attempts
    row: dict[str, Any] = {"scenario": name, "state": record.state, "attempts": len(attempts),
                           "causes": [a.cause for a in attempts], "seconds": round(done.seconds, 1),
                           "missing": done.missing, "max_running": done.service.max_running,
                           "controllers": [c["job"] for c in record.controllers]}
    fired = next((f for job in jobs for f in job.fired), None)
    first = jobs[0] if jobs else None
    if name.startswith("kill-"):
        spawned = sorted(done.controllers.started_at.values())
        row["controllers"] = list(done.controllers.started_at)
        row["detect_s"] = _seconds(done.kill_fired_at, spawned[1] if len(spawned) > 1 else None)
    elif name == "straggler":
        named = attempts[0].stragglers[:1] if attempts else []
        row["detect_s"] = _seconds(fired.at if fired else None, named[0]["at"] if named else None)
        row["named"] = [s["node"] for s in attempts[0].stragglers] if attempts else []
    elif name == "nccl" and first is not None:
        row["detect_s"] = _seconds(first.started_at, first.seen_ended_at)
    elif fired is not None and first is not None:
        row["detect_s"] = _seconds(fired.at, first.seen_ended_at)
        if name == "hang":
            row["verdict_s"] = _seconds(fired.at, first.verdict_at)
    if len(attempts) > 1 and len(jobs) > 1:
        row["restart_s"] = _seconds(attempts[0].ended_at, jobs[1].first_step_at)
        last, resumed = attempts[0].last_step, attempts[1].first_step
        row["steps_lost"] = max(0, (last or 0) - (resumed or 0)) if last is not None else None
        row["fault_step"] = fired.step if fired else None
    lost_s = sum(row.get(k) or 0.0 for k in ("detect_s", "restart_s")) + (row.get("steps_lost") or 0) * STEP_S
    row["lost_s"] = round(lost_s, 2)
    row["cost_lost_usd"] = round(lost_s * NODES * bench.price / 3600, 4)
    if baseline_s is not None:
        row["slowdown_s"] = round(done.seconds - baseline_s, 1)
    row["unsupervised"] = unsupervised(name, bench)
    return row


def unsupervised(name: str, bench: Bench) -> str:
    """What the same failure costs an Azure ML job with no supervision, at the recipe's scale."""
    hour = NODES * bench.price
    if name == "hang":
        return (f"the job holds its nodes to its timeout: {bench.timeout_h:g} h x {NODES} nodes = "
                f"${bench.timeout_h * hour:,.2f}")
    if name in ("preempt", "host-loss", "host-loss-writer", "nccl"):
        return (f"the run stops; resubmitted by hand from the start, half a run is lost on average: "
                f"{bench.expected_h / 2:g} h x {NODES} nodes = ${bench.expected_h / 2 * hour:,.2f}, plus the wait for a person")
    if name.startswith("kill-"):
        return "the attempt runs on unsupervised; when it fails, nothing restarts it (as a preemption then)"
    if name == "straggler":
        return "nobody names the slow node; every step runs at its pace"
    if name == "budget":
        return "no limit while an attempt runs: it spends until its own timeout"
    return "-"


def scenario(name: str, bench: Bench):
    from amlhpc.jobs.local import managed
    from amlhpc.jobs.managed.policy import Target

    fault = managed.Fault
    if name == "baseline":
        return bench.rehearse(name, [])
    if name == "preempt":
        return bench.rehearse(name, [fault("preempt", 1, FAULT_STEP, grace_s=5)])
    if name == "host-loss":
        return bench.rehearse(name, [fault("host_loss", 1, FAULT_STEP)])
    if name == "host-loss-writer":
        return bench.rehearse(name, [fault("host_loss", 0, FAULT_STEP)])
    if name == "hang":
        return bench.rehearse(name, [fault("hang", 1, FAULT_STEP)])
    if name == "nccl":
        from tests.fake_sysfs import build_nd96asr_sysfs

        gpu_node = build_nd96asr_sysfs(bench.root / f"sysfs-{uuid.uuid4().hex[:6]}", hcas=0)  # GPUs, no InfiniBand
        return bench.rehearse(name, [fault("nccl", 1, launcher_args=("--sysfs", str(gpu_node)))])
    if name == "straggler":
        return bench.rehearse(name, [fault("slow", 1, factor=3)],
                              command=TRAIN.replace(f"--steps {STEPS}", f"--steps {STRAGGLER_STEPS}"))
    if name == "throttle":
        from tests.faultproxy import FaultProxy

        with FaultProxy(bench.server.port, seed=11, busy=0.3, max_faults=400, max_per_request=2) as proxy:
            endpoint = f"http://127.0.0.1:{proxy.port}/{bench.server.account}"
            done, lines = bench.rehearse(name, [], blob_override={1: (endpoint, proxy.connection_string(bench.server))})
            done.throttled = dict(proxy.counts)
        return done, lines
    if name == "budget":
        rate = 3600.0  # $1 per node-second: the rehearsal's seconds cost what hours cost in Azure
        target = Target("nd-a100", NODES, rate, "LowPriority")
        return bench.rehearse(name, [], policy_changes={
            "targets": (target,), "usd_per_node_hour": rate, "limit_usd": LIMIT_USD, "limit_source": "bench limit",
            "expected_hours": 0.001, "checkpoint_interval_s": float(UPLOAD_INTERVAL_S)})
    phase = name.removeprefix("kill-")
    faults = [fault("preempt", 1, FAULT_STEP, grace_s=5)] if phase in ("ended", "backoff") else []
    waits = {"backoff_s": 5.0, "backoff_max_s": 5.0} if phase == "backoff" else {}  # looks happen during the wait
    return bench.rehearse(name, faults, kill_controller_at=phase, policy_changes=waits)


def validate_model(rows: list[dict]) -> dict[str, Any]:
    """The goodput model's loss per interruption (recovery + half an interval) against the
    measured loss of the failure scenarios, with the recovery the benchmark measured: a
    host-class failure whose lost node's part reaches Blob on the way out, restored from the
    upload interval's version (amlhpc/core/goodput.py lost_s)."""
    from amlhpc.core import goodput

    failures = [r for r in rows if r["scenario"] in ("preempt", "host-loss", "host-loss-writer", "hang")
                and r.get("restart_s") is not None]
    if not failures:
        return {}
    recovery = statistics.mean((r.get("detect_s") or 0) + r["restart_s"] for r in failures)
    interval = UPLOAD_INTERVAL_S
    failure = goodput.ClassPlan(goodput.HOST, per_hour=0.0, detect_s=0.0, recovery_s=recovery, needs_blob=0.0)
    predicted = goodput.lost_s(failure, interval, interval, upload_s=0.0)
    measured = statistics.mean(r["lost_s"] for r in failures)
    return {"recovery_s": round(recovery, 2), "interval_s": interval, "predicted_loss_s": round(predicted, 2),
            "measured_loss_s": round(measured, 2), "ratio": round(measured / predicted, 2) if predicted else None,
            "lost_steps": [r.get("steps_lost") for r in failures]}


def _f(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def summarize(runs: list[dict]) -> list[dict]:
    """One row per scenario from its runs: each figure the median of the runs that have it, with
    its series (runs, spread, load per run); what the runs said otherwise, from every run."""
    rows = []
    for name in SCENARIOS:
        mine = [r for r in runs if r["scenario"] == name]
        if not mine:
            continue
        row = dict(mine[-1])
        row["series"] = {}
        for key in FIGURES:
            series = Series(key)
            for r in mine:
                if r.get(key) is not None:
                    series.add(r[key], r.get("load"))
            row["series"][key] = series.to_json()
            row[key] = None if series.median is None else round(series.median, 4)
        row["runs"] = len(mine)
        row["states"] = sorted({r["state"] for r in mine})
        row["missing"] = sorted({m for r in mine for m in r["missing"]})
        row["max_running"] = max(r["max_running"] for r in mine)
        if any("named" in r for r in mine):
            row["named_runs"] = [r.get("named") for r in mine]
        rows.append(row)
    return rows


def _spread(row: dict, key: str, digits: int = 1) -> str:
    data = (row.get("series") or {}).get(key)
    if not data:
        return _f(row.get(key), digits)
    return text(Series.from_json(data), digits)


def render(results: dict) -> str:
    rows = results["rows"]
    lines = [SECTION, "",
             f"Command: `{results['command']}` (`make bench`), {results['date']}, commit {results.get('commit', 'unknown')}. "
             f"Written by bench/recovery.py. "
             f"Each run is one managed rehearsal: {NODES} simulated nodes x 1 rank of `{TRAIN}` (the straggler's: "
             f"{STRAGGLER_STEPS} steps), checkpoints "
             f"uploaded every {UPLOAD_INTERVAL_S} s and on every exit, watchdog.hang_s {HANG_S}, the supervision "
             "polling every second with a 15 s lease and the revival check every second; faults at step "
             f"{FAULT_STEP} on node 1 (node 0 for host-loss-writer). Costs at the recipe's Azure price (${results['price']:,.3f} per node-hour, "
             f"{NODES} nodes) for the seconds measured here. Each figure: the median of "
             f"{results.get('repeats', 1)} run(s) (lowest-highest, n); the scenarios interleaved; the load "
             "average (1, 5, 15 min) at each run in recovery.json.",
             "", f"Machine: {results['machine']}. Load average before/after: {results['load_before']} / "
             f"{results['load_after']}.{_load_range(results)}", ""]
    if results.get("repeats", MIN_RUNS) < MIN_RUNS:
        lines += [f"**Fewer than {MIN_RUNS} runs per figure: a smoke run, not for publishing.**", ""]
    lines += ["| scenario | outcome | attempts (causes) | detect s | end -> next first step s | steps lost | "
              "lost s | cost lost $ | without supervision |",
              "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        states = r.get("states") or [r["state"]]
        outcome = ", ".join(states) + ("" if not r["missing"] else f"; FAULT MISSING: {'; '.join(r['missing'])}")
        if r.get("named") is not None:
            named = r.get("named_runs") or [r["named"]]
            outcome += f"; named node(s) {', '.join(str(n or 'none') for n in named)}"
        if r.get("throttled"):
            outcome += f"; {sum(r['throttled'].values())} busy answers"
        lines.append(f"| {r['scenario']} | {outcome} | {r['attempts']} ({', '.join(map(str, r['causes']))}) | "
                     f"{_spread(r, 'detect_s')} | {_spread(r, 'restart_s')} | {_spread(r, 'steps_lost', 0)} | "
                     f"{_spread(r, 'lost_s')} | {_spread(r, 'cost_lost_usd', 4)} | {r['unsupervised']} |")
    checks = results["checks"]
    lines += ["", "Checks (the done-when of the supervision), on every run:", ""]
    lines += [f"- {text}: **{'met' if ok else 'MISSED'}**" for text, ok in checks]
    model = results.get("model") or {}
    if model:
        lines += ["", f"Goodput model (amlhpc/core/goodput.py) against these losses: recovery {model['recovery_s']} s "
                      f"(detection + restart, mean of the medians of preempt, host-loss, host-loss-writer and hang), "
                      f"checkpoint interval "
                      f"{model['interval_s']} s: predicted loss per interruption {model['predicted_loss_s']} s "
                      f"(recovery + half an interval), measured {model['measured_loss_s']} s (ratio {model['ratio']}; "
                      f"steps lost {model['lost_steps']}: a preempted or hung node uploads its last checkpoint on "
                      "the way out, and so does the writer when another node is lost: only a lost writer loses the "
                      "work since its last periodic upload)."]
    restart = results.get("restart")
    if restart:
        lines += _render_restart(restart)
    if results.get("rerun"):
        lines += _render_rerun(results["rerun"])
    return "\n".join(lines) + "\n"


def _load_range(results: dict) -> str:
    """` 1-minute load when the runs started: low-high over n runs`, from every run's load."""
    loads = [r.get("load") for r in results.get("runs") or []]
    loads += [load for paths in (results.get("restart") or {}).values() for data in paths.values()
              if not data.get("name", "").startswith("ratio_") for load in data.get("loads") or []]
    first = []
    for load in loads:
        try:
            first.append(float(str(load).split()[0]))
        except (ValueError, IndexError):
            continue
    if not first:
        return ""
    return f" The 1-minute load when the runs started: {min(first):.2f}-{max(first):.2f} ({len(first)} runs)."


def _label(path: str) -> str:
    from bench.restart import LABELS, RATIO

    if path.startswith(RATIO):
        inside = LABELS.get(path.removeprefix(RATIO), path).removeprefix("in-job, ")
        return f"resubmitted / in-job ({inside}), x"
    return LABELS.get(path, path)


def _render_restart(restart: dict) -> list[str]:
    from bench.restart import RATIO

    lines = ["", "## In-job restart against a resubmitted attempt (bench/restart.py)", "",
             "Seconds from the fault to the first step after it, each path apart, and the ratios (resubmitted over "
             "each in-job path, taken within a repeat, whose paths ran back to back): median (lowest-highest, n). "
             "Azure ML's own part of a resubmission (queueing, node allocation, image pull: minutes) is not "
             "rehearsed, so each ratio is a lower bound.", "",
             "| fault | path | median (lowest-highest, n) |", "|---|---|---:|"]
    for kind, paths in restart.items():
        for path, data in sorted(paths.items(), key=lambda item: item[0].startswith(RATIO)):
            if data.get("runs"):
                lines.append(f"| {kind} | {_label(path)} | {text(Series.from_json(data), 2)} |")
    return lines


def figures(results: dict) -> dict[str, dict]:
    """Every figure of a run that has runs: its name -> its series (as JSON)."""
    out: dict[str, dict] = {}
    for r in results.get("rows") or []:
        for key, label in COMPARED.items():
            data = (r.get("series") or {}).get(key)
            if data and data.get("runs"):
                out[f"{r['scenario']}: {label}"] = data
    for kind, paths in (results.get("restart") or {}).items():
        for path, data in paths.items():
            if data.get("runs"):
                out[f"restart, {kind}: {_label(path).strip()}"] = data
    return out


def compare(published: dict, rerun: dict) -> list[dict]:
    """For each figure both runs have: bench/spread.py's check of the rerun (inside the published
    spread, the chance of missing it with nothing changed, the exact rank test of a move)."""
    return check_rerun({name: data["runs"] for name, data in figures(published).items()},
                       {name: data["runs"] for name, data in figures(rerun).items()})


def rerun_of(published: dict, results: dict) -> dict:
    """The published results with this run's check of them (`rerun`), for the section."""
    return {**published, "rerun": {key: results.get(key) for key in ("command", "date", "commit", "load_before",
                                                                      "load_after", "machine", "repeats", "model")}
            | {"figures": compare(published, results)}}


def _render_rerun(rerun: dict) -> list[str]:
    rows = rerun["figures"]
    lines = ["", "## Rerun", "",
             f"The same benchmark again: `{rerun['command']}`, {rerun['date']}, commit {rerun.get('commit', 'unknown')}, "
             f"{rerun.get('repeats')} run(s) per figure; load average before/after: {rerun['load_before']} / "
             f"{rerun['load_after']}. {rerun_summary(rows)}", "", *rerun_table(rows)]
    model = rerun.get("model") or {}
    if model:
        lines += ["", f"Goodput model on the rerun's medians: recovery {model['recovery_s']} s, predicted loss per "
                      f"interruption {model['predicted_loss_s']} s, measured {model['measured_loss_s']} s "
                      f"(ratio {model['ratio']})."]
    return lines


def checks(runs: list[dict]) -> list[tuple[str, bool]]:
    """The supervision's done-when, each on every run of its scenario."""
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["scenario"], []).append(r)
    out = []
    if "hang" in by:
        found = [r.get("verdict_s") for r in by["hang"]]
        out.append((f"a hang is found within hang_s + two watchdog intervals ({HANG_S} + 2 x {HANG_S / 6:.2f} s) of the "
                    f"freeze: {', '.join(_f(v) for v in found)} s (the job's end, the controller's look and the restart "
                    "follow: detect s)",
                    all(v is not None and v <= HANG_S + 2 * HANG_S / 6 for v in found)))
    kills = [r for r in runs if r["scenario"].startswith("kill-")]
    if kills:
        out.append(("a controller killed at any phase is replaced and the run completes",
                    all(r["state"] == "succeeded" and len(r["controllers"]) > 1 for r in kills)))
    out.append(("never two attempts at once", all(r["max_running"] <= 1 for r in runs)))
    out.append(("every requested fault happened", all(not r["missing"] for r in runs)))
    if "budget" in by:
        spent = [(r.get("total_usd", 1e9), r.get("one_poll_usd", 0)) for r in by["budget"]]
        out.append((f"spend within the limit plus one poll's cost: {', '.join(f'${t:,.2f}' for t, _ in spent)} of "
                    f"${LIMIT_USD:,.2f} (+ ${spent[0][1]:,.2f})", all(t <= LIMIT_USD + poll for t, poll in spent)))
    if "straggler" in by:
        out.append(("the slowed node is named, and only it", all(r.get("named") == [1] for r in by["straggler"])))
    undisturbed = [r for r in runs if r["scenario"] in ("baseline", "throttle", "nccl") or r["scenario"].startswith("kill-")]
    out.append(("no straggler named on the runs without a slowed node",
                all(not r.get("stragglers") for r in undisturbed)))
    return out


def run(args: argparse.Namespace) -> dict:
    from amlhpc.jobs.local import azurite

    parts = [p for p in PARTS if not args.only or p in args.only.split(",")]
    chosen = [s for s in SCENARIOS if s in parts]
    root = Path(tempfile.mkdtemp(prefix="amlhpc-recovery-"))
    results: dict[str, Any] = {"command": "python -m bench.recovery " + " ".join(sys.argv[1:]),
                               "date": time.strftime("%Y-%m-%d %H:%M %Z"), "load_before": loadavg(),
                               "commit": commit(), "repeats": args.repeats}
    runs: list[dict] = []
    baseline: list[float] = []
    for repeat in range(args.repeats if chosen else 0):
        # Each round of the scenarios in a world of its own (Azurite, the planned stack, the code
        # snapshot): a rerun replaces all of them, so the spread samples them too. With one world
        # for every round, four runs on one machine agreed to 0.1 s while each run's spread was
        # a few hundredths (bench/RESULTS.md, the fourth run).
        with azurite.start(root / f"azurite-{repeat + 1}") as server:
            bench = Bench(server, root)
            results["price"] = bench.price
            for name in chosen:
                print(f"recovery: {name} (run {repeat + 1}/{args.repeats}) ...", flush=True)
                load = loadavg()
                done, lines = scenario(name, bench)
                row = measure(name, done, bench, statistics.median(baseline) if baseline else None)
                row.update(repeat=repeat + 1, load=load)
                row["stragglers"] = [s for a in done.record.attempts for s in a.stragglers]
                if getattr(done, "throttled", None) is not None:
                    row["throttled"] = done.throttled
                if name == "budget":
                    row["total_usd"] = round(done.record.total_usd(0.0), 2)
                    row["one_poll_usd"] = NODES * 3600.0 / 3600
                if name == "baseline":
                    baseline.append(done.seconds)
                runs.append(row)
                print(f"recovery: {name}: {json.dumps({k: v for k, v in row.items() if k != 'unsupervised'})}", flush=True)
                (root / f"{name}-{repeat + 1}.log").write_text("\n".join(lines))
    if "restart" in parts:
        from bench import restart

        with azurite.start(root / "azurite-restart") as server:
            found = restart.measure(root / "restart", server, args.repeats,
                                    say=lambda line: print(f"recovery: {line}", flush=True))
        results["restart"] = {kind: {path: series.to_json() for path, series in paths.items()}
                              for kind, paths in found.items()}
    machine = describe_machine()
    rows = summarize(runs)
    results.update(runs=runs, rows=rows, checks=checks(runs), model=validate_model(rows), load_after=loadavg(),
                   logs=str(root),
                   machine=f"{machine['cpu']}, {machine['cpus']} CPUs, {machine['mem_gib']} GiB, Python "
                           f"{machine['python']}; Azurite {azurite_version()} on the same machine")
    return results


def merge(results: dict, out: Path) -> dict:
    """With --only: the other scenarios' runs (and restart figures) from the previous run at `out` (said in the table)."""
    previous = out / "recovery.json"
    if not previous.is_file():
        return results
    old = json.loads(previous.read_text())
    rerun = {r["scenario"] for r in results["runs"]}
    kept = [r for r in old.get("runs", []) if r["scenario"] not in rerun]
    again = sorted(rerun | ({"restart"} if "restart" in results else set()))
    if "restart" not in results and old.get("restart"):
        results["restart"] = old["restart"]
    if kept or old.get("restart"):
        results["runs"] = kept + results["runs"]
        results["rows"] = summarize(results["runs"])
        results["command"] = (f"{old.get('command')}, {old.get('date')} at {old.get('commit', 'unknown')}; "
                              f"{', '.join(again)} again with {results['command']}")
        results["checks"], results["model"] = checks(results["runs"]), validate_model(results["rows"])
    return results


def write(results: dict, out: Path, update: bool, shown: dict | None = None) -> str:
    """recovery.json (this run) and recovery.md (the section: `shown`, this run by default) into
    `out`; with `update`, the section replaces its own part of bench/RESULTS.md, and only it."""
    text = render(shown or results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recovery.md").write_text(text)
    (out / "recovery.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    if update:
        previous = RESULTS.read_text() if RESULTS.exists() else ""
        RESULTS.write_text(replace_section(previous, f"{BEGIN}\n{text}{END}\n"))
    return text


def replace_section(previous: str, section: str) -> str:
    """`previous` with this benchmark's section replaced by `section`: between its markers, or
    (a file from before them) from its heading to the next benchmark's marker or top heading;
    appended when it has none. What comes before and after is kept as it is."""
    if BEGIN in previous and END in previous:
        head, rest = previous.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].removeprefix("\n")
        return head + section + tail
    if SECTION in previous:
        start = previous.index(SECTION)
        ends = [i + 1 for i in (previous.find("\n<!-- bench.", start), previous.find("\n# ", start + 1)) if i >= 0]
        stop = min(ends) if ends else len(previous)
        return previous[:start] + section + ("\n" + previous[stop:] if stop < len(previous) else "")
    return (previous.rstrip() + "\n\n" if previous.strip() else "") + section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--update-results", action="store_true", help="also write the table into bench/RESULTS.md")
    parser.add_argument("--only", help=f"comma-separated scenarios (default all: {', '.join(PARTS)})")
    parser.add_argument("--repeats", type=int, default=MIN_RUNS, help=f"runs of each scenario (at least {MIN_RUNS} to publish)")
    parser.add_argument("--rerun-of", type=Path, metavar="JSON",
                        help="a published run's recovery.json: check its figures against this run (the section keeps them)")
    args = parser.parse_args(argv)
    unknown = sorted(set((args.only or "").split(",")) - set(PARTS) - {""})
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1 (at least {MIN_RUNS} to publish)")
    published = None
    if args.rerun_of is not None:
        try:
            published = json.loads(args.rerun_of.read_text())
            if not isinstance(published, dict) or "rows" not in published:
                raise ValueError("it holds no rows")
        except (OSError, ValueError) as exc:
            parser.error(f"--rerun-of {args.rerun_of}: not a recovery.json written by this benchmark ({exc}); "
                         "give the --out folder's recovery.json of the published run")
    results = run(args)
    if args.only and published is None:
        results = merge(results, args.out)
    shown = rerun_of(published, results) if published is not None else None
    print(write(results, args.out, args.update_results, shown))
    # A figure outside its spread may be chance (bench/spread.py); one the rank test says moved is not.
    held = not any(r["moved"] for r in shown["rerun"]["figures"]) if shown else True
    if not held:
        print("recovery: a figure moved beyond chance since the published run (see the Rerun table)", file=sys.stderr)
    return 0 if all(ok for _, ok in results["checks"]) and held else 1


if __name__ == "__main__":
    sys.exit(main())

