"""aml-hpc infrastructure: the Pulumi program, its validated config and the SKU catalog.

Importing this package imports no Pulumi: `core.skus`, `infra.config` and
`core.errors` are used by `jobs/` as plain Python.
"""
