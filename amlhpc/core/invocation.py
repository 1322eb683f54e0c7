"""How the user runs aml-hpc here: from a clone of its repository, or installed from the wheel.

Every hint a command prints (a fix, the next step) must be a command the user can type. A
clone runs the parts as `python -m amlhpc.jobs ...` in its .venv and has make targets (`make
bootstrap`, `make clean`, `make up STACK=dev`); an install (pip, uv, `uv tool install`) has the
`aml-hpc` command and neither a Makefile nor a .venv of ours. This module decides which, once,
and spells the commands; hints call it rather than writing either form themselves.

The decision is made from where the package was imported: a clone is a folder holding
`amlhpc/` beside the repository's own Makefile and scripts/pulumi-stack.sh; anything else
(site-packages, a tool environment) is an install.

Written for any Python 3.6 or newer (amlhpc/core/interpreter.py uses it to say what is wrong
with the wrong Python), and imports only the standard library.
"""

import functools
import importlib.util
import shlex
import sys
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding `amlhpc/`: the clone, or site-packages."""
PARTS = ("jobs", "infra", "images")
CLEANED = (".rehearsal", ".scratch", ".azurite")
"""What the tools write into a project (`make clean` removes them in a clone)."""


@functools.cache
def from_clone() -> bool:
    """Whether aml-hpc runs from a clone of its repository (not from an installed wheel)."""
    return (PACKAGE_ROOT / "Makefile").is_file() and (PACKAGE_ROOT / "scripts" / "pulumi-stack.sh").is_file()


def _join(*words: str) -> str:
    return " ".join(word for word in words if word)


def either(clone: str, installed: str) -> str:
    """`clone` when aml-hpc runs from a clone, else `installed`: for a hint with no helper below."""
    return clone if from_clone() else installed


def command(part: str, args: str = "") -> str:
    """The command that runs aml-hpc's `part` ("jobs", "infra", "images", "doctor" or "" for
    the top level) with `args`: `python -m amlhpc.jobs ARGS` in a clone, `aml-hpc jobs ARGS`
    when installed."""
    if not from_clone():
        return _join("aml-hpc", part, args)
    if part in PARTS:
        return _join("python -m amlhpc." + part, args)
    return _join("python -m amlhpc", part, args)


def spoken(text: str) -> str:
    """Free text written for a clone (a recipe's own hint naming `python -m amlhpc.jobs ...`)
    with each such command as this user runs it."""
    if from_clone():
        return text
    for part in PARTS:
        text = text.replace("python -m amlhpc." + part + " ", command(part) + " ")
    return text


def module(name: str, args: str = "") -> str:
    """The command that runs a module of the package that has no command of its own (e.g.
    amlhpc.core.availability): with the clone's .venv, or with the interpreter of the install."""
    python = ".venv/bin/python" if from_clone() else shlex.quote(sys.executable)
    return _join(python, "-m", name, args)


def deploy(action: str, stack: str, confirm: bool = False) -> str:
    """preview, up or down of a stack: `make up STACK=dev` in a clone, `aml-hpc infra up dev`
    when installed; `confirm` adds what tearing down an environment asks for."""
    if from_clone():
        return _join("make", action, "STACK=" + stack, "CONFIRM=" + stack if confirm else "")
    return _join("aml-hpc infra", action, stack, "--confirm " + stack if confirm else "")


def new_experiment(name: str = "NAME", env: str = "dev", days: str = "") -> str:
    """The command that writes an experiment's stack file."""
    if from_clone():
        return _join("make new-experiment", "NAME=" + name, "ENV=" + env, "DAYS=" + days if days else "")
    return _join("aml-hpc infra new-experiment", name, "--env " + env, "--days " + days if days else "")


def clean() -> str:
    """The command that removes what the tools wrote into the project (rehearsals, snapshots,
    the local Blob data); it keeps the Pulumi state."""
    if from_clone():
        return "make clean"
    return "rm -rf " + " ".join(folder + "/" for folder in CLEANED)


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
"""PyTorch's own index of CPU-only builds (pytorch.org, "Start Locally", 2025): without it pip
takes the default build, which on Linux carries the CUDA libraries (gigabytes a rehearsal on a
CPU never uses)."""


def _pip_install() -> str:
    """`pip install` into the environment running aml-hpc: its own pip, or uv's (an
    environment made by uv has no pip)."""
    python = ".venv/bin/python" if from_clone() else shlex.quote(sys.executable)
    if not from_clone() and importlib.util.find_spec("pip") is not None:
        return python + " -m pip install"
    return "uv pip install --python " + python


def torch_cpu() -> str:
    """The command that installs PyTorch's CPU build (and NumPy, which its object collectives
    need and it does not require) into the environment running aml-hpc."""
    return _pip_install() + " torch numpy --index-url " + TORCH_CPU_INDEX


AZURITE_NPM = "azurite@3"
"""The npm package of Microsoft's Blob emulator (package.json pins the exact release in a clone)."""


def azurite() -> str:
    """The command that installs Azurite (it needs Node.js 20 or newer)."""
    if from_clone():
        return "make bootstrap"
    return "npm install --global " + AZURITE_NPM


def python_modules(modules: str) -> str:
    """The command that installs Python modules into the environment running aml-hpc."""
    return _pip_install() + " " + modules
