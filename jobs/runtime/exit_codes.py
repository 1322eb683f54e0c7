"""Exit statuses the in-job launcher adds for hangs, NCCL and storage-access failures,
allocated here once (the launcher's older ones live in jobs/runtime/launch.py: 2 bad input,
3 health gate, 4 staging, 5 restore, 6 final upload, 126/127 command). Managed runs
(jobs/managed/causes.py) decide from these which ends to retry.

docs/runtime.md lists them all with what to do about each.
"""

from __future__ import annotations

EXIT_HANG = 7
"""The hang watchdog stopped the command: no rank of the node (or another node) made progress
for watchdog.hang_s (jobs/runtime/watchdog.py)."""

EXIT_NCCL_SOCKETS = 8
"""NCCL uses (or would use) TCP sockets between the nodes of an InfiniBand size: the job is
stopped before training instead of running many times slower. The message names the cause
(NCCL_IB_DISABLE inherited, NCCL_NET=Socket, libibverbs missing, no InfiniBand port)."""

EXIT_STORAGE_ACCESS = 9
"""The node's managed identity cannot get a token for the job's storage, or lacks the role to
read the inputs (Storage Blob Data Reader) or write the checkpoints (Storage Blob Data
Contributor): stopped before staging, with the account, container and role named."""
