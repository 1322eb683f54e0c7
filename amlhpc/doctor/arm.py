"""The Azure Resource Manager reads `doctor` makes: plain GETs through azure-core's pipeline
(bearer token, retries), answered as JSON. The transport can be replaced (tests).

Requests and response shapes: Azure/azure-rest-api-specs, Microsoft.Resources 2021-04-01
(GetSubscription.json, GetProvider.json) and Microsoft.Authorization 2022-04-01
(RoleAssignments_ListForScope.json); `$filter=assignedTo('{objectId}')` lists a principal's
role assignments in a scope including those it has through groups ("List Azure role
assignments using the REST API", learn.microsoft.com, read 2026-11).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

MANAGEMENT_URL = "https://management.azure.com"
MANAGEMENT_SCOPE = "https://management.azure.com/.default"
RESOURCES_API = "2021-04-01"
AUTHORIZATION_API = "2022-04-01"


class ArmError(Exception):
    """ARM answered with an error status: `status`, its error `code` and message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


@dataclass
class Arm:
    """GETs against ARM for one credential."""

    credential: Any
    transport: Any = None

    _client: Any = None

    def __post_init__(self) -> None:
        from azure.core import PipelineClient
        from azure.core.pipeline import policies

        self._client = PipelineClient(MANAGEMENT_URL, policies=[
            policies.HeadersPolicy(), policies.UserAgentPolicy("aml-hpc-doctor"),
            policies.RetryPolicy(retry_total=2),
            policies.BearerTokenCredentialPolicy(self.credential, MANAGEMENT_SCOPE),
            policies.ContentDecodePolicy(), policies.NetworkTraceLoggingPolicy(),
        ], transport=self.transport)

    def get(self, path: str, api_version: str, **params: str) -> Any:
        from azure.core.rest import HttpRequest

        request = HttpRequest("GET", f"{MANAGEMENT_URL}{path}", params={"api-version": api_version, **params})
        response = self._client.send_request(request)
        try:
            body = response.json() if response.text() else {}
        except ValueError:
            body = {}
        if response.status_code >= 400:
            error = (body or {}).get("error") or {}
            raise ArmError(response.status_code, error.get("code", "Error"), error.get("message", response.text()[:200]))
        return body

    def list_all(self, path: str, api_version: str, **params: str) -> list[dict[str, Any]]:
        """Every item of a paged list (`value`, following `nextLink`)."""
        body = self.get(path, api_version, **params)
        items = list(body.get("value", []))
        next_link = body.get("nextLink")
        while next_link:
            from azure.core.rest import HttpRequest

            response = self._client.send_request(HttpRequest("GET", next_link))
            page = response.json()
            items += page.get("value", [])
            next_link = page.get("nextLink")
        return items

    def subscription(self, subscription_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.get(f"/subscriptions/{subscription_id}", RESOURCES_API)
        return found

    def providers(self, subscription_id: str) -> dict[str, str]:
        """Namespace -> registrationState for every resource provider of the subscription."""
        return {p["namespace"]: p.get("registrationState", "") for p in
                self.list_all(f"/subscriptions/{subscription_id}/providers", RESOURCES_API)}

    def role_assignments(self, subscription_id: str, object_id: str) -> list[dict[str, Any]]:
        """The principal's role assignments anywhere in the subscription (groups included)."""
        return [a.get("properties", {}) for a in self.list_all(
            f"/subscriptions/{subscription_id}/providers/Microsoft.Authorization/roleAssignments", AUTHORIZATION_API,
            **{"$filter": f"assignedTo('{object_id}')"})]


def token_claims(token: str) -> dict[str, Any]:
    """The claims of an Entra access token (a JWT), read without verifying it: only to name
    the signed-in principal (oid, upn, appid, tid). {} when it is not a JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (ValueError, json.JSONDecodeError):
        return {}
    return claims if isinstance(claims, dict) else {}
