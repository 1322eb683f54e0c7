"""In-job restart against a resubmitted attempt, and what the warm standby buys, measured on the
rehearsal: part of `python -m bench.recovery` (`--only restart`).

The rehearsed cosmoflow job, 2 simulated nodes x 2 ranks over gloo, rank 3 failing at step 5;
seconds from the fault to the first step logged after it. Each repeat runs every path once, in
an order rotated from repeat to repeat (a machine whose load drifts does not favour one path):

- in-job, warm: the launchers restart the training from their node-local copies, the command
  run by its warm standby (interpreter and torch loaded), the fault held until every rank's
  standby is ready: the standby's best case;
- in-job, as it comes: the standby on, the fault at step 5 without waiting for it (a standby
  still importing torch is waited for or passed over, as in a job);
- in-job, cold: no standby (AMLHPC_STANDBY=off): every restart starts its interpreter and
  imports torch;
- resubmitted: the same job with in-job restarts off ends (fault -> its last process gone),
  then a fresh rehearsal of it starts (launcher, staging, restore from Blob, process group,
  first step); the two are added. Azure ML's own part of a resubmission (queueing, node
  allocation, image pull: minutes) is not rehearsed, so its ratio to an in-job restart is a
  lower bound.

A hang (rank 3 stops reporting at step 5, watchdog.hang_s 10) is measured in-job (warm) and
resubmitted, with the watchdog's detection apart (the same on both paths).

Ratios (resubmitted / each in-job path) are taken within a repeat, whose paths ran back to
back under nearly the same load, and published as their median and spread like the seconds:
the median of ratios, not a ratio of medians, so a load that drifts between repeats moves
both sides of each ratio together.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from bench.checkpoint import Rehearsals, _first, _is_step, _is_verdict
from bench.spread import Series

FAULT_STEP, FAULT_RANK, HANG_S = 5, 3, 10
CRASH_PATHS = ("in_job_warm", "in_job_as_it_comes", "in_job_cold", "resubmitted")
HANG_PATHS = ("in_job_warm", "resubmitted")
LABELS = {"in_job_warm": "in-job, warm standby ready", "in_job_as_it_comes": "in-job, standby on, fault as it comes",
          "in_job_cold": "in-job, no standby (cold)", "resubmitted": "resubmitted (job end + new attempt)",
          "job_end": "  of which the job's end", "new_attempt": "  of which the new attempt",
          "detection": "  of which the watchdog's detection",
          "in_job_detection": "  in-job: of which the watchdog's detection"}
RATIO = "ratio_"
"""The prefix of a ratio's series: `ratio_in_job_warm` is resubmitted / in-job warm, within each repeat."""


def _spec(kind: str) -> str:
    """The --fault SPEC of a crash or a hang (the rank stops reporting progress: `stall`)."""
    return f"{'stall' if kind == 'hang' else kind}@step={FAULT_STEP},rank={FAULT_RANK}"


def _marker(kind: str) -> str:
    return f"injected fault: {'stall' if kind == 'hang' else kind} on rank {FAULT_RANK} at step {FAULT_STEP}"


def in_job(rehearsals: Rehearsals, kind: str, path: str) -> tuple[float, float | None]:
    """Seconds from the fault to the first step of the restarted training inside one job, and
    from the fault to the watchdog's verdict (a hang)."""
    fault = _spec(kind)
    fault, *sets = {"in_job_warm": (fault + ",after-standby=yes", "env.AMLHPC_STANDBY=on"),
                    "in_job_as_it_comes": (fault, "env.AMLHPC_STANDBY=on"),
                    "in_job_cold": (fault, "env.AMLHPC_STANDBY=off")}[path]
    watch = (f"watchdog.hang_s={HANG_S}",) if kind == "hang" else ()
    result, lines, _, _ = rehearsals.run(f"{kind}-{path}-{uuid.uuid4().hex[:6]}".replace("_", "-"), *sets, *watch,
                                         faults=(fault,))
    assert result.ok, f"the in-job restart of the {kind} ({path}) failed: {result.exit_codes}"
    at = _first(lines, lambda rank, line: _marker(kind) in line)
    resumed = _first(lines, lambda rank, line: rank == 0 and line.startswith("resumed from"), at)
    detected = _first(lines, _is_verdict, at) - at if kind == "hang" else None
    return _first(lines, _is_step, resumed) - at, detected


def resubmitted(rehearsals: Rehearsals, kind: str) -> dict[str, float]:
    """The job ending with in-job restarts off, then a new attempt of it from launcher start to its first step."""
    fault = _spec(kind)
    watch = (f"watchdog.hang_s={HANG_S}",) if kind == "hang" else ()
    name = f"{kind}-resubmit-{uuid.uuid4().hex[:6]}"
    ended, lines_ended, _, end = rehearsals.run(name, "checkpoint.local_restarts=0", *watch, faults=(fault,))
    assert not ended.ok, "with in-job restarts off the fault ends the job"
    at = _first(lines_ended, lambda rank, line: _marker(kind) in line)
    again, lines, start, _ = rehearsals.run(name, *watch)  # the new attempt: same name, same checkpoint prefix
    assert again.ok, f"the resubmitted attempt failed: {again.exit_codes}"
    resumed = _first(lines, lambda rank, line: rank == 0 and line.startswith("resumed from"))
    first_step = _first(lines, _is_step, resumed)
    row = {"job_end": end - at, "new_attempt": first_step - start}
    row["resubmitted"] = row["job_end"] + row["new_attempt"]
    if kind == "hang":
        row["detection"] = _first(lines_ended, _is_verdict, at) - at
    return row


def measure(workdir: Path, server, repeats: int, kinds: tuple[str, ...] = ("crash", "hang"),
            say=print) -> dict[str, dict[str, Series]]:
    """kind -> path -> its series (seconds), `repeats` runs each, interleaved."""
    from bench.machine import loadavg

    rehearsals = Rehearsals(workdir, server)
    found: dict[str, dict[str, Series]] = {}
    for kind in kinds:
        paths = CRASH_PATHS if kind == "crash" else HANG_PATHS
        series = {name: Series(name) for name in (*paths, "job_end", "new_attempt",
                                                  *(("detection", "in_job_detection") if kind == "hang" else ()))}
        for repeat in range(repeats):
            order = paths[repeat % len(paths):] + paths[:repeat % len(paths)]
            for path in order:
                load = loadavg()
                if path == "resubmitted":
                    row = resubmitted(rehearsals, kind)
                    for key, value in row.items():
                        series[key].add(value, load)
                else:
                    seconds, detected = in_job(rehearsals, kind, path)
                    series[path].add(seconds, load)
                    if detected is not None:
                        series["in_job_detection"].add(detected, load)
                say(f"restart: {kind} repeat {repeat + 1}/{repeats} {path}: {series[path].runs[-1]:.2f} s "
                    f"(load {load})")
        series.update(ratios(series, paths))
        found[kind] = series
    return found


def ratios(series: dict[str, Series], paths: tuple[str, ...]) -> dict[str, Series]:
    """resubmitted / each in-job path, one per repeat (the runs of a repeat ran back to back)."""
    out = {}
    resubmitted = series["resubmitted"]
    for path in paths:
        if path == "resubmitted":
            continue
        ratio = Series(RATIO + path)
        for again, inside, load in zip(resubmitted.runs, series[path].runs, series[path].loads, strict=False):
            if inside > 0:
                ratio.add(again / inside, load)
        out[ratio.name] = ratio
    return out
