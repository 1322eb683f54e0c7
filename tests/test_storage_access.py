"""The managed-identity check before staging (amlhpc/jobs/runtime/health/access.py): a missing token,
a missing role and a network refusal each stop the job with the cause named. The storage
errors are the SDK's own: azure-core's HttpResponseError with Azure Storage's error codes."""

from __future__ import annotations

import pytest
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

from amlhpc.jobs.runtime.health import access

READ = access.Target("https://acct.blob.core.windows.net/", "datasets", "cosmoflow/", False, "input 'cosmoflow'")
WRITE = access.Target("https://acct.blob.core.windows.net/", "checkpoints", "cosmoflow/run-1", True, "checkpoints")
ENV = {"AZURE_CLIENT_ID": "11111111-2222-3333-4444-555555555555"}


class Credential:
    def __init__(self, error=None):
        self.error, self.scopes = error, []

    def get_token(self, *scopes):
        self.scopes.extend(scopes)
        if self.error:
            raise self.error
        return object()


def storage_error(code: str) -> HttpResponseError:
    error = HttpResponseError(message=f"This request is not authorized to perform this operation. ErrorCode:{code}")
    error.status_code, error.error_code = 403, code
    return error


class Container:
    def __init__(self, error=None):
        self.error, self.calls = error, []

    def list_blobs(self, name_starts_with, results_per_page):
        self.calls.append(("list", name_starts_with))
        if self.error:
            raise self.error
        return type("Pages", (), {"by_page": lambda self: iter([[]])})()

    def upload_blob(self, name, data, overwrite):
        self.calls.append(("upload", name))
        if self.error:
            raise self.error

    def delete_blob(self, name):
        self.calls.append(("delete", name))


def run(credential, container, found=(READ, WRITE), env=ENV):
    return access.check_access(list(found), env, credential_factory=lambda: credential,
                               client_factory=lambda target, cred: container, host="node-0")


def test_reachable_storage_passes_with_a_probe_that_cleans_up():
    credential, container = Credential(), Container()
    assert run(credential, container) == []
    assert credential.scopes == ["https://storage.azure.com/.default"]
    assert container.calls == [("list", "cosmoflow/"), ("upload", "cosmoflow/run-1/.amlhpc-access-probe-node-0"),
                               ("delete", "cosmoflow/run-1/.amlhpc-access-probe-node-0")]


def test_no_token_names_the_identity():
    problems = run(Credential(ClientAuthenticationError("ManagedIdentityCredential: no identity assigned")), Container())
    assert len(problems) == 1 and "11111111-2222-3333-4444-555555555555" in problems[0]
    assert "assign the user-assigned identity to the compute cluster" in problems[0]


@pytest.mark.parametrize("target, role", [(READ, "Storage Blob Data Reader"), (WRITE, "Storage Blob Data Contributor")])
def test_missing_role_is_named(target, role):
    (problem,) = run(Credential(), Container(storage_error("AuthorizationPermissionMismatch")), found=(target,))
    assert f"lacks '{role}' on https://acct.blob.core.windows.net/{target.container}" in problem


def test_network_rules_are_told_apart():
    (problem,) = run(Credential(), Container(storage_error("AuthorizationFailure")), found=(READ,))
    assert "firewall or private endpoint" in problem


def test_azurite_rehearsal_has_no_identity_to_check():
    assert run(Credential(ClientAuthenticationError("x")), Container(), env={"AMLHPC_BLOB_CONNECTION_STRING": "UseDevelopmentStorage=true"}) == []
