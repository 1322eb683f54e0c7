"""NVIDIA XID error codes that mean a GPU is unfit for training: the health gate fails a node
for them (health/tools.py) and telemetry marks them in its samples (telemetry.py)."""

from __future__ import annotations

CRITICAL_XIDS = frozenset({48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120})
"""The XIDs Azure's check fails a node for (azure_gpu_xid.nhc XID_EC, 2025-07-16)."""

XID_WINDOW_HOURS = 2
"""How long a critical XID fails a node in Azure's check (azure_gpu_xid.nhc check_gpu_xid: the
default time_threshold of 2 hours, compared with the whole hours since the XID,
(now - then) / 3600 in bash's integer arithmetic, so up to 2 h 59 min)."""
