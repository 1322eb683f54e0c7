"""Where the user's aml-hpc project is, as opposed to where aml-hpc's own code is.

aml-hpc's code and data (recipes, the SKU catalog, Dockerfiles, the workloads) ship in its
package: `PACKAGE_ROOT` is the folder holding `amlhpc/` (a clone of the repository, or
site-packages when installed). A *project* is the folder with
the `Pulumi.yaml` and `Pulumi.<stack>.yaml` files a team edits; the tools also write there
(.scratch/, .rehearsal/, .azurite/). `root()` finds it, in this order:

1. `AMLHPC_PROJECT` (what `aml-hpc --project DIR` sets for itself and every process it starts);
2. the nearest folder at or above the current directory that holds a Pulumi.yaml, so a
   command works from any subfolder of a project;
3. the clone these packages run from, when it is a project itself (`python -m amlhpc.jobs` from
   the repository root);
4. the current directory (jobs that need no stack file: `--outputs FILE` or a deployed stack).

Imports nothing heavy: the `aml-hpc` entry point uses it before anything else is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path

from amlhpc.core.errors import Problem, UserError

ENV_VARIABLE = "AMLHPC_PROJECT"
PROJECT_FILE = "Pulumi.yaml"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
SCRATCH = ".scratch"


def find(start: Path) -> Path | None:
    """The nearest folder at or above `start` holding a Pulumi.yaml."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / PROJECT_FILE).is_file():
            return folder
    return None


def root(cwd: Path | None = None, environ: dict[str, str] | None = None) -> Path:
    """The project folder (see the module docstring for the order)."""
    environ = dict(os.environ) if environ is None else environ
    given = environ.get(ENV_VARIABLE, "").strip()
    if given:
        return Path(given).expanduser().resolve()
    here = Path.cwd() if cwd is None else cwd
    found = find(here)
    if found is not None:
        return found
    if (PACKAGE_ROOT / PROJECT_FILE).is_file():
        return PACKAGE_ROOT
    return here.resolve()


def is_project(folder: Path) -> bool:
    return (folder / PROJECT_FILE).is_file()


def require(folder: Path) -> Path:
    """`folder` when it is a project; else the UserError that says how to get into one."""
    if is_project(folder):
        return folder
    raise UserError([Problem(str(folder), "", f"no aml-hpc project here: no {PROJECT_FILE} in this folder or any "
                             "folder above it",
                             f"cd into your project (the folder with {PROJECT_FILE} and the Pulumi.<stack>.yaml files), "
                             f"or pass --project DIR (aml-hpc) / set {ENV_VARIABLE}=DIR; a new project starts as a copy "
                             "of Pulumi.yaml and Pulumi.dev.yaml from the aml-hpc repository")],
                    "not in a project")


def scratch(cwd: Path | None = None, environ: dict[str, str] | None = None) -> Path:
    """Where the tools keep what they make (code snapshots, generated data): the project's
    .scratch/, or, outside any project, the user's cache folder rather than wherever the
    command happened to run."""
    folder = root(cwd, environ)
    if is_project(folder):
        return folder / SCRATCH
    environ = dict(os.environ) if environ is None else environ
    cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "aml-hpc"
