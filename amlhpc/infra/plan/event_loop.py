"""The event loop one mock-runtime program run gets: its own, and closed with nothing left
behind, so a finished or failed run cannot speak up later from the garbage collector."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

_ABANDONED = ("exception was never retrieved", "destroyed but it is pending!")


@contextmanager
def private_event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A new loop, set as this thread's; on exit, what is still scheduled is cancelled, the
    RPC workers are joined and their loops closed, and the loop closed."""
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(_quiet_about_abandoned_work)
    workers = _RpcWorkers()
    loop.set_default_executor(workers)
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        _cancel_pending(loop)
        workers.shutdown_and_close_their_loops()
        loop.close()


class _RpcWorkers(ThreadPoolExecutor):
    """The run's default executor, where Pulumi sends its resource-monitor calls. The mock
    monitor waits on a coroutine with Pulumi's `_sync_await`, which gives each worker thread
    an event loop of its own and never closes it; left open, each one is closed by the
    garbage collector whenever it gets there (a ResourceWarning, or an "Exception ignored"
    traceback when its self-pipe went first). Each worker's loop is noted and closed here."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="pulumi-rpc")
        self._loops: set[asyncio.AbstractEventLoop] = set()
        self._loops_lock = threading.Lock()

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(self._noting_the_loop, fn, *args, **kwargs)

    def _noting_the_loop(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            try:
                loop = asyncio.get_event_loop_policy().get_event_loop()
            except RuntimeError:  # this call made none
                loop = None
            if loop is not None:
                with self._loops_lock:
                    self._loops.add(loop)

    def shutdown_and_close_their_loops(self) -> None:
        self.shutdown(wait=True)
        for loop in self._loops:
            loop.close()
        self._loops.clear()


def _quiet_about_abandoned_work(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A failed run stops at its first error, which the caller re-raises. Pulumi has already
    set that error on every output future of the failed resource and of whatever uses its
    outputs, and nobody awaits those. Left to asyncio's default handler, each one is logged
    with its traceback whenever the garbage collector reaches it: noise on the terminal
    after the real error, and on CPython 3.11 a traceback formatted in the middle of an
    ast.parse breaks that parse ("AST constructor recursion depth mismatch",
    github.com/python/cpython/issues/106905, read 2026-11-23). Everything else still goes to
    the default handler."""
    if not str(context.get("message", "")).endswith(_ABANDONED):
        loop.default_exception_handler(context)


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
