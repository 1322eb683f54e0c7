"""Training code that runs inside Azure ML jobs (and on CPU in tests and the rehearsal).

Shipped in the job's code snapshot next to jobs/runtime; imports only jobs.runtime from
this repository, plus torch/transformers/deepspeed where the image has them.
"""
