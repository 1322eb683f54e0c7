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
   job as given (image, quota, configuration): `bad_input` - unless the nodes' heartbeats
   showed it training (`trained_to`): a job that trained was run as given, and every
   launcher ending without a word is the hosts' doing (node 0's host lost, the others
   stopped by Azure ML before their store's reconnect grace ran out): `node_failure`.

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
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from amlhpc.jobs.managed import causes
from amlhpc.jobs.managed.causes import Why
from amlhpc.jobs.managed.observation import SERVICE_ERROR_CODES, Observation
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.launch.completion import crash_signal

PREEMPTION_CODES = frozenset({"PreemptionError"})
"""Azure ML's compute error code for a job whose low-priority nodes were taken back."""
_PREEMPTION = re.compile(r"preemption|pre-?empted", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    cause: Why
    detail: str
    exit_code: int | None = None
    bad_nodes: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    first_step: int | None = None
    """The step the attempt started from (its node 0's first report), when known."""
    last_step: int | None = None

    def retryable(self, retry_on: Collection[str | int]) -> bool:
        if self.cause in causes.NEVER_RETRIED:
            return False
        if self.cause == Why.TRAINING_ERROR and self.exit_code is not None and self.exit_code in retry_on:
            return True
        return self.cause in retry_on


def _node_cause(record: Mapping[str, Any]) -> Why | None:
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


@dataclass(frozen=True)
class Finding:
    """One cause the evidence shows, with what says so."""

    cause: Why
    detail: str
    exit_code: int | None = None


@dataclass(frozen=True)
class Evidence:
    """What an attempt left: Azure ML's view and the nodes' end records (see the module docstring)."""

    observation: Observation
    ends: Mapping[int, Mapping[str, Any]]
    nodes: int
    node_events: Collection[str] = ()
    tampered: Collection[int] = ()
    trained_to: int | None = None
    """The furthest step the nodes' heartbeats reported while the attempt ran (None: no step seen)."""

    @property
    def steps(self) -> tuple[int | None, int | None]:
        return _steps(self.ends)

    @property
    def error(self) -> str:
        return " ".join(filter(None, (self.observation.error_code, self.observation.error_message)))

    @property
    def preempted_seen(self) -> bool:
        return "preempted" in self.node_events or "preempted" in self.observation.node_states

    def verdict(self, cause: Why, detail: str, exit_code: int | None = None,
                bad_nodes: tuple[dict[str, Any], ...] = ()) -> Verdict:
        first, last = self.steps
        return Verdict(cause, detail, exit_code, bad_nodes, first, last)


Rule = Callable[[Evidence], "Verdict | None"]


def _completed(e: Evidence) -> Verdict | None:
    if e.observation.status == "Completed":
        return e.verdict(Why.COMPLETED, "the job completed", 0)
    return None


def _canceled(e: Evidence) -> Verdict | None:
    if e.observation.status != "Canceled":
        return None
    if e.preempted_seen:
        return e.verdict(Why.PREEMPTED, "Azure ML canceled the job after its nodes were preempted")
    return e.verdict(Why.CANCELED, f"the job was canceled{': ' + e.error if e.error else ''}")


def _preempted(e: Evidence) -> Verdict | None:
    by_code = PREEMPTION_CODES.intersection(e.observation.error_codes)
    if not (e.preempted_seen or by_code or (not e.observation.error_codes and _PREEMPTION.search(e.error))):
        return None
    why = ("a node of the job was preempted" if e.preempted_seen else
           f"Azure ML error code {sorted(by_code)[0]}: {e.error[:300]}" if by_code else f"Azure ML: {e.error[:300]}")
    return e.verdict(Why.PREEMPTED, why)


def _node_findings(e: Evidence) -> tuple[dict[Why, Finding], list[dict[str, Any]]]:
    """Each cause the nodes' records (and Azure ML's node states) show, first node first, and
    the nodes to distrust."""
    found: dict[Why, Finding] = {}
    bad: list[dict[str, Any]] = []
    for node, record in sorted(e.ends.items()):
        cause, code = _node_cause(record), record.get("exit_code")
        if cause is None:
            continue
        message = str(record.get("error") or f"exit {record.get('exit_code')}")
        if cause == Why.HANG and isinstance(record.get("hang"), Mapping):
            message = str(record["hang"].get("message") or message)
        elif cause == Why.HEALTH_GATE and isinstance(record.get("unhealthy"), Mapping):
            sick = record["unhealthy"]
            message = str(record.get("error") or message)
            if isinstance(sick.get("node"), int):
                bad.append({**_where(sick["node"], e.ends.get(sick["node"]) or sick),
                            "why": f"pre-restart health check ({sick.get('check')})"})
        elif cause == Why.HEALTH_GATE and code == ExitCode.HEALTH:
            bad.append({**_where(node, record), "why": "health gate"})
        elif cause == Why.NODE_FAILURE and isinstance(record.get("lost"), Mapping):
            bad.append({**_where(node, record), "why": "process not reaped after SIGKILL"})
        found.setdefault(cause, Finding(cause, f"node {node}: {message}", record.get("exit_code")))
    if Why.HANG in found:
        culprits = _hang_culprits(e.ends)
        bad.extend({**_where(n, e.ends.get(n)), "why": "hang"} for n in culprits)
        if culprits:
            found[Why.HANG] = Finding(Why.HANG, _hang_detail(culprits, e.ends), found[Why.HANG].exit_code)
    vanished = [n for n in range(e.nodes) if n not in e.ends and n not in e.tampered]
    if vanished and e.ends:
        bad.extend({"node": n, "why": "left no end record"} for n in vanished)
        found.setdefault(Why.NODE_FAILURE, Finding(Why.NODE_FAILURE, f"node(s) {', '.join(map(str, vanished))} left "
                                                   "no end record: the host crashed or was taken away"))
    if "unusable" in e.node_events or "unusable" in e.observation.node_states:
        found.setdefault(Why.NODE_FAILURE, Finding(Why.NODE_FAILURE, "a node of the job became unusable"))
    return found, bad


def _failed_nodes(e: Evidence) -> Verdict | None:
    """The cause that explains the others (causes.PRECEDENCE) among what the nodes show."""
    found, bad = _node_findings(e)
    for cause in causes.PRECEDENCE:
        if cause in found:
            return e.verdict(cause, found[cause].detail, found[cause].exit_code, _dedupe(bad))
    return None


def _tampered(e: Evidence) -> Verdict | None:
    if not e.tampered:
        return None
    return e.verdict(Why.UNKNOWN, f"the end record(s) of node(s) {', '.join(map(str, sorted(e.tampered)))} failed "
                                  "verification (written by someone without the attempt's key): not evidence",
                     bad_nodes=_dedupe(_node_findings(e)[1]))


def _completed_then_crashed_everywhere(e: Evidence) -> Verdict | None:
    crashed = [n for n, record in sorted(e.ends.items()) if _completed_then_crashed(record)]
    if not (crashed and len(e.ends) == e.nodes and all(isinstance(r.get("completed"), Mapping) for r in e.ends.values())):
        return None
    return e.verdict(Why.COMPLETED, f"every node completed its training; node(s) {', '.join(map(str, crashed))} then "
                     "crashed at exit (" + ", ".join(f"exit {e.ends[n].get('exit_code')}" for n in crashed) + ")", 0)


def _azure_said_why(e: Evidence) -> Verdict | None:
    """No node said anything: the job's RootError code."""
    if e.ends:
        return None
    if e.observation.error_code in SERVICE_ERROR_CODES:
        return e.verdict(Why.SERVICE_ERROR, f"Azure ML: {e.error[:300]}")
    if e.observation.error_code in ("UserError", "ValidationError"):
        if e.trained_to is not None:
            return Verdict(Why.NODE_FAILURE, f"no node left an end record, though the job trained to step "
                                             f"{e.trained_to}: its launchers ended without a word (a host lost, the "
                                             f"others stopped before they could write); Azure ML: {e.error[:300]}",
                           last_step=e.trained_to)
        return e.verdict(Why.BAD_INPUT, f"Azure ML could not run the job: {e.error[:300]}")
    return None


RULES: tuple[Rule, ...] = (_completed, _canceled, _preempted, _failed_nodes, _tampered,
                           _completed_then_crashed_everywhere, _azure_said_why)
"""Strongest evidence first (the module docstring); the first rule with a verdict decides."""


def classify(observation: Observation, ends: Mapping[int, Mapping[str, Any]], nodes: int,
             node_events: Collection[str] = (), tampered: Collection[int] = (),
             trained_to: int | None = None) -> Verdict:
    """The verdict for a job that ended (observation.terminal). `tampered`: nodes whose end
    record exists but failed verification (amlhpc.jobs.managed.evidence): their absence is not
    taken for a vanished host, and a verdict that would rest on it is `unknown`. `trained_to`:
    the furthest step the attempt's heartbeats showed (rule 4 of the module docstring)."""
    evidence = Evidence(observation, ends, nodes, node_events, tampered, trained_to)
    for rule in RULES:
        verdict = rule(evidence)
        if verdict is not None:
            return verdict
    error = evidence.error
    return evidence.verdict(Why.UNKNOWN, f"Azure ML says {observation.status}" + (
        f": {error[:300]}" if error else " and no node recorded a failure"),
        bad_nodes=_dedupe(_node_findings(evidence)[1]))


def _hang_culprits(ends: Mapping[int, Mapping[str, Any]]) -> list[int]:
    """Where a hang started. A node's watchdog that named another node (silent, stopped
    first, or stopped in its own work while the others waited) is believed; so is a node
    that named itself when every node that named anyone agrees. Otherwise the node that got
    least far, when one did. When every node stopped at the same step and each named only
    itself, progress cannot tell, and no node is blamed."""
    named: set[int] = set()
    self_named: set[int] = set()
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


def _dedupe(bad: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    seen, out = set(), []
    for item in bad:
        key = (item.get("node"), item.get("why"))
        if key not in seen:
            seen.add(key)
            out.append(item)
    return tuple(out)
