"""How an attempt ended: Azure ML's view of the job plus what each node's launcher recorded.

Evidence, strongest first:

1. Azure ML's status (observation.py). Completed is success. Canceled is the user's (or
   Azure's) decision: not retried, unless nodes of the job were seen preempted, as Azure
   ML cancels a job whose nodes are all gone.
2. Preemption: a node of the job seen in NodeState `preempted` while it ran, or the
   error code `PreemptionError` among the job's error codes (Azure ML reports "UserError:
   AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted ..."; public
   reports in Azure/MachineLearningNotebooks issue 1242 and microsoft/MLOpsPython issue
   346): the RootError's code, its inner errors' and details' codes, and the compute
   error code that message carries (observation.error_codes).
3. The nodes' end records (amlhpc.jobs.runtime.coord.nodestatus): each node's launcher exit status
   maps to a cause (causes.EXIT_CAUSES); a node that left none vanished (a crashed host,
   a preempted VM) - node failure - and so does a node seen `unusable`. When nodes ended
   differently, causes.PRECEDENCE picks the one that explains the others. A node whose
   training reported it completed (final step and checkpoint) and whose command then died
   by a crash signal at exit (amlhpc.jobs.runtime.launch.completion) is no failure; when every node
   completed so, the attempt did.
4. With no end record at all, the job's RootError code: service-side codes are
   `service_error` (retried), UserError/ValidationError mean Azure ML could not run the
   job as given (image, quota, configuration): `bad_input`.

Azure ML may requeue a preempted job itself; the controller then starts a new epoch of the
attempt, and what it passes here is that epoch's only: the node events seen since the
requeue and the end records written since (a preemption before a requeue does not excuse
a failure after it).

The verdict names the nodes to distrust (failed health gate, unusable, vanished, the
node a hang started on); Azure ML cannot exclude a node from a job, so the next attempt
only reports them (docs/managed-jobs.md).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from amlhpc.jobs.managed import causes
from amlhpc.jobs.managed.observation import SERVICE_ERROR_CODES, Observation
from amlhpc.jobs.runtime.launch.completion import crash_signal

PREEMPTION_CODES = frozenset({"PreemptionError"})
"""Azure ML's compute error code for a job whose low-priority nodes were taken back."""
_PREEMPTION = re.compile(r"preemption|pre-?empted", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    cause: str
    detail: str
    exit_code: int | None = None
    bad_nodes: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    first_step: int | None = None
    """The step the attempt started from (its node 0's first report), when known."""
    last_step: int | None = None

    def retryable(self, retry_on: Collection[str | int]) -> bool:
        if self.cause in causes.NEVER_RETRIED:
            return False
        if self.cause == "training_error" and self.exit_code is not None and self.exit_code in retry_on:
            return True
        return self.cause in retry_on


def _node_cause(record: Mapping[str, Any]) -> str | None:
    code = record.get("exit_code")
    if not isinstance(code, int) or code == 0 or _completed_then_crashed(record):
        return None
    return causes.cause_of_exit(code)


def _completed_then_crashed(record: Mapping[str, Any]) -> bool:
    """The node's training reported it completed and its command then died by a crash signal
    (the launcher's exit is the command's own status): the work was done, not a training error."""
    done, code = record.get("completed"), record.get("exit_code")
    return (isinstance(done, Mapping) and isinstance(done.get("step"), int) and code == record.get("command_status")
            and isinstance(code, int) and crash_signal(code) is not None and record.get("last_step") == done["step"])


def _where(node: int, record: Mapping[str, Any] | None) -> dict[str, Any]:
    found: dict[str, Any] = {"node": node}
    if record:
        found.update({k: record[k] for k in ("host", "azure_node_id") if record.get(k)})
    return found


def classify(observation: Observation, ends: Mapping[int, Mapping[str, Any]], nodes: int,
             node_events: Collection[str] = (), tampered: Collection[int] = ()) -> Verdict:
    """The verdict for a job that ended (observation.terminal). `tampered`: nodes whose end
    record exists but failed verification (amlhpc.jobs.managed.evidence): their absence is not
    taken for a vanished host, and a verdict that would rest on it is `unknown`."""
    steps = _steps(ends)
    if observation.status == "Completed":
        return Verdict("completed", "the job completed", 0, first_step=steps[0], last_step=steps[1])
    preempted_seen = "preempted" in node_events or "preempted" in observation.node_states
    error = " ".join(filter(None, (observation.error_code, observation.error_message)))
    if observation.status == "Canceled":
        if preempted_seen:
            return Verdict("preempted", "Azure ML canceled the job after its nodes were preempted", *_rest(steps))
        return Verdict("canceled", f"the job was canceled{': ' + error if error else ''}", *_rest(steps))
    by_code = PREEMPTION_CODES.intersection(observation.error_codes)
    if preempted_seen or by_code or (not observation.error_codes and _PREEMPTION.search(error)):
        why = ("a node of the job was preempted" if preempted_seen else
               f"Azure ML error code {sorted(by_code)[0]}: {error[:300]}" if by_code else f"Azure ML: {error[:300]}")
        return Verdict("preempted", why, *_rest(steps))

    found: dict[str, tuple[str, int | None, dict[str, Any], str]] = {}
    bad: list[dict[str, Any]] = []
    for node, record in sorted(ends.items()):
        cause = _node_cause(record)
        if cause is None:
            continue
        message = str(record.get("error") or f"exit {record.get('exit_code')}")
        if cause == "hang" and isinstance(record.get("hang"), Mapping):
            message = str(record["hang"].get("message") or message)
        elif cause == "health_gate":
            bad.append({**_where(node, record), "why": "health gate"})
        found.setdefault(cause, (cause, record.get("exit_code"), record, f"node {node}: {message}"))
    if "hang" in found:
        culprits = _hang_culprits(ends)
        bad.extend({**_where(n, ends.get(n)), "why": "hang"} for n in culprits)
        if culprits:
            found["hang"] = (*found["hang"][:3], _hang_detail(culprits, ends))
    vanished = [n for n in range(nodes) if n not in ends and n not in tampered]
    if vanished and ends:
        bad.extend({"node": n, "why": "left no end record"} for n in vanished)
        found.setdefault("node_failure", ("node_failure", None, {},
                                          f"node(s) {', '.join(map(str, vanished))} left no end record: the host "
                                          "crashed or was taken away"))
    if "unusable" in node_events or "unusable" in observation.node_states:
        found.setdefault("node_failure", ("node_failure", None, {}, "a node of the job became unusable"))
    for cause in causes.PRECEDENCE:
        if cause in found:
            _, code, _, detail = found[cause]
            return Verdict(cause, detail, code, _dedupe(bad), *steps)
    if tampered:
        return Verdict("unknown", f"the end record(s) of node(s) {', '.join(map(str, sorted(tampered)))} failed "
                                  "verification (written by someone without the attempt's key): not evidence", None,
                       _dedupe(bad), *steps)
    crashed = [n for n, record in sorted(ends.items()) if _completed_then_crashed(record)]
    if crashed and len(ends) == nodes and all(isinstance(r.get("completed"), Mapping) for r in ends.values()):
        return Verdict("completed", f"every node completed its training; node(s) {', '.join(map(str, crashed))} then "
                       "crashed at exit (" + ", ".join(f"exit {ends[n].get('exit_code')}" for n in crashed) + ")",
                       0, (), *steps)
    if not ends:
        if observation.error_code in SERVICE_ERROR_CODES:
            return Verdict("service_error", f"Azure ML: {error[:300]}", None, (), *steps)
        if observation.error_code in ("UserError", "ValidationError"):
            return Verdict("bad_input", f"Azure ML could not run the job: {error[:300]}", None, (), *steps)
    return Verdict("unknown", f"Azure ML says {observation.status}" + (f": {error[:300]}" if error else
                                                                        " and no node recorded a failure"),
                   None, _dedupe(bad), *steps)


def _hang_culprits(ends: Mapping[int, Mapping[str, Any]]) -> list[int]:
    """Where a hang started. A node's watchdog that named another node (silent, stopped
    first, or stopped in its own work while the others waited) is believed; so is a node
    that named itself when every node that named anyone agrees. Otherwise the node that got
    least far, when one did. When every node stopped at the same step and each named only
    itself, progress cannot tell, and no node is blamed."""
    named, self_named = set(), set()
    for node, record in ends.items():
        hang = record.get("hang")
        if isinstance(hang, Mapping) and isinstance(hang.get("culprit"), int):
            (named if hang["culprit"] != node else self_named).add(hang["culprit"])
    if named:
        return sorted(named)
    if len(self_named) == 1 and len(ends) > 1:
        return sorted(self_named)
    steps = {n: r["last_step"] for n, r in ends.items() if isinstance(r.get("last_step"), int)}
    lowest = min(steps.values(), default=None)
    behind = [n for n, step in steps.items() if step == lowest]
    return behind if lowest is not None and len(behind) < len(steps) else []


def _hang_detail(culprits: list[int], ends: Mapping[int, Mapping[str, Any]]) -> str:
    """The hang's story from where it started: the culprit's own watchdog message, else a
    message naming it."""
    messages = [(node, str(r["hang"].get("message") or "")) for node, r in sorted(ends.items())
                if isinstance(r.get("hang"), Mapping)]
    chosen = next((m for n, m in messages if n in culprits and m), None) or \
        next((m for _, m in messages if any(f"node {c} " in m for c in culprits)), None)
    where = ", ".join(f"node {c}" + (f" ({ends[c]['host']})" if ends.get(c, {}).get("host") else "") for c in culprits)
    return f"hang started on {where}" + (f": {chosen}" if chosen else "")


def _steps(ends: Mapping[int, Mapping[str, Any]]) -> tuple[int | None, int | None]:
    """(first, last) step of the attempt from node 0's record (the lowest node that has one)."""
    for _, record in sorted(ends.items()):
        first, last = record.get("first_step"), record.get("last_step")
        if first is not None or last is not None:
            return first, last
    return None, None


def _rest(steps: tuple[int | None, int | None]) -> tuple:
    return None, (), steps[0], steps[1]


def _dedupe(bad: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    seen, out = set(), []
    for item in bad:
        key = (item.get("node"), item.get("why"))
        if key not in seen:
            seen.add(key)
            out.append(item)
    return tuple(out)
