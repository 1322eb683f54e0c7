"""The rehearsal's small datasets: made by the recipe's local profile, uploaded once.

A staged input with no blobs under its prefix in the local Blob (Azurite), and no `--data`
for it, gets the dataset its profile describes (`local.data.<input>`: a command writing
into `{dir}`, e.g. the CosmoFlow generator with the demo's sizes). It is generated once
into `.scratch/local-data/<recipe>/<input>/` and uploaded gzip-encoded exactly as
`jobs data upload` would; later rehearsals find the blobs (Azurite's data in .azurite/
is kept between runs) or reuse the folder.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amlhpc.core import project
from amlhpc.core.errors import Problem, UserError
from amlhpc.jobs.local import processes

DATA_ROOT = project.scratch() / "local-data"
_DONE = ".complete"
"""Suffix of the marker written beside the folder once the generator succeeded: a folder
without it is regenerated (the marker is not inside, so it is not uploaded)."""


GIVEN_ROOT = "rehearsal-data"
"""Where `--data INPUT=DIR` uploads, in the datasets container: never the recipe's own input
path, whose blobs (an earlier upload, the profile's dataset) would be staged with DIR's."""


def given_prefix(input_name: str, folder: Path) -> str:
    """The Blob prefix of `--data INPUT=DIR`: `rehearsal-data/<input>/<fingerprint>`, where the
    fingerprint is of DIR's file list (relative path, size, modification time). The same
    folder maps to the same prefix (a rerun uploads nothing); any added, removed or changed
    file to a new one, so the prefix holds exactly the folder's files."""
    import hashlib

    from amlhpc.jobs.data.walk import scan

    digest = hashlib.sha256()
    for f in scan(folder).files:
        digest.update(f"{f.rel}\0{f.size}\0{f.mtime_ns}\n".encode())
    return f"{GIVEN_ROOT}/{input_name}/{digest.hexdigest()[:16]}"


def has_blobs(spec: dict[str, Any], connection_string: str) -> bool:
    from amlhpc.jobs.runtime.blob import blobio

    client = blobio.container_client(spec["container"], connection_string=connection_string)
    prefix = spec.get("prefix", "").rstrip("/") + "/"
    return client.exists() and next(iter(client.list_blobs(name_starts_with=prefix)), None) is not None


def generate(recipe, name: str, echo: Callable[[str], None], root: Path = DATA_ROOT) -> Path:
    """The profile's dataset for input `name`, generated unless a complete one is there."""
    folder = root / recipe.name / name
    done = folder.with_name(name + _DONE)
    if done.is_file() and folder.is_dir():
        echo(f"the local dataset for input {name!r}: {folder.relative_to(root.parent.parent) if folder.is_relative_to(root.parent.parent) else folder} (made earlier)")
        return folder
    done.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    command = recipe.local.data[name].replace("{dir}", shlex.quote(str(folder)))
    argv = shlex.split(command)
    if argv and argv[0] == "python":
        argv[0] = sys.executable  # the job's `python` is this interpreter, as in the rehearsal
    echo(f"generating the local dataset for input {name!r}: {command}")
    code = processes.run_step(argv, cwd=project.root(), env=None)  # a team's command names the project's files
    if code != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise UserError([Problem(recipe.reference, f"local.data.{name}", f"the command exited with {code}",
                                 f"run it by hand to see why: {command}")], "cannot make the local dataset")
    done.write_text(command + "\n")
    return folder


def provide(plan, recipe, given: dict[str, Path], connection_string: str, echo: Callable[[str], None],
            upload: Callable[[Any, dict[str, Path], str, Callable[[str], None]], None]) -> None:
    """Make sure each staged input has blobs: --data folders are uploaded by the caller; an
    input with none gets its profile's dataset (generated, then uploaded with `upload`)."""
    wanted = {}
    for spec in plan.staged_inputs:
        name = spec["name"]
        if name in given or name not in recipe.local.data or has_blobs(spec, connection_string):
            continue
        wanted[name] = generate(recipe, name, echo)
    if wanted:
        upload(plan, wanted, connection_string, echo)
