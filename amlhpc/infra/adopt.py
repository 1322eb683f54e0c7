"""Redeploy after teardown: each stack's own global names, and adopting what destroy kept.

Two steps `scripts/pulumi-stack.sh` runs before Pulumi does (the lifecycle emulator in
tests/lifecycle runs the same functions):

1. `ensure_suffix`: an environment stack gets a random `aml-hpc:nameSuffix`, written once
   into its stack file. Every globally unique name (storage accounts, Key Vault, container
   registry, ML registry) ends in it, so two copies of this repository never ask Azure for
   the same names (amlhpc.infra.naming).
2. `import_document`: `pulumi destroy` leaves retainOnDelete resources in Azure but drops
   them from the stack's state, and azure-native refuses to create a resource that exists
   ("cannot create already existing resource", provider defaultCreate; pulumi-azure-native
   issue #1123). Before `up`, every retained resource the program declares that exists in
   Azure but not in the state goes into a `pulumi import --file` document (parents that
   destroy removed are recreated as empty components, Pulumi >= 3.94). `pulumi import`
   reads each one as it is, and the `up` that follows brings it to the declared settings.

Singletons (blob service properties) are left out: azure-native creates them with a PUT
whatever exists, so they never conflict.

Retained role assignments (a customer-managed key's grants, kept with the workspace that
needs the key while the stack is down) are matched in Azure by (scope, role, principal),
the triple Azure allows one assignment for - never by the id the offline plan computes:
the plan's principal ids are stand-ins, Entra's are random and new with every identity.
The principal of an identity the program declares is read from that identity in Azure
(a user-assigned identity's `properties.principalId`, a system-assigned one's
`identity.principalId`); the assignments at the scope are listed (`roleAssignments`,
`$filter=atScope()`, then the exact scope kept) and the one of that role and principal is
adopted by its own id. One found under another name than the program gives it (created by
hand, or by an older version) is refused with the command that removes it: adopted, the
program's own name would replace it on the next `up`.

`python -m amlhpc.infra.adopt suffix --stack S` and `python -m amlhpc.infra.adopt import-file --stack S
--state state.json --subscription ID --out import.json` are the two commands. Bad input
exits 2 with the problem and its fix.
"""

from __future__ import annotations

import importlib
import json
import re
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from amlhpc.core import invocation
from amlhpc.core.errors import Problem, UserError, exit_on_bad_input
from amlhpc.infra import naming
from amlhpc.infra.config import (
    EXPERIMENT_PREFIX,
    NAME_SUFFIX_KEY,
    REPO_ROOT,
    read_stack_file,
    stack_file,
)

SINGLETONS = frozenset({"azure-native:storage:BlobServiceProperties"})
"""Types azure-native treats as always existing: create is a PUT, delete resets defaults."""

ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"
UAI = "azure-native:managedidentity:UserAssignedIdentity"
ARM_ENDPOINT = "https://management.azure.com"
ROLE_ASSIGNMENTS_API = "2022-04-01"


# --------------------------------------------------------------------------------------
# 1. The stack's name suffix


def ensure_suffix(stack: str, root: Path = REPO_ROOT, make: Callable[[], str] = naming.random_suffix) -> str | None:
    """The stack's aml-hpc:nameSuffix, written into Pulumi.<stack>.yaml if it has none.

    Experiment stacks own no global names: None, file untouched. The line goes right under
    `config:` so the file's comments survive."""
    if stack.startswith(EXPERIMENT_PREFIX):
        return None
    config = read_stack_file(stack, root)
    existing = config.get(NAME_SUFFIX_KEY)
    if existing is not None:
        problem = naming.check("nameSuffix", str(existing))
        if not isinstance(existing, str):  # `012345` reads as 5349 (octal): names would drift
            problem = (f"reads as {type(existing).__name__} {existing!r} in YAML, not the text written; "
                       f"quote it: {NAME_SUFFIX_KEY}: \"<the six characters>\"")
        if problem:
            raise UserError([Problem(f"Pulumi.{stack}.yaml", NAME_SUFFIX_KEY, problem,
                                     f"delete the line; the next `{invocation.deploy('preview', stack)}` writes a new one")], "invalid stack file")
        return str(existing)
    suffix = make()
    path = stack_file(stack, root)
    text = path.read_text()
    line = f"  {NAME_SUFFIX_KEY}: {suffix}  # random, once per stack: keeps global names unique (commit it)\n"
    match = re.search(r"^config:[ \t]*\n", text, flags=re.MULTILINE)
    if match:
        updated = text[:match.end()] + line + text[match.end():]
    else:  # `config: {}` or no config block: rewrite it (comments cannot survive this shape)
        updated = yaml.safe_dump({"config": {**config, NAME_SUFFIX_KEY: suffix}}, sort_keys=False)
    if read_yaml_config(updated).get(NAME_SUFFIX_KEY) != suffix:  # a `make` that YAML reads as a number
        raise AssertionError(f"could not write {NAME_SUFFIX_KEY} into {path.name}")
    path.write_text(updated)
    return suffix


def read_yaml_config(text: str) -> dict[str, Any]:
    document = yaml.safe_load(text) or {}
    return dict(document.get("config") or {})


# --------------------------------------------------------------------------------------
# 2. Adopting retained resources


@dataclass(frozen=True)
class Retained:
    """A resource the program declares with retainOnDelete: what importing it needs."""

    urn: str
    type: str
    name: str
    parent_urn: str | None
    arm_id: str
    api_version: str
    ancestors: tuple[str, ...] = ()
    """URNs of the component parents, the nearest first (the root stack left out)."""
    inputs: dict[str, Any] | None = None
    """A role assignment's scope, principalId and roleDefinitionId as the plan has them."""


@dataclass(frozen=True)
class IdentityRef:
    """Where the real principal id of a planned (stand-in) one is read in Azure."""

    arm_id: str
    api_version: str
    path: str
    """Dotted path in the ARM GET body: properties.principalId or identity.principalId."""


class AzureReader(typing.Protocol):
    """What adoption reads from Azure (ARM wire shapes)."""

    def exists(self, r: Retained) -> bool: ...

    def read(self, arm_id: str, api_version: str) -> dict[str, Any] | None: ...

    def role_assignments(self, scope: str) -> list[dict[str, Any]]:
        """`{scope}/providers/Microsoft.Authorization/roleAssignments?$filter=atScope()`: at
        the scope and above it."""
        ...


def provider_api_version(type_token: str) -> str:
    """The Azure REST API version the installed azure-native SDK uses for a type
    (its docstring: "Uses Azure REST API version ...")."""
    _, module, cls_name = type_token.split(":")
    cls = getattr(importlib.import_module(f"pulumi_azure_native.{module}"), cls_name)
    docs = [cls.__init__.__doc__ or ""] + [o.__doc__ or "" for o in typing.get_overloads(cls.__init__)]
    for doc in docs:
        found = re.search(r"Uses Azure REST API version ([0-9a-z-]+)\.", doc)
        if found:
            return found.group(1)
    raise LookupError(f"no API version in the docstring of {type_token}")


ROOT_STACK_TYPE = "pulumi:pulumi:Stack"


def engine_urns(resources: Iterable[Any]) -> dict[str, str]:
    """Recorded URN -> the URN the engine gives the same resource.

    Pulumi's mock runtime builds a URN from the parent's last type only (MockMonitor.
    make_urn), the engine from the parent's whole type chain (without the root stack's
    type): a resource two components deep gets a different URN in the offline plan than in
    the state. Rebuilt here from each recorded resource's parent."""
    by_urn = {r.urn: r for r in resources}
    out: dict[str, str] = {}

    def chain(urn: str) -> str | None:
        r = by_urn.get(urn)
        if r is None or r.type == ROOT_STACK_TYPE:
            return None
        above = chain(r.parent) if r.parent else None
        return f"{above}${r.type}" if above else r.type

    for urn, r in by_urn.items():
        types = chain(urn)
        if types is not None:
            stack, project = urn.removeprefix("urn:pulumi:").split("::")[:2]
            out[urn] = f"urn:pulumi:{stack}::{project}::{types}::{r.name}"
    return out


def retained_resources(plan: Any) -> list[Retained]:
    """Retained custom resources of an offline plan (amlhpc.infra.plan.evaluate with the real
    subscription id), singletons left out, with their ARM ids and engine URNs."""
    from amlhpc.infra.plan.mocks import PlanMocks

    ids = PlanMocks(plan.outputs["subscriptionId"])
    urns = engine_urns(plan.resources)
    parents = {r.urn: r.parent for r in plan.resources}
    out = []
    for r in plan.custom_resources():
        if not r.retain_on_delete or r.type in SINGLETONS:
            continue
        ancestors = []
        parent = r.parent
        while parent in urns:  # components up to (without) the root stack
            ancestors.append(urns[parent])
            parent = parents.get(parent)
        grant = {k: r.inputs.get(k) for k in ("scope", "principalId", "roleDefinitionId")} \
            if r.type == ROLE_ASSIGNMENT else None
        out.append(Retained(urns[r.urn], r.type, r.name, ancestors[0] if ancestors else None,
                            ids._arm_id(r.type, r.inputs, r.name),  # noqa: SLF001
                            provider_api_version(r.type), tuple(ancestors), grant))
    return out


def planned_identities(plan: Any) -> dict[str, IdentityRef]:
    """Stand-in principal id (the offline plan's) -> the identity to read the real one from."""
    from amlhpc.infra.plan.mocks import PlanMocks, physical_name, planned_principal

    ids = PlanMocks(plan.outputs["subscriptionId"])
    out = {}
    for r in plan.custom_resources():
        name = physical_name(r.type, r.inputs, r.name)
        arm_id = ids._arm_id(r.type, r.inputs, r.name)  # noqa: SLF001
        if r.type == UAI:
            out[planned_principal(r.type, name, False)] = IdentityRef(arm_id, provider_api_version(r.type),
                                                                      "properties.principalId")
        identity = r.inputs.get("identity")
        if isinstance(identity, dict) and "SystemAssigned" in str(identity.get("type", "")):
            out[planned_principal(r.type, name, True)] = IdentityRef(arm_id, provider_api_version(r.type),
                                                                     "identity.principalId")
    return out


def _dig(body: dict[str, Any] | None, dotted: str) -> Any:
    value: Any = body
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _role_guid(role_definition_id: str) -> str:
    return str(role_definition_id).rstrip("/").rsplit("/", 1)[-1].lower()


def locate_assignment(r: Retained, azure: AzureReader, identities: dict[str, IdentityRef]) -> str | None:
    """The id of the retained role assignment `r` in Azure, found by (scope, role, principal),
    or None when Azure has none (or the identity it names is gone)."""
    from amlhpc.infra.components.access import role_assignment_name

    grant = r.inputs or {}
    scope, role, principal = str(grant.get("scope")), str(grant.get("roleDefinitionId")), str(grant.get("principalId"))
    where = identities.get(principal)
    if where is not None:
        principal = _dig(azure.read(where.arm_id, where.api_version), where.path)
        if not principal:
            return None
    found = [a for a in azure.role_assignments(scope)
             if str(_dig(a, "properties.scope") or "").lower() == scope.lower()
             and _role_guid(str(_dig(a, "properties.roleDefinitionId"))) == _role_guid(role)
             and str(_dig(a, "properties.principalId") or "").lower() == str(principal).lower()]
    if not found:
        return None
    assignment = found[0]
    expected = role_assignment_name(scope, str(principal), role)
    if str(assignment.get("name", "")).lower() != expected.lower():
        raise UserError([Problem(r.urn, "", f"Azure holds this grant (role {_role_guid(role)} for principal "
                                 f"{principal} at {scope}) under the name {assignment.get('name')}, not the "
                                 f"program's {expected}: adopted, the next `up` would replace it",
                                 f"az role assignment delete --ids {assignment.get('id')}  (the next `up` "
                                 "creates it again under the program's name)")],
                        "cannot adopt a role assignment")
    return str(assignment["id"])


def normalize_urn(urn: str) -> str:
    """The engine's form of a URN: Pulumi's mock runtime (the offline plan) puts the root
    stack's type in front of every type chain, the engine does not."""
    head, sep, rest = urn.partition("::" + ROOT_STACK_TYPE + "$")
    if not sep:
        return urn
    stack, project = head.removeprefix("urn:pulumi:").split("::", 1)
    return f"urn:pulumi:{stack}::{project}::{rest}"


def state_urns(export: dict[str, Any]) -> set[str]:
    """URNs in a `pulumi stack export` document (normalized)."""
    deployment = export.get("deployment") or {}
    return {normalize_urn(r["urn"]) for r in deployment.get("resources") or [] if "urn" in r}


def _type_of(urn: str) -> str:
    return urn.split("::")[2].split("$")[-1]


def _name_of(urn: str) -> str:
    return urn.split("::", 3)[3]


def import_document(resources: Iterable[Retained], in_state: set[str], exists: Callable[[Retained], bool],
                    locate: Callable[[Retained], str | None] | None = None) -> dict[str, Any]:
    """The `pulumi import --file` document: retained resources that exist in Azure but not
    in the state. `locate` finds a role assignment's id in Azure (locate_assignment);
    without it, role assignments are probed by their planned id like everything else.
    Their parents are named from the state when still there, else created as empty
    components in the same import, each under its own parent (outermost first). Empty
    `resources`: nothing to adopt."""
    entries: list[dict[str, Any]] = []
    name_table: dict[str, str] = {}
    components: dict[str, dict[str, Any]] = {}
    for r in resources:
        if r.urn in in_state:
            continue
        arm_id: str | None = r.arm_id
        if r.type == ROLE_ASSIGNMENT and locate is not None:
            arm_id = locate(r)
        elif not exists(r):
            arm_id = None
        if arm_id is None:
            continue
        entry: dict[str, Any] = {"type": r.type, "name": r.name, "id": arm_id}
        ancestors = r.ancestors or ((r.parent_urn,) if r.parent_urn else ())
        for i, urn in enumerate(reversed(ancestors)):  # outermost first
            name = _name_of(urn)
            if urn in in_state:
                name_table[name] = urn
                continue
            component = {"type": _type_of(urn), "name": name, "component": True}
            outer = ancestors[len(ancestors) - i:]
            if outer:
                component["parent"] = _name_of(outer[0])
            components.setdefault(name, component)
        if ancestors:
            entry["parent"] = _name_of(ancestors[0])
        entries.append(entry)
    if not entries:
        return {"resources": []}
    document: dict[str, Any] = {"resources": [*components.values(), *entries]}
    if name_table:
        document["nameTable"] = name_table
    return document


class ArmReader:
    """AzureReader against Azure Resource Manager (azure-core retries; 404 is absent)."""

    def __init__(self, credential: Any = None):
        from azure.core.pipeline.policies import BearerTokenCredentialPolicy
        from azure.core.pipeline.transport import HttpRequest, HttpResponse
        from azure.mgmt.core import ARMPipelineClient

        if credential is None:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        self.client: ARMPipelineClient[HttpRequest, HttpResponse] = ARMPipelineClient(base_url=ARM_ENDPOINT, policies=None, per_call_policies=[
            BearerTokenCredentialPolicy(credential, f"{ARM_ENDPOINT}/.default")])

    def _get(self, url: str, params: dict[str, str] | None, what: str) -> dict[str, Any] | None:
        response = self.client.send_request(self.client.get(url, params=params))
        if response.status_code == 404:
            return None
        if response.status_code == 200:
            text = response.text()
            return json.loads(text) if text else {}
        raise UserError([Problem(what, "", f"Azure answered {response.status_code} for {url.split('?')[0]}",
                                 "check `az login` and that your account can read the resource group")],
                        "cannot tell what to adopt")

    def exists(self, r: Retained) -> bool:
        return self.read(r.arm_id, r.api_version, r.urn) is not None

    def read(self, arm_id: str, api_version: str, what: str = "") -> dict[str, Any] | None:
        return self._get(f"{ARM_ENDPOINT}{arm_id}", {"api-version": api_version}, what or arm_id)

    def role_assignments(self, scope: str) -> list[dict[str, Any]]:
        url: str | None = f"{ARM_ENDPOINT}{scope}/providers/Microsoft.Authorization/roleAssignments"
        params: dict[str, str] | None = {"api-version": ROLE_ASSIGNMENTS_API, "$filter": "atScope()"}
        out: list[dict[str, Any]] = []
        while url:
            page = self._get(url, params, scope) or {}
            out += page.get("value") or []
            url, params = page.get("nextLink"), None
        return out


def plan_import(stack: str, export: dict[str, Any], subscription_id: str, azure: AzureReader,
                root: Path = REPO_ROOT) -> dict[str, Any]:
    """The import document for `stack`: its offline plan's retained resources, the state
    `export` already holds, and what `azure` holds (role assignments matched by scope,
    role and principal)."""
    from amlhpc.infra.plan import evaluate

    if stack.startswith(EXPERIMENT_PREFIX):
        return {"resources": []}  # experiment stacks retain nothing
    plan = evaluate(stack, root, subscription_id=subscription_id)
    identities = planned_identities(plan)
    return import_document(retained_resources(plan), state_urns(export), azure.exists,
                           lambda r: locate_assignment(r, azure, identities))


def rbac_propagation_failure(log: str) -> str | None:
    """The Azure error code in a failed `pulumi up`'s output that means a fresh role
    assignment has not taken effect yet (amlhpc.infra.quirks.RBAC_PROPAGATION_ERRORS), or None."""
    from amlhpc.infra import quirks

    return next((code for code in quirks.RBAC_PROPAGATION_ERRORS if code in log), None)


# --------------------------------------------------------------------------------------
# Commands

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Name suffix and adoption of retained resources.")

_GUID = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")


@app.command("suffix")
def suffix_command(
    stack: Annotated[str, typer.Option("--stack", "-s", help="Stack name: Pulumi.<stack>.yaml.")],
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Write aml-hpc:nameSuffix into an environment's stack file unless it has one; print it."""
    with exit_on_bad_input(debug):
        value = ensure_suffix(stack, REPO_ROOT)
    print(value or "")


@app.command("import-file")
def import_file_command(
    stack: Annotated[str, typer.Option("--stack", "-s", help="Stack name: Pulumi.<stack>.yaml.")],
    state: Annotated[Path, typer.Option("--state", help="`pulumi stack export` of the stack.")],
    subscription: Annotated[str, typer.Option("--subscription", help="Azure subscription id the stack deploys to.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the import document (only when not empty).")],
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Write the `pulumi import --file` document for retained resources to adopt; print their count."""
    with exit_on_bad_input(debug):
        if not _GUID.match(subscription):
            raise UserError([Problem("--subscription", "", f"{subscription!r} is not a subscription id",
                                     "az account show --query id -o tsv")], "invalid option")
        try:
            export = json.loads(state.read_text())
        except (OSError, ValueError) as exc:
            raise UserError([Problem(str(state), "", f"not a `pulumi stack export` document ({exc})",
                                     f"pulumi stack export --stack {stack} --file {state}")], "invalid option") from None
        document = plan_import(stack, export, subscription, ArmReader(), root=REPO_ROOT)
    out.unlink(missing_ok=True)
    if document["resources"]:
        out.write_text(json.dumps(document, indent=2) + "\n")
    print(sum(1 for r in document["resources"] if not r.get("component")))


@app.command("propagation")
def propagation_command(
    log: Annotated[Path, typer.Option("--log", help="The output of the failed `pulumi up`.")],
) -> None:
    """Exit 0 (printing the error code) when a failed up failed on RBAC propagation, 1 otherwise."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        raise typer.Exit(1) from None
    code = rbac_propagation_failure(text)
    if code is None:
        raise typer.Exit(1)
    print(code)


if __name__ == "__main__":
    app()
