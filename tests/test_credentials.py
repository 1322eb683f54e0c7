"""The way to Azure fails fast and says why: no sign-in, access denied (only when it is the
cause), a private-network account, an unreachable endpoint, a bad container name - one
error each, in seconds, without the credential chain's log or a traceback. The refusals
come from the real Blob SDK parsing responses shaped as Azure Storage sends them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from amlhpc.core.errors import UserError
from amlhpc.jobs.azure import credentials
from tests.jobs_helpers import outputs_file

REPO = Path(__file__).resolve().parent.parent
ACCOUNT_KEY = "a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5"
MESSAGES = {
    # x-ms-error-code -> Azure Storage's message for it (Blob service / SAS error code tables)
    "AuthorizationPermissionMismatch": "This request is not authorized to perform this operation using this permission.",
    "AuthorizationFailure": "This request is not authorized to perform this operation.",
    "KeyBasedAuthenticationNotPermitted": "Key based authentication is not permitted on this storage account.",
}


class _Storage(BaseHTTPRequestHandler):
    code = "AuthorizationPermissionMismatch"

    def _refuse(self):
        body = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{self.code}</Code>'
                f"<Message>{MESSAGES[self.code]}\nRequestId:00000000-0000-0000-0000-000000000000</Message></Error>").encode()
        self.send_response(403, MESSAGES[self.code])
        self.send_header("x-ms-error-code", self.code)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = _refuse

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing_account():
    servers = []

    def start(code: str) -> str:
        handler = type("Handler", (_Storage,), {"code": code})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/acct"

    yield start
    for server in servers:
        server.shutdown()


def container(url: str, name: str = "datasets"):
    from azure.storage.blob import ContainerClient

    return ContainerClient(url, name, credential={"account_name": "acct", "account_key": ACCOUNT_KEY})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TestRefusals:
    def test_missing_role_is_access_denied_with_the_role(self, refusing_account):
        with pytest.raises(UserError) as info:
            credentials.check_container(container(refusing_account("AuthorizationPermissionMismatch")),
                                        target="acct/datasets", grant="add your object id to dataContributors")
        text = info.value.render()
        assert info.value.title == "access denied"
        assert "AuthorizationPermissionMismatch" in text and "'Storage Blob Data Contributor'" in text
        assert "dataContributors" in text

    def test_network_rules_are_not_called_access_denied(self, refusing_account):
        with pytest.raises(UserError) as info:
            credentials.check_container(container(refusing_account("AuthorizationFailure")), target="acct/datasets")
        text = info.value.render()
        assert "access denied" not in text and "role" not in text
        assert "refuses requests from this network" in text and "virtual network" in text

    def test_shared_keys_disabled(self, refusing_account):
        with pytest.raises(UserError) as info:
            credentials.check_container(container(refusing_account("KeyBasedAuthenticationNotPermitted")), target="x")
        assert "shared-key access is disabled" in info.value.render() and "az login" in info.value.render()

    def test_unreachable_endpoint_fails_in_seconds(self):
        started = time.monotonic()
        with pytest.raises(UserError) as info:
            credentials.check_container(container(f"http://127.0.0.1:{closed_port()}/acct"), target="acct/datasets")
        assert time.monotonic() - started < 10, "no retries with backoff"
        assert info.value.title == "Azure endpoint unreachable" and "cannot reach it" in info.value.render()

    def test_missing_container_is_left_to_the_caller(self, azurite):
        from azure.storage.blob import ContainerClient

        probe = ContainerClient.from_connection_string(azurite.connection_string, "no-such-container-here")
        assert credentials.check_container(probe, target="x") is False


class TestSignIn:
    def test_no_credential_is_one_error_with_the_fix(self):
        from azure.core.exceptions import ClientAuthenticationError

        class NoLogin:
            def get_token(self, *scopes, **kwargs):
                raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token from the included "
                                                "credentials.\nAttempted credentials:\n\tAzureCliCredential: Azure CLI "
                                                "not found on path")

        with pytest.raises(UserError) as info:
            credentials.credential(credentials.STORAGE, factory=lambda env: NoLogin())
        text = info.value.render()
        assert info.value.title == "not signed in to Azure" and "az login" in text and "managed identity" in text
        assert "Attempted credentials" not in text

    def test_an_expired_cli_login_says_so(self):
        from azure.core.exceptions import ClientAuthenticationError

        class Expired:
            def get_token(self, *scopes, **kwargs):
                raise ClientAuthenticationError("DefaultAzureCredential failed\n\tAzureCliCredential: AADSTS700082: "
                                                "The refresh token has expired due to inactivity.")

        with pytest.raises(UserError) as info:
            credentials.credential(credentials.MANAGEMENT, factory=lambda env: Expired())
        assert "AADSTS700082" in info.value.render() and "Azure Resource Manager" in info.value.render()

    def test_a_hanging_sign_in_gives_up(self):
        class Hangs:
            def get_token(self, *scopes, **kwargs):
                time.sleep(30)

        started = time.monotonic()
        with pytest.raises(UserError) as info:
            credentials.credential(credentials.STORAGE, timeout_s=0.5, factory=lambda env: Hangs())
        assert time.monotonic() - started < 5 and "within 0.5 s" in info.value.render()

    def test_a_working_credential_is_returned(self):
        class Works:
            calls = 0

            def get_token(self, *scopes, **kwargs):
                Works.calls += 1
                return object()

        assert isinstance(credentials.credential(credentials.STORAGE, factory=lambda env: Works()), Works)
        assert Works.calls == 1


@pytest.mark.parametrize("name,ok", [
    ("datasets", True), ("a1-b2", True), ("abc", True), ("$root", True), ("x" * 63, True),
    ("ab", False), ("x" * 64, False), ("Datasets", False), ("data_sets", False), ("-data", False),
    ("data-", False), ("da--ta", False), ("data sets", False),
])
def test_container_names(name, ok):
    if ok:
        credentials.check_container_name(name)
    else:
        with pytest.raises(UserError) as info:
            credentials.check_container_name(name)
        assert "not a valid container name" in info.value.render()


def _without_login(tmp_path) -> dict[str, str]:
    """This machine with no Azure sign-in of any kind: no AZURE_* variables, no az CLI cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "IDENTITY_", "MSI_", "AMLHPC_BLOB"))}
    env["HOME"] = str(tmp_path)
    env["AZURE_CONFIG_DIR"] = str(tmp_path / ".azure")
    return env


@pytest.mark.parametrize("argv", [
    ["data", "upload", "{data}", "--stack", "dev", "--outputs", "{outputs}", "--prefix", "x"],
    ["status", "some-job", "--stack", "dev", "--outputs", "{outputs}"],
], ids=["data upload", "status"])
def test_commands_without_login_fail_in_seconds(argv, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f.txt").write_text("x")
    argv = [a.format(data=tmp_path / "data", outputs=outputs_file("dev")) for a in argv]
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "amlhpc.jobs", *argv], cwd=REPO, env=_without_login(tmp_path),
                            capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert elapsed < 30, f"{elapsed:.0f} s"
    assert "not signed in to Azure" in result.stderr and "az login" in result.stderr
    for noise in ("Attempted credentials", "Traceback", "access denied", "EnvironmentCredential"):
        assert noise not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 4


def test_bad_container_name_is_refused_before_any_request(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    env = {**os.environ, "UNREACHABLE": f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={ACCOUNT_KEY};"
                                        f"BlobEndpoint=http://127.0.0.1:{closed_port()}/acct;"}
    result = subprocess.run([sys.executable, "-m", "amlhpc.jobs", "data", "upload", str(tmp_path / "d"), "--stack", "dev",
                             "--prefix", "x", "--connection-string-env", "UNREACHABLE", "--container", "My_Data"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "'My_Data' is not a valid container name" in result.stderr and "cannot reach" not in result.stderr
