"""A node's pending record of a version (its lease on the blobs it writes), as a listing shows it.

The record itself is JSON (store.py writes it); its metadata carries what retention needs,
so prune reads every lease from one listing with metadata instead of one read per record:
`amlhpc_state` (uploading, staged) and `amlhpc_leases` (the data folders the upload writes
or reuses, comma-separated, or LEASE_ALL).

Standard library only: ships in the image.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

LEASE_ALL = "*"
"""A pending record whose leases did not fit its metadata leases every data blob of the stream."""
LEASES_MAX_CHARS = 4000
"""Blob metadata holds 8 KiB in all; a longer list of leased folders is written as LEASE_ALL."""


@dataclass(frozen=True)
class Pending:
    """One node's pending record of a version, as one listing (with metadata) shows it."""

    version: str
    node: int
    metadata: dict[str, str]
    last_modified: datetime | None

    @property
    def staged(self) -> bool:
        return self.metadata.get("amlhpc_state") == "staged"

    @property
    def leases(self) -> set[str]:
        """The data folders (`<stream>/data/<version>/`) whose blobs the upload writes or reuses;
        {LEASE_ALL} for a record without the list (written by an older uploader, or too long)."""
        text = self.metadata.get("amlhpc_leases")
        if not text or text == LEASE_ALL:
            return {LEASE_ALL}
        return {f for f in text.split(",") if f}

    def leases_blob(self, name: str) -> bool:
        leases = self.leases
        return LEASE_ALL in leases or any(name.startswith(folder) for folder in leases)
