"""How big each block of a block blob must be for a file of a given size.

Azure's published limits ("Scalability and performance targets for Blob storage",
https://learn.microsoft.com/azure/storage/blobs/scalability-targets, as published 2026-05-18):
a block blob holds at most 50,000 committed blocks of at most 4,000 MiB each (service version
2019-12-12 and later), so at most 50,000 x 4,000 MiB (about 190.7 TiB). A fixed 8 MiB block
caps a file at 390.6 GiB: the uploader then failed at commit, after every byte had moved, and
retried it every round. `block_bytes_for` grows the block (in whole MiB) so any file up to the
maximum fits, and `check_fits` refuses a larger one before any byte moves.

Standard library only: ships in the image.
"""

from __future__ import annotations

MIB = 1 << 20
MAX_BLOCKS = 50_000
"""Committed blocks in one block blob."""
MAX_BLOCK_BYTES = 4_000 * MIB
"""One Put Block (service version 2019-12-12 and later)."""
MAX_BLOB_BYTES = MAX_BLOCKS * MAX_BLOCK_BYTES
"""About 190.7 TiB."""


class BlobTooLarge(ValueError):
    """A file larger than the largest block blob: refused before any byte moves."""


def check_fits(name: str, size: int) -> None:
    """BlobTooLarge naming `name` when `size` bytes exceed the largest block blob."""
    if size > MAX_BLOB_BYTES:
        raise BlobTooLarge(f"{name} is {size:,} bytes, more than the largest block blob ({MAX_BLOCKS:,} blocks of "
                           f"{MAX_BLOCK_BYTES // MIB:,} MiB = {MAX_BLOB_BYTES:,} bytes): split it into several files "
                           "(e.g. a checkpoint saved per rank or with torch.distributed.checkpoint)")


def block_bytes_for(size: int, floor: int) -> int:
    """The block size for a file of `size` bytes: `floor` while it fits in MAX_BLOCKS blocks,
    else the smallest whole number of MiB that does (BlobTooLarge beyond the maximum)."""
    check_fits("the file", size)
    if size <= floor * MAX_BLOCKS:
        return floor
    needed = -(-size // MAX_BLOCKS)
    return min(MAX_BLOCK_BYTES, -(-needed // MIB) * MIB)
