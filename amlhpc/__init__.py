"""aml-hpc: platform-as-code for HPC-scale distributed GPU training on Azure Machine Learning.

One package, four parts: `amlhpc.core` (facts and contracts shared by all), `amlhpc.infra`
(the Pulumi program), `amlhpc.jobs` (recipes become Azure ML jobs; `amlhpc.jobs.runtime`
runs inside them) and `amlhpc.images` (the training images). The `aml-hpc` command is
amlhpc/app.py; docs/layout.md maps the layers.

Imports nothing: the job's code snapshot and the training images carry this file beside
`amlhpc.jobs.runtime` alone (the version is `amlhpc.core.version`).
"""
