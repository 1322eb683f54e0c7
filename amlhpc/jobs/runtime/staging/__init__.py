"""Staging: datasets from Blob to the node's scratch (or a shared mount) before training.
`python -m amlhpc.jobs.runtime.staging` runs it on its own.
"""
