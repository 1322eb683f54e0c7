"""`aml-hpc init [DIR]`: a team's project, ready to plan, rehearse and deploy with the installed tool.

The project holds only what is the team's: the Pulumi project whose program is aml-hpc's
installed one (Pulumi.yaml and a two-line __main__.py: Pulumi accepts only a program inside
the project folder, so the stub hands over to the installed package), the dev environment's
stack file to edit, a recipe in recipes/ with the team's training code in src/, a
.gitignore for what the tools write, and a README with the next commands. The files come
from template/ beside this module.

Nothing is overwritten, so it also starts a project in an existing repository: a
.gitignore there gets the missing lines appended, a README.md there is kept; any other file
of the project already there stops it before anything is written, and a failure half-way
removes what it wrote.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from amlhpc.core import invocation
from amlhpc.core.errors import Problem, UserError, exit_with

TEMPLATE = Path(__file__).resolve().parent / "template"
FILES = {
    "Pulumi.yaml": "Pulumi.yaml.in",
    "__main__.py": "__main__.py",
    "Pulumi.dev.yaml": "Pulumi.dev.yaml",
    "recipes/train.yaml": "recipes/train.yaml",
    "src/train.py": "src/train.py",
    ".gitignore": "gitignore",
    "README.md": "README.md.in",
}
"""What a new project holds: its path -> the template file (a template named like a project
file would make the package's own folder look like a project)."""
PROJECT_NAME = "@PROJECT@"
APPENDED = ".gitignore"
"""Extended, not replaced, when the folder has one."""
KEPT = "README.md"
"""Left as it is when the folder has one."""


def create(folder: Path) -> list[Path]:
    """Write a new project into `folder` (made when missing); the files written."""
    if folder.exists() and not folder.is_dir():
        raise UserError([Problem(str(folder), "", "is a file, not a folder", "name a new or empty folder")],
                        "cannot create the project")
    there = [name for name in FILES if (folder / name).exists() and name not in (APPENDED, KEPT)]
    if there:
        raise UserError([Problem(str(folder), "", f"already holds {', '.join(there)}, which a new project would overwrite",
                                 "choose another folder, or move them away first (nothing was written)")],
                        "cannot create the project")
    made_folders = [p for p in (folder, folder / "recipes", folder / "src") if not p.exists()]
    written: list[Path] = []
    appended: tuple[Path, str] | None = None
    try:
        for name, source in FILES.items():
            target = folder / name
            text = (TEMPLATE / source).read_text().replace(PROJECT_NAME, folder.resolve().name)
            if name == KEPT and target.exists():
                continue
            if name == APPENDED and target.exists():
                before = target.read_text()
                missing = [line for line in text.splitlines() if line and not line.startswith("#")
                           and line not in before.splitlines()]
                if missing:
                    appended = (target, before)
                    target.write_text(before + ("" if before.endswith("\n") or not before else "\n")
                                      + "# aml-hpc\n" + "\n".join(missing) + "\n")
                    written.append(target)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            written.append(target)
    except BaseException:
        for path in written:
            if appended is not None and path == appended[0]:
                path.write_text(appended[1])
            else:
                path.unlink(missing_ok=True)
        for made in reversed(made_folders):
            if made.is_dir() and not any(made.iterdir()):
                made.rmdir()
        raise
    return written


def next_steps(folder: Path) -> list[tuple[str, str]]:
    """(command, why) to run next, as this user runs aml-hpc."""
    relative = os.path.relpath(folder)
    shown = relative if not relative.startswith("..") else str(folder.resolve())
    return [
        *([(f"cd {shown}", "")] if shown != "." else []),
        (invocation.command("jobs", "recipes"), "train (yours) beside aml-hpc's built-in recipes"),
        (invocation.command("infra", "plan --stack dev"), "offline: what dev declares, its cost and GPU quota"),
        (invocation.command("jobs", "submit train --stack dev --offline --dry-run --out .scratch/train.yml"),
         "the job as Azure ML YAML"),
        (invocation.command("jobs", "run train --local"), "rehearse it here (PyTorch and Azurite: README.md)"),
        (invocation.command("infra", "preview dev"), "against Azure, once Pulumi.dev.yaml is yours"),
    ]


def init_command(
    directory: Annotated[Path, typer.Argument(metavar="[DIR]", help="The project folder to create (default: this one).",
                                              file_okay=False)] = Path("."),
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Create a team project in DIR: Pulumi.yaml running aml-hpc's installed program,
    Pulumi.dev.yaml to edit, recipes/train.yaml with the training code in src/, .gitignore, README.md."""
    try:
        written = create(directory)
    except UserError as exc:
        exit_with(exc, debug)
    print(f"created an aml-hpc project in {directory.resolve()}: "
          + ", ".join(str(p.relative_to(directory)) for p in written))
    print("next:")
    for command, why in next_steps(directory):
        print(f"  # {why}\n  {command}" if why else f"  {command}")
