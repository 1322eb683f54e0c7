"""The simulation's scheduler: virtual time, and exactly one thread running at a time.

Every actor of a simulated world (a node's launcher, its uploader, a controller, a revival
check, a second writer) is a `Task`: a real thread that runs the project's real code. The
scheduler lets one task run at a time; a task runs until it waits (`sleep` on its node's
clock, `park` on a fake store's key, a request in flight to a simulated service), and the
scheduler then hands control straight to the task whose turn comes next in virtual time,
advancing the clock to it. Nothing happens at a wall-clock time, so a run is a function of
its seed alone:

- events at the same virtual instant are ordered by a number drawn from the seeded
  generator when they were scheduled: the seed is the interleaving;
- a task that waits while nothing else is due before its wake continues at once (no thread
  switch): a node alone in a burst of requests costs no more than the requests;
- `Node`s own clocks (`NodeClock`, the runtime's `base.clock.Clock`): virtual time plus an
  offset a fault steps back or forward; `monotonic()` never goes back. Each task runs under
  its node's clock (`clock.use`) and with the simulation's executor (`workers.use`: the
  calls a node hands to a pool run in its own thread, one after another), so neither time
  nor threads escape the scheduler; the world adds its client factory the same way;
- a node can be frozen (its tasks are not resumed until it thaws, its clock runs on) or
  killed (never resumed: a power cut, not an orderly stop); `close()` unwinds every task
  still waiting, against a world that no longer answers.

Threads that the code under test starts itself with `threading.Thread` are not scheduled;
the scenarios drive the state machines' steps from their own tasks instead of starting the
loops that would start such threads (docs/simulation.md lists which).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import random
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from amlhpc.jobs.runtime.base import clock, workers

EPOCH = 1_767_225_600.0
"""The simulated wall clock's start: 2026-01-01 00:00:00 UTC (fixed, so a seed replays its names)."""
MONOTONIC_BASE = 10_000.0
"""Where simulated monotonic clocks start (an arbitrary origin, as on a real host)."""
STACK_BYTES = 512 << 10
"""Each task's thread stack: 1,000 simulated nodes fit in a few hundred MiB of address space."""

_local = threading.local()


class Killed(BaseException):  # noqa: N818 - it is a stop, not an error to handle
    """Raised in a task whose node was killed, or when the simulation closes, at its next wait."""


class SimulationError(RuntimeError):
    """The simulation itself was misused (a wait outside a task, a task that never yields)."""


@dataclass
class Node:
    """One simulated host: its clock, its tasks' fate, what the faults did to it."""

    index: int
    name: str
    clock: NodeClock
    principal: str = "node"
    """The identity its requests count under (per principal limits and counts)."""
    frozen: bool = False
    dead: bool = False
    partitioned: bool = False
    """Requests to storage fail to connect while set (a network partition)."""
    deferred: list[Task] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)


class NodeClock:
    """A node's clocks on virtual time (amlhpc.jobs.runtime.base.clock.Clock)."""

    def __init__(self, sim: Simulation, offset_s: float = 0.0):
        self.sim = sim
        self.offset_s = offset_s

    def time(self) -> float:
        return EPOCH + self.sim.now + self.offset_s

    def monotonic(self) -> float:
        return MONOTONIC_BASE + self.sim.now

    def sleep(self, seconds: float) -> None:
        self.sim.sleep(seconds)

    def step(self, seconds: float) -> None:
        """The wall clock jumps by `seconds` (negative: back), as an NTP step does."""
        self.offset_s += seconds


class Task:
    """One thread of the simulation (see the module docstring)."""

    def __init__(self, sim: Simulation, name: str, fn: Callable[[], Any], node: Node | None):
        self.sim, self.name, self.fn, self.node = sim, name, fn, node
        self.go = threading.Lock()
        self.go.acquire()
        self.epoch = 0
        """Only the heap entry carrying the task's current epoch may resume it."""
        self.state = "new"
        """new, ready, running, parked, done, failed, killed."""
        self.notified = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.error_text = ""
        self.thread = threading.Thread(target=self._main, name=f"sim-{name}", daemon=True)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "killed")

    def _main(self) -> None:
        self.go.acquire()
        sim = self.sim
        _local.task = self
        try:
            if sim.closed or (self.node is not None and self.node.dead):
                raise Killed()
            self.state = "running"
            with contextlib.ExitStack() as stack:
                stack.enter_context(clock.use(self.node.clock if self.node is not None else sim.service_clock))
                stack.enter_context(workers.use(workers.inline))
                for context in sim.task_contexts:
                    stack.enter_context(context(self))
                self.result = self.fn()
            self.state = "done"
        except Killed:
            self.state = "killed"
        except BaseException as exc:  # noqa: BLE001 - kept for the scenario, which judges it
            self.state = "failed"
            self.error = exc
            self.error_text = "".join(traceback.format_exception(exc))
            sim.note(self, "error", f"{type(exc).__name__}: {exc}")
        finally:
            _local.task = None
            for waiter in self.sim._joiners.pop(self, []):
                self.sim._wake(waiter)
            if sim.closed:
                sim._main.release()
            else:
                sim._handoff(None)

    def __repr__(self) -> str:
        return f"Task({self.name!r}, {self.state})"


class Trace:
    """What happened, in order: (virtual time, who, kind, text). Bounded: the last `limit`."""

    def __init__(self, limit: int = 200_000):
        from collections import deque

        self.events: deque[tuple[float, str, str, str]] = deque(maxlen=limit)
        self.enabled = True

    def add(self, when: float, who: str, kind: str, text: str) -> None:
        if self.enabled:
            self.events.append((when, who, kind, text))

    def lines(self) -> Iterator[str]:
        for when, who, kind, text in self.events:
            yield f"{when:12.6f}  {who:<16} {kind:<10} {text}"


class Simulation:
    """The scheduler (see the module docstring). Made and driven from one ordinary thread."""

    def __init__(self, seed: int, trace_limit: int = 200_000):
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.closed = False
        self.trace = Trace(trace_limit)
        self.nodes: list[Node] = []
        self.tasks: list[Task] = []
        self.service_clock = NodeClock(self)
        self._heap: list[tuple[float, float, int, Task, int]] = []
        self._counter = itertools.count()
        self._until = math.inf
        self._stop: Callable[[], bool] | None = None
        self._main = threading.Lock()
        self._main.acquire()
        self._joiners: dict[Task, list[Task]] = {}
        self.switches = 0
        self.task_contexts: list[Callable[[Task], AbstractContextManager[Any]]] = []
        """Entered by every task around its function (the world's client factory, for one)."""

    # --- building the world -------------------------------------------------------------
    def node(self, name: str, *, principal: str = "node", offset_s: float = 0.0) -> Node:
        node = Node(len(self.nodes), name, NodeClock(self, offset_s), principal)
        self.nodes.append(node)
        return node

    def spawn(self, name: str, fn: Callable[[], Any], *, node: Node | None = None, delay_s: float = 0.0) -> Task:
        """A new task, due `delay_s` from now; from the main thread or from a task."""
        task = Task(self, name, fn, node)
        self.tasks.append(task)
        if node is not None:
            node.tasks.append(task)
        previous = threading.stack_size(STACK_BYTES)
        try:
            task.thread.start()
        finally:
            threading.stack_size(previous)
        self._schedule(task, self.now + max(0.0, delay_s))
        return task

    def note(self, who: Task | str | None, kind: str, text: str) -> None:
        name = who if isinstance(who, str) else (who.name if who is not None else "world")
        self.trace.add(self.now, name, kind, text)

    # --- inside tasks -------------------------------------------------------------------
    @staticmethod
    def current() -> Task | None:
        return getattr(_local, "task", None)

    def _me(self) -> Task:
        task = self.current()
        if task is None or task.sim is not self:
            raise SimulationError("a simulated wait outside a simulation task (a thread the code started itself?)")
        if self.closed or (task.node is not None and task.node.dead):
            raise Killed()
        return task

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` of virtual time (0: let tasks due now go first, in seeded order)."""
        me = self._me()
        self._schedule(me, self.now + max(0.0, seconds))
        self._handoff(me)

    def park(self, timeout_s: float | None = None) -> bool:
        """Wait until `wake(task)` or the timeout; True when woken."""
        me = self._me()
        me.notified = False
        if timeout_s is None:
            me.epoch += 1  # no entry: only a wake resumes it
            me.state = "parked"
        else:
            self._schedule(me, self.now + max(0.0, timeout_s))
            me.state = "parked"
        self._handoff(me)
        return me.notified

    def _wake(self, task: Task) -> None:
        if task.state == "parked":
            task.notified = True
            self._schedule(task, self.now)

    def wake(self, task: Task) -> None:
        """Resume a parked task at the current instant (its turn among others due now is seeded)."""
        self._wake(task)

    def join(self, task: Task, timeout_s: float | None = None) -> bool:
        """From a task: wait until `task` finished; True when it did."""
        if task.finished:
            return True
        self._joiners.setdefault(task, []).append(self._me())
        self.park(timeout_s)
        return task.finished

    # --- the scheduler's core -------------------------------------------------------------
    def _schedule(self, task: Task, when: float) -> None:
        task.epoch += 1
        if task.state != "new":
            task.state = "ready"
        heapq.heappush(self._heap, (when, self.rng.random(), next(self._counter), task, task.epoch))

    def _next(self) -> Task | None:
        heap = self._heap
        if self._stop is not None and self._stop():
            return None
        while heap:
            when, _, _, task, epoch = heap[0]
            if when > self._until:
                return None
            heapq.heappop(heap)
            if epoch != task.epoch or task.finished:
                continue
            node = task.node
            if node is not None and node.dead:
                continue
            if node is not None and node.frozen:
                node.deferred.append(task)
                continue
            if when > self.now:
                self.now = when
            return task
        return None

    def _handoff(self, me: Task | None) -> None:
        """Pass control to the next due task (or to the main thread); then, if `me` is given,
        wait for its own turn."""
        nxt = self._next()
        if nxt is me and me is not None:
            me.state = "running"
            return
        self.switches += 1
        if nxt is None:
            self._main.release()
        else:
            nxt.state = "running"
            nxt.go.release()
        if me is not None:
            me.go.acquire()
            if self.closed or (me.node is not None and me.node.dead):
                raise Killed()

    # --- from the main thread -------------------------------------------------------------
    def run(self, until: float = math.inf, stop: Callable[[], bool] | None = None) -> None:
        """Run tasks until none is due before `until` (virtual seconds; time is then `until`), or
        until `stop()` holds between two tasks' turns (time is then where it stopped)."""
        if self.current() is not None:
            raise SimulationError("Simulation.run is called from the main thread, not from a task")
        self._until, self._stop = until, stop
        try:
            nxt = self._next()
            if nxt is not None:
                nxt.state = "running"
                nxt.go.release()
                self._main.acquire()
        finally:
            self._stop = None
        if until != math.inf and until > self.now and not (stop is not None and stop()):
            self.now = until

    def run_until(self, condition: Callable[[], bool], *, limit_s: float = 3600.0) -> bool:
        """Run until `condition()` holds (checked between tasks' turns) or `limit_s` of virtual time passed."""
        self.run(self.now + limit_s, stop=condition)
        return condition()

    def idle(self) -> bool:
        """Nothing is due: every task finished, or waits for something that will not come."""
        return not any(epoch == task.epoch and not task.finished for *_, task, epoch in self._heap)

    def freeze(self, node: Node) -> None:
        node.frozen = True
        self.note(node.name, "fault", "frozen")
        me = self.current()
        if me is not None and me.node is node:
            self.sleep(0)  # the freezing task stops here too

    def thaw(self, node: Node) -> None:
        node.frozen = False
        self.note(node.name, "fault", "thawed")
        deferred, node.deferred = node.deferred, []
        for task in deferred:
            if not task.finished:
                self._schedule(task, self.now)

    def kill(self, node: Node) -> None:
        """The node is gone at once: its tasks never run again (no cleanup reaches the world)."""
        node.dead = True
        self.note(node.name, "fault", "killed")
        me = self.current()
        if me is not None and me.node is node:
            raise Killed()

    def close(self) -> None:
        """Unwind every task still waiting (the world answers none of them any more)."""
        if self.closed:
            return
        self.closed = True
        for task in self.tasks:
            if task.finished or not task.thread.is_alive():
                continue
            task.go.release()
            self._main.acquire()
        for task in self.tasks:
            task.thread.join(timeout=5)

    @contextmanager
    def running(self) -> Iterator[Simulation]:
        try:
            yield self
        finally:
            self.close()
