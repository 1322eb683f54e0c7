"""Exit statuses the in-job launcher adds for hangs, NCCL, storage-access and in-job restart failures,
allocated here once (the launcher's older ones live in amlhpc/jobs/runtime/launch/launcher.py: 2 bad input,
3 health gate, 4 staging, 5 restore, 6 final upload, 126/127 command). Managed runs
(amlhpc/jobs/managed/causes.py) decide from these which ends to retry.

docs/runtime.md lists them all with what to do about each.
"""

from __future__ import annotations

EXIT_HANG = 7
"""The hang watchdog stopped the command: no rank of the node (or another node) made progress
for watchdog.hang_s (amlhpc/jobs/runtime/launch/watchdog.py)."""

EXIT_NCCL_SOCKETS = 8
"""NCCL uses (or would use) TCP sockets between the nodes of an InfiniBand size: the job is
stopped before training instead of running many times slower. The message names the cause
(NCCL_IB_DISABLE inherited, NCCL_NET=Socket, libibverbs missing, no InfiniBand port)."""

EXIT_STORAGE_ACCESS = 9
"""The node's managed identity cannot get a token for the job's storage, or lacks the role to
read the inputs (Storage Blob Data Reader) or write the checkpoints (Storage Blob Data
Contributor): stopped before staging, with the account, container and role named."""

EXIT_NODE_LOST = 10
"""An in-job restart could not happen: a node did not answer within checkpoint.agree_s (its host
is gone, or its launcher is frozen). The job ends so the managed run can resubmit it
(amlhpc/jobs/runtime/launch/restart.py)."""

EXIT_RESTARTS_EXHAUSTED = 11
"""The training failed again after checkpoint.local_restarts in-job restarts: the job ends so the
managed run can resubmit it on other nodes (amlhpc/jobs/runtime/launch/restart.py)."""
