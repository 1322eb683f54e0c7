"""Which launch a process belongs to: a generation that only the ranks of this launch on this node share.

Staging's node barrier trusts a marker only when it carries this generation, so a marker
left by an earlier launch on the same node (a re-run with the same job id, torchrun's
placeholder id `none`, an elastic restart) is never mistaken for this launch's, however
recent it is. The generation comes from the first of:

1. `AMLHPC_LAUNCH_ID`: set by whatever starts the node's ranks, fresh for each launch
   (`export AMLHPC_LAUNCH_ID=$(cat /proc/sys/kernel/random/uuid)` in a wrapper before
   torchrun or mpirun). A value fixed in a job's definition is not fresh: don't.
2. torchrun's per-attempt log directory: torchrun's agent makes its run's log directory with
   `tempfile.mkdtemp` (random, once per agent) and an `attempt_<restart count>` directory
   below it for each (re)start of the workers, and gives each worker
   `TORCHELASTIC_ERROR_FILE=<that>/attempt_<n>/<local rank>/error.json`
   (pytorch/pytorch torch/distributed/elastic/multiprocessing/api.py, DefaultLogsSpecs,
   read 2026-11-25). So the attempt directory is unique to one start of the node's ranks,
   even when every launch has the run id `none`.
3. a unique job id (amlhpc.jobs.runtime.base.jobid: Azure ML's AZUREML_RUN_ID, an explicit rdzv id,
   PMIx's namespace, the rehearsal's AMLHPC_RUN_ID), with the node's boot id and the start
   time of the process tree's first process (in a container: the container's start), so a
   job requeued with the same id into a new container or after a reboot is another launch.
4. a node with one process has no one to wait for it: a random generation.

Otherwise (several local ranks, no unique id, no launcher id) there is no way for the
ranks to tell this launch from an earlier one, and staging refuses to run, saying so.

Standard library only: ships into the training image.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from amlhpc.jobs.runtime.base import contract, jobid, procstat

_ATTEMPT = re.compile(r"^(?P<attempt>.+/attempt_\d+)/\d+/error\.json$")


@dataclass(frozen=True)
class Generation:
    value: str
    """16 hex digits, the same in every rank of this launch on this node."""
    source: str
    """Where it came from, for messages."""


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _first_process_start() -> str:
    """Field 22 of /proc/1/stat: when pid 1 of this process tree started (clock ticks since boot)."""
    found = procstat.fields(1)
    return found[procstat.START_TIME] if found and len(found) > procstat.START_TIME else ""


def torchrun_attempt(env: Mapping[str, str]) -> str | None:
    """torchrun's attempt directory from TORCHELASTIC_ERROR_FILE, when it has torchrun's shape."""
    found = _ATTEMPT.match(env.get("TORCHELASTIC_ERROR_FILE", "").strip())
    return found.group("attempt") if found else None


def node_generation(env: Mapping[str, str], local_size: int) -> Generation | None:
    """This launch's generation on this node (see the module docstring); None when none can be known."""
    explicit = (env.get(contract.LAUNCH_ID) or "").strip()
    if explicit:
        return Generation(_digest("launch", explicit), contract.LAUNCH_ID)
    attempt = torchrun_attempt(env)
    if attempt:
        return Generation(_digest("torchrun", attempt), "torchrun's attempt directory (TORCHELASTIC_ERROR_FILE)")
    job = jobid.identify(env)
    if job.unique:
        boot = _read("/proc/sys/kernel/random/boot_id")
        return Generation(_digest("job", job.job_id, boot, _first_process_start()), f"the job id in {job.source}")
    if local_size <= 1:
        return Generation(secrets.token_hex(8), "one process on the node")
    return None


def refusal(local_size: int) -> str:
    """Why staging will not run without a generation, and what fixes it."""
    return (f"{local_size} local ranks cannot tell this launch from an earlier one on this node: no unique job id "
            f"({', '.join(jobid.ID_VARIABLES)}: unset or a placeholder such as torchrun's 'none') and no per-launch "
            f"id ({contract.LAUNCH_ID}, or torchrun's TORCHELASTIC_ERROR_FILE); an earlier launch's markers could "
            "release ranks before their data is staged")


REFUSAL_HINT = (f"export {contract.LAUNCH_ID}=$(cat /proc/sys/kernel/random/uuid) in the script that starts the "
                "node's ranks (before torchrun/mpirun), or give the job a unique id (torchrun --rdzv-id, "
                f"{contract.RUN_ID})")
