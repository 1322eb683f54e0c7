"""A stateful stand-in for the Pulumi engine and the azure-native provider, running the real
program (amlhpc.infra.program.build) under Pulumi's mock runtime against `FakeAzure`, across as
many deployments as a test needs.

What it reproduces, with the source of each behaviour:
- Engine (pulumi/pulumi, pkg/resource/deploy): a registered resource whose URN (or an
  alias) is in the state is updated, or replaced when a `replaceOnChanges` path or its ARM
  id changes (`deleteBeforeReplace` orders the two); anything else is created. Resources in
  the state the program no longer declares are deleted after the program ran. A
  `retainOnDelete` resource is dropped from the state and left in Azure, on delete and on
  replace. A `protect`ed resource stops any deployment that would delete it, before
  anything is deleted; `destroy --exclude-protected` keeps protected resources and
  everything they depend on (their parents and dependencies). A failed step fails the
  update; the steps that succeeded stay in the state (a failed delete included: what was
  deleted before it is gone, the rest stays). `refresh` drops what Azure no
  longer has. `pulumi import --file` (docs: pulumi import; components since v3.94) adds
  existing resources to the state as Azure has them, refusing URNs already in the state
  and ids that do not exist.
- Provider (pulumi-azure-native, provider/pkg/provider/provider.go `defaultCreate` and
  azure/client_azcore.go `CanCreate`): create GETs the resource first and fails with
  "cannot create already existing resource" when it exists (issue #1123), except for
  singletons, which always exist and are PUT; delete of a singleton PUTs its default body
  (provider/pkg/openapi/defaults: blobServices' default state is `{}`); update is a PUT.
  A role assignment declared without roleAssignmentName gets a random GUID (the
  provider's auto-name for it), so only a declared name can be found again after `down`.
- URNs are the engine's (no root stack type in the chain), not the mock runtime's.
- Outputs are Azure's answer (FakeAzure.response), never the inputs echoed: principal ids
  come from Azure, new on every create.
- Read-back (azure-native provider/pkg/provider/provider.go `Read`, and
  provider/pkg/convert/responseToSdkInputs.go at commit 604cfd525f96): an import takes its
  inputs from the GET response (`ResponseToSdkInputs`): the resource path's parameters from
  the id, then every property of the PUT body found in the response, read-only ones left
  out (they are not body properties), `id` dropped, empty maps and arrays removed
  (`removeEmptyCollections`). A refresh of a resource in the state projects the old and
  the new outputs onto the input properties and applies their difference to the inputs
  (`applyDiff`), so what Azure changed since the last update shows as a diff.
- Diff (provider/pkg/provider/diff.go `calculateDetailedDiff` and the `Diff` method): old
  inputs against the program's; a change of a path parameter, or of a property azure-native
  marks forceNew (its forceNewMap, provider/pkg/gen/replacement.go, for every type the program
  declares (`FORCE_NEW`), and `location`, which the
  ARM guidelines make create-only, compared without case and spaces as
  `normalizedLocation` does), replaces; adding a forceNew property whose old output already
  has that value does not (the ADD_REPLACE exception). The engine applies ignoreChanges
  first (old values kept). A replacement forced on a resource this deployment adopted by
  import fails the update: Azure would refuse the second resource of the same name, and
  the adoption exists precisely so nothing retained is replaced.
- Each `up` records its steps (`Engine.last_steps`): an up with none has no diff.
- `preview` is an up that writes nothing: the same steps, computed on a copy of the state,
  with the provider's create, update and delete left undone (azure-native's Create is what
  GETs first, so a preview never meets "already existing": pulumi/pulumi's engine calls
  only Check and Diff in a preview). Given an import document, it imports first, on that
  copy, as scripts/pulumi-stack.sh's preview does on a scratch backend.
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pulumi.runtime import rpc
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from amlhpc.infra.adopt import SINGLETONS
from amlhpc.infra.plan import _drop_provider_version_aliases
from amlhpc.infra.plan.event_loop import private_event_loop
from amlhpc.infra.plan.mocks import (
    FAKE_TENANT,
    PlanMocks,
    RecordingMonitor,
    _plain,
    id_inputs,
    physical_name,
)
from tests.lifecycle import lifecycle_answers as answers
from tests.lifecycle.lifecycle_cloud import ROLE, AzureError, FakeAzure

PROJECT = "aml-hpc"


class DeploymentFailed(Exception):
    """`pulumi up`/`destroy`/`import` exited non-zero; the message lists the errors."""


@dataclass
class StateResource:
    urn: str
    type: str
    custom: bool
    id: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    parent: str = ""
    protect: bool = False
    retain_on_delete: bool = False
    dependencies: list[str] = field(default_factory=list)
    imported: bool = False
    """Adopted by `pulumi import` and not yet updated by an `up`."""


@dataclass
class Stack:
    """One stack on the backend: its state and last outputs."""

    name: str
    resources: dict[str, StateResource] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)

    def export(self) -> dict[str, Any]:
        """What `pulumi stack export` prints (the fields the tooling reads)."""
        return {"version": 3, "deployment": {"resources": [
            {"urn": r.urn, "type": r.type, "custom": r.custom, "id": r.id, "parent": r.parent or None,
             "protect": r.protect, "retainOnDelete": r.retain_on_delete}
            for r in self.resources.values()]}}


def urn_of(stack: str, parent_urn: str, type_token: str, name: str) -> str:
    """The engine's URN: the parent's type chain, without the root stack's type."""
    chain = type_token
    if parent_urn:
        parent_chain = parent_urn.split("::")[2]
        if parent_chain != "pulumi:pulumi:Stack":
            chain = f"{parent_chain}${type_token}"
    return f"urn:pulumi:{stack}::{PROJECT}::{chain}::{name}"


def _path(value: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


class Provider(PlanMocks):
    """azure-native's create/update/delete/read as it treats existence, against FakeAzure."""

    def __init__(self, azure: FakeAzure, subscription_id: str, dry_run: bool = False):
        super().__init__(subscription_id)
        self.azure = azure
        self.dry_run = dry_run
        """A preview: nothing is written to Azure; what would be created has no answer yet."""

    def call(self, args):
        if args.token == "azure-native:authorization:getClientConfig":
            return {"subscriptionId": self.subscription_id, "tenantId": FAKE_TENANT,
                    "clientId": "client", "objectId": "deployer"}, []
        return super().call(args)

    def arm_id(self, type_token: str, inputs: dict[str, Any], name: str, keep: str = "") -> str:
        """The id a create would get. A role assignment without roleAssignmentName is
        auto-named by azure-native with a random GUID, kept on update (`keep`, the id in
        the state) and drawn anew on replace."""
        if type_token == ROLE and not inputs.get("roleAssignmentName"):
            prefix = f"{inputs.get('scope')}/providers/Microsoft.Authorization/roleAssignments/"
            return keep if keep.lower().startswith(prefix.lower()) else f"{prefix}{uuid.uuid4()}"
        return self._arm_id(type_token, inputs, name)

    def outputs(self, type_token: str, arm_id: str, inputs: dict[str, Any], name: str) -> dict[str, Any]:
        """Azure's answer, over the shape-only fields PlanMocks fills for types the answers
        do not model (endpoints, login servers, key URLs)."""
        response = self.azure.response(arm_id)
        if response is None:  # a preview's create: shapes only, as the offline plan gives them
            return {**inputs, **self._computed(type_token, inputs, name)}
        return {**self._computed(type_token, inputs, name), **response}

    def create(self, type_token: str, inputs: dict[str, Any], name: str) -> str:
        arm_id = self.arm_id(type_token, inputs, name)  # a fresh auto-name, where there is one
        if self.dry_run:
            return arm_id
        if type_token not in SINGLETONS and self.azure.exists(arm_id):
            raise AzureError(f"cannot create already existing resource '{arm_id}'")
        self.azure.put(type_token, arm_id, physical_name(type_token, inputs, name), inputs)
        return arm_id

    def update(self, type_token: str, arm_id: str, inputs: dict[str, Any], name: str) -> None:
        if not self.dry_run:
            self.azure.put(type_token, arm_id, physical_name(type_token, inputs, name), inputs)

    def delete(self, resource: StateResource) -> None:
        if self.dry_run:
            return
        if resource.type in SINGLETONS:
            self.azure.reset_to_defaults(resource.id)
        else:
            self.azure.delete(resource.id)


class EmulatorMonitor(RecordingMonitor):
    """The resource monitor: each registration becomes the engine's step for it."""

    def __init__(self, engine: Engine, stack: Stack, provider: Provider):
        super().__init__(provider)
        self.engine = engine
        self.stack = stack
        self.provider = provider
        self.seen: list[str] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        return urn_of(self.stack.name, parent, type_, name)

    def RegisterResource(self, request):  # noqa: N802 - gRPC method name
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == "pulumi:pulumi:Stack":
            return resource_pb2.RegisterResourceResponse(urn=urn)
        _ensure_event_loop()
        inputs = _plain(dict(rpc.deserialize_properties(request.object))) if request.object else {}
        with self.lock:
            try:
                arm_id, outputs = self.engine.step(self, request, urn, inputs)
            except AzureError as exc:
                self.errors.append(f"{urn}: {exc}")
                raise
        obj = _sync_await(rpc.serialize_properties(outputs, {}))
        return resource_pb2.RegisterResourceResponse(urn=urn, id=arm_id, object=obj)


def _alias_urns(stack: str, request) -> list[str]:
    out = []
    for alias in request.aliases:
        if alias.urn:
            out.append(alias.urn)
            continue
        spec = alias.spec
        parent = "" if spec.noParent else (spec.parentUrn or request.parent)
        out.append(urn_of(stack, parent, spec.type or request.type, spec.name or request.name))
    return out


class Engine:
    """One adopter's Pulumi: stacks on a backend, deploying into one subscription."""

    def __init__(self, azure: FakeAzure, subscription_id: str, dry_run: bool = False):
        self.azure = azure
        self.subscription_id = subscription_id
        self.dry_run = dry_run
        self.stacks: dict[str, Stack] = {}
        self.last_steps: list[tuple[str, str]] = []
        """(create|update|replace|delete, URN) of the last `up`: empty means no diff."""

    # --- stacks ----------------------------------------------------------------------
    def select(self, name: str) -> Stack:
        return self.stacks.setdefault(name, Stack(name))

    def remove(self, name: str) -> None:
        """`pulumi stack rm` (without --force): refuses a stack that still has resources."""
        stack = self.stacks.get(name)
        if stack and any(r.custom for r in stack.resources.values()):
            raise DeploymentFailed(f"stack {name} still has resources; refusing to remove it")
        self.stacks.pop(name, None)

    # --- up --------------------------------------------------------------------------
    def up(self, name: str, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run the program; create/update/replace what it declares, then delete the rest."""
        stack = self.select(name)
        self.refresh(stack)
        self.last_steps = []
        provider = Provider(self.azure, self.subscription_id, self.dry_run)
        monitor = EmulatorMonitor(self, stack, provider)
        try:
            outputs = _run(monitor, build, name)
        except Exception as exc:  # noqa: BLE001 - a failed step, or the program itself
            errors = monitor.errors or [f"{type(exc).__name__}: {exc}"]
            raise DeploymentFailed("update failed:\n  " + "\n  ".join(errors)) from exc
        gone = [r for urn, r in stack.resources.items() if urn not in monitor.seen]
        self.last_steps += [("delete", r.urn) for r in gone if r.custom]
        self._delete(stack, gone)
        stack.outputs = outputs
        return outputs

    def preview(self, name: str, build: Callable[[], dict[str, Any]],
                imports: dict[str, Any] | None = None) -> list[tuple[str, str]]:
        """`pulumi preview` (after `pulumi import --file imports`, when given): the steps it
        shows, (import|create|update|replace|delete, URN); nothing is written to Azure, the
        stacks are untouched."""
        scratch = Engine(self.azure, self.subscription_id, dry_run=True)
        scratch.stacks = copy.deepcopy(self.stacks)
        steps = []
        if imports and imports.get("resources"):
            steps = [("import", urn) for urn in scratch.import_file(name, imports, protect=False)
                     if scratch.select(name).resources[urn].custom]
        scratch.up(name, build)
        return steps + scratch.last_steps

    def step(self, monitor: EmulatorMonitor, request, urn: str, inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        stack, provider = monitor.stack, monitor.provider
        for alias in _alias_urns(stack.name, request):
            if urn not in stack.resources and alias in stack.resources:
                moved = stack.resources.pop(alias)
                moved.urn = urn
                stack.resources[urn] = moved
        monitor.seen.append(urn)
        old = stack.resources.get(urn)
        entry = StateResource(urn, request.type, bool(request.custom), inputs=inputs, parent=request.parent or "",
                              protect=bool(request.protect), retain_on_delete=bool(request.retainOnDelete),
                              dependencies=list(request.dependencies))
        if not request.custom:
            entry.id = f"{request.name}-component"
            stack.resources[urn] = entry
            return "", inputs
        if old is not None and old.custom:
            inputs = entry.inputs = _ignoring(old.inputs, inputs, list(request.ignoreChanges))
        new_id = provider.arm_id(request.type, inputs, request.name, keep=old.id if old and old.custom else "")
        if old is None or not old.custom:
            entry.id = provider.create(request.type, inputs, request.name)
            self.last_steps.append(("create", urn))
        elif replaces := replace_reasons(request.type, old, inputs, list(request.replaceOnChanges), new_id):
            if old.imported:
                raise AzureError(f"a replacement after import, forced by {', '.join(replaces)} (forceNew in "
                                 f"azure-native): the adopted resource would be replaced, not kept")
            self.last_steps.append(("replace", urn))
            if request.deleteBeforeReplace:
                self._forget_or_delete(provider, old)
                entry.id = provider.create(request.type, inputs, request.name)
            else:
                entry.id = provider.create(request.type, inputs, request.name)
                self._forget_or_delete(provider, old)
        else:
            entry.id = old.id
            if _canonical(old.inputs) != _canonical(inputs):
                provider.update(request.type, old.id, inputs, request.name)
                self.last_steps.append(("update", urn))
        entry.outputs = provider.outputs(request.type, entry.id, inputs, request.name)
        stack.resources[urn] = entry
        return entry.id, entry.outputs

    def _forget_or_delete(self, provider: Provider, resource: StateResource) -> None:
        if resource.protect:
            raise AzureError(f"resource {resource.urn} is protected and cannot be replaced")
        if not resource.retain_on_delete:
            provider.delete(resource)

    # --- delete, destroy, refresh, import --------------------------------------------
    def _delete(self, stack: Stack, resources: list[StateResource]) -> None:
        protected = [r.urn for r in resources if r.protect]
        if protected:
            raise DeploymentFailed("resource(s) cannot be deleted because they are protected: " + ", ".join(protected))
        provider = Provider(self.azure, self.subscription_id, self.dry_run)
        for r in reversed(resources):
            if r.custom and not r.retain_on_delete:
                try:
                    provider.delete(r)
                except AzureError as exc:  # the deletes before it are done and stay done
                    raise DeploymentFailed(f"deleting {r.urn} failed:\n  {exc}") from exc
            stack.resources.pop(r.urn, None)

    def destroy(self, name: str, exclude_protected: bool = False) -> None:
        """`pulumi destroy --refresh [--exclude-protected]`."""
        stack = self.select(name)
        self.refresh(stack)
        targets = list(stack.resources.values())
        if exclude_protected:
            keep = _closure(stack, {r.urn for r in targets if r.protect})
            targets = [r for r in targets if r.urn not in keep]
        self._delete(stack, targets)
        if not stack.resources:
            stack.outputs = {}

    def refresh(self, stack: Stack) -> None:
        """Read every resource back: what Azure no longer has leaves the state (404); for
        the rest, what changed in Azure since the last update moves into the inputs."""
        for urn, r in list(stack.resources.items()):
            if not r.custom:
                continue
            response = self.azure.response(r.id)
            if response is None:
                stack.resources.pop(urn)
                continue
            fresh = {**r.outputs, **response}
            r.inputs = _apply_diff(r.inputs, answers.writable(r.type, r.outputs), answers.writable(r.type, fresh))
            r.outputs = fresh

    def import_file(self, name: str, document: dict[str, Any], protect: bool = True) -> list[str]:
        """`pulumi import --file document [--protect=false]`: read each resource into the
        state as Azure has it. Returns the imported URNs."""
        stack = self.select(name)
        table = dict(document.get("nameTable") or {})
        provider = Provider(self.azure, self.subscription_id, self.dry_run)
        staged: dict[str, StateResource] = {}
        errors = []
        for entry in document.get("resources", []):
            parent = table.get(entry.get("parent", ""), "")
            urn = urn_of(name, parent, entry["type"], entry.get("logicalName") or entry["name"])
            if urn in stack.resources or urn in staged:
                errors.append(f"{urn}: already in the stack's state")
                continue
            if entry.get("component"):
                staged[urn] = StateResource(urn, entry["type"], False, id=f"{entry['name']}-component", parent=parent)
                table[entry["name"]] = urn
                continue
            response = self.azure.response(entry["id"])
            if response is None:
                errors.append(f"{urn}: resource '{entry['id']}' does not exist")
                continue
            inputs = response_to_inputs(entry["type"], response)
            staged[urn] = StateResource(urn, entry["type"], True, id=entry["id"], inputs=inputs,
                                        outputs=provider.outputs(entry["type"], entry["id"], inputs, entry["name"]),
                                        parent=parent, protect=protect, imported=True)
        if errors:
            raise DeploymentFailed("import failed:\n  " + "\n  ".join(errors))
        stack.resources.update(staged)
        return list(staged)


def _closure(stack: Stack, roots: set[str]) -> set[str]:
    keep, todo = set(), list(roots)
    while todo:
        urn = todo.pop()
        if urn in keep or urn not in stack.resources:
            continue
        keep.add(urn)
        r = stack.resources[urn]
        todo += [r.parent, *r.dependencies]
    return keep


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


FORCE_NEW_MAP = "pulumi-azure-native provider/pkg/gen/replacement.go forceNewMap at 1b7112af33c62b247daed1028686bf279f4d5e69"
TRACKED_LOCATION = ("`location`: x-ms-mutability [read, create] on ARM's TrackedResource (common-types), forceNew in the "
                    "provider's schema; compared as normalizedLocation (replace_reasons)")
FORCE_NEW: dict[str, frozenset[str]] = {
    # Every type the program declares (test_resource_manager_rules holds this to the conformance
    # rows, which test_conformance holds to the stacks): the properties azure-native's schema
    # marks forceNew beyond the path parameters (id_inputs) and `location` (TRACKED_LOCATION),
    # each from FORCE_NEW_MAP. A type the map lists with no property ("no force-news", or
    # "covered by x-ms-mutability") and a type it does not list get only those two.
    "azure-native:authorization:RoleAssignment": frozenset({"principalId", "scope"}),
    "azure-native:resources:ResourceGroup": frozenset({"location"}),
    "azure-native:storage:StorageAccount": frozenset({"isHnsEnabled", "location"}),
    "azure-native:storage:BlobContainer": frozenset(),
    "azure-native:storage:BlobServiceProperties": frozenset(),
    "azure-native:storage:ManagementPolicy": frozenset(),  # not in the map: only its path parameters
    "azure-native:network:PublicIPAddress": frozenset({"location", "publicIPAddressVersion", "publicIPPrefix", "sku"}),
    "azure-native:network:VirtualNetwork": frozenset({"location"}),
    "azure-native:network:Subnet": frozenset(),
    "azure-native:network:PrivateEndpoint": frozenset({"subnet"}),  # pulumi-azure-native#3883
    "azure-native:network:NetworkSecurityGroup": frozenset(),
    "azure-native:network:NatGateway": frozenset(),
    "azure-native:network:NetworkInterface": frozenset(),
    "azure-native:network:BastionHost": frozenset(),
    "azure-native:network:PrivateDnsZoneGroup": frozenset(),
    "azure-native:privatedns:PrivateZone": frozenset(),
    "azure-native:privatedns:VirtualNetworkLink": frozenset(),
    "azure-native:applicationinsights:Component": frozenset(),  # the map: "covered by x-ms-mutability"
    "azure-native:operationalinsights:Workspace": frozenset(),
    "azure-native:containerregistry:Registry": frozenset(),
    "azure-native:keyvault:Vault": frozenset(),
    "azure-native:keyvault:Key": frozenset(),
    "azure-native:managedidentity:UserAssignedIdentity": frozenset(),
    "azure-native:monitor:DiagnosticSetting": frozenset(),
    "azure-native:authorization:ManagementLockByScope": frozenset(),
    "azure-native:consumption:Budget": frozenset(),
    "azure-native:compute:VirtualMachine": frozenset(),
    "azure-native:compute:VirtualMachineExtension": frozenset(),
    "azure-native:machinelearningservices:Workspace": frozenset(),
    "azure-native:machinelearningservices:Compute": frozenset(),
    "azure-native:machinelearningservices:Datastore": frozenset(),
    "azure-native:machinelearningservices:EnvironmentContainer": frozenset(),
    "azure-native:machinelearningservices:EnvironmentVersion": frozenset(),
    "azure-native:machinelearningservices:Registry": frozenset(),
}
"""Per type, what forces a replacement besides the path parameters and `location`. The
x-ms-mutability flags of nested and flattened properties other than `location` are not read
here: the provider's generated metadata is not available offline."""


def _normalized_location(value: Any) -> Any:
    return str(value).replace(" ", "").lower() if isinstance(value, str) else value


def replace_reasons(type_token: str, old: StateResource, inputs: dict[str, Any], replace_on_changes: list[str],
                    new_id: str) -> list[str]:
    """What forces a replacement, as azure-native's Diff (and the engine's
    replaceOnChanges) decide it; [] for an in-place update or no change."""
    reasons = [p for p in replace_on_changes if _path(old.inputs, p) != _path(inputs, p)]
    if old.id.lower() != new_id.lower():
        reasons.append("the resource id")
    for key in (*id_inputs(type_token), *FORCE_NEW.get(type_token, ()), "location"):
        before, after = old.inputs.get(key), inputs.get(key)
        if key == "location":
            before, after = _normalized_location(before), _normalized_location(after)
        if before == after:
            continue
        if before is None and after is not None and old.outputs.get(key) == inputs.get(key):
            continue  # ADD_REPLACE exception: the old output already holds the new value
        reasons.append(key)
    return sorted(set(reasons))


def _ignoring(old: dict[str, Any], new: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """ignoreChanges: the old value of each named top-level property where the state has one."""
    out = dict(new)
    for path in paths:
        key = path.split(".")[0]
        if key in old:
            out[key] = copy.deepcopy(old[key])
    return out


def remove_empty_collections(value: Any) -> Any:
    """azure-native's removeEmptyCollections: empty maps and arrays (after cleaning) -> None."""
    if isinstance(value, dict):
        cleaned = {k: c for k, v in value.items() if (c := remove_empty_collections(v)) is not None}
        return cleaned or None
    if isinstance(value, list):
        cleaned_list = [c for v in value if (c := remove_empty_collections(v)) is not None]
        return cleaned_list or None
    return value


def response_to_inputs(type_token: str, response: dict[str, Any]) -> dict[str, Any]:
    """azure-native's ResponseToSdkInputs on an emulated GET answer."""
    out = {}
    for key, value in answers.writable(type_token, response).items():
        cleaned = remove_empty_collections(value)
        if cleaned is not None:
            out[key] = cleaned
    return out


def _apply_diff(inputs: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """azure-native's applyDiff: changes between two projections, applied to the inputs,
    recursing into objects present in all three."""
    out = {k: v for k, v in inputs.items() if not (k in old and k not in new)}
    for key, value in new.items():
        if key in old and old[key] == value:
            continue
        base = inputs.get(key)
        if isinstance(base, dict) and isinstance(old.get(key), dict) and isinstance(value, dict):
            out[key] = _apply_diff(base, old[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _run(monitor: EmulatorMonitor, build: Callable[[], dict[str, Any]], stack: str) -> dict[str, Any]:
    """Run `build` under the mock runtime with `monitor`, on a fresh thread (Pulumi's
    runtime state is context-local); return the resolved outputs document."""
    box: dict[str, Any] = {}

    def run() -> None:
        import pulumi
        from pulumi.runtime import settings
        from pulumi.runtime.mocks import set_mocks
        from pulumi.runtime.stack import run_pulumi_func

        try:
            with private_event_loop():
                settings.ROOT.set(None)
                set_mocks(monitor.mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor)
                settings.SETTINGS.rpc_manager.clear()
                settings.SETTINGS.outputs.clear()
                # the offline plan's speed-up: provider version aliases mean nothing here either
                pulumi.runtime.register_stack_transformation(_drop_provider_version_aliases)
                resolved: dict[str, Any] = {}

                async def resolve(document: dict[str, Any] | None) -> None:
                    for key, value in (document or {}).items():
                        resolved[key] = await pulumi.Output.from_input(value).future()

                _sync_await(run_pulumi_func(lambda: resolve(build())))
                box["value"] = json.loads(json.dumps(resolved, default=str))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name=f"emulate-{stack}")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
