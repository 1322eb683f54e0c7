"""Shrink-and-continue at submit: the node counts a managed run may shrink to.

A smaller attempt keeps the run's global batch - the samples per optimizer step over all
ranks - so that it trains the same model the full-size run would: the training takes
`--global-batch N` (the shipped workloads do: amlhpc/jobs/workloads/bert_pretrain/train.py,
amlhpc/jobs/workloads/cosmoflow/train.py) and accumulates N / (micro batch x ranks) micro-batches
per step on whatever world it starts in, and the launcher restores every part of the
versioned checkpoint when the world differs, so it reshards (amlhpc/jobs/workloads/resume.py). The
controller changes nothing but the attempt's instance count (amlhpc.jobs.managed.azureml).

So a count is allowed only when the global batch splits over its ranks in whole
micro-batches. The micro batch is the command's `--micro-batch` or `--batch-size` (the
workloads' flags), else the DeepSpeed plan's `train_micro_batch_size_per_gpu`, else 1; a
training that reads it elsewhere still refuses a split it cannot do (exit 2, `bad_input`).
Pure functions; the submit side (render.py) calls them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GLOBAL_BATCH_FLAG = "--global-batch"
MICRO_BATCH_FLAGS = ("--micro-batch", "--batch-size")
ACCUMULATION_FLAG = "--grad-accum"


def flag(command: str, name: str) -> int | None:
    """The integer value of `name` in a command line (`--name N` or `--name=N`; the last one
    wins, as with argparse), or None when it is absent or not an integer."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    found = None
    for i, word in enumerate(words):
        text = word.partition("=")[2] if word.startswith(name + "=") else \
            words[i + 1] if word == name and i + 1 < len(words) else None
        if text is not None:
            found = int(text) if text.isdigit() else None
    return found


@dataclass(frozen=True)
class Batch:
    """What the training's batch is made of, as far as the job definition says."""

    global_batch: int | None
    """Samples per optimizer step over all ranks (`--global-batch`); None: the command does not say."""
    micro_batch: int
    accumulation: int
    ranks_per_node: int

    def now(self, nodes: int) -> int:
        """The global batch the training uses on `nodes` without `--global-batch`."""
        return self.micro_batch * self.accumulation * self.ranks_per_node * nodes

    def splits_over(self, nodes: int) -> bool:
        return self.global_batch is not None and self.global_batch % (self.micro_batch * self.ranks_per_node * nodes) == 0


def batch_of(command: str, ranks_per_node: int, deepspeed: Mapping[str, Any] | None = None) -> Batch:
    """The batch of a training command (the recipe's, without the launcher) on `ranks_per_node`
    processes per node; `deepspeed`: the ds_config the job carries (AMLHPC_DEEPSPEED_JSON's "config")."""
    config = deepspeed or {}
    micro = next((v for v in (flag(command, f) for f in MICRO_BATCH_FLAGS) if v), None) or \
        int(config.get("train_micro_batch_size_per_gpu") or 1)
    accumulation = flag(command, ACCUMULATION_FLAG) or int(config.get("gradient_accumulation_steps") or 1)
    return Batch(flag(command, GLOBAL_BATCH_FLAG), max(1, micro), max(1, accumulation), max(1, ranks_per_node))


def counts(nodes: int, min_nodes: int | None, batch: Batch) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the counts a run of `nodes` may shrink to, largest first; the counts from `min_nodes`
    up that the global batch does not split over, skipped). Nothing without min_nodes."""
    if min_nodes is None or min_nodes >= nodes:
        return (), ()
    below = range(nodes - 1, min_nodes - 1, -1)
    return tuple(n for n in below if batch.splits_over(n)), tuple(n for n in below if not batch.splits_over(n))
