"""The order of checkpoint versions in Blob: a version's name starts with its sequence number."""

from __future__ import annotations


def sequence_of(version: str) -> int:
    """A version's order: the digits it starts with (the upload sequence, or the training step)."""
    head = version.split("-", 1)[0]
    return int(head) if head.isdigit() else -1
