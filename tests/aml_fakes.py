"""A real azure-ai-ml MLClient whose HTTP goes to a fake Azure ML service.

Every MLClient call jobs makes runs through the SDK's own code: request building, the REST
models' deserialization, the entities' `_from_rest_object` and the SDK's error mapping
(404 -> ResourceNotFoundError, 409 -> ResourceExistsError, others -> HttpResponseError with
the service's error code and message). Only the transport is fake: it answers each request
with JSON shaped like Azure ML's responses (tests/fixtures/aml-rest/, after the examples in
Azure/azure-rest-api-specs specification/machinelearningservices) and records the requests.

`jobs.create_or_update` uploads the code snapshot to Blob first, which no fake transport can
serve; for it, `created_job()` returns what the SDK makes of the service's PUT response (the
same JobBase document a GET returns), and `service_error()` what it raises for an error answer.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import requests
from azure.core.credentials import AccessToken, AccessTokenInfo
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest._requests_basic import RestRequestsTransportResponse

REST = Path(__file__).parent / "fixtures" / "aml-rest"
SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"


def rest_json(fixture: str, **replace: str) -> Any:
    """A fixture document, with {placeholders} filled in."""
    text = (REST / fixture).read_text()
    for key, value in replace.items():
        text = text.replace("{" + key + "}", value)
    return json.loads(text)


class FakeCredential:
    """A credential that always has a token (the fake service does not check it)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("fake-token", 4102444800)

    def get_token_info(self, *scopes: str, **kwargs: Any) -> AccessTokenInfo:
        return AccessTokenInfo("fake-token", 4102444800)


class ServiceTransport(HttpTransport):
    """Answers requests whose URL contains a route key with (status, JSON body)."""

    def __init__(self, routes: dict[str, tuple[int, Any]] | None = None):
        self.routes = dict(routes or {})
        self.requests: list[tuple[str, str]] = []

    def __enter__(self) -> ServiceTransport:
        return self

    def __exit__(self, *args: Any) -> None:
        pass

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def send(self, request, **kwargs: Any):
        self.requests.append((request.method, request.url))
        path = request.url.split("?", 1)[0]
        for key, (status, body) in self.routes.items():
            if path.endswith(key):
                raw = requests.Response()
                raw.status_code, raw.raw, raw.url = status, io.BytesIO(), request.url
                raw._content = json.dumps(body).encode()
                raw.headers["Content-Type"] = "application/json"
                raw.headers["x-ms-request-id"] = "00000000-0000-0000-0000-0000000000aa"
                response = RestRequestsTransportResponse(request=request, internal_response=raw)
                response._content = raw._content
                return response
        raise AssertionError(f"the fake Azure ML service has no route for {request.method} {request.url}")


def ml_client(routes: dict[str, tuple[int, Any]] | None = None, workspace: str = "mlw-amlhpc-dev"):
    """(MLClient, transport): azure-ai-ml's real client talking to the fake service."""
    from azure.ai.ml import MLClient

    transport = ServiceTransport(routes)
    client = MLClient(FakeCredential(), SUBSCRIPTION, "rg-amlhpc-dev", workspace, transport=transport)
    return client, transport


def created_job(name: str, **replace: str):
    """The Job entity azure-ai-ml returns for the service's answer to a job PUT."""
    client, _ = ml_client({f"/jobs/{name}": (200, rest_json("job.json", name=name, **replace))})
    return client.jobs.get(name)


def service_error(status: int, code: str, message: str) -> Exception:
    """The exception azure-ai-ml raises when the service answers `status` with an ARM error body."""
    client, _ = ml_client({"/jobs/probe": (status, {"error": {"code": code, "message": message}})})
    try:
        client.jobs.get("probe")
    except Exception as exc:  # noqa: BLE001 - whatever the SDK raises is the point
        return exc
    raise AssertionError(f"the SDK raised nothing for HTTP {status}")
