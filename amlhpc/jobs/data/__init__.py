"""Datasets: `python -m amlhpc.jobs data upload` compresses a local directory into the stack's
`datasets` container, in the layout and with the metadata that in-job staging reads."""
