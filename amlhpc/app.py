"""The console commands the wheel installs.

    aml-hpc [--project DIR] infra|jobs|images|doctor ...
    aml-hpc init [DIR]                                    (a new team project: amlhpc/scaffold/)
    aml-hpc-infra | aml-hpc-jobs | aml-hpc-images ...     (the same apps, one each)

`--project DIR` names the project (the folder with Pulumi.yaml and the stack files);
without it the project is found from the current folder upwards (amlhpc/core/project.py). It is
taken off the command line before anything else is imported, because the parts read the
project's location when they load, and passed on to every process a command starts
(AMLHPC_PROJECT). It may stand anywhere on the line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from amlhpc.core import project
from amlhpc.core.cli_help import VersionOption, new_app, run
from amlhpc.core.errors import EXIT_USAGE

PROJECT_OPTION = "--project"


def take_project(argv: list[str]) -> tuple[list[str], str | None]:
    """(argv without `--project DIR` / `--project=DIR`, DIR or None)."""
    rest, chosen, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i:]
            break
        if arg == PROJECT_OPTION:
            if i + 1 >= len(argv):
                _refuse(f"{PROJECT_OPTION} needs a folder: {PROJECT_OPTION} DIR")
            chosen, i = argv[i + 1], i + 2
            continue
        if arg.startswith(PROJECT_OPTION + "="):
            chosen, i = arg.split("=", 1)[1], i + 1
            continue
        rest.append(arg)
        i += 1
    return rest, chosen


def _refuse(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(EXIT_USAGE)


def enter_project(argv: list[str]) -> list[str]:
    """Apply `--project DIR` (checked: it must hold a Pulumi.yaml) for this process and its children."""
    rest, chosen = take_project(argv)
    if chosen is not None:
        folder = Path(chosen).expanduser().resolve()
        if not project.is_project(folder):
            _refuse(f"{PROJECT_OPTION} {chosen}: no {project.PROJECT_FILE} in {folder}: fix: pass the folder that "
                    f"holds the project's {project.PROJECT_FILE} and Pulumi.<stack>.yaml files")
        os.environ[project.ENV_VARIABLE] = str(folder)
    return rest


def build() -> typer.Typer:
    """`aml-hpc`: the three apps under one command, and `doctor`."""
    from amlhpc.doctor.cli import doctor
    from amlhpc.images.cli import app as images_app
    from amlhpc.infra.cli import app as infra_app
    from amlhpc.jobs.cli.main import app as jobs_app
    from amlhpc.scaffold import init_command

    app = new_app("aml-hpc: platform-as-code for distributed GPU training on Azure Machine Learning.")

    @app.callback()
    def _root(
        version: VersionOption = False,
        project_dir: Annotated[Path | None, typer.Option(
            PROJECT_OPTION, metavar="DIR",
            help="The project folder (its Pulumi.yaml and Pulumi.<stack>.yaml); default: found from the current "
                 "folder upwards.")] = None,
    ) -> None:
        """aml-hpc: start a team project (init), plan and deploy the platform (infra), run training on it (jobs),
        build its images (images)."""

    app.add_typer(infra_app, name="infra", help="Plan, preview, deploy and tear down stacks; experiment stacks.")
    app.add_typer(jobs_app, name="jobs", help="Recipes, submission, rehearsals, runs, logs and reports.")
    app.add_typer(images_app, name="images", help="Training images: build, list, check.")
    app.command("doctor")(doctor)
    app.command("init")(init_command)
    return app


def main() -> None:
    argv = enter_project(sys.argv[1:])
    run(build(), "aml-hpc", argv)


ONE_APP = {"aml-hpc-infra": "amlhpc.infra.cli", "aml-hpc-jobs": "amlhpc.jobs.cli.main",
           "aml-hpc-images": "amlhpc.images.cli"}
"""The one-app commands and the module whose `app` each runs."""


def one_app(prog_name: str) -> typer.Typer:
    """The typer app behind aml-hpc-infra, aml-hpc-jobs or aml-hpc-images."""
    app: typer.Typer = __import__(ONE_APP[prog_name], fromlist=["app"]).app
    return app


def _one(prog_name: str) -> None:
    argv = enter_project(sys.argv[1:])
    run(one_app(prog_name), prog_name, argv)


def infra_main() -> None:
    _one("aml-hpc-infra")


def jobs_main() -> None:
    _one("aml-hpc-jobs")


def images_main() -> None:
    _one("aml-hpc-images")
