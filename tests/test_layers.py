"""The layers of docs/layout.md hold: every import goes down the table, and no two modules
import each other, directly or through others. Every import counts, inside functions too."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "docs" / "layout.md"


@cache
def table() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """row -> (module prefixes, rows it may import directly), from docs/layout.md."""
    text = LAYOUT.read_text()
    block = text.split("<!-- layers -->", 1)[1].split("<!-- /layers -->", 1)[0]
    rows = {}
    for line in block.strip().splitlines()[2:]:
        name, modules, allowed = (cell.strip() for cell in line.strip().strip("|").split("|"))
        rows[name] = (tuple(re.findall(r"`([\w.]+)`", modules)),
                      tuple(a.strip() for a in allowed.split(",") if a.strip()))
    return rows


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "amlhpc").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def _module_of(name: str) -> str | None:
    """The module `name` is, or the module it is an attribute of."""
    known = modules()
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imported(source: str) -> set[str]:
    """Every module or `module.name` the source imports (absolute imports)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


@cache
def graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports, anywhere in its source."""
    edges: dict[str, set[str]] = {}
    for name, path in modules().items():
        found = {m for t in imported(path.read_text()) if t.startswith("amlhpc") and (m := _module_of(t))}
        found.discard(name)
        edges[name] = found
    return edges


def row_of(module: str) -> str | None:
    best, length = None, -1
    for row, (prefixes, _) in table().items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = row, len(prefix)
    return best


@cache
def reachable(row: str) -> frozenset[str]:
    """The rows `row` may import: its own, its column's, and theirs."""
    seen, todo = {row}, list(table()[row][1])
    while todo:
        other = todo.pop()
        if other not in seen:
            seen.add(other)
            todo.extend(table()[other][1])
    return frozenset(seen)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_table_names_rows_that_exist():
    rows = table()
    assert len(rows) > 15, "docs/layout.md lost its layer table"
    for name, (prefixes, allowed) in rows.items():
        assert prefixes, f"row {name} names no modules"
        assert not set(allowed) - set(rows), f"row {name} may import rows the table lacks: {set(allowed) - set(rows)}"


def test_every_module_has_a_row():
    assert [m for m in modules() if row_of(m) is None] == []


def test_every_import_goes_down_the_table():
    wrong = sorted(f"{a} ({row_of(a)}) imports {b} ({row_of(b)})"
                   for a, targets in graph().items() for b in targets
                   if row_of(b) not in reachable(row_of(a) or ""))
    assert wrong == []


def test_no_module_imports_itself_through_others():
    assert cycles(graph()) == []


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
])
def test_the_cycle_finder_finds_cycles(edges, expected):
    assert sorted(cycles(edges)) == expected


def test_a_lazy_import_counts():
    """An import inside a function is an edge like any other (they hid the old cycles)."""
    source = "def f():\n    from amlhpc.jobs.runtime.launch import launcher\n"
    assert imported(source) == {"amlhpc.jobs.runtime.launch.launcher"}
    assert row_of("amlhpc.jobs.runtime.launch.launcher") not in reachable("runtime.checkpoint")
