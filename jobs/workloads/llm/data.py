"""Synthetic token batches: a learnable task with no download and an order that resumes exactly.

Each sequence repeats a random n-gram (period `PERIOD`) drawn from the vocabulary: after
the first period a model that learns to copy from `PERIOD` tokens back predicts every
token, so the loss falls from ln(vocab) towards ln(vocab) / (seq_len / PERIOD) and a broken
step shows. Sample i of the run is generated from its own seed (run seed, i), so the batch of
optimizer step k on rank r is a function of (k, r) alone: a resumed run sees exactly the data
an uninterrupted one would, whatever the world size, with no loader state to save.
"""

from __future__ import annotations

import torch

PERIOD = 16


def sample(index: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    """Token ids (seq_len + 1,) of sample `index`: inputs are [:-1], targets [1:]."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    gram = torch.randint(0, vocab, (PERIOD,), generator=generator)
    return gram.repeat(seq_len // PERIOD + 2)[: seq_len + 1]


def batch(step: int, micro: int, *, rank: int, world: int, micro_batch: int, grad_accum: int, seq_len: int,
          vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each (micro_batch, seq_len), of micro-batch `micro` of optimizer step
    `step` (counted from 1) on `rank`: global sample indices never overlap between ranks or steps."""
    per_step = world * grad_accum * micro_batch
    first = (step - 1) * per_step + (rank * grad_accum + micro) * micro_batch
    rows = torch.stack([sample(first + i, seq_len, vocab, seed) for i in range(micro_batch)])
    return rows[:, :-1], rows[:, 1:]
