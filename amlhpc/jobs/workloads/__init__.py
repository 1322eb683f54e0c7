"""Training code that runs inside Azure ML jobs (and on CPU in tests and the rehearsal).

Shipped in the job's code snapshot next to amlhpc/jobs/runtime; imports only amlhpc.jobs.runtime from
this repository, plus torch/transformers/deepspeed where the image has them.
"""
