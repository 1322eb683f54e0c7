"""What a Python file imports, read from its source (a lazy import inside a function counts)."""

from __future__ import annotations

import ast
from pathlib import Path


def imports_of(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Every imported module, and `module.name` for each `from module import name`;
    relative imports are left out."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found
