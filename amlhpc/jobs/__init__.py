"""aml-hpc jobs: recipes become Azure ML jobs against a stack's outputs.

`amlhpc.jobs.runtime` ships into the container and imports nothing else from this repository.
"""
