"""Environment variables the job builder sets for the training code (beyond the launcher's
contract in amlhpc/jobs/runtime/base/contract.py). One place for the names; no heavy imports here, the
builder imports this module.
"""

from __future__ import annotations

PROFILE_DIR = "AMLHPC_PROFILE_DIR"
"""Set when the recipe's profiling switch is on: PyTorch profiler traces go there
(TensorBoard's profiler plugin reads them)."""

DEEPSPEED_JSON = "AMLHPC_DEEPSPEED_JSON"
"""{"config": ds_config, "memory": {...}, "model": {...}, "autotune": [candidates] | null,
"ort": bool}: what amlhpc/jobs/plan/deepspeed.py planned for this job."""

OUTPUT_DIR_DEFAULT = "outputs"
"""Azure ML uploads ./outputs of every node as the job's artifacts."""

METRICS_FILE = "aml-hpc/metrics.json"
"""Under the output dir: the run's summary (throughput, loss), read by `jobs scale report`."""
