"""`jobs run --fault SPEC`: the faults a rehearsal injects, in one grammar, parsed in one place.

    SPEC   := KIND '@' KEY=VALUE (',' KEY=VALUE)*
    KIND   := preempt | hang | kill-host | slow | kill-controller | crash | error | stall

    preempt@step=4,node=0,grace=30     node 0's training stops at step 4, then SIGTERM and SIGKILL grace s later
    hang@step=6,node=1                 node 1's training is frozen (SIGSTOP) at step 6: the watchdog must find it
    kill-host@step=5,node=1,replace=no node 1's processes are SIGKILLed at step 5; replace=no: the cluster stays a node short
    slow@node=1,factor=3               node 1's own work per step takes 3x longer (a straggler)
    kill-controller@phase=watch        the managed run's controller dies at that phase of its loop
    crash@step=5,rank=3                rank 3's process exits (status 86) after step 5
    error@step=3,rank=1                rank 1 raises an NCCL error after step 3
    stall@step=5,rank=3                rank 3 stops reporting progress after step 5 (its process runs on)

Every kind but kill-controller takes `gen=K` (in the launch's restart generation K; default 0,
the first run; each in-job restart adds one) and every kind `attempt=K` (in the managed run's
attempt K; default 1, and for kill-controller the phase's first hit in any attempt). crash, error and stall take `after-commit=K` (first wait until a
checkpoint of step K is committed in Blob), `after-standby=yes` (first wait until every rank's
warm standby is ready), `corrupt=yes` (flip a byte in the rank's local checkpoint copies
first) and `rot=yes` (the same, keeping each file's mtime: the medium's corruption, which only
the load's hashes find). A bad key or value is one error naming it and the keys or values accepted.

Every fault goes through a named fault point (amlhpc/jobs/runtime/base/faultpoints.py, armed in
the processes by AMLHPC_FAULTPOINTS): the node faults through `training.step` (a gate where
the rehearsal acts) and `training.compute` (slow), the rank faults through `training.fault`
(amlhpc/jobs/workloads/resume.py), the controller through its `controller.*` points.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from amlhpc.core.errors import Problem, UserError

EXIT_INJECTED_CRASH = 86
"""The status a `crash` fault's process exits with (amlhpc/jobs/workloads/resume.py)."""
NCCL_ERROR = "NCCL error: unhandled system error (injected: {spec})"
"""What an `error` fault raises: the words NCCL uses, so the launcher treats it as NCCL's."""
PREEMPT_GRACE_S = 30.0
"""Seconds between a preempted node's SIGTERM and its SIGKILL: the notice Azure gives a Spot or
low-priority VM before evicting it (Scheduled Events, event type Preempt, minimum notice 30
seconds: https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events, read
2026-11). Within it the launcher uploads the node's part of the newest checkpoint, so the
next attempt resumes from it."""
CONTROLLER_PHASES = {"claim": "controller.claim", "claimed": "controller.claimed", "submitted": "controller.submitted",
                     "watch": "controller.watch", "ended": "controller.ended", "backoff": "controller.backoff",
                     "record-write": "controller.record.write"}
"""kill-controller@phase=PHASE -> the fault point where the controller dies."""
NODE_KINDS = ("preempt", "hang", "kill-host", "slow")
"""Faults the rehearsal acts out on a node's processes (only a managed rehearsal has the actor)."""
RANK_KINDS = ("crash", "error", "stall")
"""Faults a rank's own training acts out at the fault point training.fault."""


def _integer(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < low:
            raise ValueError(f"a whole number >= {low}")
        return int(text)
    parse.__doc__ = f"a whole number >= {low}"
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise ValueError("seconds from 0 to 3600 (Azure gives an evicted VM 30)")
    return value


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 1:
        raise ValueError("a factor > 1 (3: three times slower)")
    return value


def _yes_no(text: str) -> bool:
    if text not in ("yes", "no"):
        raise ValueError("yes or no")
    return text == "yes"


def _phase(text: str) -> str:
    if text not in CONTROLLER_PHASES:
        raise ValueError(f"one of {', '.join(CONTROLLER_PHASES)}")
    return text


KEYS: dict[str, tuple[Callable[[str], Any], str]] = {
    "step": (_integer(1), "the training step it fires at"),
    "node": (_integer(0), "the simulated node (default 0)"),
    "rank": (_integer(0), "the global rank (default 0)"),
    "gen": (_integer(0), "in this restart generation of the launch (default 0: its first run)"),
    "attempt": (_integer(1), "in this attempt of the managed run (default 1)"),
    "grace": (_seconds, "seconds between SIGTERM and SIGKILL (default 30)"),
    "replace": (_yes_no, "whether the cluster gets a node in the lost one's place (default yes)"),
    "factor": (_factor, "how many times slower the node's own work is"),
    "phase": (_phase, "the controller's phase"),
    "after-commit": (_integer(1), "first wait for a committed checkpoint of this step"),
    "after-standby": (_yes_no, "first wait for every rank's warm standby"),
    "corrupt": (_yes_no, "first corrupt the rank's local checkpoint copies"),
    "rot": (_yes_no, "first corrupt the rank's local checkpoint copies, keeping their size and mtime"),
}
_RANK_KEYS = ("step", "rank", "gen", "attempt", "after-commit", "after-standby", "corrupt", "rot")
GRAMMAR: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # kind: (required keys, every accepted key)
    "preempt": (("step",), ("step", "node", "grace", "gen", "attempt")),
    "hang": (("step",), ("step", "node", "gen", "attempt")),
    "kill-host": (("step",), ("step", "node", "replace", "gen", "attempt")),
    "slow": (("node", "factor"), ("node", "factor", "gen", "attempt")),
    "kill-controller": (("phase",), ("phase", "attempt")),
    "crash": (("step",), _RANK_KEYS),
    "error": (("step",), _RANK_KEYS),
    "stall": (("step",), _RANK_KEYS),
}
EXAMPLES = ("hang@step=6,node=1", "preempt@step=4,node=0,grace=30", "kill-host@step=5,node=1,replace=no",
            "slow@node=1,factor=3", "kill-controller@phase=watch", "error@step=3,rank=1")


@dataclass(frozen=True)
class FaultSpec:
    """One parsed --fault: its kind and settings (the keys of GRAMMAR, defaults filled in)."""

    text: str
    kind: str
    step: int | None = None
    node: int = 0
    rank: int = 0
    gen: int = 0
    """The launch's restart generation it fires in (0: the first run; each in-job restart adds one)."""
    attempt: int | None = None
    """None: attempt 1, except kill-controller: the phase's first hit in any attempt."""
    grace_s: float = PREEMPT_GRACE_S
    replace: bool = True
    factor: float = 1.0
    phase: str | None = None
    after_commit: int | None = None
    after_standby: bool = False
    corrupt: bool = False
    rot: bool = False

    @property
    def on_node(self) -> bool:
        return self.kind in NODE_KINDS

    @property
    def in_rank(self) -> bool:
        return self.kind in RANK_KINDS

    def point(self) -> tuple[str, dict[str, Any]]:
        """A rank fault's fault point and its AMLHPC_FAULTPOINTS setting (amlhpc/jobs/runtime/base/faultpoints.py)."""
        if not self.in_rank:
            raise ValueError(f"{self.text}: the rehearsal acts it out; no fault point of the training does")
        action: dict[str, Any] = ({"action": "exit", "code": EXIT_INJECTED_CRASH} if self.kind == "crash" else
                                  {"action": "error", "message": NCCL_ERROR.format(spec=self.text)}
                                  if self.kind == "error" else {"action": "hang"})
        settings = {**action, "kind": self.kind, "spec": self.text, "step": self.step, "rank": self.rank, "gen": self.gen}
        if self.after_commit is not None:
            settings["after_commit"] = self.after_commit
        if self.after_standby:
            settings["after_standby"] = True
        if self.corrupt:
            settings["corrupt"] = True
        if self.rot:
            settings["rot"] = True
        return "training.fault", settings


def _accepted(kind: str) -> str:
    return "; ".join(f"{key}: {KEYS[key][1]}" for key in GRAMMAR[kind][1])


def parse(text: str) -> FaultSpec:
    """One SPEC; UserError naming the bad kind, key or value and what is accepted."""
    spec = text.strip()
    kind, at, rest = spec.partition("@")
    if kind not in GRAMMAR:
        raise UserError([Problem("--fault", spec, f"{kind!r} is not a fault kind",
                                 f"kinds: {', '.join(GRAMMAR)}; e.g. --fault {' --fault '.join(EXAMPLES[:2])}")],
                        "invalid --fault")
    required, accepted = GRAMMAR[kind]
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))) if at else []:
        key, equals, value = item.partition("=")
        if key not in accepted:
            problems.append(Problem("--fault", spec, f"{kind} takes no key {key!r}", f"{kind} takes: {_accepted(kind)}"))
        elif not equals or not value:
            problems.append(Problem("--fault", spec, f"{key} has no value", f"{key}=VALUE, {key}: {KEYS[key][1]}"))
        elif key in values:
            problems.append(Problem("--fault", spec, f"{key} is given twice", "give each key once"))
        else:
            try:
                values[key] = KEYS[key][0](value)
            except ValueError as exc:
                problems.append(Problem("--fault", spec, f"{key}={value}: not {exc}", f"{key}: {KEYS[key][1]}"))
    missing = [key for key in required if key not in values and not any(p.message.startswith(f"{key}=") for p in problems)]
    if missing:
        example = next(e for e in (*EXAMPLES, f"{kind}@step=5,rank=1") if e.startswith(f"{kind}@"))
        problems.append(Problem("--fault", spec, f"{kind} needs {' and '.join(missing)}",
                                f"e.g. --fault {example}; {kind} takes: {_accepted(kind)}"))
    if problems:
        raise UserError(problems, "invalid --fault")
    renamed = {"grace": "grace_s", "after-commit": "after_commit", "after-standby": "after_standby"}
    return FaultSpec(spec, kind, **{renamed.get(key, key): value for key, value in values.items()})


@dataclass(frozen=True)
class RehearsalFaults:
    """The --fault options of one rehearsal, checked against its size."""

    faults: tuple[FaultSpec, ...] = ()

    @property
    def controller(self) -> FaultSpec | None:
        return next((f for f in self.faults if f.kind == "kill-controller"), None)

    def in_rank(self, attempt: int | None = None) -> list[FaultSpec]:
        return [f for f in self.faults if f.in_rank and (attempt is None or (f.attempt or 1) == attempt)]

    def on_node(self) -> list[FaultSpec]:
        return [f for f in self.faults if f.on_node]


def plan(texts: Iterable[str], *, nodes: int, ranks: int, managed: bool) -> RehearsalFaults:
    """Every --fault, parsed and checked together: one UserError naming each problem."""
    problems: list[Problem] = []
    parsed: list[FaultSpec] = []
    for text in texts:
        try:
            parsed.append(parse(text))
        except UserError as exc:
            problems.extend(exc.problems)
    for fault in parsed:
        if not managed and (fault.on_node or fault.kind == "kill-controller"):
            problems.append(Problem("--fault", fault.text, "the supervision recovers from it: only a managed "
                                    "rehearsal acts it out", "add --managed"))
        if not managed and fault.attempt not in (None, 1):
            problems.append(Problem("--fault", fault.text, f"attempt={fault.attempt}: a rehearsal without --managed "
                                    "has one attempt", "add --managed, or drop attempt="))
        if fault.on_node and not 0 <= fault.node < nodes:
            problems.append(Problem("--fault", fault.text, f"node {fault.node} does not exist ({nodes} simulated node(s))",
                                    f"pick node=0..{nodes - 1}"))
        if fault.in_rank and not 0 <= fault.rank < ranks:
            problems.append(Problem("--fault", fault.text, f"rank {fault.rank} does not exist ({ranks} rank(s))",
                                    f"pick rank=0..{ranks - 1}"))
    stepped: dict[tuple[int, int | None], str] = {}
    for fault in parsed:
        if fault.kind in ("preempt", "hang", "kill-host"):
            when = (fault.attempt or 1, fault.gen)
            if when in stepped:
                problems.append(Problem("--fault", f"{stepped[when]} and {fault.text}",
                                        "one node fault at a step per attempt and generation",
                                        "give them other attempt= or gen= (or rehearse them one after the other)"))
            stepped[when] = fault.text
    if sum(f.kind == "kill-controller" for f in parsed) > 1:
        problems.append(Problem("--fault", "kill-controller", "one controller kill per rehearsal",
                                "rehearse the phases one after the other"))
    if problems:
        raise UserError(problems, "invalid --fault")
    return RehearsalFaults(tuple(parsed))


def points_env(faults: Iterable[FaultSpec]) -> dict[str, str]:
    """AMLHPC_FAULTPOINTS for a training's processes arming these rank faults (empty: none)."""
    from amlhpc.jobs.runtime.base import faultpoints

    settings = [fault.point() for fault in faults]
    if not settings:
        return {}
    points: dict[str, Any] = {}
    for name, setting in settings:
        points.setdefault(name, []).append(setting)
    return faultpoints.env_for(points)


def env_for(*texts: str) -> dict[str, str]:
    """AMLHPC_FAULTPOINTS for rank faults written as SPECs (tests and benchmarks that start a
    launcher themselves): `env_for("crash@step=5,rank=1")`."""
    return points_env(parse(text) for text in texts)
