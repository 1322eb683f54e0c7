"""A stand-in for Azure Resource Manager as the lifecycle emulator needs it: resources by
ARM id across subscriptions, with the rules that decide whether a second deployment works.

Each rule is Azure's, with its source:
- Globally unique names (storage accounts, Key Vaults, container registries, ML
  registries) are taken across all subscriptions: Microsoft Learn, "Naming rules and
  restrictions for Azure resources" (Scope: global) and "Manage Azure Machine Learning
  registries" (registry names are unique across Azure).
- Deleting a resource group deletes everything in it: Azure Resource Manager, "Delete
  resource group and resources".
- A deleted Azure ML workspace is soft-deleted for 14 days and its name cannot be reused
  until then: Microsoft Learn, "Workspace soft deletion" ("You can't reuse the name of a
  workspace that has been soft deleted until the retention period passes").
- A deleted Key Vault stays soft-deleted for its retention; with purge protection nobody
  can purge it, and a vault of the same name can only be recovered (createMode recover):
  Microsoft Learn, "Azure Key Vault soft-delete overview".
- A deleted Log Analytics workspace is kept 14 days; creating it again with the same name
  in the same resource group recovers it: REST API, Log Analytics "Workspaces - Delete".
- A role assignment for the same principal, role and scope exists at most once
  (RoleAssignmentExists), compared as Resource Manager compares them: GUIDs without case and
  the role by its definition's GUID, so the tenant form
  (/providers/Microsoft.Authorization/roleDefinitions/<guid>) and the subscription form name
  the same role (Microsoft Learn, "Troubleshoot Azure RBAC": "The role assignment already
  exists"; ids are case-insensitive, "Azure Resource Manager resource names").
- An existing role assignment keeps its principal and scope: a PUT that changes them is refused
  with 400 RoleAssignmentUpdateNotPermitted, "Tenant ID, application ID, principal ID, and scope
  are not allowed to be updated." (Microsoft Learn, "Troubleshoot Azure RBAC", symptom "ARM
  template role assignment returns BadRequest status"; Azure/Azure-Landing-Zones#833).
- A PUT lacks no property the API requires: each body is held against the Azure SDK model the
  conformance suite reads (tests/conformance/conformance_rows.py) and a missing required
  property is refused as Resource Manager refuses it (LocationRequired for `location`,
  InvalidRequestContent "Required property ... not found" otherwise).
- A blob service (storageAccounts/blobServices/default) exists as long as its account.
- A management lock (CanNotDelete or ReadOnly) on a scope blocks deleting that scope and
  everything under it - child resources (containers) and extension resources (role
  assignments, diagnostic settings) - with ScopeLocked; deleting a resource group that
  holds a locked resource fails whole ("You never have a partial deletion"); the lock
  itself can be deleted (by someone holding Microsoft.Authorization/locks/delete, which
  the emulator does not model). A ReadOnly lock also refuses writes under its scope.
  Microsoft Learn, "Lock your resources to protect your infrastructure" (ms.date
  2024-03-08: lock inheritance, extension resources, "A cannot-delete lock on a resource
  or resource group prevents the deletion of Azure RBAC assignments").
- Deleting a private endpoint removes its connection on the target resource, so a lock on
  the target blocks it too: ScopeLocked on `<target>/privateEndpointConnectionProxies/...`
  (hashicorp/terraform-provider-azurerm issue #17478; MicrosoftDocs/azure-docs issue
  #116983, "When I delete a private endpoint it fails because the target resource has a
  lock on it"). A private endpoint connects to a resource that exists, or is refused.
- An Azure ML registry comes with what Azure ML creates for it in a managed resource group:
  a storage account per region and one container registry (Microsoft Learn, "Manage Azure
  Machine Learning registries"); they exist from the registry's creation, under the ids
  its GET reports, and are nobody's PUT.

Blobs are data: a container holds them, and they disappear with it.

GETs answer as Azure does, not with the request echoed (tests/lifecycle/lifecycle_answers.py):
server-assigned principals (random on every create, as Entra issues them), read-only
properties, server defaults, ids in Azure's casing and system-added items. Role
assignments can be listed by scope, role and principal, as `az role assignment list` does.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from amlhpc.core.permissions import MODEL
from amlhpc.infra import quirks
from amlhpc.infra.plan.mocks import id_inputs
from tests.conformance import conformance_reference as conformance
from tests.conformance.conformance_rows import ROWS
from tests.lifecycle import lifecycle_answers as answers

GLOBAL_NAME_TYPES = {
    "azure-native:storage:StorageAccount": "StorageAccountAlreadyTaken: the storage account name {name!r} is already taken",
    "azure-native:keyvault:Vault": "VaultAlreadyExists: the vault name {name!r} is already in use",
    "azure-native:containerregistry:Registry": "AlreadyInUse: the registry DNS name {name}.azurecr.io is already in use",
    "azure-native:machinelearningservices:Registry": "the ML registry name {name!r} is already taken in Azure",
}
WORKSPACE = "azure-native:machinelearningservices:Workspace"
VAULT = "azure-native:keyvault:Vault"
LOGS = "azure-native:operationalinsights:Workspace"
ACCOUNT = "azure-native:storage:StorageAccount"
BLOB_SERVICE = "azure-native:storage:BlobServiceProperties"
ROLE = "azure-native:authorization:RoleAssignment"
LOCK = "azure-native:authorization:ManagementLockByScope"
PRIVATE_ENDPOINT = "azure-native:network:PrivateEndpoint"
ML_REGISTRY = "azure-native:machinelearningservices:Registry"
CONTAINER_REGISTRY = "azure-native:containerregistry:Registry"
_LOCKS_SEGMENT = "/providers/microsoft.authorization/locks/"


class AzureError(Exception):
    """What ARM answers when it refuses a request."""


@dataclass
class AzureObject:
    id: str
    type: str
    name: str
    body: dict[str, Any]
    blobs: dict[str, bytes] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    """What Azure assigned at creation (principal ids...): kept across updates."""
    created_at: int = 0
    """The operation count when it was created (RBAC propagation is counted in operations)."""


@dataclass
class Deleted:
    """A soft-deleted resource: its name is held until `until`."""

    id: str
    type: str
    name: str
    until: datetime
    body: dict[str, Any]


def _key(arm_id: str) -> str:
    return arm_id.lower()


def _resource_group_id(arm_id: str) -> str | None:
    parts = arm_id.split("/")
    return "/".join(parts[:5]) if len(parts) > 5 and parts[3].lower() == "resourcegroups" else None


def extension_scope(arm_id: str) -> str:
    """The scope of an extension resource (a role assignment, a lock): the id before its last
    /providers/Microsoft.Authorization/, found without regard to case as ARM reads ids."""
    at = arm_id.lower().rfind("/providers/microsoft.authorization/")
    return arm_id[:at] if at >= 0 else arm_id


def _top_level_id(arm_id: str) -> str:
    """/subscriptions/s/resourceGroups/g/providers/NS/type/name of a nested id."""
    parts = arm_id.split("/")
    return "/".join(parts[:9]) if "providers" in parts else arm_id


class FakeAzure:
    """All of Azure: every adopter's subscriptions share the global name space."""

    def __init__(self, now: datetime | None = None, tenant: str = "00000000-0000-0000-0000-0000000000aa"):
        self.now = now or datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
        self.tenant = tenant
        self.objects: dict[str, AzureObject] = {}
        self.deleted: dict[str, Deleted] = {}
        self.log: list[str] = []
        self.operations = 0
        """Writes so far: the clock RBAC propagation is measured on (a step, not a wall time)."""
        self.propagation_operations = 0
        """A role assignment takes effect this many operations after its creation (0: at once)."""

    def wait(self, operations: int) -> None:
        """Time passes (the tooling's wait between attempts), counted in operations."""
        self.operations += operations

    def grant_effective(self, scope: str, role_guid: str, principal: str) -> bool:
        return any(self.operations - o.created_at >= self.propagation_operations
                   for o in self.role_assignments(scope, role_guid, principal))

    # --- time ------------------------------------------------------------------------
    def advance(self, days: float) -> None:
        self.now += timedelta(days=days)
        self.deleted = {k: d for k, d in self.deleted.items() if d.until > self.now}

    # --- reads -----------------------------------------------------------------------
    def get(self, arm_id: str) -> AzureObject | None:
        return self.objects.get(_key(arm_id))

    def exists(self, arm_id: str) -> bool:
        return _key(arm_id) in self.objects

    def of_type(self, type_token: str) -> list[AzureObject]:
        return [o for o in self.objects.values() if o.type == type_token]

    def response(self, arm_id: str) -> dict[str, Any] | None:
        """The GET answer, in azure-native's SDK shape (lifecycle_answers)."""
        obj = self.get(arm_id)
        if obj is None:
            return None
        return answers.answer(obj.type, obj.id, obj.body, obj.server, self.response)

    def role_assignments(self, scope: str | None = None, role: str | None = None,
                         principal: str | None = None) -> list[AzureObject]:
        """Role assignments exactly at `scope` (ids compared without case, as ARM does), of
        `role` (a role definition id or its GUID) and `principal`; None matches any."""
        out = []
        for o in self.of_type(ROLE):
            at = extension_scope(o.id)
            definition = str(o.body.get("roleDefinitionId", ""))
            if scope is not None and at.lower() != scope.lower():
                continue
            if role is not None and definition.lower().rsplit("/", 1)[-1] != role.lower().rsplit("/", 1)[-1]:
                continue
            if principal is not None and str(o.body.get("principalId", "")).lower() != principal.lower():
                continue
            out.append(o)
        return out

    # --- writes ----------------------------------------------------------------------
    def put(self, type_token: str, arm_id: str, name: str, body: dict[str, Any]) -> AzureObject:
        """Create or update, refusing what Azure refuses."""
        key = _key(arm_id)
        existing = self.objects.get(key)
        if type_token != LOCK:
            self._check_not_read_only(arm_id)
        self._check_required(type_token, body)
        if existing is not None and type_token == ROLE:
            self._check_role_update(existing, body)
        if existing is None:
            self._check_parent(type_token, arm_id)
            self._check_global_name(type_token, arm_id, name)
            body = self._check_soft_deleted(type_token, arm_id, name, body)
            if type_token == ROLE:
                self._check_role_unique(arm_id, body)
            if type_token == WORKSPACE:
                self._check_key_access(body)
            if type_token == PRIVATE_ENDPOINT:
                self._check_link_target(arm_id, body)
        self.operations += 1
        server = (answers.on_update(type_token, body, existing.server, self.tenant) if existing
                  else answers.on_create(type_token, body, self.tenant))
        obj = AzureObject(arm_id, type_token, name, copy.deepcopy(body), existing.blobs if existing else {},
                          server, existing.created_at if existing else self.operations)
        self.objects[key] = obj
        if type_token == ACCOUNT and _key(f"{arm_id}/blobServices/default") not in self.objects:
            # Azure creates the blob service with the account, in its default state.
            self.objects[_key(f"{arm_id}/blobServices/default")] = AzureObject(
                f"{arm_id}/blobServices/default", BLOB_SERVICE, "default", {})
        self.log.append(f"{'update' if existing else 'create'} {arm_id}")
        if type_token == ML_REGISTRY:
            self._create_registry_storage(arm_id)
        return obj

    def _create_registry_storage(self, registry_id: str) -> None:
        """What Azure ML creates with a registry (and a region added to it): the storage
        accounts and the container registry its answer names."""
        answer = self.response(registry_id) or {}
        for region in answer.get("regionDetails") or []:
            for kind, key, type_token in (("acrDetails", "systemCreatedAcrAccount", CONTAINER_REGISTRY),
                                          ("storageAccountDetails", "systemCreatedStorageAccount", ACCOUNT)):
                for entry in region.get(kind) or []:
                    created_id = ((entry.get(key) or {}).get("armResourceId") or {}).get("resourceId")
                    if created_id and _key(created_id) not in self.objects:
                        self.objects[_key(created_id)] = AzureObject(
                            created_id, type_token, created_id.rsplit("/", 1)[-1],
                            {"location": region.get("location")}, created_at=self.operations)

    def delete(self, arm_id: str) -> None:
        key = _key(arm_id)
        obj = self.objects.get(key)
        if obj is None:
            return  # ARM DELETE of a missing resource succeeds (azure-native treats 404 as done)
        self.operations += 1
        if obj.type != LOCK:
            self._check_not_locked(obj)
        if obj.type == "azure-native:resources:ResourceGroup":
            for child in [o for k, o in self.objects.items() if k.startswith(key + "/")]:
                self._delete_one(child)
        else:
            for child in [o for k, o in self.objects.items() if k.startswith(key + "/")]:
                self.objects.pop(_key(child.id), None)
        self._delete_one(obj)

    def reset_to_defaults(self, arm_id: str) -> None:
        """What azure-native does to delete a singleton: PUT the default (empty) body."""
        self._check_not_read_only(arm_id)
        obj = self.objects[_key(arm_id)]
        obj.body = {}
        self.log.append(f"reset {arm_id}")

    def upload(self, container_id: str, blob: str, data: bytes) -> None:
        self.objects[_key(container_id)].blobs[blob] = data

    def locks(self) -> list[tuple[str, str]]:
        """(locked scope, level) of every management lock."""
        return [(o.id[:o.id.lower().index(_LOCKS_SEGMENT)], o.body.get("level", "")) for o in self.of_type(LOCK)]

    # --- rules -----------------------------------------------------------------------
    def _check_not_locked(self, obj: AzureObject) -> None:
        """ScopeLocked: a lock at, above or below the resource blocks its deletion (a
        deletion takes what the resource holds with it); a lock on a private endpoint's
        target blocks deleting the endpoint."""
        target = _key(obj.id)
        touched = [target]
        if obj.type == PRIVATE_ENDPOINT:
            touched += [_key(c.get("privateLinkServiceId") or "")
                        for c in obj.body.get("privateLinkServiceConnections") or []]
        for scope, level in self.locks():
            if level not in ("CanNotDelete", "ReadOnly"):
                continue
            held = _key(scope)
            for place in touched:
                if place and (place == held or place.startswith(held + "/") or held.startswith(place + "/")):
                    raise AzureError(f"ScopeLocked: the scope '{obj.id}' cannot perform delete operation because "
                                     f"following scope(s) are locked: '{scope}'. Please remove the lock and try again.")

    def _check_not_read_only(self, arm_id: str) -> None:
        target = _key(arm_id)
        for scope, level in self.locks():
            held = _key(scope)
            if level == "ReadOnly" and (target == held or target.startswith(held + "/")):
                raise AzureError(f"ScopeLocked: the scope '{arm_id}' cannot perform write operation because "
                                 f"following scope(s) are locked: '{scope}'. Please remove the lock and try again.")

    def _delete_one(self, obj: AzureObject) -> None:
        self.objects.pop(_key(obj.id), None)
        self.log.append(f"delete {obj.id}")
        if obj.type == WORKSPACE:
            self.deleted[_key(obj.id)] = Deleted(obj.id, obj.type, obj.name,
                                                 self.now + timedelta(days=quirks.WORKSPACE_SOFT_DELETE_DAYS), obj.body)
        elif obj.type == VAULT:
            days = obj.body.get("properties", {}).get("softDeleteRetentionInDays", 90)
            self.deleted[_key(obj.id)] = Deleted(obj.id, obj.type, obj.name, self.now + timedelta(days=days), obj.body)
        elif obj.type == LOGS:
            self.deleted[_key(obj.id)] = Deleted(obj.id, obj.type, obj.name, self.now + timedelta(days=14), obj.body)

    def _check_parent(self, type_token: str, arm_id: str) -> None:
        group = _resource_group_id(arm_id)
        if type_token == "azure-native:resources:ResourceGroup" or group is None:
            return
        if _key(group) not in self.objects:
            raise AzureError(f"ResourceGroupNotFound: resource group {group.rsplit('/', 1)[-1]!r} could not be found")
        top = _top_level_id(arm_id)
        if top != arm_id and _key(top) not in self.objects:
            raise AzureError(f"ParentResourceNotFound: {top} does not exist")
        if type_token == ROLE:
            scope = extension_scope(arm_id)
            if _key(scope) not in self.objects and _key(_top_level_id(scope)) not in self.objects:
                raise AzureError(f"the scope {scope} of the role assignment does not exist")

    def _check_global_name(self, type_token: str, arm_id: str, name: str) -> None:
        message = GLOBAL_NAME_TYPES.get(type_token)
        if message is None:
            return
        taken = [o for o in self.objects.values() if o.type == type_token and o.name.lower() == name.lower()]
        held = [d for d in self.deleted.values()
                if d.type == type_token and d.name.lower() == name.lower() and type_token != VAULT]
        if taken or held:
            raise AzureError(message.format(name=name))

    def _check_soft_deleted(self, type_token: str, arm_id: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if type_token == WORKSPACE and _key(arm_id) in self.deleted:
            raise AzureError(f"the workspace name {name!r} belongs to a soft-deleted workspace until "
                             f"{self.deleted[_key(arm_id)].until:%Y-%m-%d}: recover or permanently delete it")
        if type_token == VAULT:
            held = [d for d in self.deleted.values() if d.type == VAULT and d.name.lower() == name.lower()]
            if held:
                if body.get("properties", {}).get("createMode") == "recover" and _key(held[0].id) == _key(arm_id):
                    self.deleted.pop(_key(arm_id))
                    return held[0].body
                raise AzureError(f"ConflictError: a vault named {name!r} exists in deleted state (purge protection "
                                 f"holds it until {held[0].until:%Y-%m-%d}): recover it (createMode recover)")
        if type_token == LOGS and _key(arm_id) in self.deleted:
            self.deleted.pop(_key(arm_id))  # same name, group and location: recovered
        return body

    def _check_key_access(self, body: dict[str, Any]) -> None:
        """Azure ML checks, when it creates a workspace with a customer-managed key, that the
        identity the encryption names can use the key: a grant not yet in effect is refused
        with Key Vault's RBAC denial (amlhpc.infra.quirks.RBAC_PROPAGATION_ERRORS)."""
        encryption = body.get("encryption") or {}
        uai = (encryption.get("identity") or {}).get("userAssignedIdentity")
        key_url = str((encryption.get("keyVaultProperties") or {}).get("keyIdentifier") or "")
        if not uai or not key_url:
            return
        vault, _, rest = key_url.removeprefix("https://").partition(".vault.azure.net/keys/")
        key = next((o for o in self.of_type("azure-native:keyvault:Key")
                    if o.name == rest.split("/")[0] and f"/vaults/{vault}/".lower() in o.id.lower()), None)
        identity = self.response(uai) or {}
        if key is None or not self.grant_effective(key.id, MODEL.role("key-vault-crypto-service-encryption-user").guid,
                                                   str(identity.get("principalId"))):
            raise AzureError(f"Forbidden: ForbiddenByRbac: the identity {uai.rsplit('/', 1)[-1]} may not wrap/unwrap "
                             f"with the key {key_url} (its role assignment is not in effect)")

    def _check_link_target(self, arm_id: str, body: dict[str, Any]) -> None:
        """A private endpoint's connections name resources that exist."""
        for connection in body.get("privateLinkServiceConnections") or []:
            target = str(connection.get("privateLinkServiceId") or "")
            if _key(target) not in self.objects:
                raise AzureError(f"the private link resource '{target}' of private endpoint "
                                 f"'{arm_id.rsplit('/', 1)[-1]}' does not exist")

    def _check_role_unique(self, arm_id: str, body: dict[str, Any]) -> None:
        scope = extension_scope(arm_id)
        for o in self.role_assignments(scope, str(body.get("roleDefinitionId", "")), str(body.get("principalId", ""))):
            if _key(o.id) != _key(arm_id):
                raise AzureError(f"RoleAssignmentExists: The role assignment already exists. (the assignment {o.id} "
                                 "gives this principal this role at this scope)")

    @staticmethod
    def _check_role_update(existing: AzureObject, body: dict[str, Any]) -> None:
        """RoleAssignmentUpdateNotPermitted: the principal (and scope, in the id) are fixed."""
        before, after = str(existing.body.get("principalId", "")), str(body.get("principalId", ""))
        if before.lower() != after.lower():
            raise AzureError("RoleAssignmentUpdateNotPermitted: Tenant ID, application ID, principal ID, and scope are "
                             f"not allowed to be updated. (principal {before} -> {after} on {existing.id})")

    @staticmethod
    def _check_required(type_token: str, body: dict[str, Any]) -> None:
        """The request body has every property the API requires (the SDK model of the type's
        conformance row; path parameters are the URL's, not the body's)."""
        row = ROWS.get(type_token)
        if row is None:
            return
        path = {conformance.norm(k) for k in id_inputs(type_token)} | {conformance.norm(k) for k in row.fixed_inputs}
        found: list[conformance.Finding] = []
        request = conformance.arm_shape({k: v for k, v in body.items() if conformance.norm(k) not in path})
        conformance.check_model(request, conformance.resolve(row.model), "", row.not_covered, found, exclude=path)
        # azure-native sends an empty `properties` container the schema requires (its
        # requiredContainers, provider/pkg/gen/properties.go): only real properties can be missing.
        missing = [f.path for f in found if "but not set" in f.message and f.path != "properties"]
        if "location" in missing:
            raise AzureError("LocationRequired: The location property is required for this definition.")
        if missing:
            raise AzureError(f"InvalidRequestContent: The request content was invalid and could not be deserialized: "
                             f"'Required property '{missing[0]}' not found in JSON.' ({type_token}: "
                             f"{', '.join(missing)} missing)")
