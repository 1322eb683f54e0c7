"""Runs inside the job on every node: launch, staging, health gate, pinning, checkpoints.

Standard library plus azure-storage-blob, azure-identity and isal only; nothing from the
rest of this repository, because this package is copied into the training image.
"""
