"""An environment's published outputs: what its experiment stacks read instead of its state.

Experiment stacks live in their own state container with their own passphrase, so the
identity that tears expired experiments down never holds the environment's passphrase nor
reaches its state. A Pulumi StackReference cannot cross that line: reading even a non-secret
output of a passphrase stack needs that stack's passphrase (pulumi/pulumi#5151, and #21143
"Can not use stack reference to a non-secret output without passphrase", open 2025-12-04). So
an environment's `up` publishes its outputs document (which never holds a secret:
amlhpc/infra/outputs.py) beside its state, and an experiment's preview and up read that
document: scripts/pulumi-stack.sh fetches it and names the file in AMLHPC_ENVIRONMENT_OUTPUTS;
the offline plan hands over the environment plan's outputs the same way.

    pulumi stack output --json --stack dev > out.json
    python -m amlhpc.infra.published write --environment dev --outputs out.json --out published.json
    python -m amlhpc.infra.published check --environment dev --file published.json
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from amlhpc.core import invocation
from amlhpc.core.errors import Problem, UserError, exit_on_bad_input
from amlhpc.core.outputs import StackOutputs

KIND = "aml-hpc/environment-outputs"
VERSION = 1
VARIABLE = "AMLHPC_ENVIRONMENT_OUTPUTS"
"""The published document's file, for an experiment stack's program (set by scripts/pulumi-stack.sh)."""
BLOB = "published/outputs.json"
"""Where an environment's up publishes it: in the environment's own state container (or file backend)."""
MASKED = "[secret]"
"""What `pulumi stack output --json` prints for a secret value: never published."""


def _republish_fix(environment: str) -> str:
    return f"bring environment {environment!r} up again ({invocation.deploy('up', environment)}): its up publishes the document"


def _restored(outputs: dict[str, Any]) -> dict[str, Any]:
    from amlhpc.infra.outputs import inherited  # imports pulumi: only when a document is checked

    return {key: inherited(key, value) for key, value in outputs.items()}


def _check(outputs: Any, environment: str, where: str, title: str) -> None:
    """UserError `title`, listing what makes `outputs` unusable as environment `environment`'s outputs."""
    problems = _problems(outputs, environment, where)
    if problems:
        raise UserError(problems, title)


def _problems(outputs: Any, environment: str, where: str) -> list[Problem]:
    fix = _republish_fix(environment)
    if not isinstance(outputs, dict):
        return [Problem(where, "outputs", "is not a JSON object of stack outputs", fix)]
    masked = sorted(k for k, v in outputs.items() if MASKED in json.dumps(v))
    if masked:
        return [Problem(where, key, "holds a secret: an environment's outputs never do, and none is published",
                        "remove the secret from the environment's outputs") for key in masked]
    try:
        model = StackOutputs.model_validate(_restored(outputs))
    except ValidationError as exc:
        return [Problem(where, ".".join(str(p) for p in err["loc"]), err["msg"].lower(), fix) for err in exc.errors()]
    if model.kind != "environment" or model.stack != environment or model.environment != environment:
        return [Problem(where, "stack", f"these are the outputs of {model.kind} stack {model.stack!r}, "
                        f"not of environment {environment!r}", fix)]
    return []


def publish(outputs: Any, environment: str, now: datetime | None = None) -> dict[str, Any]:
    """The document an environment's up publishes, from its `pulumi stack output --json`."""
    _check(outputs, environment, "pulumi stack output --json", "environment outputs not published")
    return {"kind": KIND, "version": VERSION, "environment": environment,
            "publishedAt": (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ"), "outputs": outputs}


@dataclass(frozen=True)
class EnvironmentOutputs:
    """An environment's outputs as an experiment's program reads them (the StackReference
    methods it used: `require_output`, `get_output`)."""

    environment: str
    outputs: dict[str, Any]
    source: str
    """Where they came from, for the plan and messages: a file, or the offline plan."""
    published_at: str | None = None

    def require_output(self, key: str) -> Any:
        import pulumi

        if key not in self.outputs:
            raise UserError([Problem(self.source, key, f"environment {self.environment!r} published no such output",
                                     _republish_fix(self.environment))], "incomplete environment outputs")
        return pulumi.Output.from_input(self.outputs[key])

    def get_output(self, key: str) -> Any:
        import pulumi

        return pulumi.Output.from_input(self.outputs.get(key))


def offline(outputs: dict[str, Any], environment: str) -> EnvironmentOutputs:
    """The environment plan's outputs, handed over as its up would publish them."""
    source = f"offline plan of Pulumi.{environment}.yaml"
    _check(outputs, environment, source, "environment outputs not published")  # what its up would refuse
    return EnvironmentOutputs(environment, outputs, source)


def read(path: Path, environment: str) -> EnvironmentOutputs:
    """The published document in `path`, checked: its kind, its environment, its outputs."""
    where = str(path)
    fix = _republish_fix(environment)
    try:
        document = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UserError([Problem(where, "", f"cannot be read ({exc.strerror or exc})", fix)],
                        "no environment outputs") from None
    except ValueError as exc:
        raise UserError([Problem(where, "", f"is not JSON ({exc})", fix)], "invalid environment outputs") from None
    return from_document(document, environment, where)


def from_document(document: Any, environment: str, where: str) -> EnvironmentOutputs:
    """A published document (parsed), checked: its kind, its environment, its outputs."""
    fix = _republish_fix(environment)
    if not isinstance(document, dict) or document.get("kind") != KIND or document.get("version") != VERSION:
        raise UserError([Problem(where, "kind", f"is not an aml-hpc environment outputs document ({KIND}, "
                                 f"version {VERSION})", fix)], "invalid environment outputs")
    if document.get("environment") != environment:
        raise UserError([Problem(where, "environment", f"{document.get('environment')!r}: published by another "
                                 f"environment than {environment!r}, whose experiment this is",
                                 f"fetch environment {environment!r}'s document")], "wrong environment outputs")
    _check(document.get("outputs"), environment, where, "invalid environment outputs")
    return EnvironmentOutputs(environment, document["outputs"], where, document.get("publishedAt"))


def from_environ(environment: str, environ: dict[str, str] | None = None) -> EnvironmentOutputs:
    """An experiment's program under the Pulumi engine: the file AMLHPC_ENVIRONMENT_OUTPUTS names."""
    given = (os.environ if environ is None else environ).get(VARIABLE, "").strip()
    if not given:
        raise UserError([Problem(VARIABLE, "", f"is not set: an experiment stack reads environment {environment!r}'s "
                                 "published outputs, which scripts/pulumi-stack.sh fetches",
                                 f"run it through {invocation.deploy('preview', '<experiment>')} (or up), or "
                                 f"set {VARIABLE} to a copy of the environment's {BLOB}")], "no environment outputs")
    return read(Path(given), environment)


app = typer.Typer(add_completion=False, no_args_is_help=True, help="An environment's published outputs.")


@app.command("write")
def write_command(
    environment: Annotated[str, typer.Option("--environment", help="The environment stack's name.")],
    outputs: Annotated[Path, typer.Option("--outputs", help="Its `pulumi stack output --json`.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the published document.")],
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    with exit_on_bad_input(debug):
        try:
            given = json.loads(outputs.read_text())
        except (OSError, ValueError) as exc:
            raise UserError([Problem(str(outputs), "", f"not readable JSON ({exc})",
                                     f"pulumi stack output --json --stack {environment} > {outputs}")],
                            "environment outputs not published") from None
        document = publish(given, environment)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        tmp.replace(out)


@app.command("check")
def check_command(
    environment: Annotated[str, typer.Option("--environment", help="The environment the document must be of.")],
    file: Annotated[Path, typer.Option("--file", help="The published document.")],
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    with exit_on_bad_input(debug):
        found = read(file, environment)
        typer.echo(f"{file}: environment {environment}'s outputs, published {found.published_at or 'at an unknown time'}")


if __name__ == "__main__":
    app()
