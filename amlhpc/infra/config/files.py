"""Reading a stack's configuration: its Pulumi.<stack>.yaml file, or the Pulumi engine's config."""

from __future__ import annotations

import difflib
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from amlhpc.core import invocation, yamlfile
from amlhpc.core.errors import Problem, UserError
from amlhpc.infra.config.models import (
    _TEXT_KEYS,
    _TOP_LEVEL_KEYS,
    LOCATION_KEY,
    NAMESPACE,
    PROJECT,
    REPO_ROOT,
    StackConfig,
)
from amlhpc.infra.config.parse import parse


def stack_file(stack: str, root: Path = REPO_ROOT) -> Path:
    return root / f"Pulumi.{stack}.yaml"


def available_stacks(root: Path = REPO_ROOT) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in root.glob("Pulumi.*.yaml"))


def read_stack_file(stack: str, root: Path = REPO_ROOT) -> dict[str, Any]:
    """The `config:` mapping of a stack file, or a UserError naming what is wrong."""
    path = stack_file(stack, root)
    reference = path.name
    if not path.is_file():
        stacks = available_stacks(root)
        near = difflib.get_close_matches(stack, stacks, n=2, cutoff=0.5)
        raise UserError(
            [Problem(reference, "", f"stack file not found for stack {stack!r}",
                     (f"did you mean {' or '.join(near)}? " if near else "")
                     + f"stacks here: {', '.join(stacks) or 'none'}; create an experiment with "
                     f"`{invocation.new_experiment('NAME', 'dev')}`")],
            "unknown stack",
        )
    try:
        document = yamlfile.load(path.read_text()) or {}
    except yaml.YAMLError as exc:  # bad syntax, or a key written twice (both lines named)
        raise UserError([yamlfile.problem(exc, reference)], "invalid stack file") from None
    if not isinstance(document, dict) or not isinstance(document.get("config", {}), dict):
        raise UserError([Problem(reference, "config", "must be a mapping of `namespace:key: value`",
                                 "see Pulumi.dev.yaml for the layout")], "invalid stack file")
    return dict(document.get("config") or {})


def load_stack_config(stack: str, root: Path = REPO_ROOT, now: datetime | None = None) -> StackConfig:
    """Read and validate `Pulumi.<stack>.yaml` (offline: plan, tests, jobs)."""
    return parse(stack, read_stack_file(stack, root), f"Pulumi.{stack}.yaml", now=now)


def from_pulumi() -> StackConfig:
    """Read the current stack's config through the Pulumi engine (honours `pulumi config set`)."""
    import json

    import pulumi

    stack = pulumi.get_stack()
    ours = pulumi.Config(PROJECT)
    flat: dict[str, Any] = {}
    for key in _TOP_LEVEL_KEYS:
        # The engine hands every value over as a string: objects, lists, numbers and
        # booleans JSON-encoded, text as is (so "1234" as a cost center stays text).
        raw = ours.get(key)
        if raw is None:
            continue
        if key in _TEXT_KEYS:
            flat[NAMESPACE + key] = raw
            continue
        try:
            flat[NAMESPACE + key] = json.loads(raw)
        except ValueError:
            flat[NAMESPACE + key] = raw  # the validator names the key and the bad value
    location = pulumi.Config("azure-native").get("location")
    if location is not None:
        flat[LOCATION_KEY] = location
    return parse(stack, flat, f"Pulumi.{stack}.yaml", deploying=True)
