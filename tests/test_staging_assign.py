"""amlhpc.jobs.runtime.staging.assign: byte-balanced, deterministic split of files over nodes and ranks."""

from __future__ import annotations

import random

import pytest

from amlhpc.jobs.runtime.staging.assign import (
    BALANCED,
    Item,
    balance,
    balance_indices,
    contiguous_bin,
    contiguous_parts,
    measure,
    split_for_ranks,
)
from bench.dataset import cosmoflow_name


def cosmoflow_items(n: int = 64, size: int = 1000) -> list[Item]:
    return [Item(cosmoflow_name(10000, i), size) for i in range(n)]


def optimum_lower_bound(items: list[Item], bins: int) -> int:
    total = sum(i.size for i in items)
    return max(-(-total // bins), max(i.size for i in items))


class TestBalance:
    @pytest.mark.parametrize("bins", [1, 2, 3, 4, 5, 7, 16, 64, 100])
    def test_equal_sizes_give_counts_within_one(self, bins):
        groups = balance(cosmoflow_items(), bins)
        counts = [len(g) for g in groups]
        assert max(counts) - min(counts) <= 1
        assert sum(counts) == 64

    def test_every_item_exactly_once_and_bins_sorted_by_name(self):
        items = [Item(f"f{i:03d}", random.Random(i).randint(1, 10**6)) for i in range(300)]
        groups = balance(items, 7)
        flat = [i.name for g in groups for i in g]
        assert sorted(flat) == sorted(i.name for i in items)
        assert all([i.name for i in g] == sorted(i.name for i in g) for g in groups)

    def test_deterministic_whatever_the_input_order(self):
        items = [Item(f"f{i:03d}", random.Random(i).randint(1, 5000)) for i in range(200)]
        shuffled = items[:]
        random.Random(1).shuffle(shuffled)
        assert balance(items, 6) == balance(shuffled, 6)

    def test_balances_bytes_not_counts(self):
        """One large file and many small ones: the large one gets a bin to itself."""
        items = [Item("big", 1000)] + [Item(f"s{i:02d}", 10) for i in range(100)]
        groups = balance(items, 2)
        big = next(g for g in groups if any(i.name == "big" for i in g))
        assert len(big) == 1
        assert measure(groups).max_bytes == 1000

    def test_local_search_fixes_what_largest_first_misses(self):
        """LPT puts {3,2,2} | {3,2} = 7/5; the optimum is 6/6."""
        items = [Item(str(i), s) for i, s in enumerate([3, 3, 2, 2, 2])]
        assert sorted(measure(balance(items, 2)).bytes_per_bin) == [6, 6]

    @pytest.mark.parametrize("seed", range(8))
    def test_close_to_optimal_on_random_sizes(self, seed):
        rng = random.Random(seed)
        items = [Item(f"f{i:04d}", rng.randint(1, 10**7)) for i in range(rng.randint(20, 400))]
        bins = rng.randint(2, 9)
        result = measure(balance(items, bins))
        assert result.max_bytes <= optimum_lower_bound(items, bins) * 1.02 + max(i.size for i in items) * 0.05

    def test_zero_bins_is_an_error(self):
        with pytest.raises(ValueError, match="at least one bin"):
            balance(cosmoflow_items(), 0)

    def test_duplicate_names_are_an_error(self):
        with pytest.raises(ValueError, match="unique"):
            balance([Item("a", 1), Item("a", 2)], 2)

    def test_large_listing_is_fast(self):
        """50k files over 7 nodes: well under the time a node takes to list them."""
        import time

        rng = random.Random(3)
        items = [Item(f"f{i:07d}", rng.randint(1, 1000)) for i in range(50_000)]
        start = time.monotonic()
        groups = balance(items, 7)
        assert time.monotonic() - start < 10
        assert measure(groups).imbalance < 1.001


class TestLargeListings:
    """Many small files: after the large ones, the rest is dealt by slicing (module docstring)."""

    @pytest.mark.parametrize(("seed", "bins"), [(0, 8), (1, 7), (2, 64), (3, 3)])
    def test_dealt_bins_end_within_the_tolerance(self, seed, bins):
        rng = random.Random(seed)
        sizes = ([rng.randint(1000, 9191) for _ in range(150_000)] + [rng.randint(10**5, 10**7) for _ in range(300)]
                 + [int(rng.paretovariate(1.5) * 2000) for _ in range(50_000)])
        groups = balance_indices(sizes, bins)
        assert sorted(k for g in groups for k in g) == list(range(len(sizes)))
        assert all(g == sorted(g) for g in groups)
        totals = [sum(sizes[k] for k in g) for g in groups]
        assert max(totals) - min(totals) <= BALANCED * sum(sizes) / bins

    def test_equal_sizes_dealt_give_counts_within_one(self):
        groups = balance_indices([4096] * 200_003, 8)
        counts = [len(g) for g in groups]
        assert max(counts) - min(counts) <= 1 and sum(counts) == 200_003

    def test_one_huge_file_is_still_placed_largest_first(self):
        """The small files never get within the tolerance of the huge one: none joins it."""
        sizes = [1000 + i % 5000 for i in range(100_000)]
        sizes[4242] = 10**9
        groups = balance_indices(sizes, 4)
        assert [4242] in groups

    def test_same_plan_as_largest_first_where_nothing_is_dealt(self):
        """Items all above half the tolerance: placed one by one, as the heap alone places them."""
        rng = random.Random(9)
        sizes = [rng.randint(10**6, 2 * 10**6) for _ in range(3000)]
        groups = balance_indices(sizes, 5)
        totals = [0] * 5
        expected = [[] for _ in range(5)]
        for k in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
            b = min(range(5), key=lambda b: (totals[b], b))
            expected[b].append(k)
            totals[b] += sizes[k]
        assert max(totals) - min(totals) <= BALANCED * sum(sizes) / 5  # nothing to search: LPT's own answer stands
        assert groups == [sorted(g) for g in expected]


class TestSplitForRanks:
    @pytest.mark.parametrize(("nodes", "local"), [(1, 1), (2, 2), (3, 2), (3, 4), (4, 8)])
    def test_ranks_partition_the_dataset_and_nodes_hold_their_ranks_files(self, nodes, local):
        items = cosmoflow_items()
        split = split_for_ranks(items, nodes, local)
        assert len(split.per_rank) == nodes * local
        every = [i.name for files in split.per_rank for i in files]
        assert sorted(every) == sorted(i.name for i in items)  # each file read by exactly one rank
        for node in range(nodes):
            ranks_files = {i.name for r in range(node * local, (node + 1) * local) for i in split.per_rank[r]}
            assert ranks_files == {i.name for i in split.per_node[node]}
        counts = [len(f) for f in split.per_rank]
        assert max(counts) - min(counts) <= 1 + (1 if nodes > 1 else 0)

    def test_balance_report(self):
        split = split_for_ranks(cosmoflow_items(64, 1000), 3, 2)
        node_balance = measure(split.per_node)
        assert node_balance.bytes_per_bin == (22000, 21000, 21000)
        assert node_balance.max_bytes == 22000
        assert node_balance.mean_bytes == pytest.approx(64000 / 3)
        assert node_balance.to_json()["imbalance"] == pytest.approx(22000 / (64000 / 3), rel=1e-3)


class TestContiguous:
    """The split of a manifest in parts: a node reads only the parts that hold its share."""

    @pytest.mark.parametrize("seed", range(12))
    def test_a_node_finds_every_file_of_its_share_in_the_parts_it_reads(self, seed):
        rng = random.Random(seed)
        sizes = [rng.choice([0, 1, rng.randrange(1, 10**6), rng.randrange(1, 10**9)]) for _ in range(rng.randrange(1, 400))]
        cuts = sorted(rng.sample(range(1, len(sizes)), min(len(sizes) - 1, rng.randrange(0, 40))))
        groups = [list(range(a, b)) for a, b in zip([0, *cuts], [*cuts, len(sizes)], strict=True)]
        bins = rng.choice([1, 2, 3, 8, 64, 1000])
        total = sum(sizes)
        start, owner = 0, []
        for size in sizes:
            owner.append(contiguous_bin(start, size, total, bins))
            start += size
        assert owner == sorted(owner) and all(0 <= b < bins for b in owner)  # contiguous ranges, in name order
        weights = [sum(sizes[k] for k in g) for g in groups]
        for b in range(bins):
            needed = {g for g, members in enumerate(groups) if any(owner[k] == b for k in members)}
            read = contiguous_parts(weights, bins, b)
            assert needed <= set(read), (b, needed, read)
            assert len(read) <= len(needed) + 2  # at most the parts at its two edges beside its own
            held = sum(size for size, o in zip(sizes, owner, strict=True) if o == b)
            assert held <= total / bins + max(sizes)  # the bound staging reports

    def test_each_node_reads_a_few_parts_and_each_part_a_few_nodes_at_any_scale(self):
        weights = [4_000 * 150_000_000] * 250  # 1 M files of 150 MB in 250 parts
        for nodes in (8, 64, 512, 1000):
            reads = [contiguous_parts(weights, nodes, n) for n in range(nodes)]
            per_node = max(map(len, reads))
            per_part = max(sum(p in r for r in reads) for p in range(len(weights)))
            assert per_node <= -(-len(weights) // nodes) + 1, (nodes, per_node)
            assert per_part <= -(-nodes // len(weights)) + 1, (nodes, per_part)
