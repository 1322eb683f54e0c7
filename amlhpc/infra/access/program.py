"""What the access program declares, from the permission model (amlhpc/core/catalog/permissions.toml).

Per subscription: a resource group for the CI identities and the state account; the state
account (Entra ID only, versioning and soft delete) with two containers per environment, one
for the environment stack (state-<env>) and one for its experiments (state-<env>-experiments),
so the teardown identity, which destroys experiments, never reaches the environment's state; the
custom roles (authorization.RoleDefinition, assignable in the environments' resource groups);
each environment's resource group, created here so its identities can be scoped to it
before its first deployment (the environment stack adopts it: it is retained).

Per environment and CI principal of the model (deploy, teardown): a user-assigned identity
with one federated credential, for the GitHub environment the model names and nothing else
(subject repo:<owner>/<name>:environment:<name>; a pull request's token never matches), and
the principal's `access-setup` rights as role assignments at that environment's scopes.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi_azure_native import authorization, managedidentity, resources, storage

from amlhpc.core.errors import Problem, UserError
from amlhpc.core.permissions import MODEL, Right
from amlhpc.infra.access.config import AccessConfig
from amlhpc.infra.components.access import role_assignment
from amlhpc.infra.components.storage_account import blob_service, secure_storage_account
from amlhpc.infra.config import StackConfig
from amlhpc.infra.program import stack_facts
from amlhpc.infra.quirks import role_definition_id

GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
GITHUB_AUDIENCE = "api://AzureADTokenExchange"
"""GitHub's OIDC issuer, and the audience azure/login asks Entra ID for (Azure/login README, OIDC)."""
STATE_SOFT_DELETE_DAYS = 30
CI_PRINCIPALS = tuple(p.key for p in MODEL.principals.values() if p.kind == "ci" and p.per_environment)
EXPERIMENTS_SUFFIX = "-experiments"


def state_container(environment: str) -> str:
    """The environment stack's state (and its published outputs)."""
    return f"state-{environment}"


def experiments_state_container(environment: str) -> str:
    """The state of the environment's experiment stacks, under their own passphrase."""
    return f"state-{environment}{EXPERIMENTS_SUFFIX}"


def identity_name(prefix: str, environment: str, principal: str) -> str:
    return f"id-{prefix}-{environment}-{principal}"


def build(cfg: AccessConfig) -> dict[str, Any]:
    _refuse_ambiguous_containers(cfg)
    client = authorization.get_client_config_output()
    subscription = client.subscription_id
    tags = {"managed-by": "pulumi-aml-hpc-access", "environment": "access", "owner": "platform"}
    group = resources.ResourceGroup("access-rg", resource_group_name=cfg.resource_group, location=cfg.location,
                                    tags=tags, opts=pulumi.ResourceOptions(protect=True))
    account = secure_storage_account("state-account", account_name=cfg.state_account, resource_group_name=group.name,
                                     location=cfg.location, tags=tags, opts=pulumi.ResourceOptions(protect=True))
    blob_service("state-blob-service", account=account, resource_group_name=group.name,
                 soft_delete_days=STATE_SOFT_DELETE_DAYS, versioning=True,
                 opts=pulumi.ResourceOptions(retain_on_delete=True))

    groups = {env.stack: _environment_group(env) for env in cfg.environments}
    roles = {role.key: _custom_role(role.key, subscription, list(groups.values())) for role in MODEL.custom_roles()}
    github: dict[str, Any] = {}
    for env in cfg.environments:
        containers = {scope: storage.BlobContainer(name, account_name=account.name, resource_group_name=group.name,
                                                   container_name=name, public_access="None",
                                                   opts=pulumi.ResourceOptions(protect=True))
                      for scope, name in (("state-container", state_container(env.stack)),
                                          ("experiments-state-container", experiments_state_container(env.stack)))}
        scopes = {"resource-group": groups[env.stack].id, **{scope: c.id for scope, c in containers.items()}}
        for principal in CI_PRINCIPALS:
            identity = _ci_identity(cfg, group, env.stack, principal)
            for right in MODEL.rights_of(principal, "access-setup"):
                if right.applies(stack_facts(env)):
                    _assign(right, env.stack, scopes, identity, subscription, roles)
            gh = MODEL.github_environment_of(principal)
            assert gh is not None, f"the model names no GitHub environment for {principal}"
            values = {"AZURE_CLIENT_ID": identity.client_id, "AZURE_TENANT_ID": client.tenant_id,
                      "AZURE_SUBSCRIPTION_ID": subscription, "AMLHPC_STATE_ACCOUNT": cfg.state_account}
            github[gh.name_for(env.stack)] = {
                **{name: values[name] for name in gh.variables},
                "reviewers": gh.needs_reviewers(env.stack), "branches": list(gh.branches),
                "secrets": gh.secret_files(env.stack)}
    return {"github": github, "stateAccount": account.name,
            "customRoles": {key: role.role_name for key, role in roles.items()}}


def _refuse_ambiguous_containers(cfg: AccessConfig) -> None:
    """state-x-experiments holds x's experiments: no environment may be named x-experiments."""
    problems = [Problem(f"Pulumi.{env.stack}.yaml", "aml-hpc-access:environments",
                        f"environment {env.stack!r} ends in {EXPERIMENTS_SUFFIX!r}: its state container "
                        f"{state_container(env.stack)!r} is named like the container of environment "
                        f"{env.stack.removesuffix(EXPERIMENTS_SUFFIX)!r}'s experiments",
                        "rename the environment stack, or leave it out of aml-hpc-access:environments")
                for env in cfg.environments if env.stack.endswith(EXPERIMENTS_SUFFIX)]
    if problems:
        raise UserError(problems, "invalid access configuration")


def _environment_group(env: StackConfig) -> resources.ResourceGroup:
    """The environment's resource group, before its first deployment; the environment stack
    adopts it (retained there) and owns its tags, so this program ignores them after creation."""
    return resources.ResourceGroup(
        f"env-{env.stack}-rg", resource_group_name=env.names.resource_group, location=env.location, tags=env.tags(),
        opts=pulumi.ResourceOptions(protect=True, retain_on_delete=True, ignore_changes=["tags"]))


def _custom_role(key: str, subscription: pulumi.Output[str],
                 groups: list[resources.ResourceGroup]) -> authorization.RoleDefinition:
    role = MODEL.role(key)
    return authorization.RoleDefinition(
        f"role-{key}",
        role_definition_id=subscription.apply(role.guid_in),
        scope=subscription.apply(lambda sub: f"/subscriptions/{sub}"),
        role_name=subscription.apply(role.display_name),
        description=role.description,
        role_type="CustomRole",
        permissions=[authorization.PermissionArgs(actions=list(role.actions), not_actions=list(role.not_actions),
                                                  data_actions=list(role.data_actions))],
        assignable_scopes=[g.id for g in groups],
    )


def _ci_identity(cfg: AccessConfig, group: resources.ResourceGroup, environment: str,
                 principal: str) -> managedidentity.UserAssignedIdentity:
    gh = MODEL.github_environment_of(principal)
    assert gh is not None
    name = identity_name(cfg.name_prefix, environment, principal)
    identity = managedidentity.UserAssignedIdentity(
        f"{principal}-{environment}", resource_name_=name, resource_group_name=group.name, location=cfg.location,
        tags={"environment": environment, "managed-by": "pulumi-aml-hpc-access", "owner": "platform"})
    managedidentity.FederatedIdentityCredential(
        f"{principal}-{environment}-github", resource_name_=name, resource_group_name=group.name,
        federated_identity_credential_resource_name=f"github-{gh.name_for(environment)}",
        issuer=GITHUB_ISSUER, audiences=[GITHUB_AUDIENCE],
        subject=f"repo:{cfg.repository}:environment:{gh.name_for(environment)}",
        opts=pulumi.ResourceOptions(parent=identity))
    return identity


def _assign(right: Right, environment: str, scopes: dict[str, Any], identity: managedidentity.UserAssignedIdentity,
            subscription: pulumi.Output[str], roles: dict[str, authorization.RoleDefinition]) -> None:
    role = right.role
    role_id = subscription.apply(lambda sub: role_definition_id(sub, role.guid_in(sub)))
    condition: pulumi.Output[str] | None = None
    if right.condition:
        condition = subscription.apply(lambda sub: MODEL.condition_text(right.condition, sub) or "")
    role_assignment(f"{right.principal}-{environment}-{right.key}", scope=scopes[right.scope],
                    principal_id=identity.principal_id, principal_type="ServicePrincipal",
                    role_definition_id=role_id, condition=condition,
                    opts=pulumi.ResourceOptions(depends_on=[roles[role.key]] if role.custom else None))
