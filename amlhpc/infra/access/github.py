"""The GitHub side of access: environments, their protection rules and variables, as `gh`
commands derived from the access program's outputs and the permission model.

    pulumi -C amlhpc/infra/access stack output github --json > access.json
    python -m amlhpc.infra.access.github --outputs access.json --repository my-org/aml-hpc \\
        --reviewers team:ml-platform         # prints the commands; scripts/access-setup.sh runs them

For every GitHub environment the model names ({environment} and teardown-{environment}): the
environment with deployment limited to the model's branches (main), required reviewers where
the model says so (prod's deploy), and the variables the workflows read - as *environment*
variables, never repository ones, so a job that runs in no environment (a pull request's)
sees none. Passphrases are secrets per GitHub environment (`gh secret set ... --env`), which
nobody but their holder types: the commands read them from files in `--passphrases DIR`, only
when given one, each secret from the file the model names for it: <env>.txt (the environment
stack's) reaches only the environment's own deploy job; teardown-<env> gets
<env>-experiments.txt (its experiments') and nothing else.

Environments with reviewers also get `prevent_self_review` (whoever pushed cannot approve
their own deployment). `main` gets branch protection: a pull request with an approving
review (stale approvals dismissed, the last push approved by someone else), no force push, no
deletion, and `enforce_admins` so administrators cannot bypass it either - without it anyone
who can push to main runs main's workflows in every environment. The last commands read both
back and fail, naming what is missing, unless they hold (GitHub REST API, "Update branch
protection" and "Create or update an environment", API version 2022-11-28).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from amlhpc.core.errors import Problem, UserError, exit_on_bad_input
from amlhpc.core.permissions import MODEL


def _reviewer(spec: str) -> tuple[str, str]:
    kind, _, name = spec.partition(":")
    if kind not in ("team", "user") or not name:
        raise UserError([Problem("--reviewers", spec, "is not team:<slug> or user:<login>",
                                 "e.g. --reviewers team:ml-platform")], "invalid reviewers")
    return kind, name


BRANCH_PROTECTION = {
    "required_status_checks": None,
    "enforce_admins": True,
    "required_pull_request_reviews": {"required_approving_review_count": 1, "dismiss_stale_reviews": True,
                                      "require_last_push_approval": True},
    "restrictions": None,
    "allow_force_pushes": False,
    "allow_deletions": False,
}
"""main's protection: review required, admins included, no force push, no deletion."""

PROTECTED_BRANCH = "main"
VARIABLES = tuple(dict.fromkeys(v for gh in MODEL.github_environments.values() for v in gh.variables))
"""Every variable the model's GitHub environments hold (the access outputs carry their values)."""

_PROTECTION_HOLDS = ("[.enforce_admins.enabled == true, (.allow_force_pushes.enabled // false) == false, "
                     "(.allow_deletions.enabled // false) == false, "
                     "(.required_pull_request_reviews.required_approving_review_count // 0) >= 1] | all")
_SELF_REVIEW_PREVENTED = '[.protection_rules[]? | select(.type == "required_reviewers") | .prevent_self_review] | any'


def protection_commands(repository: str) -> list[str]:
    """Protect main (BRANCH_PROTECTION)."""
    body = json.dumps(BRANCH_PROTECTION, separators=(",", ":"))
    return [f"gh api -X PUT repos/{repository}/branches/{PROTECTED_BRANCH}/protection --input - <<< {shlex.quote(body)}"]


def check_commands(outputs: dict, repository: str) -> list[str]:
    """Read main's protection and each reviewed environment back; fail naming what does not hold."""
    q = shlex.quote
    branch = f"repos/{repository}/branches/{PROTECTED_BRANCH}/protection"
    out = [f"test \"$(gh api {branch} --jq {q(_PROTECTION_HOLDS)})\" = true || "
           f"{{ echo {q(f'{PROTECTED_BRANCH} is not protected as required: review, enforce_admins, no force push, no deletion')} >&2; exit 1; }}"]
    for name in sorted(outputs):
        if outputs[name]["reviewers"]:
            out.append(f"test \"$(gh api repos/{repository}/environments/{name} --jq {q(_SELF_REVIEW_PREVENTED)})\" = true || "
                       f"{{ echo {q(f'environment {name} lets a deployment be approved by whoever started it (prevent_self_review)')} >&2; exit 1; }}")
    return out


def commands(outputs: dict, repository: str, reviewers: list[str], passphrases: Path | None = None) -> list[str]:
    """One shell command per line, in order: protect main; create, protect, then fill each
    environment; check what was set."""
    owner = repository.split("/", 1)[0]
    parsed = [_reviewer(r) for r in reviewers]
    out: list[str] = protection_commands(repository)
    q = shlex.quote
    for name in sorted(outputs):
        entry = outputs[name]
        _check_entry(name, entry, passphrases)
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
            fields.append("-F prevent_self_review=true")
        out.append(f"gh api -X PUT {base} {' '.join(fields)}")
        for branch in entry["branches"]:
            out.append(f"gh api -X POST {base}/deployment-branch-policies -f name={q(branch)} -f type=branch")
        for variable in VARIABLES:
            out.append(f"gh variable set {variable} --repo {q(repository)} --env {q(name)} --body {q(str(entry[variable]))}")
        if passphrases is not None:
            for secret, file in sorted(entry["secrets"].items()):
                out.append(f"gh secret set {secret} --repo {q(repository)} --env {q(name)} < {q(str(passphrases / file))}")
    return out + check_commands(outputs, repository)


def _check_entry(name: str, entry: dict, passphrases: Path | None) -> None:
    """Outputs of an older access program, or a passphrase file not written yet, named with the fix."""
    missing = [key for key in (*VARIABLES, "secrets") if key not in entry]
    if missing:
        raise UserError([Problem("--outputs", f"github.{name}", f"has no {', '.join(missing)}",
                                 "run scripts/access-setup.sh up first (these outputs are an older access program's)")],
                        "outdated access outputs")
    if passphrases is None:
        return
    absent = [Problem("--passphrases", str(passphrases / file), f"is missing ({secret} of GitHub environment {name!r})",
                      "put the passphrase its stacks are encrypted with there (none yet: a new one, "
                      f"openssl rand -base64 32 > {passphrases / file})")
              for secret, file in sorted(entry["secrets"].items()) if not (passphrases / file).is_file()]
    if absent:
        raise UserError(absent, "missing passphrase files")


app = typer.Typer(add_completion=False, help="gh commands for the GitHub environments of the access outputs.")


@app.command()
def main(
    outputs: Annotated[Path, typer.Option("--outputs", help="`pulumi stack output github --json` of amlhpc/infra/access.")],
    repository: Annotated[str, typer.Option("--repository", help="GitHub owner/name.")],
    reviewers: Annotated[list[str], typer.Option("--reviewers", help="team:<slug> or user:<login>, repeatable.")] = [],  # noqa: B006
    passphrases: Annotated[Path | None, typer.Option(
        "--passphrases", help="Folder with each environment's passphrases: <environment>.txt (its stack's) "
                              "and <environment>-experiments.txt (its experiments').")] = None,
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
