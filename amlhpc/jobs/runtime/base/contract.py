"""Environment variables shared by the job builder, the in-job runtime, the local
rehearsal and the training code. One place for the names (docs/contracts.md, section 4).
"""

from __future__ import annotations

# Set on the job by amlhpc/jobs/plan/build.py (and by the local rehearsal).
SKU_JSON = "AMLHPC_SKU_JSON"
STAGE_JSON = "AMLHPC_STAGE_JSON"
BLOB_CONNECTION_STRING = "AMLHPC_BLOB_CONNECTION_STRING"
SCRATCH = "AMLHPC_SCRATCH"
SHARED_DIR = "AMLHPC_SHARED_DIR"
HEALTH = "AMLHPC_HEALTH"
PIN = "AMLHPC_PIN"
CHECKPOINT_JSON = "AMLHPC_CHECKPOINT_JSON"
REPORT_DIR = "AMLHPC_REPORT_DIR"
STAGE_TIMEOUT_S = "AMLHPC_STAGE_TIMEOUT_S"
RUN_ID = "AMLHPC_RUN_ID"
WATCHDOG_JSON = "AMLHPC_WATCHDOG_JSON"
NCCL_RESOLVE = "AMLHPC_NCCL_RESOLVE"
TELEMETRY_INTERVAL_S = "AMLHPC_TELEMETRY_INTERVAL_S"
EVIDENCE_KEY = "AMLHPC_EVIDENCE_KEY"
"""Set per attempt by a managed run's controller: the key that signs the nodes' end records
and heartbeats (amlhpc/jobs/runtime/coord/nodestatus.py)."""
EARLIER_KEYS = "AMLHPC_EARLIER_EVIDENCE_KEYS"
"""Set per attempt by a managed run's controller: the evidence keys of the run's earlier
attempts ({job: key}, JSON), so the launcher can tell a checkpoint pointer one of them signed
on a stream the restore pin does not name (amlhpc/jobs/runtime/checkpoint/trust.py). Each key is
already in its own attempt's job definition; the run's secret, which derives them all (future
attempts' included), never leaves the controller."""
RESTORE_PIN = "AMLHPC_RESTORE_PIN"
"""Set per attempt by a managed run's controller: the checkpoint version of each stream it
checked and its manifest's digest, which the attempt restores unless its own newer commit
(amlhpc/jobs/runtime/checkpoint/trust.py)."""

# Set by whatever starts a node's ranks (a launcher, a wrapper script), fresh for each launch.
LAUNCH_ID = "AMLHPC_LAUNCH_ID"

# The job's coordination store (amlhpc/jobs/runtime/coord/jobstore.py), hosted by node 0's launcher.
COORD_PORT = "AMLHPC_COORD_PORT"
"""The port node 0's launcher serves the store on, at the rendezvous host (MASTER_ADDR);
default MASTER_PORT + 1."""
COORD_LISTEN_FD = "AMLHPC_COORD_LISTEN_FD"
"""Optional, node 0's local rank 0 only: a listening socket already bound to COORD_PORT and
inherited from whatever started the ranks (the local rehearsal), served instead of binding."""
COORD_STORE = "AMLHPC_COORD_STORE"
"""torch | stdlib | auto (default): torch's TCPStore, this project's server and client speaking
its protocol, or torch's where it can be imported."""
STANDBY = "AMLHPC_STANDBY"
"""on | off | auto (default): keep a warm standby of a Python training command for in-job
restarts (amlhpc/jobs/runtime/launch/standby.py). auto: when the node has standby.CPUS_PER_RANK
CPUs per local rank, so that a standby importing torch never slows the running training (a
local rehearsal counts every simulated node's ranks: amlhpc/jobs/local/rehearsal.py)."""
COORD_GRACE_S = "AMLHPC_COORD_GRACE_S"
"""Optional, whole seconds: how long a node rides out an unreachable store before it takes node 0
for lost and ends (default kvstore.RECONNECT_GRACE_S). Lower ends a job that lost node 0 sooner;
higher rides out longer network flaps."""

# Set by amlhpc.jobs.runtime.launch.launcher for the training command.
DATA_DIR_PREFIX = "AMLHPC_DATA_DIR_"
FILE_LIST_PREFIX = "AMLHPC_FILE_LIST_"
CHECKPOINT_DIR = "AMLHPC_CHECKPOINT_DIR"
RESUME_DIR = "AMLHPC_RESUME_DIR"
PROGRESS_FILE = "AMLHPC_PROGRESS_FILE"
RESUME_VERSION = "AMLHPC_RESUME_VERSION"
"""The versioned checkpoint (a folder of the node's tier) to resume from; unset: start fresh."""
RESTART_GENERATION = "AMLHPC_RESTART_GENERATION"
"""0 for the job's first training run, n after n in-job restarts."""
CHECKPOINT_TAG = "AMLHPC_CHECKPOINT_TAG"
"""The timeline the run's versioned checkpoints belong to (job run and restart generation)."""
BLOB_READ_SAS = "AMLHPC_BLOB_READ_SAS"
"""Only under a connection string (Azurite), which the training never gets: a read-only SAS of the
checkpoint container, valid a day, so a reshard load reads its ranges (checkpoint/ranged.py). On
Azure the training reads with the node's managed identity and this is not set."""

DEFAULT_REPORT_DIR = "outputs/aml-hpc"


def data_dir_var(input_name: str) -> str:
    """AMLHPC_DATA_DIR_<NAME> for an input (upper-case, '-' -> '_')."""
    return DATA_DIR_PREFIX + input_name.upper().replace("-", "_")


def file_list_var(input_name: str) -> str:
    """AMLHPC_FILE_LIST_<NAME> for an input (upper-case, '-' -> '_')."""
    return FILE_LIST_PREFIX + input_name.upper().replace("-", "_")
