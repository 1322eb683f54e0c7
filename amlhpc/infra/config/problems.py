"""How a configuration problem is told (the key's path, the type error in words, the command that fixes it), and the check every concern shares: principal ids."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from amlhpc.core.errors import Problem, ProblemCollector
from amlhpc.infra.config.models import GUID_FORMAT, NAMESPACE, PrincipalConfig, _RawConfig


def fix_command(stack: str, path: str, value: str = "<value>") -> str:
    """The `pulumi config set` that sets `path` (e.g. aml-hpc:clusters[0].maxNodes)."""
    flag = " --path" if ("[" in path or "." in path.split(":", 1)[-1]) else ""
    return f"pulumi config set{flag} '{path}' {value} --stack {stack}"


def _key_path(loc: tuple[Any, ...]) -> str:
    out = NAMESPACE.rstrip(":")
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += (":" if i == 0 else ".") + str(part)
    return out


def _type_problems(reference: str, stack: str, exc: ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = _key_path(loc)
        if err["type"] == "extra_forbidden":
            *parent, key = loc
            allowed = _allowed_keys(tuple(parent))
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            problems.append(Problem(reference, path, f"unknown key {key!r}", f"{hint}allowed here: {', '.join(sorted(allowed))}"))
            continue
        if err["type"] == "missing":
            problems.append(Problem(reference, path, "is required", fix_command(stack, path)))
            continue
        bad = err.get("input")
        msg = err["msg"][:1].lower() + err["msg"][1:]
        problems.append(Problem(reference, path, f"{bad!r}: {msg}", fix_command(stack, path)))
    return problems


def _allowed_keys(parent: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = _RawConfig
    for part in parent:
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return []
        annotation = field.annotation
        inner = getattr(annotation, "__args__", (annotation,))
        model = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), model)
    return [f.alias or n for n, f in model.model_fields.items()]


def _check_principals(found: ProblemCollector, principals: list[PrincipalConfig], path: str) -> None:
    for i, principal in enumerate(principals):
        if not GUID_FORMAT.match(principal.principal_id):
            found.add(f"{path}[{i}].principalId",
                      f"{principal.principal_id!r} is not an Entra object id (a GUID)",
                      "find it with `az ad signed-in-user show --query id -o tsv` or `az ad group show -g NAME --query id -o tsv`")
