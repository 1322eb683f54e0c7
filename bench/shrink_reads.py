"""What a shrink restore must read from Blob, by the granularity of its reads: a model, not a
measurement (no bytes move), for the design of the per-node restore.

The state: Llama 3 405B's parameter shapes (126 layers, model dimension 16,384, FFN 53,248, 128
attention heads, 8 key-value heads, vocabulary 128,256: "The Llama 3 Herd of Models", arXiv
2407.21783, Table 3), at 16 bytes per parameter held as four fp32-sized tensors per parameter
(weights and optimizer state). Sharded as FSDP2 shards it: each tensor chunked on dim 0 over the
ranks with `torch.chunk` (PyTorch docs, torch.distributed.fsdp.fully_shard, read 2026-11-29),
so rank r of W holds rows [r*c, (r+1)*c) with c = ceil(rows / W), and ranks past the rows hold
nothing. Eight ranks per node; each rank saved its shards as one file, each shard a stored item.

For a job of `old` nodes restored on `new`, every node needs its ranks' rows of every tensor, and
reads either whole files (each rank file any of its items is in), or whole items (the shards it
overlaps), or byte ranges of the items cut to `--leaf` KiB (what a per-leaf hash could verify).
Printed: bytes read across all nodes as a multiple of the checkpoint.

    python -m bench.shrink_reads [--old 1000] [--new 999,990,900,750,500] [--leaf 64] [--block 16]

The last column is what checkpoint/rows.py and ranged.py do (`built`): of each item a node's
ranks overlap, the whole item when they need every row, else its first 4 KiB (where its rows
start) and the rows they need; each node once, in whole hashed blocks.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from dataclasses import dataclass

RANKS_PER_NODE = 8
STATE_TENSORS, BYTES = 4, 4  # four fp32-sized tensors per parameter: 16 bytes


def llama3_405b() -> Counter[tuple[int, int]]:
    """(rows, bytes per row of one fp32 tensor) -> how many tensors have that shape."""
    dim, layers, heads, kv_heads, ffn, vocab = 16384, 126, 128, 8, 53248, 128256
    kv = kv_heads * (dim // heads)
    per_layer = [(dim, dim), (kv, dim), (kv, dim), (dim, dim), (ffn, dim), (ffn, dim), (dim, ffn), (dim, 1), (dim, 1)]
    shapes: Counter[tuple[int, int]] = Counter({(vocab, dim * BYTES): 2, (dim, BYTES): 1})
    for rows, cols in per_layer:
        shapes[(rows, cols * BYTES)] += layers
    return shapes


def rows_of(rows: int, world: int, rank: int) -> tuple[int, int]:
    chunk = math.ceil(rows / world)
    return min(rank * chunk, rows), min((rank + 1) * chunk, rows)


@dataclass
class Reads:
    checkpoint: int = 0
    whole_files: int = 0
    whole_items: int = 0
    leaves: int = 0


def shrink(old_nodes: int, new_nodes: int, leaf: int) -> Reads:
    shapes = llama3_405b()
    old_world, new_world = old_nodes * RANKS_PER_NODE, new_nodes * RANKS_PER_NODE
    reads = Reads()
    file_bytes = [0] * old_world
    for (rows, row_bytes), count in shapes.items():
        reads.checkpoint += rows * row_bytes * count * STATE_TENSORS
        for rank in range(old_world):
            start, end = rows_of(rows, old_world, rank)
            file_bytes[rank] += (end - start) * row_bytes * count * STATE_TENSORS
    touched: list[set[int]] = [set() for _ in range(new_nodes)]
    for (rows, row_bytes), count in shapes.items():
        chunk = math.ceil(rows / old_world)
        weight = count * STATE_TENSORS
        for node in range(new_nodes):
            first, _ = rows_of(rows, new_world, node * RANKS_PER_NODE)
            _, last = rows_of(rows, new_world, node * RANKS_PER_NODE + RANKS_PER_NODE - 1)
            if last <= first:
                continue
            for rank in range(first // chunk, min(old_world - 1, (last - 1) // chunk) + 1):
                item_start, item_end = rows_of(rows, old_world, rank)
                low, high = max(first, item_start), min(last, item_end)
                if high <= low:
                    continue
                touched[node].add(rank)
                size = (item_end - item_start) * row_bytes
                reads.whole_items += size * weight
                if (low, high) == (item_start, item_end):
                    reads.leaves += size * weight
                    continue
                begin = (low - item_start) * row_bytes // leaf * leaf
                stop = min(size, -(-(high - item_start) * row_bytes // leaf) * leaf)
                head = min(leaf, size) if begin else 0  # the item's first leaf says where its data starts
                reads.leaves += (stop - begin + head) * weight
    reads.whole_files = sum(file_bytes[rank] for ranks in touched for rank in ranks)
    return reads


def llama3_405b_in_order() -> list[tuple[int, int]]:
    """(rows, bytes per row) of every tensor of the state in the order a rank's file holds them:
    the parameters (embedding, the layers, the final norm, the output), then the same shapes again
    for each of the three other state tensors (as a state dict lists model, then optimizer state)."""
    dim, layers, heads, kv_heads, ffn, vocab = 16384, 126, 128, 8, 53248, 128256
    kv = kv_heads * (dim // heads)
    per_layer = [(dim, dim), (kv, dim), (kv, dim), (dim, dim), (ffn, dim), (ffn, dim), (dim, ffn), (dim, 1), (dim, 1)]
    params = [(vocab, dim)] + per_layer * layers + [(dim, 1), (vocab, dim)]
    return [(rows, cols * BYTES) for rows, cols in params] * STATE_TENSORS


HEAD_BYTES = 4096
"""What the built restore reads of an item's start to find its rows (checkpoint/rows.py HEAD_BYTES)."""


def built(old_nodes: int, new_nodes: int, block: int, shapes: list[tuple[int, int]] | None = None,
          ranks_per_node: int = RANKS_PER_NODE) -> tuple[int, int]:
    """(checkpoint bytes, bytes the built restore reads: checkpoint/rows.py and ranged.py): each
    node reads, of each stored item its ranks' rows overlap, the whole item when it needs every
    row, else the item's first HEAD_BYTES (where its rows start) and the bytes of the rows it
    needs; each node once, in `block`-sized blocks (a block read for one item serves the next).
    `shapes`: (rows, bytes per row) of each tensor in a rank file's order (Llama 3 405B's state
    by default)."""
    import numpy as np

    shapes = shapes or llama3_405b_in_order()
    rows = np.array([r for r, _ in shapes], dtype=np.int64)
    row_bytes = np.array([b for _, b in shapes], dtype=np.int64)
    old_world, new_world = old_nodes * ranks_per_node, new_nodes * ranks_per_node
    old_chunk, new_chunk = -(-rows // old_world), -(-rows // new_world)
    total = int((rows * row_bytes).sum())
    read = 0
    for node in range(new_nodes):
        first = np.minimum(node * ranks_per_node * new_chunk, rows)
        last = np.minimum((node + 1) * ranks_per_node * new_chunk, rows)
        wanted = last > first
        low_rank = np.where(wanted, first // old_chunk, old_world)
        high_rank = np.where(wanted, (last - 1) // old_chunk, -1)
        for rank in range(int(low_rank.min()), int(high_rank.max()) + 1):
            item_start = np.minimum(rank * old_chunk, rows)
            item_end = np.minimum((rank + 1) * old_chunk, rows)
            sizes = (item_end - item_start) * row_bytes
            offsets = np.concatenate(([0], np.cumsum(sizes)))
            take = (low_rank <= rank) & (rank <= high_rank) & (sizes > 0)
            if not take.any():
                continue
            low, high = np.maximum(first, item_start)[take], np.minimum(last, item_end)[take]
            start, end, rb, off = item_start[take], item_end[take], row_bytes[take], offsets[:-1][take]
            whole = (low == start) & (high == end)
            head_end = np.where(whole, off, off + np.minimum(HEAD_BYTES, sizes[take]))
            begin, stop = off + (low - start) * rb, off + (high - start) * rb
            # each item: its head (empty when read whole), then its rows; in file order
            starts = np.stack([off, begin], axis=1).ravel() // block * block
            ends = np.minimum(-(-np.stack([head_end, stop], axis=1).ravel() // block) * block, offsets[-1])
            keep = np.stack([head_end > off, stop > begin], axis=1).ravel()
            starts, ends = starts[keep], ends[keep]
            reached = np.maximum.accumulate(np.concatenate(([0], ends)))[:-1]
            read += int(np.maximum(0, ends - np.maximum(starts, reached)).sum())
    return total, read


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=int, default=1000, help="nodes that saved the checkpoint")
    parser.add_argument("--new", default="999,990,900,750,500", help="comma-separated node counts restoring it")
    parser.add_argument("--leaf", type=int, default=64, help="KiB a byte-range read is cut to")
    parser.add_argument("--block", type=int, default=16, help="KiB per hashed block of the built restore")
    args = parser.parse_args(argv)
    print(f"Llama 3 405B state, saved by {args.old} nodes x {RANKS_PER_NODE} ranks (FSDP2 dim-0 chunks); bytes read "
          f"across all nodes / checkpoint bytes\n")
    print(f"| nodes restoring | whole files | whole items | item ranges cut to {args.leaf} KiB | built: rows in "
          f"{args.block} KiB blocks |")
    print("|---:|---:|---:|---:|---:|")
    for new in (int(n) for n in args.new.split(",")):
        reads = shrink(args.old, new, args.leaf << 10)
        total, read = built(args.old, new, args.block << 10)
        print(f"| {new} | {reads.whole_files / reads.checkpoint:.3f}x | {reads.whole_items / reads.checkpoint:.3f}x | "
              f"{reads.leaves / reads.checkpoint:.3f}x | {read / total:.3f}x |")
    print(f"\n(checkpoint {reads.checkpoint / 1e12:.2f} TB)")


if __name__ == "__main__":
    main()
