"""The copy a background save holds the training for: the state into CPU buffers kept for the
process's life (page-locked on a GPU node, filled with non-blocking copies, then one sync), so
only the first save allocates and every later one is a copy into the same memory.

torch's `StateDictStager` does the copy (tensors, DTensors' local shards, plain values; a
storage shared by two tensors is copied once) and keeps its CPU storages keyed by the source
storage, which is what makes the buffers reusable. It is used directly, not through
`DefaultStager`, for two reasons found on the versions our images ship:

- torch 2.11's `DefaultStager` closes its `StateDictStager` at the end of every stage (a fix of
  a leak in one-shot `dcp.async_save`): the cached buffers are dropped, so every save pays the
  first save's allocation again, and the second stage fails with `KeyError: <class 'type'>`
  (pytorch/pytorch#183413, 2026-05; seen on an H200 with torch 2.11.0: the llm-pretrain run's
  second checkpoint ended the training);
- torch 2.8 (the ROCm image) has no `DefaultStager` or `StagingOptions` at all.

`StateDictStager(pin_memory, share_memory)` and its `stage(state, non_blocking=...)` are the
same on 2.8, 2.11 and 2.13.

Imports torch: used by the training process, never by the launcher.
"""

from __future__ import annotations

from typing import Any


class KeptBuffersStager:
    """Stages state dicts into CPU memory that lives as long as this object. The caller must
    not hand the staged dict of one save to a writer while the next save is staging (the
    buffers are the same): one save in flight, as `versioned.Checkpointer` keeps it."""

    def __init__(self) -> None:
        import torch
        from torch.distributed.checkpoint._state_dict_stager import StateDictStager

        self.accelerator = torch.accelerator.is_available()
        self._stager: Any = StateDictStager(pin_memory=self.accelerator, share_memory=False)

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """A CPU copy of `state`, complete when this returns (the training may change its
        tensors right after)."""
        import torch

        staged = self._stager.stage(state, non_blocking=self.accelerator)
        if self.accelerator:
            torch.accelerator.synchronize()  # the non-blocking copies land before the training goes on
        return staged

    def close(self) -> None:
        """Release the buffers (torch 2.8's stager has no close: its cache goes with it)."""
        close = getattr(self._stager, "close", None)
        if close is not None:
            close()
        self._stager = None
