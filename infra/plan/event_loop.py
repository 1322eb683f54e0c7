"""The event loop one mock-runtime program run gets: its own, and closed with nothing left
behind, so a failed run cannot speak up later from the garbage collector."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_ABANDONED = ("exception was never retrieved", "destroyed but it is pending!")


@contextmanager
def private_event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A new loop, set as this thread's; on exit, what is still scheduled is cancelled and
    the loop closed."""
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(_quiet_about_abandoned_work)
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        _cancel_pending(loop)
        loop.close()


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
