"""The access program's config: `aml-hpc-access:*` keys of amlhpc/infra/access/Pulumi.<stack>.yaml.

    aml-hpc-access:repository: my-org/aml-hpc      # the GitHub repository (owner/name)
    aml-hpc-access:stateAccount: amlhpcstate7x2k   # the Pulumi state account (global name)
    aml-hpc-access:environments: [dev, prod]       # default: every environment stack file
    azure-native:location: swedencentral

Each environment's resource group name and facts (its dataset lock) come from its own stack
file (Pulumi.<environment>.yaml at the repository root): one fact, one place. Problems are
collected and raised once, each with the key and the fix (amlhpc.core.errors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amlhpc.core.errors import Problem, UserError
from amlhpc.infra import naming
from amlhpc.infra.config import (
    EXPERIMENT_PREFIX,
    REPO_ROOT,
    StackConfig,
    available_stacks,
    load_stack_config,
)

NAMESPACE = "aml-hpc-access:"
_REPOSITORY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")


@dataclass(frozen=True)
class AccessConfig:
    repository: str
    """GitHub owner/name: the federated credentials' subjects are repo:<repository>:environment:<name>."""
    location: str
    state_account: str
    environments: tuple[StackConfig, ...]
    resource_group: str = "rg-amlhpc-access"
    """Holds the CI identities and the state account (never an environment's resources)."""
    name_prefix: str = "amlhpc"


def parse(flat: dict[str, Any], reference: str, root: Path = REPO_ROOT) -> AccessConfig:
    problems: list[Problem] = []
    ours = {k[len(NAMESPACE):]: v for k, v in flat.items() if k.startswith(NAMESPACE)}
    known = {"repository", "stateAccount", "environments", "resourceGroup", "namePrefix"}
    for key in sorted(set(ours) - known):
        problems.append(Problem(reference, NAMESPACE + key, "unknown key", f"known keys: {', '.join(sorted(known))}"))
    repository = str(ours.get("repository") or "")
    if not _REPOSITORY.match(repository):
        problems.append(Problem(reference, NAMESPACE + "repository", f"{repository!r} is not a GitHub owner/name",
                                f"pulumi config set {NAMESPACE}repository my-org/aml-hpc"))
    account = str(ours.get("stateAccount") or "")
    account_problem = naming.check("storageAccount", account)
    if account_problem:
        problems.append(Problem(reference, NAMESPACE + "stateAccount", f"{account!r}: {account_problem}",
                                f"pulumi config set {NAMESPACE}stateAccount <3-24 lowercase letters and digits>"))
    location = str(flat.get("azure-native:location") or "")
    if not location:
        problems.append(Problem(reference, "azure-native:location", "is required (the state account's region)",
                                "pulumi config set azure-native:location swedencentral"))
    names = ours.get("environments") or [s for s in available_stacks(root) if not s.startswith(EXPERIMENT_PREFIX)]
    environments = []
    for name in names:
        if str(name).startswith(EXPERIMENT_PREFIX):
            problems.append(Problem(reference, NAMESPACE + "environments", f"{name!r} is an experiment stack",
                                    "list environment stacks only (dev, prod): experiments deploy with theirs"))
            continue
        try:
            environments.append(load_stack_config(str(name), root))
        except UserError as exc:
            problems.extend(exc.problems)
    if problems:
        raise UserError(problems, "invalid access configuration")
    return AccessConfig(repository, location, account, tuple(environments),
                        str(ours.get("resourceGroup") or AccessConfig.resource_group),
                        str(ours.get("namePrefix") or AccessConfig.name_prefix))


def from_pulumi() -> AccessConfig:
    """The config through the engine (`pulumi config set` works)."""
    import json

    import pulumi

    flat: dict[str, Any] = {}
    ours = pulumi.Config(NAMESPACE.rstrip(":"))
    for key in ("repository", "stateAccount", "resourceGroup", "namePrefix"):
        if ours.get(key) is not None:
            flat[NAMESPACE + key] = ours.get(key)
    environments = ours.get("environments")
    if environments is not None:
        flat[NAMESPACE + "environments"] = json.loads(environments)
    location = pulumi.Config("azure-native").get("location")
    if location:
        flat["azure-native:location"] = location
    return parse(flat, f"amlhpc/infra/access/Pulumi.{pulumi.get_stack()}.yaml")
