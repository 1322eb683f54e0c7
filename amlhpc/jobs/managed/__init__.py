"""Managed runs: a training job that recovers by itself from preemption, node failure and hangs.

A controller job on the stack's small CPU cluster (amlhpc/infra/components/controller.py)
submits the training job, watches it, classifies how it ended and resubmits it, resuming
from the latest committed checkpoint, with backoff and up to a limit, within one cost
limit enforced while attempts run. docs/managed-jobs.md explains what is retried, what is
not, what it costs, and which test holds each guarantee.

- causes.py      why an attempt ended: the causes, their defaults, the exit-status map
- observation.py what Azure ML says about one job (status, error codes, times, node states)
- classify.py    observation + the nodes' end records -> a verdict
- policy.py      limits, retry rules and target clusters of one run (from its job definition)
- record.py      the run's durable record in the supervision container: ETag-guarded writes
                 under a lease, cancel requests, the run's controller jobs
- evidence.py    what the nodes left in Blob (signed end records and heartbeats, the checkpoint)
- stragglers.py  naming a node persistently slower than its peers
- supervisor.py  the loop: claim, submit, watch, classify, back off, stop
- revive.py      the revival check an Azure ML schedule runs: a dead controller is replaced
- azureml.py     the job service on Azure ML (the only MLClient user of the controller)
- controller.py  `python -m amlhpc.jobs.managed.controller`: the controller job's entry point
- render.py      (submit side) the controller job and the training job templates
- client.py      (submit side) status and cancel from the laptop
- report.py      the attempt history as rows and totals for `status` and the rehearsal

Fault points for tests and rehearsals are listed in amlhpc/jobs/runtime/base/faultpoints.py. The
modules the controller job runs (all but render.py and client.py) import only the
standard library, amlhpc.jobs.runtime and the Azure SDKs: the controller's image needs nothing else.
"""
