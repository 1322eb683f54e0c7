"""Worker pools, through one seam: where the runtime hands work to other threads.

Production code asks `workers.pool(n, name)` for an executor instead of making a
`ThreadPoolExecutor` itself. By default it is one. A simulation (amlhpc/sim) runs every
simulated node's code in a thread it schedules on virtual time; a pool's threads would
run outside that schedule (and outside the node's clock), so the simulation installs
`inline` for the node's thread (`use`): each submitted call runs at once in the calling
thread and its future is done when `submit` returns. The calls of one node then go one
after another, as `max_workers=1` would run them: the same requests, the same results.

Standard library only: this module ships into the training image.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

PoolFactory = Callable[[int, str], Executor]


def threads(max_workers: int, thread_name_prefix: str = "") -> Executor:
    """The default: a ThreadPoolExecutor."""
    return ThreadPoolExecutor(max_workers, thread_name_prefix=thread_name_prefix)


class InlineExecutor(Executor):
    """Runs each call in the submitting thread, at submit time (see the module docstring)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        future.set_running_or_notify_cancel()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - delivered through the future, as a pool would
            if not isinstance(exc, Exception):
                raise  # a crash or a kill stops the thread itself, not just the call
            future.set_exception(exc)
        return future


def inline(max_workers: int, thread_name_prefix: str = "") -> Executor:
    """A factory for `use`/`install`: every pool runs inline."""
    return InlineExecutor()


_process: PoolFactory = threads
_thread = threading.local()


def install(factory: PoolFactory | None) -> None:
    """Make `factory` the process's pool factory (None: threads again)."""
    global _process
    _process = factory or threads


@contextlib.contextmanager
def use(factory: PoolFactory) -> Iterator[PoolFactory]:
    """Make pools with `factory` in this thread only."""
    previous = getattr(_thread, "factory", None)
    _thread.factory = factory
    try:
        yield factory
    finally:
        _thread.factory = previous


def pool(max_workers: int, thread_name_prefix: str = "") -> Executor:
    """An executor for `max_workers` workers: this thread's factory's, else the process's."""
    return (getattr(_thread, "factory", None) or _process)(max_workers, thread_name_prefix)
