"""Azure RBAC over the emulated cloud: may this principal do this action at this scope?

Evaluates what is in `FakeAzure` - the role assignments the real programs created (the
access program's for CI identities, the environment stacks' for workloads and people) and
the custom role definitions the access program wrote - the way Azure documents its
decision (Microsoft Learn, "How Azure RBAC determines if a user has access to a resource",
2024): the principal's role assignments at the scope or above it; a role grants an action
when one of its actions (or dataActions, for a data action) matches it and none of its
notActions does, `*` matching any run of characters, case-insensitively; an assignment with
a condition grants only when its condition holds for the request. No deny assignments exist
here. Built-in role definitions are the permission model's copies of Azure's.

Conditions are parsed and evaluated as "Azure role assignment condition format and syntax"
(Microsoft Learn, 2024-04-01) describes them: `!`/`NOT`, `AND`, `OR`, parentheses,
`ActionMatches{}`, `SubOperationMatches{}` and `@Request[...]`/`@Resource[...]` attributes
compared with the String*, Guid* and ForAnyOfAnyValues operators. A blob's container and
path come from the scope (`.../containers/<name>/<path>`). An attribute, operator or token
this emulator does not know refuses the request as not understood, never guessed; an
attribute the request does not carry makes its comparison false, as in Azure.

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
_TOKEN = re.compile(r"\s*(?:(?P<paren>[()!])|(?P<word>AND|OR|NOT)\b|"
                    r"(?P<func>ActionMatches|SubOperationMatches)\{'(?P<arg>[^']*)'\}|"
                    r"@(?P<source>Request|Resource|Principal|Environment)\[(?P<attr>[^\]]+)\]\s+(?P<op>[A-Za-z:]+)\s+"
                    r"(?:'(?P<value>[^']*)'|\{(?P<values>[^}]*)\}))")
ATTRIBUTES = {
    ("Request", "Microsoft.Authorization/roleAssignments:RoleDefinitionId"): "requested_role",
    ("Resource", "Microsoft.Authorization/roleAssignments:RoleDefinitionId"): "existing_role",
    ("Request", "Microsoft.Authorization/roleAssignments:PrincipalType"): "requested_principal_type",
    ("Resource", "Microsoft.Authorization/roleAssignments:PrincipalType"): "existing_principal_type",
    ("Resource", "Microsoft.Storage/storageAccounts/blobServices/containers:name"): "container",
    ("Resource", "Microsoft.Storage/storageAccounts/blobServices/containers/blobs:path"): "path",
}
"""The attributes this emulator evaluates (Microsoft Learn, "Authorization actions and
attributes" and "Actions and attributes for Azure role assignment conditions for Azure Blob
Storage"), each to the field of `Request` that carries it."""


class NotUnderstood(Exception):
    """A condition this emulator cannot evaluate: the request is refused, never guessed."""


@dataclass(frozen=True)
class Request:
    action: str
    requested_role: str | None = None
    existing_role: str | None = None
    requested_principal_type: str | None = None
    existing_principal_type: str | None = None
    container: str | None = None
    path: str | None = None
    suboperation: str | None = None


def _like(pattern: str, value: str, ignore_case: bool) -> bool:
    regex = "^" + ".*".join(".".join(re.escape(q) for q in part.split("?")) for part in pattern.split("*")) + "$"
    return re.match(regex, value, re.IGNORECASE if ignore_case else 0) is not None


def _compare(op: str, value: str | None, operands: list[str]) -> bool:
    """One attribute comparison; a missing attribute compares false."""
    if value is None:
        return False
    quantified = op.startswith("ForAnyOfAnyValues:")
    base = op.split(":", 1)[1] if quantified else op
    if base == "GuidEquals":
        return _guid(value) in {o.strip().lower() for o in operands}
    ignore = base.endswith("IgnoreCase")
    base = base.removesuffix("IgnoreCase")
    if base == "StringEquals":
        return any((value.lower() == o.lower()) if ignore else value == o for o in operands)
    if base == "StringLike":
        return any(_like(o, value, ignore) for o in operands)
    raise NotUnderstood(f"operator {op}")


class _Condition:
    """A recursive-descent evaluator over the condition's tokens."""

    def __init__(self, text: str, request: Request):
        self.tokens, self.request, self.at = self._lex(text), request, 0

    @staticmethod
    def _lex(text: str) -> list[re.Match]:
        tokens, at = [], 0
        while text[at:].strip():
            match = _TOKEN.match(text, at)
            if match is None:
                raise NotUnderstood(f"token at {text[at:at + 40]!r}")
            tokens.append(match)
            at = match.end()
        return tokens

    def evaluate(self) -> bool:
        result = self._or()
        if self.at != len(self.tokens):
            raise NotUnderstood("trailing tokens")
        return result

    def _peek(self) -> str | None:
        if self.at >= len(self.tokens):
            return None
        t = self.tokens[self.at]
        return t["paren"] or t["word"]

    def _or(self) -> bool:
        values = [self._and()]
        while self._peek() == "OR":
            self.at += 1
            values.append(self._and())
        return any(values)

    def _and(self) -> bool:
        values = [self._unary()]
        while self._peek() == "AND":
            self.at += 1
            values.append(self._unary())
        return all(values)

    def _unary(self) -> bool:
        if self.at >= len(self.tokens):
            raise NotUnderstood("unexpected end")
        token = self.tokens[self.at]
        self.at += 1
        if token["paren"] in ("!",) or token["word"] == "NOT":
            return not self._unary()
        if token["paren"] == "(":
            value = self._or()
            if self._peek() != ")":
                raise NotUnderstood("unbalanced parentheses")
            self.at += 1
            return value
        if token["func"] == "ActionMatches":
            return action_matches(token["arg"], self.request.action)
        if token["func"] == "SubOperationMatches":
            return self.request.suboperation == token["arg"]
        if token["source"]:
            field = ATTRIBUTES.get((token["source"], token["attr"]))
            if field is None:
                raise NotUnderstood(f"attribute @{token['source']}[{token['attr']}]")
            operands = ([token["value"]] if token["value"] is not None
                        else [v.strip().strip("'") for v in token["values"].split(",")])
            return _compare(token["op"], getattr(self.request, field), operands)
        raise NotUnderstood(f"token {token.group(0).strip()!r}")


def condition_holds(condition: str, request: Request) -> bool:
    """Whether an ABAC condition grants `request`; NotUnderstood for anything unknown."""
    return _Condition(condition, request).evaluate()


def blob_location(scope: str) -> tuple[str | None, str | None]:
    """(container, blob path) of a scope `.../containers/<name>[/<path>]`; (None, None) elsewhere."""
    marker = "/containers/"
    if marker not in scope.lower():
        return None, None
    rest = scope[scope.lower().index(marker) + len(marker):]
    container, _, path = rest.partition("/")
    return container, path or None


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
              requested_role: str | None = None, existing_role: str | None = None,
              principal_type: str | None = None) -> Decision:
        """May `principal_id` do `action` on `scope`? `requested_role` / `existing_role`: the role
        definition a role assignment write asks for / a delete removes; `principal_type`: the
        type of principal a role assignment write names (the conditions' attributes)."""
        held = self.assignments(principal_id)
        if not held:
            return Decision(False, f"principal {principal_id} holds no role assignment anywhere")
        container, path = blob_location(scope) if data else (None, None)
        request = Request(action, requested_role, existing_role, principal_type, None, container, path)
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
                refused = self._condition_refuses(condition, request)
                if refused:
                    why_not.append(f"{name} at {at}: {refused}")
                    continue
            return Decision(True, f"{name} at {at} allows {action}")
        return Decision(False, f"denied {action} on {scope}: " + "; ".join(why_not))

    @staticmethod
    def _condition_refuses(condition: str, request: Request) -> str | None:
        try:
            if condition_holds(condition, request):
                return None
        except NotUnderstood as error:
            return f"its condition is not one this emulator understands ({error}): refused"
        if request.container is not None:
            return f"its condition does not allow {request.action} on {request.container}/{request.path}"
        value = request.requested_role if "write" in request.action.lower() else request.existing_role
        shown = MODEL.role_by_guid(_guid(value or ""))
        return (f"its condition does not allow {request.action} for the role "
                f"{shown.name if shown else value} (principal type {request.requested_principal_type})")
