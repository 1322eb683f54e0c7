"""Refuse the wrong Python in one line, before anything that needs the right one is imported.

`python3 -m amlhpc.jobs` with a system Python (too old, or without the project's packages) would
otherwise end in a syntax error or a "No module named typer" traceback. Each entry point
calls `check()` first. Written for any Python 3.6 or newer to run, so it can say so itself.
"""

import importlib.util
import sys

from amlhpc.core import invocation

SUPPORTED = ((3, 11), (3, 13))
"""The oldest and newest minor version pyproject.toml's requires-python allows."""
NEEDED = ("typer", "rich", "pydantic", "yaml")
"""What every command line imports first."""


def problem(version=None, find_spec=importlib.util.find_spec):
    """What is wrong with this interpreter for aml-hpc, or None."""
    version = tuple(sys.version_info[:2]) if version is None else tuple(version)
    shown = "{}.{}".format(*version)
    oldest, newest = SUPPORTED
    if not oldest <= version <= newest:
        return f"{sys.executable} is Python {shown}; aml-hpc needs Python {oldest[0]}.{oldest[1]} to {newest[0]}.{newest[1]}"
    missing = [name for name in NEEDED if find_spec(name) is None]
    if missing:
        return "{} (Python {}) does not have aml-hpc's dependencies ({} missing)".format(
            sys.executable, shown, ", ".join(missing))
    return None


def fix(program):
    """What to run instead: the clone's environment, or the installed command."""
    command = "aml-hpc" if program == "amlhpc" else "aml-hpc " + program
    if invocation.from_clone():
        module = program if program == "amlhpc" else "amlhpc." + program
        return (f"fix: run `make bootstrap` and then `.venv/bin/python -m {module} ...` from the repository, "
                f"or install the tool (`uv tool install aml-hpc`, see README) and run `{command} ...`")
    (old_major, old_minor), (new_major, new_minor) = SUPPORTED
    return (f"fix: run `{command} ...`, the command the install put on PATH, or reinstall aml-hpc into a Python "
            f"{old_major}.{old_minor} to {new_major}.{new_minor} (`uv tool install aml-hpc` or `pip install aml-hpc`)")


def check(program):
    """Exit 2 with one line when this interpreter cannot run aml-hpc's `program`."""
    found = problem()
    if found:
        sys.stderr.write(f"error: {found}: {fix(program)}\n")
        raise SystemExit(2)
