"""Who can do what, where, in a stack: the offline plan's role assignments joined with the
permission model (`python -m amlhpc.infra plan --stack S --access`, docs/security.md).

`access_view(plan)` reads every role assignment the program declares, tells which principal
it names (by the principal ids the plan's identities, workspace and stack file give), which
of the model's scopes it sits at (by the ids of the plan's own resources) and which right
of the model it is; then adds the rights the access program gives the environment's CI
identities. An assignment the model does not explain is listed under `unexplained`:
tests/test_permissions_stacks.py requires none in any stack.
"""

from __future__ import annotations

from typing import Any

from amlhpc.core.permissions import MODEL, Right
from amlhpc.infra.plan import Plan
from amlhpc.infra.plan.mocks import PlanMocks, RecordedResource

ROLE = "azure-native:authorization:RoleAssignment"

# The plan's resources (logical names) the model's principals and scopes are.
IDENTITIES = {"ml-compute-identity": "compute", "controller-identity": "controller", "ml-cmk-identity": "cmk"}
SCOPES = {"ml-mlw": "workspace", "ml-storage": "workspace-storage", "data-account": "dataset-account",
          "ml-acr": "registry", "ml-cmk-key": "cmk-key", "way-in-jump-box": "jump-box",
          "way-in-jump-box-nic": "jump-box-nic", "way-in-bastion": "bastion"}


DATA_CONTAINER_PARENTS = ("data-", "checkpoints", "coordination-")
"""The containers of the dataset account and of the role accounts (amlhpc/infra/program.py role_accounts):
each is the model's container:<name> scope in whichever account holds it."""

Holder = tuple[str, str, int | None]
"""(model principal, who, position in its stack file list)"""


def _ids(plan: Plan) -> tuple[dict[str, list[Holder]], dict[str, tuple[str, str]]]:
    """(principal id -> the model principals it is: one person may be a submitter and a jump box
    login), lower-case resource id -> (scope, name))."""
    mocks = PlanMocks(plan.subscription_id)
    principals: dict[str, list[Holder]] = {}
    scopes: dict[str, tuple[str, str]] = {}
    for r in plan.resources:
        if not r.custom:
            continue
        computed = mocks._computed(r.type, r.inputs, r.name)  # noqa: SLF001 - the plan's own synthetic answers
        if r.name in IDENTITIES:
            principals[computed["principalId"]] = [(IDENTITIES[r.name], str(r.inputs.get("resourceName")), None)]
        if r.name == "ml-mlw":
            principals[computed["identity"]["principalId"]] = [("workspace", f"{r.inputs['workspaceName']} (system)", None)]
        arm_id = mocks._arm_id(r.type, r.inputs, r.name).lower()  # noqa: SLF001
        name = str(computed.get("name"))
        if r.name in SCOPES:
            scopes[arm_id] = (SCOPES[r.name], name)
        elif r.type == "azure-native:storage:BlobContainer" and r.name.startswith(DATA_CONTAINER_PARENTS):
            scopes[arm_id] = (f"container:{r.inputs['containerName']}", f"{r.inputs['accountName']}/{name}")
        elif r.type == "azure-native:network:PrivateEndpoint" and r.name.startswith("endpoints-"):
            scopes[arm_id] = (f"endpoint:{r.name.removeprefix('endpoints-')}", name)
    cfg = plan.config
    way_in = cfg.network.way_in
    logins = way_in.jump_box.logins if way_in is not None and way_in.jump_box is not None else []
    for listed, key in ((cfg.submitters, "submitter"), (cfg.storage.data_contributors, "data-contributor"),
                        (logins, "jump-box-user")):
        for i, who in enumerate(listed):
            principals.setdefault(who.principal_id, []).append((key, f"{who.principal_type} {who.principal_id}", i))
    if cfg.encryption.cosmos_db_principal_id:
        principals.setdefault(cfg.encryption.cosmos_db_principal_id, []).append(
            ("cosmos-db", cfg.encryption.cosmos_db_principal_id, None))
    return principals, scopes


def _explain(r: RecordedResource, principal: str, scope: str, subscription: str) -> Right | None:
    guid = str(r.inputs.get("roleDefinitionId", "")).rsplit("/", 1)[-1].lower()
    for right in MODEL.rights_of(principal) if principal in MODEL.principals else []:
        if right.scope == scope and right.role.guid_in(subscription).lower() == guid:
            return right
    return None


def _entry(right: Right, resource: str, subscription: str, assignment: str | None,
           index: int | None = None) -> dict[str, Any]:
    role = right.role
    return {"key": right.resource_key(index) if "{i}" in right.key and index is not None else right.key, "role": role.name, "scope": right.scope, "resource": resource,
            "grantedBy": right.granted_by, "condition": right.condition, "why": right.why,
            "residual": right.residual, "custom": role.custom,
            "actions": list(role.actions) if role.custom else [], "assignment": assignment,
            "roleDefinition": role.guid_in(subscription)}


def access_view(plan: Plan) -> dict[str, Any]:
    """The stack's principals and their rights (JSON-safe); see the module docstring."""
    if plan.config.is_experiment and plan.environment is not None:
        view = access_view(plan.environment)
        view["stack"], view["note"] = plan.config.stack, (
            f"experiment stacks grant nothing: their clusters run as environment {plan.config.environment!r}'s "
            "GPU clusters' identity, with its rights below")
        return view
    subscription = plan.subscription_id
    principals, scopes = _ids(plan)
    rights: dict[str, list[dict[str, Any]]] = {}
    unexplained = []
    for r in plan.of_type(ROLE):
        holders = principals.get(str(r.inputs.get("principalId"))) or [("?", str(r.inputs.get("principalId")), None)]
        scope, resource = scopes.get(str(r.inputs.get("scope", "")).lower(), ("?", str(r.inputs.get("scope"))))
        explained = [(right, holder) for holder in holders
                     if (right := _explain(r, holder[0], scope, subscription)) is not None]
        principal, who, index = explained[0][1] if explained else holders[0]
        right = explained[0][0] if explained else None
        if right is None:
            unexplained.append({"assignment": r.name, "principal": principal, "scope": scope,
                                "roleDefinitionId": r.inputs.get("roleDefinitionId")})
            continue
        rights.setdefault(principal, []).append({**_entry(right, resource, subscription, r.name, index), "who": who})
    from amlhpc.infra.access.program import experiments_state_container, state_container

    environment = plan.config.environment
    for principal in ("deploy", "teardown"):
        gh = MODEL.github_environment_of(principal)
        for right in MODEL.rights_of(principal, "access-setup"):
            if right.applies(_facts(plan)):
                resource = {"resource-group": plan.config.names.resource_group,
                            "state-container": state_container(environment),
                            "experiments-state-container": experiments_state_container(environment)}[right.scope]
                rights.setdefault(principal, []).append(
                    {**_entry(right, resource, subscription, None),
                     "who": f"GitHub environment {gh.name_for(environment) if gh else '?'}"})
    for right in (r for r in MODEL.rights if r.granted_by == "azure-ml"):
        rights.setdefault(right.principal, []).append(
            {**_entry(right, plan.config.names.resource_group, subscription, None), "who": "assigned by Azure ML"})
    out = []
    for key, model_principal in MODEL.principals.items():
        entries = sorted(rights.get(key, []), key=lambda e: (e["who"], e["key"]))
        out.append({"principal": key, "title": model_principal.title, "kind": model_principal.kind, "note": model_principal.note,
                    "rights": entries})
    return {"stack": plan.config.stack, "environment": environment, "subscription": subscription,
            "principals": out, "unexplained": unexplained}


def _facts(plan: Plan) -> frozenset[str]:
    from amlhpc.infra.program import stack_facts

    return stack_facts(plan.config)
