"""The permission model: who may do what, where, and why, loaded from amlhpc/core/catalog/permissions.toml.

Pure data and lookups (no Pulumi, no Azure SDK): the program's grants
(amlhpc/infra/components/access.py), the access program (amlhpc/infra/access/), the policy pack, the
offline plan's access view and the abuse-case tests all read the same `MODEL`.

    from amlhpc.core.permissions import MODEL
    for right in MODEL.rights_of("controller"):
        print(right.role.name, right.scope, right.why)
    MODEL.assignable_principal_types()       # what a deploy identity may assign, and to whom
    MODEL.constrain_roles_condition()        # the ABAC condition that says so
    job_writes_condition()                   # where a job identity may write the workspace storage
    MODEL.role("controller").guid_in(subscription_id)

Action strings match as Azure matches them: case-insensitive, `*` standing for any run of
characters (Microsoft Learn, "Understand Azure role definitions", actions and notActions).
"""

from __future__ import annotations

import re
import tomllib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

from amlhpc.core.skus import CatalogError

PERMISSIONS_FILE = Path(__file__).resolve().parent / "catalog" / "permissions.toml"

GrantedBy = Literal["program", "access-setup", "azure-ml"]
When = Literal["identity-storage", "closed-network", "customer-managed-key", "dataset-lock", "bastion"]
GRANTED_BY: tuple[str, ...] = ("program", "access-setup", "azure-ml")
WHEN: tuple[str, ...] = ("identity-storage", "closed-network", "customer-managed-key", "dataset-lock", "bastion")
FIXED_SCOPES = ("subscription", "resource-group", "workspace", "workspace-storage", "dataset-account", "registry",
                "cmk-key", "state-container", "experiments-state-container", "jump-box", "jump-box-nic", "bastion")
SCOPE_PREFIXES = ("container:", "endpoint:")
CONDITIONS = ("constrain-roles", "job-writes-only")
ENVIRONMENT_PLACEHOLDER = "{environment}"

CUSTOM_ROLE_NAMESPACE = uuid.UUID("0b6f6c2e-5a7d-4e59-9d41-7f3c2a8e61d4")
"""Ours, fixed for good: custom role GUIDs derive from it, the subscription and the role key."""


@dataclass(frozen=True)
class Role:
    key: str
    name: str
    actions: tuple[str, ...] = ()
    not_actions: tuple[str, ...] = ()
    data_actions: tuple[str, ...] = ()
    guid: str | None = None
    """A built-in role's GUID (the same in every tenant); None for a custom role."""
    custom: bool = False
    description: str = ""
    source: str = ""
    why: Mapping[str, str] = field(default_factory=dict)
    """Custom roles: action -> the call that needs it."""
    privileged: str | None = None
    """Why a role may never be assigned unconditioned (Owner, User Access Administrator...)."""

    def guid_in(self, subscription_id: str) -> str:
        """The role definition's GUID in a subscription (custom roles: derived, so the access
        program that defines it and the stack that assigns it agree)."""
        if self.guid:
            return self.guid
        return str(uuid.uuid5(CUSTOM_ROLE_NAMESPACE, f"{subscription_id.lower()}|{self.key}"))

    def display_name(self, subscription_id: str) -> str:
        """Custom role names are unique per tenant: one definition per subscription."""
        return f"{self.name} ({subscription_id})" if self.custom else self.name

    def allows(self, action: str, data: bool = False) -> bool:
        """Whether this role's definition grants `action` (a data action when `data`)."""
        if data:
            return any(action_matches(p, action) for p in self.data_actions)
        return (any(action_matches(p, action) for p in self.actions)
                and not any(action_matches(p, action) for p in self.not_actions))


@dataclass(frozen=True)
class Principal:
    key: str
    title: str
    kind: Literal["ci", "person", "workload", "azure"]
    identity: Literal["none", "user-assigned", "system-assigned", "entra"]
    note: str = ""
    per_environment: bool = False
    github_environment: str | None = None
    listed_in: str | None = None


@dataclass(frozen=True)
class Right:
    principal: str
    role: Role
    scope: str
    key: str
    granted_by: GrantedBy
    why: str
    when: When | None = None
    condition: str | None = None
    residual: str | None = None

    def resource_key(self, index: int | None = None) -> str:
        """The grant key with its list position filled in (submitter-{i}-workspace -> submitter-0-workspace)."""
        if "{i}" in self.key:
            if index is None:
                raise ValueError(f"right {self.key!r} is per list entry: give its index")
            return self.key.replace("{i}", str(index))
        return self.key

    def applies(self, facts: Iterable[str]) -> bool:
        """Whether the right exists in a stack with these facts (the `when` values that hold)."""
        return self.when is None or self.when in set(facts)


@dataclass(frozen=True)
class GitHubEnvironment:
    key: str
    name: str
    """Template: {environment} is the aml-hpc environment (dev, prod)."""
    principal: str
    branches: tuple[str, ...]
    reviewers: Literal["outside-dev", "never", "always"]
    secrets: Mapping[str, str]
    """Secret name -> the passphrase file its value is read from (template, e.g. {environment}.txt)."""
    variables: tuple[str, ...]

    def name_for(self, environment: str) -> str:
        return self.name.replace(ENVIRONMENT_PLACEHOLDER, environment)

    def secret_files(self, environment: str) -> dict[str, str]:
        """Secret name -> its passphrase file's name for one environment (prod: prod.txt...)."""
        return {secret: file.replace(ENVIRONMENT_PLACEHOLDER, environment) for secret, file in self.secrets.items()}

    def needs_reviewers(self, environment: str) -> bool:
        return self.reviewers == "always" or (self.reviewers == "outside-dev" and environment != "dev")


@dataclass(frozen=True)
class PermissionModel:
    roles: Mapping[str, Role]
    principals: Mapping[str, Principal]
    rights: tuple[Right, ...]
    github_environments: Mapping[str, GitHubEnvironment]

    # -- lookups
    def role(self, key: str) -> Role:
        return self.roles[key]

    def role_by_guid(self, guid: str, subscription_id: str = "") -> Role | None:
        wanted = guid.lower().rsplit("/", 1)[-1]
        return next((r for r in self.roles.values() if r.guid_in(subscription_id).lower() == wanted), None)

    def rights_of(self, principal: str, granted_by: str | None = None) -> list[Right]:
        if principal not in self.principals:
            raise KeyError(f"no principal {principal!r} in the permission model")
        return [r for r in self.rights if r.principal == principal and (granted_by is None or r.granted_by == granted_by)]

    def right(self, principal: str, key: str) -> Right:
        found = [r for r in self.rights if r.principal == principal and r.key == key]
        if len(found) != 1:
            raise KeyError(f"no right {key!r} of principal {principal!r} in the permission model")
        return found[0]

    def custom_roles(self) -> list[Role]:
        return [r for r in self.roles.values() if r.custom]

    def github_environment_of(self, principal: str) -> GitHubEnvironment | None:
        return next((g for g in self.github_environments.values() if g.principal == principal), None)

    # -- derived facts
    def assignable_principal_types(self) -> dict[tuple[str, ...], list[str]]:
        """The principal types each assignable role may be given to, grouped: a role the model
        gives only to identities (workloads, Azure's, CI) goes to ServicePrincipal only; one it
        gives people (submitters, uploaders, jump-box logins, who may be groups or CI
        identities) to User, Group or ServicePrincipal. Sorted, for a stable condition."""
        people = {r.role.key for r in self.rights if r.granted_by in ("program", "azure-ml")
                  and self.principals[r.principal].kind == "person"}
        keys = {r.role.key for r in self.rights if r.granted_by in ("program", "azure-ml")}
        groups: dict[tuple[str, ...], list[str]] = {}
        for key in sorted(keys):
            types = PERSON_PRINCIPAL_TYPES if key in people else IDENTITY_PRINCIPAL_TYPES
            groups.setdefault(types, []).append(key)
        return groups

    def constrain_roles_condition(self, subscription_id: str) -> str:
        """Azure's "constrain roles and principal types" condition for Role Based Access
        Control Administrator: role assignments may be written and deleted only for the listed
        roles, each to the principal types the model gives it to (Microsoft Learn, "Delegate
        Azure role assignment management to others with conditions", examples "Constrain roles"
        and "Constrain roles and principal types"; attribute syntax in
        conditions-authorization-actions-attributes)."""
        def allowed(source: str) -> str:
            parts = []
            for types, keys in self.assignable_principal_types().items():
                guids = ", ".join(sorted(self.roles[k].guid_in(subscription_id) for k in keys))
                names = ", ".join(f"'{t}'" for t in types)
                parts.append(f"(@{source}[Microsoft.Authorization/roleAssignments:RoleDefinitionId] "
                             f"ForAnyOfAnyValues:GuidEquals {{{guids}}} AND "
                             f"@{source}[Microsoft.Authorization/roleAssignments:PrincipalType] "
                             f"ForAnyOfAnyValues:StringEqualsIgnoreCase {{{names}}})")
            return " OR ".join(parts)

        return ("((!(ActionMatches{'Microsoft.Authorization/roleAssignments/write'})) OR "
                f"({allowed('Request')}))"
                " AND "
                "((!(ActionMatches{'Microsoft.Authorization/roleAssignments/delete'})) OR "
                f"({allowed('Resource')}))")

    def condition_text(self, name: str | None, subscription_id: str) -> str | None:
        if name is None:
            return None
        if name == "constrain-roles":
            return self.constrain_roles_condition(subscription_id)
        if name == "job-writes-only":
            return job_writes_condition()
        raise KeyError(f"unknown condition {name!r}")


JOB_WRITE_PATHS: tuple[tuple[str, str], ...] = (
    ("azureml", "ExperimentRun/*"),
    ("azureml-blobstore-*", "azureml/*"),
)
"""Where Azure ML writes a job's own files in the workspace storage, as (container, blob path)
patterns: run history's logs and artifacts (`azureml` container, `ExperimentRun/dcid.<run>/`)
and the default outputs of a job (the workspaceblobstore datastore's container,
`azureml/<job>/<output>/`). Code snapshots (`LocalUpload/<hash>/` in the same container) and
everything else stay read-only to a job identity."""

JOB_WRITE_ACTIONS: tuple[str, ...] = (
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write",
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/add/action",
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/delete",
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/move/action",
)
"""Every data action of Storage Blob Data Contributor that changes a blob."""

_CONTAINER_NAME = "@Resource[Microsoft.Storage/storageAccounts/blobServices/containers:name]"
_BLOB_PATH = "@Resource[Microsoft.Storage/storageAccounts/blobServices/containers/blobs:path]"


def job_writes_condition() -> str:
    """The condition on a job identity's Storage Blob Data Contributor on the workspace
    storage: reads anywhere, writes, deletes and renames only in `JOB_WRITE_PATHS`, so no job
    can overwrite another job's code snapshot or the controller's code asset. Format and
    operators: Microsoft Learn, "Example Azure role assignment conditions for Blob Storage"
    (examples "Read or write blobs in named container with a path", 2024-04-01) and "Azure role
    assignment condition format and syntax" (StringLike: `*` matches any run of characters);
    attributes `containers:name` and `blobs:path` in "Actions and attributes for Azure role
    assignment conditions for Azure Blob Storage"."""
    actions = " AND ".join(f"!(ActionMatches{{'{a}'}})" for a in JOB_WRITE_ACTIONS)
    places = " OR ".join(
        f"({_CONTAINER_NAME} {'StringLike' if '*' in c else 'StringEquals'} '{c}' AND {_BLOB_PATH} StringLike '{p}')"
        for c, p in JOB_WRITE_PATHS)
    return f"(({actions}) OR ({places}))"


IDENTITY_PRINCIPAL_TYPES: tuple[str, ...] = ("ServicePrincipal",)
"""Managed identities and applications (Azure's principalType for a managed identity)."""
PERSON_PRINCIPAL_TYPES: tuple[str, ...] = ("Group", "ServicePrincipal", "User")
"""What aml-hpc:submitters and the other people lists may name."""

CONDITION_VERSION = "2.0"
"""The only version Azure accepts for role assignment conditions (RoleAssignment.conditionVersion)."""


def action_matches(pattern: str, action: str) -> bool:
    """Azure's action matching: case-insensitive, `*` is any run of characters."""
    regex = "^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$"
    return re.match(regex, action, re.IGNORECASE) is not None


# --------------------------------------------------------------------------------------
# Loading

_ROLE_KEYS = {"name", "guid", "source", "actions", "not_actions", "data_actions", "custom", "description", "privileged"}
_PRINCIPAL_KEYS = {"title", "kind", "identity", "note", "per_environment", "github_environment", "listed_in"}
_RIGHT_KEYS = {"principal", "role", "scope", "key", "granted_by", "why", "when", "condition", "residual"}
_GITHUB_KEYS = {"name", "principal", "branches", "reviewers", "secrets", "variables"}
_GUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _unknown(where: str, given: Mapping[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(given) - allowed)
    if extra:
        raise CatalogError(f"{PERMISSIONS_FILE.name}: {where}: unknown key(s) {', '.join(extra)}")


def _role(key: str, raw: dict[str, Any]) -> Role:
    _unknown(f"roles.{key}", raw, _ROLE_KEYS)
    custom = bool(raw.get("custom"))
    actions = raw.get("actions") or ()
    why: dict[str, str] = {}
    if custom:
        if not isinstance(actions, dict) or not actions or raw.get("guid"):
            raise CatalogError(f"{PERMISSIONS_FILE.name}: roles.{key}: a custom role lists its actions as "
                               "`action = why` and has no guid (it is derived per subscription)")
        why = {str(a): str(reason) for a, reason in actions.items()}
        actions = tuple(why)
    elif not _GUID.match(str(raw.get("guid", ""))) or not raw.get("source"):
        raise CatalogError(f"{PERMISSIONS_FILE.name}: roles.{key}: a built-in role needs its guid and source")
    return Role(key, str(raw["name"]), tuple(actions), tuple(raw.get("not_actions", ())),
                tuple(raw.get("data_actions", ())), raw.get("guid"), custom, str(raw.get("description", "")),
                str(raw.get("source", "")), why, raw.get("privileged"))


def _scope_known(scope: str) -> bool:
    return scope in FIXED_SCOPES or any(scope.startswith(p) and len(scope) > len(p) for p in SCOPE_PREFIXES)


def _right_problems(raw: Mapping[str, Any], roles: Mapping[str, Role], principals: Mapping[str, Principal]) -> list[str]:
    checks = [
        (raw.get("principal") in principals, f"unknown principal {raw.get('principal')!r}"),
        (raw.get("role") in roles, f"unknown role {raw.get('role')!r}"),
        (_scope_known(str(raw.get("scope"))), f"unknown scope {raw.get('scope')!r}"),
        (raw.get("granted_by") in GRANTED_BY, f"granted_by must be one of {', '.join(GRANTED_BY)}"),
        (raw.get("when") in (None, *WHEN), f"when must be one of {', '.join(WHEN)}"),
        (raw.get("condition") in (None, *CONDITIONS), f"unknown condition {raw.get('condition')!r}"),
        (bool(str(raw.get("why", "")).strip()), "a right says why"),
    ]
    return [message for ok, message in checks if not ok]


def parse(document: Mapping[str, Any]) -> PermissionModel:
    """The model from the TOML document; CatalogError naming the first bad entry."""
    _unknown("top level", document, {"roles", "principals", "github_environments", "rights"})
    roles = {k: _role(k, v) for k, v in document.get("roles", {}).items()}
    principals = {}
    for key, raw in document.get("principals", {}).items():
        _unknown(f"principals.{key}", raw, _PRINCIPAL_KEYS)
        principals[key] = Principal(key, raw["title"], raw["kind"], raw["identity"], raw.get("note", ""),
                                    bool(raw.get("per_environment")), raw.get("github_environment"), raw.get("listed_in"))
    github = {}
    for key, raw in document.get("github_environments", {}).items():
        _unknown(f"github_environments.{key}", raw, _GITHUB_KEYS)
        if raw["principal"] not in principals:
            raise CatalogError(f"{PERMISSIONS_FILE.name}: github_environments.{key}: unknown principal {raw['principal']!r}")
        secrets = raw.get("secrets", {})
        if not isinstance(secrets, dict) or not all(isinstance(f, str) and f.endswith(".txt") for f in secrets.values()):
            raise CatalogError(f"{PERMISSIONS_FILE.name}: github_environments.{key}.secrets: not a table of "
                               'SECRET = "<passphrase file>.txt" (e.g. PULUMI_CONFIG_PASSPHRASE = "{environment}.txt")')
        github[key] = GitHubEnvironment(key, raw["name"], raw["principal"], tuple(raw["branches"]), raw["reviewers"],
                                        dict(secrets), tuple(raw.get("variables", ())))
    rights = []
    for i, raw in enumerate(document.get("rights", [])):
        where = f"rights[{i}] ({raw.get('principal')}/{raw.get('key')})"
        _unknown(where, raw, _RIGHT_KEYS)
        problems = _right_problems(raw, roles, principals)
        if problems:
            raise CatalogError(f"{PERMISSIONS_FILE.name}: {where}: {'; '.join(problems)}")
        role = roles[raw["role"]]
        if role.privileged and raw.get("condition") is None:
            raise CatalogError(f"{PERMISSIONS_FILE.name}: {where}: {role.name} only with a condition ({role.privileged})")
        rights.append(Right(raw["principal"], role, raw["scope"], raw["key"], raw["granted_by"], raw["why"].strip(),
                            raw.get("when"), raw.get("condition"), raw.get("residual")))
    seen: set[tuple[str, str]] = set()
    for r in rights:
        if (r.principal, r.key) in seen:
            raise CatalogError(f"{PERMISSIONS_FILE.name}: right {r.key!r} of {r.principal!r} is listed twice")
        seen.add((r.principal, r.key))
    return PermissionModel(roles, principals, tuple(rights), github)


@cache
def load(path: Path = PERMISSIONS_FILE) -> PermissionModel:
    with path.open("rb") as handle:
        return parse(tomllib.load(handle))


MODEL = load()
