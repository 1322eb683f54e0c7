"""Variables set in this process's environment for the length of a `with` block, then restored.

For settings a C library reads from the process environment when it starts (NCCL reads
NCCL_DEBUG_FILE or NCCL_TOPO_FILE with getenv() at communicator init), which no Python mapping
passed around can reach. Not thread-safe: os.environ is one per process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def process_env(settings: Mapping[str, str]) -> Iterator[None]:
    """`settings` in os.environ inside the block; each variable as it was (or absent) after."""
    before = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
