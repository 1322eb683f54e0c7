"""Recipes: YAML files, loaded, overridden (`--set key=value`) and validated.

A recipe is named or given by path. A name is looked up in the project's `recipes/` folder
first (a team's own recipes, and its edited copies of aml-hpc's), then among the built-in
recipes of this folder: a project recipe of the same name shadows the built-in one, and
`jobs recipes` says so. A path (anything ending in .yaml or .yml) is read as given.

`load(name_or_path, overrides)` returns a `Recipe` or raises one `UserError` listing every
problem with the file, the dotted key, the bad value and the fix. Overrides are applied to
the raw YAML before validation, so `--set` values get exactly the same checks as the file.
`load(..., local=True)` applies the recipe's local profile (`local.overrides`, the
rehearsal's smaller model and data) first, so `--set` still wins over it. A `--set` naming
an input or output the recipe does not have is refused with the near match, not added.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from amlhpc.core import project, yamlfile
from amlhpc.core.errors import Problem, ProblemCollector, UserError
from amlhpc.jobs.recipes.schema import Recipe, display_path

RECIPES_DIR = Path(__file__).resolve().parent
"""The built-in recipes."""
PROJECT_RECIPES = "recipes"
"""The folder of a project that holds its own recipes (`aml-hpc init` makes it)."""
_STRING_MAPS = {"env", "tags"}
_YAML11_WORDS = {"on", "off", "yes", "no", "y", "n"}


def project_dir(root: Path | None = None) -> Path:
    """The project's recipes folder (it may not exist)."""
    return (project.root() if root is None else root) / PROJECT_RECIPES


def builtin() -> list[str]:
    """Names of the recipes that ship with aml-hpc."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def from_project(root: Path | None = None) -> list[str]:
    """Names of the project's own recipes (recipes/*.yaml)."""
    folder = project_dir(root)
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def available(root: Path | None = None) -> list[str]:
    """Every recipe name a command accepts here: the project's and the built-in ones."""
    return sorted(set(builtin()) | set(from_project(root)))


def resolve(name_or_path: str, root: Path | None = None) -> Path:
    """The recipe file for a name (the project's recipes/NAME.yaml, else the built-in one) or
    a path to a YAML file."""
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix in (".yaml", ".yml"):
        if candidate.is_file():
            return candidate
        raise UserError([Problem(str(candidate), "", "recipe file not found",
                                 f"check the path, or use a recipe by name: {', '.join(available(root))}")], "unknown recipe")
    for folder in (project_dir(root), RECIPES_DIR):
        path = folder / f"{name_or_path}.yaml"
        if path.is_file():
            return path
    names = available(root)
    near = difflib.get_close_matches(name_or_path, names, n=2)
    hint = ((f"did you mean {' or '.join(near)}? " if near else "") + f"recipes here: {', '.join(names)} "
            f"(the project's own in {display_path(project_dir(root))}/, then aml-hpc's); or pass a path to a .yaml file")
    raise UserError([Problem("recipe", name_or_path, f"unknown recipe {name_or_path!r}", hint)], "unknown recipe")


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`key.sub=value` strings -> {dotted key: YAML-parsed value}; bad syntax is a UserError."""
    found = ProblemCollector("--set", "invalid --set")
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            found.add(pair, "is not key=value", "e.g. --set nodes=2 --set inputs.cosmoflow.mode=download")
            continue
        if key.split(".")[0] in _STRING_MAPS or raw.strip().lower() in _YAML11_WORDS:
            # environment values and tags are strings; on/off/yes/no stay words (health=off)
            parsed[key] = raw
            continue
        try:
            parsed[key] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            parsed[key] = raw  # not YAML: take the literal string
    found.raise_if_any()
    return parsed


def apply_overrides(document: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of `document` with each dotted key set (intermediate mappings created)."""
    result = _deep_copy(document)
    for dotted, value in overrides.items():
        node = result
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[leaf] = value
    return result


def load(name_or_path: str, overrides: dict[str, Any] | None = None, *, local: bool = False) -> Recipe:
    """Read, override and validate a recipe; raises UserError with every problem.

    local: apply the recipe's local profile (`local.overrides`) under the overrides."""
    path = resolve(name_or_path)
    reference = display_path(path)
    try:
        document = yamlfile.load(path.read_text()) or {}
    except yaml.YAMLError as exc:  # bad syntax, or a key written twice (both lines named)
        raise UserError([yamlfile.problem(exc, reference, "fix the YAML syntax at that line")], "invalid recipe") from None
    if not isinstance(document, dict):
        raise UserError([Problem(reference, "", "a recipe must be a YAML mapping", "see amlhpc/jobs/recipes/cosmoflow.yaml")], "invalid recipe")
    overrides = overrides or {}
    unknown_names = _unknown_named_blocks(reference, document, overrides)
    profile = _local_overrides(document) if local else {}
    merged = apply_overrides(document, {**profile, **overrides})
    if "inputs" in overrides:
        _forget_local_data_of_dropped_inputs(merged)
    try:
        recipe = Recipe.model_validate(merged)
    except ValidationError as exc:
        raise UserError(unknown_names + _problems(reference, exc, overrides, profile), f"invalid recipe {path.stem!r}") from None
    if unknown_names:
        raise UserError(unknown_names, f"invalid recipe {path.stem!r}")
    recipe._source = path.resolve()
    return recipe


def _forget_local_data_of_dropped_inputs(merged: dict[str, Any]) -> None:
    """`--set inputs=...` replaces the inputs: the profile's data for inputs it dropped go
    with them (a name in `local.data` that is no input is still an error in the file)."""
    profile, inputs = merged.get("local"), merged.get("inputs")
    data = profile.get("data") if isinstance(profile, dict) else None
    if isinstance(profile, dict) and isinstance(data, dict) and isinstance(inputs, dict):
        profile["data"] = {name: value for name, value in data.items() if name in inputs}


def _local_overrides(document: dict[str, Any]) -> dict[str, Any]:
    """The profile's `local.overrides` as written (validated with the rest of the recipe)."""
    profile = document.get("local")
    values = profile.get("overrides") if isinstance(profile, dict) else None
    return dict(values) if isinstance(values, dict) else {}


def _unknown_named_blocks(reference: str, document: dict[str, Any], overrides: dict[str, Any]) -> list[Problem]:
    """`--set inputs.NAME...` / `outputs.NAME...` must name one the recipe has: a typo would
    otherwise add a new, unused input silently."""
    problems = []
    for key in overrides:
        parts = key.split(".")
        if parts[0] not in ("inputs", "outputs") or len(parts) < 2:
            continue
        found = document.get(parts[0])
        block: dict[str, Any] = found if isinstance(found, dict) else {}
        if parts[1] in block:
            continue
        kind = parts[0][:-1]
        near = difflib.get_close_matches(parts[1], list(block), n=1)
        hint = (f"did you mean --set {'.'.join([parts[0], near[0], *parts[2:]])}=...? " if near else "")
        hint += (f"this recipe's {parts[0]}: {', '.join(block)}" if block else f"this recipe has no {parts[0]}")
        hint += f"; to add one, add it under `{parts[0]}:` in a copy of the recipe"
        problems.append(Problem(reference, key, f"unknown {kind} {parts[1]!r} (from --set)", hint))
    return problems


def _problems(reference: str, exc: ValidationError, overrides: dict[str, Any],
              profile: dict[str, Any] | None = None) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        path = ".".join(loc)
        origin = (" (from --set)" if _comes_from(path, overrides)
                  else " (from local.overrides)" if _comes_from(path, profile or {}) else "")
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            near = difflib.get_close_matches(loc[-1], allowed, n=1)
            hint = (f"did you mean {near[0]!r}? " if near else "") + (f"allowed here: {', '.join(allowed)}" if allowed else "")
            problems.append(Problem(reference, path, f"unknown key {loc[-1]!r}{origin}", hint))
        elif err["type"] == "missing":
            problems.append(Problem(reference, path, "is required", f"add `{loc[-1]}:` to the recipe or pass --set {path}=..."))
        else:
            bad = err.get("input")
            shown = repr(bad) if not isinstance(bad, dict) else "this block"
            expected = err["msg"]
            if err["type"] == "value_error":
                expected = expected.removeprefix("Value error, ")
            problems.append(Problem(reference, path or "(top level)", f"{shown}{origin}: {expected}",
                                    f"fix the value in the recipe or pass --set {path or 'KEY'}=VALUE"))
    return problems


def _comes_from(path: str, keys) -> bool:
    """Whether the value at dotted `path` was set by one of the dotted `keys`."""
    return any(path == k or path.startswith(k + ".") for k in keys)


def _allowed_keys(parent: list[str]) -> list[str]:
    """Keys allowed at `parent` (a dotted path split), for "did you mean" hints."""
    import typing

    from pydantic import BaseModel

    model: type[BaseModel] = Recipe
    parts = list(parent)
    while parts:
        field = model.model_fields.get(parts.pop(0))
        if field is None:
            return []
        annotation = field.annotation
        if typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
            if parts:
                parts.pop(0)  # the user's own key (an input or output name)
        candidates = [a for a in (typing.get_args(annotation) or (annotation,)) if isinstance(a, type)]
        nested = next((a for a in candidates if issubclass(a, BaseModel)), None)
        if nested is None:
            return []
        model = nested
    return sorted(model.model_fields)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
