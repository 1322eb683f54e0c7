"""A node's share of a dataset version whose manifest is in parts: read only the parts that hold it.

Every node computes the same split without reading the parts it does not need: the index
gives each part's file count and stored bytes, the files go to nodes by `assign.contiguous_bin`
(their place in the dataset's bytes, in name order), so a node reads the parts that overlap its
range, about (parts / nodes + 1) of them, and a part is read by about (nodes / parts + 1)
nodes, whatever the node count. Replica mode reads every part (each node stages everything),
and so does node 0 of a shared folder (it removes what is not in the dataset).

Standard library only: ships into the training image.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from amlhpc.jobs.runtime.blob.fetch import BlobEntry
from amlhpc.jobs.runtime.staging import assign
from amlhpc.jobs.runtime.staging.dataversion import Manifest, PartRef, parse_part


@dataclass(frozen=True)
class Share:
    """What one node read of a manifest in parts, and which of those files are its own."""

    entries: list[BlobEntry]
    """The files of the parts read, in name order."""
    mine: frozenset[str]
    """Names of this node's files (every file read, in replica mode)."""
    parts_read: int
    max_node_bytes: int
    """The most stored bytes any node's share can hold: the mean plus the largest file (all, in replica mode)."""


def read_share(manifest: Manifest, get: Callable[[PartRef], bytes], mode: str, node: int, nodes: int) -> Share:
    """This node's share of `manifest` (in parts), reading each part it needs with `get`
    (VersionError from a part that does not match the index)."""
    parts = manifest.parts
    by_bytes = manifest.bytes > 0  # a dataset of empty files is split by count
    weights = [p.bytes if by_bytes else p.files for p in parts]
    total = sum(weights)
    every = mode == "replica" or (mode == "shared" and node == 0)
    wanted = range(len(parts)) if every else assign.contiguous_parts(weights, nodes, node)
    starts = list(itertools.accumulate(weights, initial=0))
    entries: list[BlobEntry] = []
    mine: set[str] = set()
    for k in wanted:
        start = starts[k]
        for entry in parse_part(get(parts[k]), parts[k], manifest):
            weight = entry.size if by_bytes else 1
            if mode == "replica" or assign.contiguous_bin(start, weight, total, nodes) == node:
                mine.add(entry.name)
            entries.append(entry)
            start += weight
    if mode == "replica":
        bound = manifest.bytes
    else:
        bound = math.ceil(manifest.bytes / nodes) + max(p.largest for p in parts)
    return Share(entries, frozenset(mine), len(wanted), min(bound, manifest.bytes))
