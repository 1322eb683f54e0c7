"""`aml-hpc:checkpointAccounts`: a stack's own checkpoint accounts, given as a count or derived
from the checkpoint's size (amlhpc/core/storage_load.py checkpoint_accounts_needed)."""

from __future__ import annotations

from pydantic import Field

from amlhpc.core import skus
from amlhpc.core.storage_load import (
    CHECKPOINT_BYTES_PER_PARAM,
    MAX_CHECKPOINT_ACCOUNTS,
    checkpoint_accounts_needed,
)
from amlhpc.core.values import Gbps
from amlhpc.infra.config.base import _Model


class CheckpointAccountsConfig(_Model):
    """The stack's own checkpoint accounts (stack output checkpointAccounts, in striping order):
    `count`, or the checkpoint's size (`modelParams` x `bytesPerParam`, or `checkpointGb`) from
    which the count is derived: size / (intervalS x 90 % x ingressGbps), rounded up."""

    count: int | None = Field(None, ge=1, le=MAX_CHECKPOINT_ACCOUNTS)
    model_params: float | None = Field(None, gt=0)
    """Parameters of the model, e.g. 405e9."""
    bytes_per_param: float = Field(CHECKPOINT_BYTES_PER_PARAM, gt=0)
    """Checkpoint bytes per parameter: 16 for bf16 weights with fp32 master weights and two Adam moments."""
    checkpoint_gb: float | None = Field(None, gt=0)
    """The largest checkpoint, GB (10^9 bytes), instead of modelParams."""
    interval_s: int = Field(600, ge=60)
    """The checkpoint interval the upload must fit in."""
    ingress_gbps: Gbps = skus.STORAGE_ACCOUNT.ingress_gbits_per_s_default
    """One account's ingress, Gb/s (Azure's per-region target)."""
    soft_delete_days: int = Field(0, ge=0, le=1)
    """Blob soft delete on the checkpoint accounts: off, or one day at most."""

    def checkpoint_bytes(self) -> float | None:
        if self.checkpoint_gb is not None:
            return self.checkpoint_gb * 1e9
        return self.model_params * self.bytes_per_param if self.model_params is not None else None

    def accounts(self) -> int:
        """How many accounts: the given count, else the count the checkpoint's size needs."""
        if self.count is not None:
            return self.count
        size = self.checkpoint_bytes()
        if size is None:
            return 1
        return min(MAX_CHECKPOINT_ACCOUNTS, checkpoint_accounts_needed(size, self.interval_s, self.ingress_gbps))
