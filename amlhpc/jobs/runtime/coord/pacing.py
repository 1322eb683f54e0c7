"""How often the nodes of a job may look at something they all read: intervals that grow with
the node count, with jitter, so a job's polling stays under the service's limits at any size.

- A blob every node reads (a pointer, a listing): Azure's target for one blob is 500
  requests/s (Microsoft Learn, "Scalability and performance targets for Blob storage",
  read 2026-11-28); `blob_poll_s` keeps a job within half of it in its busiest second:
  `max(base, N / 200)` seconds between one node's reads, 200 reads/s on average, as N nodes
  looking at random phases make some seconds busier than the mean (in the simulation of
  1,000 nodes, bench/scale.py, a mean of 250/s peaked at 265 in one second).
- The job's coordination store (node 0's TCPStore): `store_poll_s` keeps the whole job's
  polling near STORE_POLLS_PER_S operations/s, far below what torch's libuv server answers
  (its tutorial "Introduction to Libuv TCPStore Backend" benchmarks thousands of ranks
  connecting at once).

- A burst every node makes once (a checkpoint commit: each node writes its pending record and
  its parts when node 0 leads a version): `stage_offset_s` gives node k its own slot, so the
  whole job's writes stay near COMMIT_REQUESTS_PER_S on the account, a tenth of Azure's 20,000
  requests/s per standard account (the same Learn page) leaving the rest to the other jobs
  sharing the stack's account (in the simulation of 1,000 nodes, unpaced followers put 6,000
  requests on the account in one second).

- A blob every node reads once as the job starts (a dataset version's manifest): `read_slot_s`
  gives node k its own slot at BLOB_READS_PER_S.

`jittered` spreads the nodes' looks over the interval (+-20 %), so a fleet that started
together does not poll in lock step.

Standard library only: ships into every training image.
"""

from __future__ import annotations

import random

BLOB_READS_PER_S = 200.0
"""Reads per second of one blob by a whole job, on average: its busiest second stays under 250,
half Azure's 500/s per-blob target."""
STORE_POLLS_PER_S = 2000.0
"""Polls per second of the job's coordination store by all its nodes together."""
COMMIT_REQUESTS_PER_S = 1500.0
"""Requests per second on the account by a whole job's commit burst: under 2,000, a tenth of
Azure's 20,000 per account."""
JITTER = 0.2


def blob_poll_s(base_s: float, nodes: int) -> float:
    """Seconds between one node's reads of a blob that every node of the job reads."""
    return max(base_s, max(nodes, 1) / BLOB_READS_PER_S)


def store_poll_s(base_s: float, nodes: int) -> float:
    """Seconds between one node's polls of a key in the job's store."""
    return max(base_s, max(nodes, 1) / STORE_POLLS_PER_S)


def read_slot_s(node: int) -> float:
    """Seconds node `node` waits before its one read of a blob every node reads once as the job
    starts (a dataset version's manifest): node k reads k / BLOB_READS_PER_S after node 0, so the
    blob sees at most that rate whatever the job's size (1,000 nodes read within 5 s)."""
    return max(node, 0) / BLOB_READS_PER_S


def stage_offset_s(node: int, requests: int) -> float:
    """Seconds node `node` waits, after hearing of a burst every node makes, before its own
    `requests` writes: node k goes k x requests / COMMIT_REQUESTS_PER_S after node 0, so the job's
    burst is spread at that rate whatever its size (nothing to wait for on a small job)."""
    return max(node, 0) * max(requests, 1) / COMMIT_REQUESTS_PER_S


def byte_offset_s(node: int, nodes: int, burst_bytes: float, rate_bytes_per_s: float) -> float:
    """Seconds node `node` waits before a transfer every node starts at once under its own cap
    (`rate_bytes_per_s`, which sends `burst_bytes` - a block - before the cap holds it): node k
    goes k/N of one burst's time at the cap after node 0, so the nodes' blocks reach the accounts
    at evenly spread phases, at the job's average rate, instead of N blocks in the same second (in
    the simulation of a 405B checkpoint from 1,000 nodes, every node's first block at once kept the
    four accounts' ingress throttling for minutes, and parts failed)."""
    if nodes <= 1 or rate_bytes_per_s <= 0 or burst_bytes <= 0:
        return 0.0
    return (max(node, 0) % nodes) / nodes * burst_bytes / rate_bytes_per_s


def jittered(seconds: float, rng: random.Random | None = None, fraction: float = JITTER) -> float:
    """`seconds` scaled by a random factor in [1 - fraction, 1 + fraction]."""
    return seconds * (rng or random).uniform(1 - fraction, 1 + fraction)
