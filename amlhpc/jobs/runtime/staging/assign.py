"""Split a dataset's files over nodes and ranks so each gets about the same number of bytes.

Rules (deterministic: every process computes the same answer from the same listing):

- Items are weighed by their size in bytes (staging passes the blob size: the bytes that
  cross the network, which is what limits a node). Sizes are balanced, not counts.
- `balance(items, bins)` is largest-first greedy (LPT): items in order of decreasing size
  (ties by name) each go to the bin with the fewest bytes so far (ties: lowest bin index),
  followed by a local search that moves or swaps single items between the fullest and
  the emptiest bin while that strictly lowers the fullest bin. LPT alone is within 4/3 of
  the optimum; the search fixes the common cases where it is not optimal. With equal
  sizes LPT deals items round-robin, so counts differ by at most one, and the search
  never breaks that (a move between bins of equal-size items cannot strictly help once
  counts differ by one).
- The tolerance is BALANCED of a bin's mean (at least one byte): bins within it of each
  other are not searched. Once every item left is at most half the tolerance and the bins
  are within half of it of each other, the items left are dealt instead of placed one by
  one: back and forth over the bins, emptiest first (round one gives the i-th emptiest bin
  the i-th item, round two the i-th from the round's end, and so on). Any two bins then
  take turns at the larger item of each pair of rounds, so dealing widens their spread by
  at most its largest item: the bins end within the tolerance, and a million files are
  split by slicing rather than a million heap steps. A listing whose items all exceed half
  the tolerance (with equal sizes: under 20,000 files a bin) is placed by LPT alone; equal
  sizes are all placed or all dealt, and a deal, too, gives counts within one.
- Each bin's items are returned sorted by name, so file lists read naturally.
- A listing too large for every node to read whole (a manifest in parts) is split by
  `contiguous`: items in name order, weighed as above, each goes to the bin its weight's
  midpoint falls in when the total is cut into `bins` equal ranges. A node then needs only
  the parts that overlap its range (`contiguous_parts`), and its bytes stay within its mean
  plus the largest item. LPT balances better, but it needs every item on every node.
- `split_for_ranks(items, node_count, local_size)` balances over nodes first (the node is
  the unit that downloads), then each node's share over its local ranks: rank r on node
  n = r // local_size gets part (r % local_size) of node n's share. In `local` staging
  mode this is how every rank's file list is made.

Standard library only: this module ships into the training image.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

MAX_SEARCH_STEPS = 10_000
"""Bound on local-search improvements (each step strictly lowers the fullest bin)."""
SEARCH_BUDGET = 2_000_000
"""Bound on the items the local search looks at, all steps together."""
BALANCED = 1e-4
"""Fullest minus emptiest bin below this fraction of a bin: no search (it could gain at most that)."""


@dataclass(frozen=True)
class Item:
    name: str
    size: int


@dataclass(frozen=True)
class Balance:
    """Bytes per bin after assignment."""

    bytes_per_bin: tuple[int, ...]
    items_per_bin: tuple[int, ...]

    @property
    def max_bytes(self) -> int:
        return max(self.bytes_per_bin, default=0)

    @property
    def mean_bytes(self) -> float:
        return sum(self.bytes_per_bin) / len(self.bytes_per_bin) if self.bytes_per_bin else 0.0

    @property
    def imbalance(self) -> float:
        """max / mean: 1.0 is perfect; staging time is set by the fullest bin."""
        return self.max_bytes / self.mean_bytes if self.mean_bytes else 1.0

    def to_json(self) -> dict[str, object]:
        return {"bins": len(self.bytes_per_bin), "max_bytes": self.max_bytes, "mean_bytes": round(self.mean_bytes, 1),
                "imbalance": round(self.imbalance, 4), "bytes_per_bin": list(self.bytes_per_bin),
                "items_per_bin": list(self.items_per_bin)}


def balance(items: Sequence[Item], bins: int) -> list[list[Item]]:
    """Assign `items` to `bins` bins, balancing total size (see the module docstring)."""
    if bins < 1:
        raise ValueError(f"need at least one bin, got {bins}")
    ordered = sorted(items, key=lambda i: i.name)
    if any(a.name == b.name for a, b in zip(ordered, ordered[1:], strict=False)):
        raise ValueError("item names must be unique")
    groups = balance_indices([i.size for i in ordered], bins)
    return [[ordered[k] for k in group] for group in groups]


def balance_indices(sizes: Sequence[int], bins: int) -> list[list[int]]:
    """`balance` on sizes alone: the item at index k is the k-th in name order (ties go to
    the lower index). Returns each bin's indices, ascending. A million items take well under
    a second: no per-item objects, a C-level sort, heap steps only for the items large
    enough to matter, the rest dealt by slicing."""
    if bins < 1:
        raise ValueError(f"need at least one bin, got {bins}")
    # Largest first; Python's sort is stable, so equal sizes stay in index (= name) order.
    order = sorted(range(len(sizes)), key=sizes.__getitem__, reverse=True)
    total = sum(sizes)
    tolerance = max(1.0, BALANCED * total / bins)
    # One item at a time onto the emptiest bin (a heap) while the items are large or the bins
    # apart: more than half the tolerance. The rest, if any, is dealt (`_deal`): for a large
    # listing most of it, by slicing.
    small = bisect.bisect_left(order, -tolerance / 2, key=lambda k: -sizes[k])
    assigned: list[list[int]] = [[] for _ in range(bins)]
    appends = [group.append for group in assigned]
    heap = [(0, b) for b in range(bins)]
    replace = heapq.heapreplace
    position = 0
    while position < len(order) and (position < small or max(heap)[0] - heap[0][0] > tolerance / 2):
        stop = max(small, position + bins)
        for k in order[position:stop]:
            total_b, b = heap[0]
            appends[b](k)
            replace(heap, (total_b + sizes[k], b))
        position = stop
    if position < len(order):
        # Dealt: the bins end within the tolerance (see `_deal`), where the search would stop anyway.
        _deal(order[position:], assigned, sorted(heap))
    elif bins > 1:
        totals = [0] * bins
        for total_b, b in heap:
            totals[b] = total_b
        # Bins within the tolerance of each other are left alone: the search could gain at most that.
        if max(totals) - min(totals) > tolerance:
            _improve(assigned, totals, sizes)
    for group in assigned:
        group.sort()
    return assigned


def _deal(rest: list[int], assigned: list[list[int]], emptiest_first: list[tuple[int, int]]) -> None:
    """Deal `rest` (largest first) back and forth over the bins, emptiest bin first: round one
    gives the i-th emptiest bin the i-th item, round two the i-th from the end of the round,
    and so on. Any two bins' items then alternate between the larger and the smaller of each
    pair of rounds, so dealing widens the spread of the bins by at most the largest item of
    `rest`. By slicing: no Python step per item."""
    stride = 2 * len(assigned)
    for i, (_, b) in enumerate(emptiest_first):
        assigned[b].extend(rest[i::stride])
        assigned[b].extend(rest[stride - 1 - i::stride])


def _improve(assigned: list[list[int]], totals: list[int], sizes: Sequence[int]) -> None:
    """Move or swap one item between the fullest and the emptiest bin while that lowers the fullest.

    Each step strictly lowers the sum of squared bin totals (a transfer d with 0 < d < gap
    does), so the search ends; candidates are found by bisection. The work is bounded
    (SEARCH_BUDGET item visits, counted, so the result stays deterministic): with very many
    items largest-first has already left the bins within one small item of each other.
    """
    # Per bin: indices sorted by (size, index), and the sizes alone for bisection.
    keyed = [sorted(group, key=lambda k: (sizes[k], k)) for group in assigned]
    sized = [[sizes[k] for k in group] for group in keyed]
    budget = SEARCH_BUDGET
    for _ in range(MAX_SEARCH_STEPS):
        hi = max(range(len(totals)), key=lambda b: (totals[b], -b))
        lo = min(range(len(totals)), key=lambda b: (totals[b], b))
        gap = totals[hi] - totals[lo]
        budget -= len(keyed[hi])
        if gap <= 1 or budget < 0:
            break
        # The ideal transfer is gap / 2; any 0 < d < gap lowers the pair's maximum.
        best_d, best = 0, None  # best: (position in hi, position in lo or -1)
        for i, a in enumerate(sized[hi]):
            if 0 < a < gap and abs(gap - 2 * a) < abs(gap - 2 * best_d):
                best_d, best = a, (i, -1)
            # swap a with c where c ~= a - gap / 2 and a - gap < c < a
            j0 = bisect.bisect_left(sized[lo], a - gap / 2)
            for j in (j0 - 1, j0):
                if 0 <= j < len(sized[lo]):
                    d = a - sized[lo][j]
                    if 0 < d < gap and abs(gap - 2 * d) < abs(gap - 2 * best_d):
                        best_d, best = d, (i, j)
        if best is None:
            break
        i, j = best
        moved = keyed[hi].pop(i)
        sized[hi].pop(i)
        back = None
        if j >= 0:
            back = keyed[lo].pop(j)
            sized[lo].pop(j)
        _insert(keyed[lo], sized[lo], moved, sizes)
        if back is not None:
            _insert(keyed[hi], sized[hi], back, sizes)
        totals[hi] -= best_d
        totals[lo] += best_d
    for b, group in enumerate(keyed):
        assigned[b] = group


def _insert(group: list[int], sized: list[int], k: int, sizes: Sequence[int]) -> None:
    key = (sizes[k], k)
    lo, hi = 0, len(group)
    while lo < hi:
        mid = (lo + hi) // 2
        if (sized[mid], group[mid]) < key:
            lo = mid + 1
        else:
            hi = mid
    group.insert(lo, k)
    sized.insert(lo, sizes[k])


def measure(groups: Sequence[Sequence[Item]]) -> Balance:
    return Balance(tuple(sum(i.size for i in g) for g in groups), tuple(len(g) for g in groups))


@dataclass(frozen=True)
class RankSplit:
    """Files per node and per global rank (`local` mode)."""

    per_node: list[list[Item]]
    per_rank: list[list[Item]]


def split_for_ranks(items: Sequence[Item], node_count: int, local_size: int) -> RankSplit:
    """Balance over nodes, then each node's share over its local ranks."""
    if local_size < 1:
        raise ValueError(f"need at least one rank per node, got {local_size}")
    per_node = balance(items, node_count)
    per_rank: list[list[Item]] = []
    for share in per_node:
        per_rank.extend(balance(share, local_size))
    return RankSplit(per_node, per_rank)


def node_and_ranks(sizes: Sequence[int], node_count: int, local_size: int, node: int) -> tuple[list[list[int]], list[list[int]]]:
    """`split_for_ranks` on sizes in name order, for one node: (indices per node, indices per
    local rank of `node`). Only this node's ranks are split: the others are not needed here."""
    if local_size < 1:
        raise ValueError(f"need at least one rank per node, got {local_size}")
    per_node = balance_indices(sizes, node_count)
    return per_node, split_share(sizes, per_node[node], local_size)


def split_share(sizes: Sequence[int], share: Sequence[int], local_size: int) -> list[list[int]]:
    """A node's `share` (indices into `sizes`) balanced over its `local_size` ranks: the indices each gets."""
    return [[share[k] for k in group] for group in balance_indices([sizes[k] for k in share], local_size)]


def contiguous_bin(start: int, weight: int, total: int, bins: int) -> int:
    """The bin of an item whose weight runs from `start` to `start + weight` of `total` (its midpoint's range)."""
    if total <= 0:
        return 0
    return min(bins - 1, (2 * start + weight) * bins // (2 * total))


def contiguous_parts(weights: Sequence[int], bins: int, bin_index: int) -> list[int]:
    """The groups of consecutive items (weighed in order by `weights`) that may hold an item of
    bin `bin_index` under `contiguous_bin`: each group's items have midpoints inside it."""
    total, start, found = sum(weights), 0, []
    for k, weight in enumerate(weights):
        lowest = contiguous_bin(start, 0, total, bins)
        highest = contiguous_bin(start + weight, 0, total, bins)
        if lowest <= bin_index <= highest:
            found.append(k)
        start += weight
    return found
