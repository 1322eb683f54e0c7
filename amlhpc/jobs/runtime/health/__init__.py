"""Node health checks, as a gate before training or as a standalone job (the NDv4 performance article).

Per node: GEMM throughput (bf16, fp16 on V100), host<->device copies from pinned memory,
device-to-device copies, NCCL all-reduce bus bandwidth within the node and across the
job, InfiniBand ports ACTIVE at the size's rate, ECC / row-remap state. Pass marks come
from the size's facts (AMLHPC_SKU_JSON, see amlhpc/jobs/runtime/node/skufacts.py); each figure passes,
warns (within 3.5 % of failing) or fails, and is compared with the rest of the fleet.

    python -m amlhpc.jobs.runtime.health [--quick] [--mode gate|warn|report] [--report-dir DIR]
    python -m amlhpc.jobs.runtime.health summarize DIR

Modules: grading (pass/warn/fail), measure (GPU micro-benchmarks via PyTorch), checks (a
node's own checks), infiniband, ecc, collective (all-reduce), fleet, results (JSON
reports), summary (table), runner (the run on every process and its verdict).
"""

from amlhpc.jobs.runtime.health.runner import (
    MODES,
    HealthOptions,
    HealthOutcome,
    run_health,
)

__all__ = ["MODES", "HealthOptions", "HealthOutcome", "run_health"]
