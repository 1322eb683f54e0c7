"""What GitHub hands a workflow job: an OIDC token (and its subject) and which secrets, given
the event, the ref, the job's `environment` and `permissions`, and the repository's GitHub
environments as the permission model declares them (amlhpc/core/catalog/permissions.toml).

GitHub's documented behaviour this follows:
- A job gets an OIDC token only with `permissions: id-token: write`. Its subject is
  `repo:<owner>/<repo>:environment:<name>` when the job names an environment, else
  `repo:<owner>/<repo>:pull_request` for pull_request events, else `repo:<owner>/<repo>:ref:<ref>`
  (GitHub Docs, "OpenID Connect", example subject claims).
- Environment secrets reach only jobs that name the environment, once its protection rules
  pass; a deployment branch policy admits only matching branches, and a pull request's run is
  on refs/pull/<n>/merge, no branch at all (GitHub Docs, "Managing environments for
  deployment": deployment branches and tags, environment secrets).
- A pull request from the same repository runs the workflow file of its own merge commit:
  the pull request decides the job's `environment` and `permissions` itself.

Which secret holds which value: what `gh secret set NAME --env E < FILE` lines (the access
setup's commands, amlhpc/infra/access/github.py) stored, read back by `stored_secrets`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from amlhpc.core.permissions import MODEL


@dataclass(frozen=True)
class JobAccess:
    subject: str | None
    """The OIDC token's subject, or None when the job gets no token."""
    secrets: tuple[str, ...]
    refused: str | None = None
    """Why GitHub does not run the job at all (an environment's protection rule)."""
    values: dict[str, str] = field(default_factory=dict)
    """Secret -> its value, when the job is given what the setup commands stored (`stored`)."""


def github_environments(environments: list[str]) -> dict[str, tuple[str, ...]]:
    """GitHub environment name -> its deployment branches, as the model declares them."""
    out = {}
    for env in environments:
        for gh in MODEL.github_environments.values():
            out[gh.name_for(env)] = gh.branches
    return out


def environment_secrets(environments: list[str]) -> dict[str, tuple[str, ...]]:
    return {gh.name_for(env): tuple(gh.secrets) for env in environments for gh in MODEL.github_environments.values()}


def stored_secrets(commands: list[str]) -> dict[str, dict[str, str]]:
    """GitHub environment -> secret -> value, as the `gh secret set` lines among `commands`
    leave them (each value the text of the file the line redirects from)."""
    out: dict[str, dict[str, str]] = {}
    for line in (c for c in commands if c.startswith("gh secret set ")):
        words = shlex.split(line)
        environment, file = words[words.index("--env") + 1], words[words.index("<") + 1]
        out.setdefault(environment, {})[words[3]] = Path(file).read_text()
    return out


def job_access(job: dict, *, repository: str, event: str, ref: str, environments: list[str],
               repository_secrets: tuple[str, ...] = (), stored: dict[str, dict[str, str]] | None = None) -> JobAccess:
    """What GitHub gives `job` (a job mapping of a workflow file); `environment` expressions
    must already be resolved to a name. `stored` (from `stored_secrets`): the environments'
    secrets with their values; without it, the names the model declares."""
    environment = job.get("environment")
    if isinstance(environment, dict):
        environment = environment.get("name")
    wants_token = (job.get("permissions") or {}).get("id-token") == "write"
    if environment is None:
        subject = (f"repo:{repository}:pull_request" if event == "pull_request" else f"repo:{repository}:ref:{ref}")
        return JobAccess(subject if wants_token else None, tuple(repository_secrets))
    branches = github_environments(environments).get(environment)
    if branches is not None:
        branch = ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None
        if branch not in branches:
            return JobAccess(None, (), f"environment {environment!r} admits deployments from {', '.join(branches)} "
                                       f"only, and this run is on {ref}")
    subject = f"repo:{repository}:environment:{environment}" if wants_token else None
    if stored is not None:
        values = stored.get(environment, {})
        return JobAccess(subject, tuple(repository_secrets) + tuple(values), values=dict(values))
    return JobAccess(subject, tuple(repository_secrets) + environment_secrets(environments).get(environment, ()))
