"""Checkpoints in two tiers: node-local NVMe and Blob, committed atomically, restored safely.

- settings.py: AMLHPC_CHECKPOINT_JSON (container, prefix, retention, cap, restart limits)
- snapshot.py: what a checkpoint folder holds (regular files, no symlinks, no temporary names)
- store.py: one stream of versions in Blob: pending leases, parts, verified commits, restores
- prune.py: retention that is safe while an upload or a commit runs
- tier.py: the node-local tier of versioned checkpoints (per-rank markers, verification)
- uploader.py: the launcher's background uploads (the folder; versioned checkpoints, node 0 commits)
- safepath.py: a restore writes only inside its folder
- safeload.py: torch.distributed.checkpoint files read without running pickled code (training side)
- metapickle.py: the pure-Python unpickler safeload reads DCP `.metadata` with (records only)
- (its named steps, where tests inject a second writer, a kill or a cancel, are in
  amlhpc/jobs/runtime/base/faultpoints.py with every other state machine's)
- cli.py: `python -m amlhpc.jobs.runtime.checkpoint upload|restore|list|prune`

Standard library plus azure-storage-blob (torch only in safeload.py and metapickle.py, for the training process):
ships in the image.
"""

from amlhpc.jobs.runtime.checkpoint.errors import (
    CheckpointError,
    FileChanged,
    NotReady,
    PartMissing,
    PointerConflict,
    UnsafeCheckpoint,
    UploadCancelled,
)
from amlhpc.jobs.runtime.checkpoint.settings import (
    CheckpointSettings,
    container_from_settings,
    parse_settings,
    settings_from_env,
)
from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore, Manifest, UploadResult
from amlhpc.jobs.runtime.checkpoint.uploader import (
    BackgroundUploader,
    FolderUploader,
    VersionUploader,
)

__all__ = [
    "BackgroundUploader", "CheckpointError", "CheckpointSettings", "CheckpointStore", "FileChanged", "FolderUploader",
    "Manifest", "NotReady", "PartMissing", "PointerConflict", "UnsafeCheckpoint", "UploadCancelled", "UploadResult",
    "VersionUploader", "container_from_settings", "parse_settings", "settings_from_env",
]
