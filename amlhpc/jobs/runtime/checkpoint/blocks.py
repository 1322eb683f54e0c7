"""Block digests of a rank's checkpoint files, so that a byte range read alone can be checked alone.

While a rank writes its DCP files (versioned.HashingWriter) each aligned block of the file is
hashed beside the whole file's SHA-256, and the rank's folder gets `blocks.json`: the block size
and every block's SHA-256 per data file. The rank's marker lists `blocks.json` with its SHA-256
like any other file of the part, and the version's manifest lists the marker's, so a reader that
fetched only some blocks of a file (ranged.py, a reshard restore) checks each against a chain
the commit vouches for. `blocks.json` stays out of the marker itself: every node of a reshard
restore reads every rank's marker, and only the ranks that read a file need its block digests.

Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError

BLOCKS_FILE = "blocks.json"
DATA_SUFFIX = ".distcp"
"""DCP's data files (tensors and values): the files with block digests; `.metadata` and the rest are small."""
BLOCK_VARIABLE = "AMLHPC_CHECKPOINT_BLOCK_KIB"
"""KiB per hashed block of a checkpoint file (default DEFAULT_KIB): the unit a reshard restore fetches and checks."""
DEFAULT_KIB = 16
"""16 KiB: a reshard restore reads the rows its ranks need of each stored item, and the first
block of an item it reads in part (rows.py), rounded out to whole blocks; a 405B model has items
of a few bytes (its norms' shards at 8,000 ranks) beside ones of ~436 KB, so runs break often.
Modelled for Llama 3 405B from 1,000 nodes (bench/shrink_reads.py `built`): 1.017x the
checkpoint on 900 nodes at 16 KiB, 1.005x at 4, 1.068x at 64, 1.269x at 256. The price: ~26 GB of hex digests for its 6.5 TB, ~3.3 MB in each of 8,000
ranks' `blocks.json`, which only the nodes that read that part read (0.5-1 % of a node's share)."""
LIMITS_KIB = (4, 65_536)


def block_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The block size from BLOCK_VARIABLE (a whole number of KiB within LIMITS_KIB), else the default."""
    environ = os.environ if environ is None else environ
    given = (environ.get(BLOCK_VARIABLE) or "").strip()
    if not given:
        return DEFAULT_KIB * 1024
    low, high = LIMITS_KIB
    if not given.isdigit() or not low <= int(given) <= high:
        raise CheckpointError(f"{BLOCK_VARIABLE}={given!r} is not a whole number of KiB from {low} to {high}: set "
                              f"the size of the checkpoint blocks a reshard restore fetches, or unset it "
                              f"({DEFAULT_KIB} KiB)")
    return int(given) * 1024


class BlockHasher:
    """SHA-256 of each aligned `block`-byte block of a stream written front to back."""

    def __init__(self, block: int):
        self.block = block
        self.digests: list[str] = []
        self._current = hashlib.sha256()
        self._filled = 0

    def update(self, view: memoryview) -> None:
        while view:
            take = min(len(view), self.block - self._filled)
            self._current.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.block:
                self._close_block()

    def finish(self) -> list[str]:
        if self._filled:
            self._close_block()
        return self.digests

    def _close_block(self) -> None:
        self.digests.append(self._current.hexdigest())
        self._current, self._filled = hashlib.sha256(), 0


def document(block: int, files: Mapping[str, list[str]]) -> bytes:
    """The bytes of a rank's `blocks.json` (file names relative to its folder)."""
    return json.dumps({"blockBytes": block, "files": dict(sorted(files.items()))}, separators=(",", ":")).encode()


def parse(data: bytes, where: str) -> tuple[int, dict[str, list[str]]]:
    """(block size, name -> block digests) of a `blocks.json`; CheckpointError naming `where` when malformed."""
    try:
        document: Any = json.loads(data)
    except ValueError:
        document = None
    block = document.get("blockBytes") if isinstance(document, dict) else None
    files = document.get("files") if isinstance(document, dict) else None
    if (not isinstance(block, int) or isinstance(block, bool) or block <= 0 or not isinstance(files, dict)
            or not all(isinstance(v, list) and all(isinstance(d, str) and len(d) == 64 for d in v)
                       for v in files.values())):
        raise CheckpointError(f"{where} is not a list of checkpoint block digests")
    return block, files


def covers(digests: list[str], block: int, size: int) -> bool:
    """Whether `digests` are as many as a file of `size` bytes has blocks."""
    return len(digests) == -(-size // block)
