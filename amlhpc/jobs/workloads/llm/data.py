"""Synthetic token batches: a learnable task with no download and an order that resumes exactly.

Each sequence repeats a random n-gram (period `PERIOD`) drawn from the vocabulary: after
the first period a model that learns to copy from `PERIOD` tokens back predicts every
token, so the loss falls from ln(vocab) towards ln(vocab) / (seq_len / PERIOD) and a broken
step shows. Sample i of the run is generated from its own seed (run seed, i), so a batch is
a function of where the run is in that sequence of samples (`Position`, saved with every
checkpoint) and of the rank: a resumed run sees exactly the data an uninterrupted one would,
and on another world size it goes on with the next sample not yet trained on.
"""

from __future__ import annotations

from typing import Any

import torch

PERIOD = 16


def sample(index: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    """Token ids (seq_len + 1,) of sample `index`: inputs are [:-1], targets [1:]."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    gram = torch.randint(0, vocab, (PERIOD,), generator=generator)
    return gram.repeat(seq_len // PERIOD + 2)[: seq_len + 1]


class Position:
    """The samples the completed steps trained on (`consumed`), the sampler state of
    common.TrainState: every optimizer step takes the next world x grad_accum x micro_batch
    samples; micro-batch `micro` of rank r is rows (r x grad_accum + micro) x micro_batch on."""

    def __init__(self, *, rank: int, world: int, micro_batch: int, grad_accum: int, seq_len: int, vocab: int,
                 seed: int):
        self.rank, self.world, self.micro_batch, self.grad_accum = rank, world, micro_batch, grad_accum
        self.seq_len, self.vocab, self.seed = seq_len, vocab, seed
        self.consumed = 0

    @property
    def per_step(self) -> int:
        return self.world * self.grad_accum * self.micro_batch

    def batch(self, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (micro_batch, seq_len), of this rank's micro-batch `micro`
        of the next step: global sample indices never overlap between ranks or steps."""
        first = self.consumed + (self.rank * self.grad_accum + micro) * self.micro_batch
        rows = torch.stack([sample(first + i, self.seq_len, self.vocab, self.seed) for i in range(self.micro_batch)])
        return rows[:, :-1], rows[:, 1:]

    def step_done(self) -> None:
        self.consumed += self.per_step

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed, "per_step": self.per_step}

    def load_state_dict(self, state: dict[str, Any], same_world: bool = True) -> None:
        """The same position at any world size (the samples are the job's, not a rank's)."""
        self.consumed = int(state["consumed"])
