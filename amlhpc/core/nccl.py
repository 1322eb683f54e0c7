"""The NCCL / UCX / MPI environment per VM size, as Azure sets it: amlhpc/core/catalog/nccl.toml as
frozen records.

Each setting names its variable, value, sizes, source and reason, and how the in-job
launcher adapts it to the node (`resolve`). amlhpc/jobs/plan/tuning.py picks the settings of a job's
size; docs/tuning.md lists them. Like amlhpc/core/skus.py, a malformed entry (unknown key, unknown
size or source, the same variable twice for one size) fails at load with the entry named.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from amlhpc.core import skus

CATALOG_FILE = Path(__file__).resolve().parent / "catalog" / "nccl.toml"

RESOLVE_KINDS = ("", "topology", "ib-port", "ib-ports", "imex")
"""How the launcher adapts a value to the node (amlhpc/jobs/runtime/node/nccl_env.py)."""
OPT_INS = ("", "sharp")
"""Recipe switches that turn settings on."""
DISTRIBUTIONS = ("pytorch", "mpi", "tensorflow")
"""Azure ML distribution types (a deepspeed recipe runs as pytorch)."""

_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$|^OMPI_MCA_[a-z0-9_]+$")


@dataclass(frozen=True)
class Setting:
    """One variable, one value, for some sizes, with its source and reason."""

    name: str
    value: str
    sizes: tuple[str, ...]
    source: str
    why: str
    resolve: str = ""
    opt_in: str = ""
    distributions: tuple[str, ...] = ()

    def applies(self, sku_name: str, distribution: str, opt_ins: Iterable[str] = ()) -> bool:
        return (sku_name in self.sizes and (not self.opt_in or self.opt_in in set(opt_ins))
                and (not self.distributions or distribution in self.distributions))


class NcclCatalogError(ValueError):
    """amlhpc/core/catalog/nccl.toml is malformed: names the entry and the key."""


def _load(path: Path) -> tuple[tuple[Setting, ...], dict[str, skus.Source]]:
    document = tomllib.loads(path.read_text())
    sources = {key: skus.Source(id=key, **value) for key, value in document.get("sources", {}).items()}
    known = {f.name for f in fields(Setting)}
    settings: list[Setting] = []
    seen: dict[tuple[str, str, str, tuple[str, ...]], int] = {}
    for i, raw in enumerate(document.get("setting", [])):
        where = f"{path.name}: setting[{i}] ({raw.get('name', '?')})"
        unknown = sorted(set(raw) - known)
        if unknown:
            raise NcclCatalogError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        try:
            setting = Setting(**values)
        except TypeError as exc:
            raise NcclCatalogError(f"{where}: {exc}") from None
        problems = []
        if not _NAME.match(setting.name):
            problems.append(f"name {setting.name!r} is not an environment variable name")
        if setting.source not in sources:
            problems.append(f"source {setting.source!r} is not in [sources] ({', '.join(sorted(sources))})")
        unknown_sizes = [s for s in setting.sizes if s not in skus.CATALOG]
        if unknown_sizes or not setting.sizes:
            problems.append(f"sizes {unknown_sizes or '[]'} are not in amlhpc/core/catalog/skus.toml")
        if setting.resolve not in RESOLVE_KINDS:
            problems.append(f"resolve {setting.resolve!r} is not one of {RESOLVE_KINDS}")
        if setting.opt_in not in OPT_INS:
            problems.append(f"opt_in {setting.opt_in!r} is not one of {OPT_INS}")
        if any(d not in DISTRIBUTIONS for d in setting.distributions):
            problems.append(f"distributions {list(setting.distributions)} must be among {DISTRIBUTIONS}")
        if not setting.why.strip():
            problems.append("why is empty: say what the value does for the job")
        if problems:
            raise NcclCatalogError(f"{where}: " + "; ".join(problems))
        for size in setting.sizes:
            key = (setting.name, size, setting.opt_in, setting.distributions)
            if key in seen:
                raise NcclCatalogError(f"{where}: {setting.name} is set twice for {size} (also setting[{seen[key]}])")
            seen[key] = i
        settings.append(setting)
    return tuple(settings), sources


SETTINGS, _sources = _load(CATALOG_FILE)
SOURCES: MappingProxyType[str, skus.Source] = MappingProxyType(_sources)


def for_size(sku_name: str, distribution: str = "pytorch", opt_ins: Iterable[str] = ()) -> list[Setting]:
    """The settings of one size, distribution and set of recipe opt-ins, in catalog order."""
    wanted = set(opt_ins)
    return [s for s in SETTINGS if s.applies(sku_name, distribution, wanted)]


def available_opt_ins(sku_name: str) -> set[str]:
    """The opt-ins (e.g. sharp) that change anything on this size."""
    return {s.opt_in for s in SETTINGS if s.opt_in and sku_name in s.sizes}


def cite(source_id: str) -> str:
    source = SOURCES.get(source_id)
    return source.cite() if source else skus.cite(source_id)
