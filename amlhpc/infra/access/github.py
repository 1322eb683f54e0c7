"""The GitHub side of access: environments, their protection rules and variables, as `gh`
commands derived from the access program's outputs and the permission model.

    pulumi -C amlhpc/infra/access stack output github --json > access.json
    python -m amlhpc.infra.access.github --outputs access.json --repository my-org/aml-hpc \\
        --reviewers team:ml-platform         # prints the commands; scripts/access-setup.sh runs them

For every GitHub environment the model names ({environment} and teardown-{environment}): the
environment with deployment limited to the model's branches (main), required reviewers where
the model says so (prod's deploy), and the variables the workflows read - as *environment*
variables, never repository ones, so a job that runs in no environment (a pull request's)
sees none. The passphrase is a secret per environment (`gh secret set ... --env`), which
nobody but its holder types: the commands read it from a file only when given one.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from amlhpc.core.errors import Problem, UserError, exit_on_bad_input


def _reviewer(spec: str) -> tuple[str, str]:
    kind, _, name = spec.partition(":")
    if kind not in ("team", "user") or not name:
        raise UserError([Problem("--reviewers", spec, "is not team:<slug> or user:<login>",
                                 "e.g. --reviewers team:ml-platform")], "invalid reviewers")
    return kind, name


def commands(outputs: dict, repository: str, reviewers: list[str], passphrases: Path | None = None) -> list[str]:
    """One shell command per line, in order: create, protect, then fill each environment."""
    owner = repository.split("/", 1)[0]
    parsed = [_reviewer(r) for r in reviewers]
    out: list[str] = []
    q = shlex.quote
    for name in sorted(outputs):
        entry = outputs[name]
        base = f"repos/{repository}/environments/{name}"
        # gh api's nested fields (the gh manual, `gh api`: key[subkey]=value, arrays key[][subkey]=value).
        fields = ["-F deployment_branch_policy[protected_branches]=false",
                  "-F deployment_branch_policy[custom_branch_policies]=true"]
        if entry["reviewers"]:
            if not parsed:
                raise UserError([Problem("--reviewers", "", f"GitHub environment {name!r} needs required reviewers",
                                         "give --reviewers team:<slug> (or user:<login>), repeatable")],
                                "missing reviewers")
            for kind, login in parsed:
                lookup = f"orgs/{owner}/teams/{login}" if kind == "team" else f"users/{login}"
                fields += [f"-F 'reviewers[][type]={'Team' if kind == 'team' else 'User'}'",
                           f'-F "reviewers[][id]=$(gh api {lookup} --jq .id)"']
        out.append(f"gh api -X PUT {base} {' '.join(fields)}")
        for branch in entry["branches"]:
            out.append(f"gh api -X POST {base}/deployment-branch-policies -f name={q(branch)} -f type=branch")
        for variable in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_SUBSCRIPTION_ID", "PULUMI_BACKEND_URL"):
            out.append(f"gh variable set {variable} --repo {q(repository)} --env {q(name)} --body {q(str(entry[variable]))}")
        environment = name.removeprefix("teardown-")
        if passphrases is not None:
            out.append(f"gh secret set PULUMI_CONFIG_PASSPHRASE --repo {q(repository)} --env {q(name)} "
                       f"< {q(str(passphrases / f'{environment}.txt'))}")
    return out


app = typer.Typer(add_completion=False, help="gh commands for the GitHub environments of the access outputs.")


@app.command()
def main(
    outputs: Annotated[Path, typer.Option("--outputs", help="`pulumi stack output github --json` of amlhpc/infra/access.")],
    repository: Annotated[str, typer.Option("--repository", help="GitHub owner/name.")],
    reviewers: Annotated[list[str], typer.Option("--reviewers", help="team:<slug> or user:<login>, repeatable.")] = [],  # noqa: B006
    passphrases: Annotated[Path | None, typer.Option(
        "--passphrases", help="Folder with <environment>.txt holding each environment's passphrase.")] = None,
    debug: Annotated[bool, typer.Option("--debug")] = False,
) -> None:
    with exit_on_bad_input(debug):
        try:
            document = json.loads(outputs.read_text())
        except (OSError, ValueError) as exc:
            raise UserError([Problem(str(outputs), "", f"not readable JSON ({exc})",
                                     "pulumi -C amlhpc/infra/access stack output github --json > access.json")],
                            "bad outputs") from None
        sys.stdout.write("\n".join(commands(document, repository, reviewers, passphrases)) + "\n")


if __name__ == "__main__":
    app()
