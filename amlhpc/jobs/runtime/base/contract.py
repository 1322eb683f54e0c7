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

# Set by whatever starts a node's ranks (a launcher, a wrapper script), fresh for each launch.
LAUNCH_ID = "AMLHPC_LAUNCH_ID"

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

DEFAULT_REPORT_DIR = "outputs/aml-hpc"


def data_dir_var(input_name: str) -> str:
    """AMLHPC_DATA_DIR_<NAME> for an input (upper-case, '-' -> '_')."""
    return DATA_DIR_PREFIX + input_name.upper().replace("-", "_")


def file_list_var(input_name: str) -> str:
    """AMLHPC_FILE_LIST_<NAME> for an input (upper-case, '-' -> '_')."""
    return FILE_LIST_PREFIX + input_name.upper().replace("-", "_")
