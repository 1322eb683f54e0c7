"""Mounted inputs pinned to a dataset version when a job is submitted.

Azure ML mounts (or downloads) a folder, not a manifest: a recipe's `download` or `ro_mount`
input that names no version would read `<path>/` whole - every version `jobs data upload` wrote
there, and the files of one still being written. Staged inputs take the latest committed
version when the job stages (every node agrees on its manifest); a mounted one cannot choose
inside the job without the nodes agreeing, so `jobs submit` chooses before the job exists: it
lists `<path>/_versions/` once, pins the input to `<path>/v<k>/` of the latest committed
version, and says so. The job definition then names one version, the same on every node and
in every attempt of a managed run, and Studio shows which.

A folder with no committed version (data not written by `jobs data upload`) is mounted whole,
as before, with the plan's warning; a listing that fails (no read right, no network) says why
and mounts the folder whole too - the submission never fails on it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from amlhpc.core.outputs import StackOutputs
from amlhpc.jobs.data import versions as dataset_versions
from amlhpc.jobs.data.upload import describe_azure_error
from amlhpc.jobs.recipes.schema import Recipe
from amlhpc.jobs.runtime.blob import blobio
from amlhpc.jobs.runtime.staging import dataversion

Lister = Callable[[str], dataversion.Versions]
"""A dataset's prefix -> its versions (amlhpc.jobs.data.versions.list_versions on a container)."""


@dataclass
class Pinned:
    recipe: Recipe
    """The recipe with each pinned input's version set."""
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def pin_mounted_inputs(recipe: Recipe, lister: Lister,
                       describe_error: Callable[[BaseException], str] = describe_azure_error) -> Pinned:
    """Each `download` / `ro_mount` input that names no version, pinned to its dataset's latest committed version."""
    inputs = dict(recipe.inputs)
    found = Pinned(recipe)
    for name, spec in recipe.inputs.items():
        if spec.mode == "stage" or spec.version is not None or not spec.path:
            continue
        prefix = spec.path.strip("/")
        try:
            versions = lister(prefix)
        except Exception as exc:  # noqa: BLE001 - the job still runs on the whole folder, and the user is told
            found.warnings.append(f"input {name!r}: could not list {dataversion.versions_prefix(prefix)} "
                                  f"({describe_error(exc)}); Azure ML mounts {prefix}/ whole: set "
                                  f"inputs.{name}.version=K to read one version")
            continue
        if versions.latest is None:
            if versions.writing:
                found.warnings.append(f"input {name!r}: {prefix} has no committed version yet ({versions.describe()})")
            continue
        inputs[name] = spec.model_copy(update={"version": versions.latest})
        busy = f"; {', '.join(map(str, sorted(versions.writing)))} still being written" if versions.writing else ""
        found.notes.append(f"input {name!r} ({spec.mode}): version {versions.latest} of {prefix}, the latest "
                           f"committed{busy}; pinned in the job ({dataversion.data_prefix(prefix, versions.latest)}/)")
    if found.notes:
        found.recipe = recipe.model_copy(update={"inputs": inputs})
    return found


def stack_lister(outputs: StackOutputs) -> Lister:
    """Lists a dataset's versions in the stack's `datasets` container as the signed-in user (the
    permission model's submitter-<i>-datasets-read), as `jobs submit --managed` writes its record."""
    container = functools.cache(lambda: blobio.container_client_from_env(outputs.storage.containers["datasets"],
                                                                          outputs.storage.blob_endpoint))
    return lambda prefix: dataset_versions.list_versions(container(), prefix)
