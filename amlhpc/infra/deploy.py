"""`aml-hpc infra preview|up|down|destroy STACK`: Pulumi against Azure, from a clone or an install.

The rules of a deploy (one state container and passphrase per environment, which stacks a
CI environment may touch, adopting what an earlier `down` kept, the policy pack, CONFIRM
for an environment's teardown, retries on Azure RBAC propagation) live in one place:
scripts/pulumi-stack.sh, which `make preview|up|down` and the workflows call. The wheel
carries the same file (pyproject.toml's force-include puts it at
amlhpc/infra/scripts/pulumi-stack.sh), and these commands run it with what it needs to know
about an install:

- AMLHPC_PROJECT: the project folder (its Pulumi.yaml and stack files);
- AMLHPC_PYTHON: this interpreter, which Pulumi then runs the program and the policy pack
  with (PULUMI_PYTHON_CMD): a team's project has no .venv of its own;
- AMLHPC_POLICY_PACK: the installed policy pack;
- AMLHPC_TOOL: `aml-hpc infra` when installed, so its hints name these commands.

Before that, what this side can check is checked: the project, the stack name, the Pulumi
program the project's Pulumi.yaml names (a Pulumi.yaml copied from a clone of aml-hpc
names a program folder and a .venv a team's repository does not have), bash. The script then
goes as far as it can without Azure and stops with what is missing: the Pulumi CLI, the
passphrase, a subscription. Exit status: the script's (2 bad input, 0 done, Pulumi's own
otherwise), with its 127 for a missing CLI reported as 2, the status every command uses
for a missing tool.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from amlhpc.core import invocation, project
from amlhpc.core.errors import EXIT_USAGE, Problem, UserError, exit_with

SCRIPT_NAME = "pulumi-stack.sh"
INSTALLED_SCRIPT = Path(__file__).resolve().parent / "scripts" / SCRIPT_NAME
"""Where the wheel carries scripts/pulumi-stack.sh (pyproject.toml, force-include)."""
POLICY_PACK = Path(__file__).resolve().parent / "policy" / "pack"
ACTIONS = ("preview", "up", "down")
MISSING_CLI = 127
"""The script's status for a missing CLI (Pulumi)."""
_STACK = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def script() -> Path:
    """The deploy rules: the clone's scripts/pulumi-stack.sh, or the copy the wheel carries."""
    clone = invocation.PACKAGE_ROOT / "scripts" / SCRIPT_NAME
    return clone if invocation.from_clone() and clone.is_file() else INSTALLED_SCRIPT


def check_program(root: Path) -> None:
    """The Pulumi program the project's Pulumi.yaml names must be there, and its Python be the
    one Pulumi is given: a UserError naming the key and the fix otherwise."""
    path = root / project.PROJECT_FILE
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError([Problem(str(path), "", f"not valid YAML: {exc}", "fix the file, or make a new project with "
                                 "`aml-hpc init DIR` and copy your stack files into it")], "invalid Pulumi.yaml") from None
    runtime = document.get("runtime") if isinstance(document, dict) else None
    options = runtime.get("options") if isinstance(runtime, dict) else None
    main = str(document.get("main") or ".") if isinstance(document, dict) else "."
    problems = []
    program = root / main
    if not (program / "__main__.py").is_file() and not (program.is_file() and program.suffix == ".py"):
        problems.append(Problem(str(path), "main", f"names {main!r}, which holds no Pulumi program (__main__.py) here",
                                "a project runs aml-hpc's installed program through a two-line __main__.py beside "
                                "Pulumi.yaml, with no `main:` key: `aml-hpc init NEWDIR` writes both; copy them"))
    venv = options.get("virtualenv") if isinstance(options, dict) else None
    if venv and not (root / str(venv)).is_dir():
        problems.append(Problem(str(path), "runtime.options.virtualenv", f"names {venv!r}, which is not here",
                                "delete the key: aml-hpc runs the program with the Python it is installed in"))
    if problems:
        raise UserError(problems, "the project's Pulumi program cannot run")


def environment(root: Path, confirm: str | None) -> dict[str, str]:
    """What the script is told about this run (see the module docstring)."""
    env = dict(os.environ)
    env.update({"AMLHPC_PROJECT": str(root), "AMLHPC_PYTHON": sys.executable, "AMLHPC_POLICY_PACK": str(POLICY_PACK)})
    if not invocation.from_clone():
        env["AMLHPC_TOOL"] = "aml-hpc infra"
    if confirm is not None:
        env["CONFIRM"] = confirm
    return env


def run(action: str, stack: str, extra: list[str], confirm: str | None = None) -> int:
    """Run the script for `action` on `stack`; its exit status (a missing CLI as EXIT_USAGE)."""
    root = project.require(project.root())
    if not _STACK.match(stack):
        raise UserError([Problem("STACK", stack, "is not a stack name",
                                 "stack names are lowercase letters, digits and hyphens, e.g. dev or exp-bert")],
                        "invalid stack")
    check_program(root)
    bash = shutil.which("bash")
    if bash is None:
        raise UserError([Problem("bash", "", "is not on PATH (the deploy steps are a bash script)",
                                 "run it where bash is (Linux, macOS, WSL, Git Bash)")], "missing tool")
    argv = [bash, str(script()), action, stack, *(["--", *extra] if extra else [])]
    status = subprocess.run(argv, cwd=root, env=environment(root, confirm), check=False).returncode
    return EXIT_USAGE if status == MISSING_CLI else status


StackArgument = Annotated[str, typer.Argument(help="The stack: Pulumi.STACK.yaml in the project.")]
PulumiArguments = Annotated[list[str] | None, typer.Argument(
    metavar="-- PULUMI_ARGS", help="Passed on to pulumi after --, e.g. -- --diff --target URN.", show_default=False)]
DebugOption = Annotated[bool, typer.Option("--debug", help="Show tracebacks.")]


def _finish(action: str, stack: str, extra: list[str] | None, confirm: str | None, debug: bool) -> None:
    try:
        status = run(action, stack, list(extra or []), confirm)
    except UserError as exc:
        exit_with(exc, debug)
    raise typer.Exit(status)


def preview_command(stack: StackArgument, extra: PulumiArguments = None, debug: DebugOption = False) -> None:
    """Preview STACK against Azure: refresh, the changes, and the policy pack (needs the Pulumi
    CLI, az login and the stack's passphrase; creates the stack on its backend the first time)."""
    _finish("preview", stack, extra, None, debug)


def up_command(stack: StackArgument, extra: PulumiArguments = None, debug: DebugOption = False) -> None:
    """Deploy STACK: what preview shows, applied after you confirm (an environment first takes back
    what an earlier down kept)."""
    _finish("up", stack, extra, None, debug)


def down_command(
    stack: StackArgument,
    extra: PulumiArguments = None,
    confirm: Annotated[str | None, typer.Option(
        "--confirm", metavar="STACK", help="An environment stack is torn down only when this names it again.")] = None,
    debug: DebugOption = False,
) -> None:
    """Tear STACK down: an experiment goes with its stack; an environment (with --confirm STACK)
    keeps its protected and retained resources, data included, for the next up to adopt."""
    _finish("down", stack, extra, confirm, debug)
