"""What the nodes of a job agree on through its store: barriers, decisions made once, counters.

`Channel` is one node's typed view of the job's store (any object with torch's Store API,
kvstore.Store: the job's TCPStore, torch's HashStore, MemoryStore, a simulation's fake):

- `decide(key, proposal)`: a create-only record (`compare_set(key, "", proposal)`): the first
  proposal stored wins and every node, proposer or not, adopts what the store answers. One
  decision per key, the same on every node, whatever order the proposals arrive in;
- `publish` / `read` / `has` / `gather`: JSON documents under keys (`read` checks first,
  as torch's `get` of a missing key waits out the store's timeout);
- `count(key, n)`: a counter every node adds to (`add`), read with `count(key, 0)`. A hint,
  never a proof: a retried add can count twice (kvstore's docstring), so a count that
  reached its target is confirmed with `all_present` of the parties' own keys;
- `all_present(keys)`: whether every key exists (one `check`);
- `await_key(key, timeout_s)`: poll until a key exists, one `check` per poll.

`Barrier` of N parties: each arrives once (a counter); the party that completes it, or the
first that fails, decides the barrier's outcome (`decide`), which every waiter reads. A
waiter's poll is one `check`, whatever N is. `greet` and `farewell`: a barrier at the end, for
the node that hosts the store to keep it up until every node is done with it (bounded; a
failing host waits only for the nodes that greeted).

Polls are `pacing.store_poll_s(base, nodes)` apart, jittered; time comes from
amlhpc.jobs.runtime.base.clock (a simulation runs it on virtual time). Every operation goes through kvstore.call:
a transport error is tried again (each operation here is idempotent under a lost reply, or
its caller tolerates the over-count) and only a store unreachable for
kvstore.RECONNECT_GRACE_S raises kvstore.StoreLost.

Standard library only: ships into every training image.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from amlhpc.jobs.runtime.base import clock
from amlhpc.jobs.runtime.coord import pacing
from amlhpc.jobs.runtime.coord.kvstore import (
    RECONNECT_GRACE_S,
    Store,
    StoreLost,
    StoreTimeout,
    call,
    decode,
    encode,
)
from amlhpc.jobs.runtime.coord.nodebarrier import BarrierFailed, BarrierTimeout

BASE_POLL_S = 0.2
T = TypeVar("T")
NAMED_MISSING_MAX = 64
"""A barrier that times out names the missing nodes when it has at most this many parties
(one `check` each); beyond, it counts them."""


class Channel:
    """One node's typed view of the job's store (see the module docstring)."""

    def __init__(self, store: Store, *, node: int, nodes: int, namespace: str = "", base_poll_s: float = BASE_POLL_S,
                 rng: random.Random | None = None, _lost: list[str] | None = None):
        self.store, self.node, self.nodes = store, node, nodes
        self.namespace = namespace.strip("/")
        self.base_poll_s = base_poll_s
        self.rng = rng or random.Random()
        self._lost = _lost if _lost is not None else []
        """Why the store was lost, once it was (shared by every scope of this channel): later
        calls fail at once instead of each asking a store that is gone."""

    @property
    def lost(self) -> str | None:
        return self._lost[0] if self._lost else None

    def _call(self, what: str, operation: Callable[[], T]) -> T:
        if self._lost:
            raise StoreLost(self._lost[0])
        try:
            # A connection to node 0 carries its grace (jobstore.Reconnecting; contract.COORD_GRACE_S).
            return call(what, operation, rng=self.rng, grace_s=getattr(self.store, "grace_s", RECONNECT_GRACE_S))
        except StoreLost as exc:
            self._lost.append(str(exc))
            raise

    def key(self, *parts: object) -> str:
        return "/".join(str(p).strip("/") for p in (self.namespace, *parts) if str(p).strip("/"))

    def scoped(self, *parts: object) -> Channel:
        """The same store under a longer namespace."""
        return Channel(self.store, node=self.node, nodes=self.nodes, namespace=self.key(*parts),
                       base_poll_s=self.base_poll_s, rng=self.rng, _lost=self._lost)

    @property
    def poll_s(self) -> float:
        return pacing.store_poll_s(self.base_poll_s, self.nodes)

    def pause(self, seconds: float | None = None) -> None:
        """Sleep one poll interval (jittered), on the runtime's clock."""
        clock.sleep(pacing.jittered(self.poll_s if seconds is None else seconds, self.rng))

    # --- operations (one store call each, unless said) -----------------------------------
    def decide(self, key: str, proposal: Any) -> tuple[Any, bool]:
        """(the document stored under `key`, whether it is `proposal`): the first proposal wins."""
        mine = encode(proposal)
        # Idempotent: a retry after a lost reply answers what the first try stored.
        stored = bytes(self._call(f"deciding {key}", lambda: self.store.compare_set(key, b"", mine)))
        return decode(stored), stored == mine

    def publish(self, key: str, document: Any) -> None:
        """Write `document` under `key`, confirmed: the TCPStore protocol does not answer a `set`, so
        one written into a connection that was just reset is lost without an error. The `check`
        behind it, on the same connection, answers only after the server took the `set`; a
        `check` that fails, or finds no key (the connection was replaced between the two), has
        the pair tried again (two calls)."""
        value = encode(document)

        def publish() -> None:
            self.store.set(key, value)
            if not self.store.check([key]):
                raise ConnectionResetError(f"the store did not keep {key}: the connection was replaced")
        self._call(f"publishing {key}", publish)

    def has(self, key: str) -> bool:
        return bool(self._call(f"checking {key}", lambda: self.store.check([key])))

    def all_present(self, keys: Sequence[str]) -> bool:
        """Whether every one of `keys` exists (one `check`, whatever their number)."""
        listed = list(keys)
        return bool(self._call(f"checking {len(listed)} key(s) under {self.namespace or 'the store'}",
                               lambda: self.store.check(listed)))

    def read(self, key: str) -> Any | None:
        """The document under `key`, or None when there is none (two calls when present)."""
        def read() -> Any | None:
            return decode(self.store.get(key)) if self.store.check([key]) else None
        return self._call(f"reading {key}", read)

    def gather(self, keys: Sequence[str]) -> list[Any]:
        """Documents under keys known to exist (one call)."""
        if not keys:
            return []
        listed = list(keys)
        return [decode(raw) for raw in self._call(f"reading {len(listed)} key(s) under {self.namespace or 'the store'}",
                                                  lambda: self.store.multi_get(listed))]

    def count(self, key: str, amount: int = 1) -> int:
        """Add `amount` (0: read the counter). With `amount` != 0 a retry after a lost reply
        counts twice: the caller treats the answer as a hint (see the module docstring)."""
        return int(self._call(f"counting {key}", lambda: self.store.add(key, amount)))

    def delete(self, key: str) -> bool:
        """Whether the key was there (False also after a retry whose first try deleted it)."""
        return bool(self._call(f"deleting {key}", lambda: self.store.delete_key(key)))

    def await_key(self, key: str, timeout_s: float, *, interrupt: Callable[[], BaseException | None] | None = None,
                  poll_s: float | None = None) -> Any:
        """Poll (one `check` per poll) until `key` exists; its document. StoreTimeout after
        `timeout_s`; `interrupt()` returning an exception raises it (the caller's own reason to stop)."""
        deadline = clock.monotonic() + timeout_s
        while True:
            if self.has(key):
                return self.read(key)
            if interrupt is not None:
                stop = interrupt()
                if stop is not None:
                    raise stop
            if clock.monotonic() >= deadline:
                raise StoreTimeout(f"waited {timeout_s:.0f}s for {key}")
            self.pause(poll_s)


class Barrier:
    """N parties on the job's store (see the module docstring). Names are per use: a barrier is
    passed once; a second use needs another name."""

    def __init__(self, channel: Channel, name: str, parties: int, timeout_s: float):
        self.channel, self.name, self.parties, self.timeout_s = channel, name, parties, timeout_s

    def _key(self, leaf: str) -> str:
        return self.channel.key(self.name, leaf)

    def arrive(self, document: Any = None) -> int:
        """This node is here (with an optional document); how many parties have arrived."""
        channel = self.channel
        channel.publish(self._key(f"node-{channel.node}"), {"node": channel.node, **({"document": document} if document
                                                                                   is not None else {})})
        arrived = channel.count(self._key("arrived"))
        # The count may be over (a retried add); every party's own key confirms it. The last
        # party to arrive always sees a count at the target, and every key, its own included.
        if arrived >= self.parties and channel.all_present(self._party_keys()):
            channel.decide(self._key("outcome"), {"ok": True})
        return arrived

    def _party_keys(self) -> list[str]:
        return [self._key(f"node-{k}") for k in range(self.parties)]

    def fail(self, message: str, kind: str = "failed") -> None:
        """This node cannot go on: the barrier fails for every party (unless it passed already)."""
        self.channel.decide(self._key("outcome"), {"ok": False, "node": self.channel.node, "message": message,
                                                   "kind": kind})

    def wait(self, interrupt: Callable[[], BaseException | None] | None = None) -> None:
        """Return once every party arrived; BarrierFailed with the first failure; BarrierTimeout."""
        try:
            outcome = self.channel.await_key(self._key("outcome"), self.timeout_s, interrupt=interrupt)
        except StoreTimeout:
            raise BarrierTimeout(f"waited {self.timeout_s:.0f}s at {self.name}: {self._missing()}") from None
        if not isinstance(outcome, dict) or not outcome.get("ok"):
            outcome = outcome if isinstance(outcome, dict) else {}
            raise BarrierFailed(f"node {outcome.get('node', '?')}: {outcome.get('message', 'failed')}",
                                str(outcome.get("kind") or "failed"))

    def _missing(self) -> str:
        arrived = self.channel.count(self._key("arrived"), 0)
        if self.parties > NAMED_MISSING_MAX:
            return f"about {min(arrived, self.parties - 1)} of {self.parties} nodes arrived"
        missing = [k for k in range(self.parties) if not self.channel.has(self._key(f"node-{k}"))]
        return f"node(s) {', '.join(map(str, missing)) or '?'} did not arrive"


def greet(channel: Channel, name: str) -> None:
    """This node uses the store from now on (one publish and one add): a failing host's
    `farewell` of the same `name` waits for the goodbye of every node that greeted."""
    channel.publish(channel.key(name, "joined", f"node-{channel.node}"), {"node": channel.node})
    channel.count(channel.key(name, "joined", "count"))


def farewell(channel: Channel, name: str, *, hosting: bool, wait_s: float, failing: bool = False) -> None:
    """This node is done with the store (a barrier of every node, `name`); the node that hosts
    it (`hosting`) then waits, at most `wait_s`, until every node is, so that none loses the
    store while it still reads its last answers (a node that has not connected yet among them).
    A host that is `failing` ends the job anyway (Azure ML ends every node's process when one
    fails): it waits only for the nodes that `greet`ed, which may be reading its failure, not
    for one that never reached the store. A node that never says goodbye keeps the host waiting
    `wait_s`, no longer."""
    bye = Barrier(channel, name, channel.nodes, wait_s)
    bye.arrive()
    if not hosting or channel.nodes <= 1:
        return
    if not failing:
        try:
            bye.wait()
        except BarrierTimeout:
            pass
        return
    deadline = clock.monotonic() + wait_s
    while clock.monotonic() < deadline:
        if channel.has(bye._key("outcome")) or _greeted_said_bye(channel, name, bye):
            return
        channel.pause()


def _greeted_said_bye(channel: Channel, name: str, bye: Barrier) -> bool:
    """Whether every node that greeted has arrived at `bye`. The counters (one call each) are a
    hint, as a retried add counts twice; only when they say so are the nodes' own keys read."""
    joined = channel.count(channel.key(name, "joined", "count"), 0)
    if channel.count(bye._key("arrived"), 0) < joined:
        return False
    greeted = [k for k in range(channel.nodes) if channel.has(channel.key(name, "joined", f"node-{k}"))]
    return channel.all_present([bye._key(f"node-{k}") for k in greeted])
