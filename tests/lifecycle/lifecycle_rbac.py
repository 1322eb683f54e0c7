"""Azure RBAC over the emulated cloud: may this principal do this action at this scope?

Evaluates what is in `FakeAzure` - the role assignments the real programs created (the
access program's for CI identities, the environment stacks' for workloads and people) and
the custom role definitions the access program wrote - the way Azure documents its
decision (Microsoft Learn, "How Azure RBAC determines if a user has access to a resource",
2024): the principal's role assignments at the scope or above it; a role grants an action
when one of its actions (or dataActions, for a data action) matches it and none of its
notActions does, `*` matching any run of characters, case-insensitively; an assignment with
a condition grants only when its condition holds for the request. No deny assignments exist
here. Built-in role definitions are the permission model's copies of Azure's; a condition
in any other form than the model's constrain-roles condition is refused as not understood,
never guessed.

A refusal carries the reason a test asserts: what the principal holds, and why none of it
grants the action there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from amlhpc.core.permissions import MODEL, Role, action_matches
from tests.lifecycle.lifecycle_cloud import ROLE, FakeAzure

ROLE_DEFINITION = "azure-native:authorization:RoleDefinition"
_ASSIGNMENTS = "/providers/microsoft.authorization/roleassignments/"
_CLAUSE = re.compile(r"\(\(!\(ActionMatches\{'(?P<action>[^']+)'\}\)\) OR \(@(?P<source>Request|Resource)"
                     r"\[Microsoft\.Authorization/roleAssignments:RoleDefinitionId\] ForAnyOfAnyValues:GuidEquals "
                     r"\{(?P<guids>[^}]*)\}\)\)")


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


def _guid(role_definition_id: str) -> str:
    return str(role_definition_id).rstrip("/").rsplit("/", 1)[-1].lower()


def _covers(scope: str, target: str) -> bool:
    scope, target = scope.lower().rstrip("/"), target.lower().rstrip("/")
    return target == scope or target.startswith(scope + "/")


class Authorizer:
    """RBAC decisions over one `FakeAzure`."""

    def __init__(self, azure: FakeAzure):
        self.azure = azure

    def role(self, role_definition_id: str) -> Role | None:
        """A built-in role from the model, or a custom one as the access program defined it in Azure."""
        guid = _guid(role_definition_id)
        custom = next((o for o in self.azure.of_type(ROLE_DEFINITION)
                       if _guid(o.body.get("roleDefinitionId", "")) == guid), None)
        if custom is not None:
            permissions = (custom.body.get("permissions") or [{}])[0]
            return Role(f"custom:{guid}", str(custom.body.get("roleName")), tuple(permissions.get("actions") or ()),
                        tuple(permissions.get("notActions") or ()), tuple(permissions.get("dataActions") or ()),
                        custom=True)
        return next((r for r in MODEL.roles.values() if r.guid == guid), None)

    def assignments(self, principal_id: str) -> list[tuple[str, dict]]:
        """(scope, body) of every role assignment of the principal."""
        out = []
        for o in self.azure.of_type(ROLE):
            if o.body.get("principalId") == principal_id:
                out.append((o.id[:o.id.lower().index(_ASSIGNMENTS)], o.body))
        return out

    def check(self, principal_id: str, action: str, scope: str, *, data: bool = False,
              requested_role: str | None = None, existing_role: str | None = None) -> Decision:
        """May `principal_id` do `action` on `scope`? `requested_role` / `existing_role`: the role
        definition a role assignment write asks for / a delete removes (the condition's attributes)."""
        held = self.assignments(principal_id)
        if not held:
            return Decision(False, f"principal {principal_id} holds no role assignment anywhere")
        why_not = []
        for at, body in held:
            role = self.role(body.get("roleDefinitionId", ""))
            name = role.name if role else _guid(body.get("roleDefinitionId", ""))
            if not _covers(at, scope):
                why_not.append(f"{name} at {at} does not cover {scope}")
                continue
            if role is None or not role.allows(action, data=data):
                why_not.append(f"{name} at {at} does not allow {action}")
                continue
            condition = body.get("condition")
            if condition:
                refused = self._condition_refuses(condition, action, requested_role, existing_role)
                if refused:
                    why_not.append(f"{name} at {at}: {refused}")
                    continue
            return Decision(True, f"{name} at {at} allows {action}")
        return Decision(False, f"denied {action} on {scope}: " + "; ".join(why_not))

    @staticmethod
    def _condition_refuses(condition: str, action: str, requested: str | None, existing: str | None) -> str | None:
        clauses = condition.split(" AND ")
        parsed = [_CLAUSE.fullmatch(c.strip()) for c in clauses]
        if not all(parsed):
            return f"its condition is not one this emulator understands ({condition[:60]}...): refused"
        for match in parsed:
            if not action_matches(match["action"], action):
                continue
            allowed = {g.strip().lower() for g in match["guids"].split(",")}
            value = requested if match["source"] == "Request" else existing
            if value is None or _guid(value) not in allowed:
                shown = MODEL.role_by_guid(_guid(value or ""))
                return (f"its condition allows {action} only for the roles {sorted(allowed)}, "
                        f"not {shown.name if shown else value}")
        return None
