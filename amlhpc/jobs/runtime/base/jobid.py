"""Which job this is, for staging's markers: a key no earlier job on the same node shares.

Staging's node barrier (local rank 0 stages, the other local ranks wait for its result)
and the shared-mode node markers are files; a marker left by an earlier job under the
same key would release this job's ranks before their data is staged. The key is:

    <job id>-<inputs digest>

- job id: the first of these that is set and not a known placeholder:
  `AZUREML_RUN_ID` (Azure ML sets it in every process of a job, unique per job; the
  Azure/azureml-examples training scripts read it as the run's id, e.g.
  sdk/python/featurestore_sample/project/fraud_model/train/src/train.py at commit
  085cd6ea, read 2026-11-23), `AMLHPC_RUN_ID` (the local rehearsal, tests),
  `TORCHELASTIC_RUN_ID` (torchrun's --rdzv-id; its default `none` is a placeholder),
  `PMIX_NAMESPACE` (one per mpirun), `OMPI_MCA_orte_ess_jobid`. Azure ML's id comes
  first: an `AMLHPC_RUN_ID` fixed by hand in a job's environment must not make every job
  share one key.
- inputs digest: a hash of the inputs and the node layout, so even jobs without a unique
  id (a fixed id, torchrun's default) collide only when they stage the same thing the
  same way.

`unique` says whether the id is one a scheduler made unique per job (Azure ML, PMIx, an
explicit rdzv id, the rehearsal's). Without it, the barriers also reject markers older
than their own wait (amlhpc.jobs.runtime.coord.nodebarrier).

Standard library only: ships into the training image.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from amlhpc.jobs.runtime.base import contract

ID_VARIABLES: tuple[str, ...] = ("AZUREML_RUN_ID", contract.RUN_ID, "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE",
                                 "OMPI_MCA_orte_ess_jobid")
PLACEHOLDERS = frozenset({"", "none", "default", "null", "0"})
"""Values launchers use when nobody chose an id (torchrun: `none`)."""


@dataclass(frozen=True)
class JobIdentity:
    job_id: str
    source: str
    """The variable it came from, or 'none'."""
    unique: bool

    def key(self, inputs_digest: str) -> str:
        return f"{self.job_id}-{inputs_digest}"


def _safe(value: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in value)[:100]


def identify(env: Mapping[str, str]) -> JobIdentity:
    for name in ID_VARIABLES:
        value = (env.get(name) or "").strip()
        if value.lower() not in PLACEHOLDERS:
            return JobIdentity(_safe(value), name, unique=True)
    return JobIdentity("default", "none", unique=False)


def inputs_digest(specs: Sequence[object], node_count: int, local_size: int) -> str:
    """12 hex digits over the inputs (dataclasses or mappings) and the node layout."""
    def plain(spec: object) -> object:
        return getattr(spec, "__dict__", None) or spec

    text = json.dumps([[plain(s) for s in specs], node_count, local_size], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
