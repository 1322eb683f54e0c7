"""No dead code: every function, method and class the repository defines is used somewhere
else in it (called, imported, registered, or named in configuration such as pyproject.toml's
console scripts).

The check is by name: a definition whose name appears nowhere but in its own `def`/`class`
line is dead. It is deliberately simple (a name used anywhere counts), so it misses dead code
with a common name but never flags live code; the framework callbacks below are called by
the libraries they are written for.
"""

from __future__ import annotations

import ast
import collections
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = (".py", ".toml", ".yaml", ".yml", ".sh", ".cfg")
PACKAGES = ("amlhpc", "scripts", "bench", "tests")

CALLED_BY_FRAMEWORKS = {
    "new_resource", "call",          # pulumi.runtime.Mocks: the mock runtime calls them
    "create_module", "exec_module",  # importlib loaders (amlhpc/infra/plan/lazy_provider.py)
    "get_token", "get_token_info",   # azure-core's credential protocols
    "find_class", "persistent_load",  # pickle.Unpickler's hooks (amlhpc/jobs/runtime/checkpoint/safeload.py)
    "readinto",                      # io.RawIOBase: io.BufferedReader reads through it (checkpoint/ranged.py)
}


def tracked(suffixes: tuple[str, ...]) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [ROOT / name for name in listed
            if (name.endswith(suffixes) or name == "Makefile") and (ROOT / name).is_file()]


def definitions(path: Path) -> list[tuple[str, int]]:
    """(name, line) of the functions, methods and classes a module defines, but those that are
    plainly entry points: tests, fixtures and other decorated callables, dunders."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = node.name
            if name.startswith(("__", "test_", "Test")) or node.decorator_list or name in CALLED_BY_FRAMEWORKS:
                continue
            found.append((name, node.lineno))
    return found


def test_every_definition_is_used():
    words: collections.Counter[str] = collections.Counter()
    for path in tracked(CODE):
        words.update(re.findall(r"\b\w+\b", path.read_text(errors="replace")))
    dead = []
    for path in tracked((".py",)):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in PACKAGES or rel.name.startswith("test_") or rel.name == "conftest.py":
            continue
        for name, line in definitions(path):
            if words[name] <= 1:
                dead.append(f"{rel}:{line}: {name}")
    assert not dead, "defined but used nowhere (remove them, or use them):\n" + "\n".join(dead)
