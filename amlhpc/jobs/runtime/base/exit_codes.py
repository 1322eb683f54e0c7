"""Every exit status of the in-job runtime, in one enum: the launcher's, the staging command's
and the health gate's. Managed runs (amlhpc/jobs/managed/causes.py) decide from these which
ends to retry; docs/runtime.md lists them with what to do about each.

A process ended by signal N exits 128+N (the shell's convention); those are not listed here.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    USAGE = 2
    """Bad input: flags, AMLHPC_* variables, rank variables (nothing was started); as in
    amlhpc.core.errors and argparse."""
    HEALTH = 3
    """The health gate failed or timed out (the training did not start)."""
    STAGING = 4
    """Staging failed (the launcher; the staging command on its own too)."""
    RESTORE = 5
    """The latest checkpoint could not be restored."""
    FINAL_UPLOAD = 6
    """The command succeeded but its final checkpoint could not be uploaded."""
    HANG = 7
    """The hang watchdog stopped the command: no rank of the node (or another node) made progress
    for watchdog.hang_s (amlhpc/jobs/runtime/launch/watchdog.py)."""
    NCCL_SOCKETS = 8
    """NCCL uses (or would use) TCP sockets between the nodes of an InfiniBand size: the job is
    stopped before training instead of running many times slower. The message names the cause
    (NCCL_IB_DISABLE inherited, NCCL_NET=Socket, libibverbs missing, no InfiniBand port)."""
    STORAGE_ACCESS = 9
    """The node's managed identity cannot get a token for the job's storage, or lacks the role to
    read the inputs (Storage Blob Data Reader) or write the checkpoints (Storage Blob Data
    Contributor): stopped before staging, with the account, container and role named."""
    NODE_LOST = 10
    """A node is lost: node 0, whose launcher hosts the job's coordination store (it stopped
    answering: every other node ends at once), or a node that did not answer an in-job restart
    within checkpoint.agree_s (its host is gone, or its launcher is frozen), or a node whose training
    process was not reaped within --kill-wait seconds of its SIGKILL (uninterruptible sleep: a GPU
    off the bus, a wedged driver or file system). The job ends so the managed run can resubmit it
    (amlhpc/jobs/runtime/launch/restart.py, amlhpc/jobs/runtime/coord/jobstore.py,
    amlhpc/jobs/runtime/launch/reap.py)."""
    RESTARTS_EXHAUSTED = 11
    """The training failed again after checkpoint.local_restarts in-job restarts: the job ends so
    the managed run can resubmit it on other nodes (amlhpc/jobs/runtime/launch/restart.py)."""
    STAGING_TIMEOUT = 12
    """Staging did not finish within its timeout (the staging command on its own; the launcher
    reports a timed-out staging as STAGING)."""
    RESTART_HEALTH = 13
    """A node failed the quick health check before an in-job restart (a GPU gone or erroring, a new
    critical XID, a fabric port down: amlhpc/jobs/runtime/health/quick.py): no node restarts, the
    job ends so the managed run resubmits it; every node's end record names the node and the check."""
    NOT_EXECUTABLE = 126
    """The training command is not executable."""
    NOT_FOUND = 127
    """The training command was not found."""
