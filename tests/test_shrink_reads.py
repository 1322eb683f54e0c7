"""bench/shrink_reads.py's model of what a shrink restore reads: the same world reads each byte
once at every granularity; at 1,000 nodes a shrink by whole items stays within 1.1x while whole
files do not; on 100 nodes whole items pass 1.1x and 64 KiB ranges do not, nor does the built
restore, which reads rows."""

from __future__ import annotations

from bench import shrink_reads


def test_the_same_world_reads_the_checkpoint_once():
    reads = shrink_reads.shrink(16, 16, 64 << 10)
    assert reads.checkpoint == sum(rows * row * n * 16 // 4 for (rows, row), n in shrink_reads.llama3_405b().items())
    assert reads.whole_files == reads.whole_items == reads.leaves == reads.checkpoint


def test_a_shrink_by_items_stays_within_a_tenth_at_1000_nodes_and_by_files_does_not():
    reads = shrink_reads.shrink(1000, 900, 64 << 10)
    assert reads.checkpoint < reads.leaves <= reads.whole_items <= 1.1 * reads.checkpoint
    assert reads.whole_files > 2 * reads.checkpoint
    assert round(reads.checkpoint / 1e12, 2) == 6.49, "405B at 16 bytes per parameter"


def test_on_100_nodes_whole_items_pass_a_tenth_and_ranges_do_not():
    reads = shrink_reads.shrink(100, 90, 64 << 10)
    assert reads.whole_items > 1.1 * reads.checkpoint > reads.leaves


def test_the_built_restore_reads_the_rows_it_needs_within_a_tenth_on_100_nodes():
    """What checkpoint/rows.py and ranged.py read: the same world each byte once; on 100 -> 90
    nodes, where whole items pass 1.1x, the rows each node needs plus each partly read item's
    first block stay within it; the smaller the block the fewer bytes past the rows' ends."""
    assert shrink_reads.built(16, 16, 16 << 10) == (shrink_reads.shrink(16, 16, 64 << 10).checkpoint,) * 2
    items = shrink_reads.shrink(100, 90, 64 << 10)
    by_block = {kib: shrink_reads.built(100, 90, kib << 10) for kib in (4, 16, 256)}
    assert all(total == items.checkpoint for total, _ in by_block.values())
    assert items.checkpoint < by_block[4][1] <= by_block[16][1] < by_block[256][1]
    assert by_block[16][1] <= 1.01 * items.checkpoint < 1.1 * items.checkpoint < items.whole_items
