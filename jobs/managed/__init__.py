"""Managed runs: a training job that recovers by itself from preemption, node failure and hangs.

A controller job on the stack's small CPU cluster (infra/components/controller.py)
submits the training job, watches it, classifies how it ended and resubmits it, resuming
from the latest committed checkpoint, with backoff and up to a limit. docs/managed-jobs.md
explains what is retried, what is not, and what it costs.

- causes.py      why an attempt ended: the causes, their defaults, the exit-status map
- observation.py what Azure ML says about one job (status, error, times, node states)
- classify.py    observation + the nodes' end records -> a verdict
- policy.py      limits and retry rules for one run (from the recipe and the stack)
- record.py      the run's durable record in Blob: ETag-guarded writes under a lease
- evidence.py    what the nodes left in Blob (end records, heartbeats, the checkpoint)
- supervisor.py  the loop: claim, submit, watch, classify, back off, stop
- azureml.py     the job service on Azure ML (the only MLClient user here)
- controller.py  `python -m jobs.managed.controller`: the controller job's entry point
- render.py      (submit side) the controller job and the training job template
- report.py      the attempt history as rows and totals for `status` and the rehearsal

The modules the controller job runs (all but render.py) import only the standard
library, jobs.runtime and the Azure SDKs: the controller's image needs nothing else.
"""
