"""bench/shrink_reads.py's model of what a shrink restore reads: the same world reads each byte
once at every granularity; at 1,000 nodes a shrink by whole items stays within 1.1x while whole
files do not; on 100 nodes whole items pass 1.1x and 64 KiB ranges do not."""

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
