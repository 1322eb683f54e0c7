"""What can go wrong with a checkpoint, as exception types the launcher and the CLI tell apart.

Every message names the blob, file or version concerned and, where there is one, the fix.
"""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint could not be restored or committed (the message names the blob)."""


class FileChanged(CheckpointError):
    """A file changed while it was being uploaded: the version is abandoned, not committed."""


class PointerConflict(CheckpointError):
    """Another writer moved the `latest` pointer, a part or a lease of this version while it
    uploaded: two jobs write under one prefix."""


class UnsafeCheckpoint(CheckpointError):
    """A checkpoint asks for something a restore never does: a path outside its folder, a blob
    outside its stream, a pickled object that is not plain data. Nothing of it was used."""


class PartMissing(CheckpointError):
    """A version names a part that is not in Blob as it was uploaded (deleted, overwritten,
    never finished): the version is not committed."""


class NotReady(CheckpointError):
    """A version cannot be committed yet: some node has not staged its parts."""


class UploadCancelled(CheckpointError):
    """The upload was cancelled (the launcher restarts the training, or stops): nothing committed."""


class LocalCopyCorrupt(CheckpointError):
    """A node's copy of a version does not hash to what its writer recorded: its marker is set
    aside, and the next restart agrees on another version (Blob's)."""
