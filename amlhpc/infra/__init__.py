"""aml-hpc infrastructure: the Pulumi program, its validated config and the SKU catalog.

Importing this package imports no Pulumi: `amlhpc.core.skus`, `amlhpc.infra.config` and
`amlhpc.core.errors` are used by `amlhpc/jobs/` as plain Python.
"""
