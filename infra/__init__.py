"""aml-hpc infrastructure: the Pulumi program, its validated config and the SKU catalog.

Importing this package imports no Pulumi: `infra.skus`, `infra.config` and
`infra.errors` are used by `jobs/` as plain Python.
"""
