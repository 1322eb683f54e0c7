"""pulumi_azure_native for the offline plan: each service module loads only what it is asked for.

Every service package of azure-native (`pulumi_azure_native.network`, `.storage`, ...)
imports all of its resources and functions in its `__init__`: about 290 files for
`network`, where the plan uses seven. Importing the twelve packages the program uses
cost about 2 CPU seconds, most of a first evaluation (cProfile and `python -X importtime`;
bench/RESULTS.md).

`install()` puts a finder in front of the import system that gives those packages a
module whose names are loaded on first use (PEP 562 `__getattr__`): `network.Subnet`
imports `network/subnet.py` (and, through it, the package's `_inputs`, `outputs` and
`_enums`, as always). The classes are the SDK's own, unchanged. Which file defines a name
is read from the `__all__` list at the top of each generated file; a name found nowhere
falls back to running the package's own `__init__`, so nothing can be missing, only slower.

Only the offline plan installs this (`pulumi up` runs the stock package), and
`AMLHPC_PLAN_EAGER_IMPORTS=1` turns it off: tests/test_plan_determinism.py checks both
give the byte-identical plan.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

PACKAGE = "pulumi_azure_native"
EAGER_ENV = "AMLHPC_PLAN_EAGER_IMPORTS"
_SKIP = {"config"}  # provider configuration, not a service module
_ALL = re.compile(r"^__all__ = \[([^\]]*)\]", re.M)
_NAME = re.compile(r"'(\w+)'")
_HEAD_BYTES = 8192


def exported_names(path: Path) -> list[str]:
    """The names a generated module lists in its `__all__` (read from the source, not run)."""
    with path.open("rb") as f:
        head = f.read(_HEAD_BYTES).decode("utf-8", "replace")
    match = _ALL.search(head)
    if match is None:  # a long __all__ that ends past the head
        match = _ALL.search(path.read_text(encoding="utf-8"))
    return _NAME.findall(match.group(1)) if match else []


def index(package_dir: Path) -> dict[str, str]:
    """name -> the submodule of a service package that defines it (its own resource files)."""
    names: dict[str, str] = {}
    for entry in os.scandir(package_dir):
        stem, ext = os.path.splitext(entry.name)
        if ext != ".py" or stem.startswith("_") or stem == "outputs":
            continue
        for name in exported_names(Path(entry.path)):
            names.setdefault(name, stem)
    return names


class _ServiceModule:
    """The lookups behind one lazily loaded service package."""

    def __init__(self, module: types.ModuleType, stock_loader: importlib.abc.Loader):
        self.module = module
        self.stock_loader = stock_loader
        spec = module.__spec__
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"{module.__name__} is not a package: no submodule search location", name=module.__name__)
        self.directory = Path(spec.submodule_search_locations[0])
        self._index: dict[str, str] | None = None
        self._stock_loaded = False

    def _submodule(self, stem: str) -> types.ModuleType:
        return importlib.import_module(f"{self.module.__name__}.{stem}")

    def _has_submodule(self, name: str) -> bool:
        return (self.directory / f"{name}.py").is_file() or (self.directory / name / "__init__.py").is_file()

    def resolve(self, name: str) -> Any:
        if name.startswith("__") or self._stock_loaded:
            raise AttributeError(f"module {self.module.__name__!r} has no attribute {name!r}")
        if self._index is None:
            self._index = index(self.directory)
        value: Any = _MISSING
        if name in self._index:
            value = getattr(self._submodule(self._index[name]), name, _MISSING)
        elif self._has_submodule(name):
            value = self._submodule(name)
        else:
            for shared in ("_enums", "_inputs"):
                if self._has_submodule(shared):
                    value = getattr(self._submodule(shared), name, _MISSING)
                    if value is not _MISSING:
                        break
        if value is _MISSING:
            # Not where the generated layout puts it: run the package's own __init__.
            self._stock_loaded = True
            self.stock_loader.exec_module(self.module)
            value = self.module.__dict__.get(name, _MISSING)
            if value is _MISSING:
                raise AttributeError(f"module {self.module.__name__!r} has no attribute {name!r}")
        setattr(self.module, name, value)
        return value

    def names(self) -> list[str]:
        if self._index is None:
            self._index = index(self.directory)
        return sorted(set(self.module.__dict__) | set(self._index))


_MISSING = object()


class _LazyServiceLoader(importlib.abc.Loader):
    def __init__(self, stock_loader: importlib.abc.Loader):
        self.stock_loader = stock_loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        service = _ServiceModule(module, self.stock_loader)
        # PEP 562: a module's __getattr__ and __dir__ are entries of its namespace.
        module.__dict__["__getattr__"] = service.resolve
        module.__dict__["__dir__"] = service.names


class _ServiceFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        parts = fullname.split(".")
        if len(parts) != 2 or parts[0] != PACKAGE or parts[1] in _SKIP:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.submodule_search_locations is None or spec.loader is None:
            return None  # a plain module (provider.py, _utilities.py): loaded as usual
        spec.loader = _LazyServiceLoader(spec.loader)
        return spec


_FINDER = _ServiceFinder()


def install() -> bool:
    """Load azure-native service packages lazily from now on. False when turned off by
    AMLHPC_PLAN_EAGER_IMPORTS=1. Packages already loaded stay as they are."""
    if os.environ.get(EAGER_ENV, "") not in ("", "0"):
        return False
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return True


def installed() -> bool:
    return _FINDER in sys.meta_path
