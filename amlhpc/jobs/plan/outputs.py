"""Stack outputs for jobs: from the deployed stack, a JSON file, or the offline plan.

Three sources, one document validated with the model infra produces it with
(amlhpc.core.outputs.StackOutputs; docs/contracts.md section 2). Reading a file or a deployed
stack imports no Pulumi; only --offline runs the program under Pulumi's mock runtime:

- deployed: `pulumi stack output --json --stack S` (secrets stay masked: never --show-secrets);
- file: `--outputs FILE`, e.g. a saved copy of the above or tests/fixtures/outputs/dev.json;
- offline: `amlhpc.infra.plan.offline_outputs(S)`, the document the program would export.

`load()` checks every key jobs rely on and raises one `UserError` listing each missing or
mistyped key with the source it came from and how to refresh it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from amlhpc.core import invocation, project
from amlhpc.core.errors import Problem, UserError
from amlhpc.core.outputs import REQUIRED_CONTAINERS, REQUIRED_DATASTORES, StackOutputs

REPO_ROOT = project.root()
"""The project folder, whose stack files the offline plan reads (amlhpc/core/project.py)."""

Source = Literal["deployed", "file", "offline"]


@dataclass(frozen=True)
class LoadedOutputs:
    outputs: StackOutputs
    source: Source
    reference: str
    """Where it came from, for messages: a file path or the command that produced it."""


OFFLINE_HINT = "or use --offline (plan locally)"
AZURE_ONLY_HINT = "or, for this project's rehearsals, add --local instead of --stack"


def load(stack: str, *, outputs_file: str | Path | None = None, offline: bool = False,
         root: Path = REPO_ROOT, runner=subprocess.run, offline_allowed: bool = True) -> LoadedOutputs:
    """The validated outputs of `stack` from exactly one source (default: the deployed stack).
    `offline_allowed` False: the command asks Azure ML about the deployed stack (status, list,
    logs...), so no fix suggests --offline, which it refuses."""
    other = OFFLINE_HINT if offline_allowed else AZURE_ONLY_HINT
    if outputs_file is not None and offline:
        raise UserError([Problem("command line", "--outputs/--offline", "give at most one of --outputs FILE and --offline",
                                 "--offline plans the stack locally; --outputs reads a saved `pulumi stack output --json`")],
                        "conflicting options")
    if outputs_file is not None:
        reference = str(outputs_file)
        document, source = _from_file(Path(outputs_file), other), "file"
        refresh = f"regenerate it: pulumi stack output --json --stack {stack} > {outputs_file}"
    elif offline:
        reference = f"offline plan of Pulumi.{stack}.yaml"
        document, source = _from_offline(stack, root), "offline"
        refresh = f"check Pulumi.{stack}.yaml with `{invocation.command('infra', 'plan --stack ' + stack)}`"
    else:
        reference = f"pulumi stack output --json --stack {stack}"
        document, source = _from_pulumi(stack, runner, other), "deployed"
        refresh = (f"run `pulumi up --stack {stack}` so the stack exports it"
                   + (" (or use --offline to plan without Azure)" if offline_allowed else ""))
    outputs = validate(document, reference, refresh)
    if outputs.stack != stack:
        raise UserError([Problem(reference, "stack", f"these outputs are for stack {outputs.stack!r}, not {stack!r}",
                                 f"pass --stack {outputs.stack}, or the outputs of {stack!r}")], "wrong stack outputs")
    return LoadedOutputs(outputs, source, reference)  # type: ignore[arg-type]


def validate(document: Any, reference: str, refresh: str) -> StackOutputs:
    """Check the outputs document; every missing or mistyped key is one problem."""
    if not isinstance(document, dict):
        raise UserError([Problem(reference, "", "is not a JSON object of stack outputs", refresh)], "invalid stack outputs")
    problems: list[Problem] = []
    try:
        outputs = StackOutputs.model_validate(document)
    except ValidationError as exc:
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"])
            if err["type"] == "missing":
                problems.append(Problem(reference, path, "stack outputs are missing this key", refresh))
            elif err["type"] == "extra_forbidden":
                problems.append(Problem(reference, path, "is not a key of aml-hpc's stack outputs (another version of aml-hpc "
                                        "deployed this stack?)", f"{refresh}, or update this checkout"))
            else:
                problems.append(Problem(reference, path, f"{err.get('input')!r}: {err['msg'].lower()}", refresh))
        raise UserError(problems, "invalid stack outputs") from None
    for key in REQUIRED_DATASTORES:
        if key not in outputs.datastores:
            problems.append(Problem(reference, f"datastores.{key}", "stack outputs are missing this key", refresh))
    for key in REQUIRED_CONTAINERS:
        if key not in outputs.storage.containers:
            problems.append(Problem(reference, f"storage.containers.{key}", "stack outputs are missing this key", refresh))
    if problems:
        raise UserError(problems, "invalid stack outputs")
    return outputs


def _from_file(path: Path, other: str = OFFLINE_HINT) -> Any:
    if not path.is_file():
        raise UserError([Problem(str(path), "", "outputs file not found",
                                 f"save one with `pulumi stack output --json --stack S > FILE`, {other}")], "missing outputs file")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError([Problem(str(path), f"line {exc.lineno}", f"not valid JSON: {exc.msg}",
                                 "the file must be the output of `pulumi stack output --json`")], "invalid outputs file") from None


def _from_offline(stack: str, root: Path) -> Any:
    from rich.console import Console

    from amlhpc.core.console import working
    from amlhpc.infra.plan import offline_outputs  # the program under Pulumi's mock runtime

    project.require(root)
    with working(Console(stderr=True), f"planning stack {stack} offline for its outputs"):
        return offline_outputs(stack, root=root)


def _from_pulumi(stack: str, runner, other: str = OFFLINE_HINT) -> Any:
    command = ["pulumi", "stack", "output", "--json", "--stack", stack]
    if shutil.which("pulumi") is None:
        raise UserError([Problem("pulumi CLI", "", "the pulumi command is not installed or not on PATH",
                                 "install it (https://www.pulumi.com/docs/install/), pass --outputs FILE (a saved "
                                 f"`pulumi stack output --json`), {other}")], "cannot read stack outputs")
    result = runner(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        # stderr of `pulumi stack output` names the stack/backend problem; it holds no secrets
        detail = (result.stderr or result.stdout or "").strip().splitlines()
        raise UserError([Problem(" ".join(command), "", f"failed (exit {result.returncode}): {detail[-1] if detail else 'no output'}",
                                 "log in to the state backend (`pulumi login`), check the stack name (`pulumi stack ls`), "
                                 f"{other}")], "cannot read stack outputs")
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        raise UserError([Problem(" ".join(command), "", "did not print JSON", "run it by hand to see what it prints")],
                        "cannot read stack outputs") from None
