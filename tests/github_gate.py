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
"""

from __future__ import annotations

from dataclasses import dataclass

from amlhpc.core.permissions import MODEL


@dataclass(frozen=True)
class JobAccess:
    subject: str | None
    """The OIDC token's subject, or None when the job gets no token."""
    secrets: tuple[str, ...]
    refused: str | None = None
    """Why GitHub does not run the job at all (an environment's protection rule)."""


def github_environments(environments: list[str]) -> dict[str, tuple[str, ...]]:
    """GitHub environment name -> its deployment branches, as the model declares them."""
    out = {}
    for env in environments:
        for gh in MODEL.github_environments.values():
            out[gh.name_for(env)] = gh.branches
    return out


def environment_secrets(environments: list[str]) -> dict[str, tuple[str, ...]]:
    return {gh.name_for(env): gh.secrets for env in environments for gh in MODEL.github_environments.values()}


def job_access(job: dict, *, repository: str, event: str, ref: str, environments: list[str],
               repository_secrets: tuple[str, ...] = ()) -> JobAccess:
    """What GitHub gives `job` (a job mapping of a workflow file); `environment` expressions
    must already be resolved to a name."""
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
    secrets = tuple(repository_secrets) + environment_secrets(environments).get(environment, ())
    return JobAccess(f"repo:{repository}:environment:{environment}" if wants_token else None, secrets)
