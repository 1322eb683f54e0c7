"""Reaching Azure from the command line: one sign-in, checked up front, and one clear error
for each way the way to Azure fails.

`credential(scope)` returns DefaultAzureCredential (az login, a managed identity, a
service principal or workload identity from AZURE_* variables) after it has produced a
token for `scope`, within `SIGN_IN_TIMEOUT_S`; without a usable sign-in it raises one
UserError with the fix instead of the credential chain's log and minutes of retries.
`check_container()` makes one request without retries, so an account that is unreachable
or refuses this caller fails in seconds, and `explain()` turns an SDK error into the one
problem that caused it:

- not signed in / token refused -> `az login` (or a managed identity);
- 403 AuthorizationPermissionMismatch (Blob) or AuthorizationFailed (ARM) -> access
  denied, naming the role to grant - only then is "access denied" said;
- 403 AuthorizationFailure (Blob) -> the account's network rules refuse this machine
  (private-network accounts, firewalls);
- DNS, connection refused, timeouts -> the endpoint is unreachable from here.

Container names are checked locally first (`check_container_name`). Error codes: Azure
Storage "Blob service error codes" and "Shared access signature error codes", and
"Configure Azure Storage firewalls and virtual networks" (learn.microsoft.com, read
2026-11); naming: "Naming and referencing containers, blobs, and metadata" (same).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from amlhpc.core.errors import Problem, UserError

STORAGE = "https://storage.azure.com/.default"
MANAGEMENT = "https://management.azure.com/.default"
SIGN_IN_TIMEOUT_S = 20.0
PROBE_CONNECT_TIMEOUT_S = 5
PROBE_READ_TIMEOUT_S = 15
SIGN_IN_FIX = ("run `az login` (and `az account set --subscription ...`); on an Azure VM, compute instance or CI runner, "
               "give it a managed identity (AZURE_CLIENT_ID for a user-assigned one) or a workload identity")
BLOB_DATA_ROLE = "Storage Blob Data Contributor"
WORKSPACE_ROLE = "aml-hpc job submitter (the stack grants it to aml-hpc:submitters)"
_CONTAINER_NAME = re.compile(r"^(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*$")
_SPECIAL_CONTAINERS = {"$root", "$web", "$logs"}


def quiet_sdk_logs() -> None:
    """The credential chain logs every attempt as a warning; the error below says what matters."""
    for name in ("azure.identity", "azure.core.pipeline.policies.http_logging_policy", "msal"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _default_credential(env: Mapping[str, str]):
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(managed_identity_client_id=env.get("AZURE_CLIENT_ID") or None,
                                  exclude_interactive_browser_credential=True)


def credential(scope: str, *, timeout_s: float = SIGN_IN_TIMEOUT_S, env: Mapping[str, str] | None = None,
               factory: Callable[[Mapping[str, str]], Any] | None = None):
    """A credential that has just produced a token for `scope` (later requests reuse it)."""
    env = os.environ if env is None else env
    quiet_sdk_logs()
    cred = (factory or _default_credential)(env)
    outcome: dict[str, BaseException | None] = {}

    def sign_in() -> None:
        try:
            cred.get_token(scope)
            outcome["error"] = None
        except Exception as exc:  # reported below as one line
            outcome["error"] = exc

    worker = threading.Thread(target=sign_in, daemon=True)
    worker.start()
    worker.join(timeout_s)
    service = "Azure Storage" if scope == STORAGE else "Azure Resource Manager" if scope == MANAGEMENT else scope
    if "error" not in outcome:
        raise UserError([Problem("Azure sign-in", "", f"no credential produced a token for {service} within "
                                 f"{timeout_s:g} s (az CLI or the managed identity endpoint did not answer)",
                                 SIGN_IN_FIX)], "not signed in to Azure")
    if outcome["error"] is not None:
        raise UserError([Problem("Azure sign-in", "", f"no credential could sign in to {service}"
                                 f"{_cli_detail(outcome['error'])}", SIGN_IN_FIX)], "not signed in to Azure")
    return cred


def _cli_detail(exc: BaseException) -> str:
    """The az CLI's own reason when it is installed but could not give a token (e.g. an
    expired login); nothing for the usual 'not installed / not logged in'."""
    for line in str(exc).splitlines():
        line = line.strip()
        if line.startswith("AzureCliCredential:"):
            reason = line.split(":", 1)[1].strip()
            if "not found" in reason.lower() or "az login" in reason.lower():
                return ""
            return f" (az CLI: {reason[:160]})"
    return ""


def check_container_name(name: str, where: str = "--container") -> None:
    """Azure's container naming rules, before any request (a bad name is a 400 otherwise)."""
    if name in _SPECIAL_CONTAINERS or _CONTAINER_NAME.match(name):
        return
    raise UserError([Problem(where, name, f"{name!r} is not a valid container name",
                             "3-63 characters: lowercase letters, digits and single hyphens, starting and ending "
                             "with a letter or digit, e.g. datasets")], "invalid container name")


def explain(exc: BaseException, *, target: str, role: str, grant: str = "") -> UserError | None:
    """The one problem behind an Azure SDK error, or None when it is none of ours to explain
    (not found, conflicts: the caller knows what those mean)."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ServiceRequestError,
        ServiceResponseError,
    )

    status = getattr(exc, "status_code", None)
    code = getattr(exc, "error_code", None) or _header_code(exc)
    if isinstance(exc, ServiceRequestError | ServiceResponseError):
        reason = _first_line(exc)
        return UserError([Problem(target, "", f"cannot reach it: {reason}",
                                  "check this machine's network, DNS and proxy (HTTPS_PROXY), and the endpoint in the stack "
                                  "outputs; an account with private-network access is reachable only from inside its "
                                  "virtual network")], "Azure endpoint unreachable")
    if isinstance(exc, ClientAuthenticationError) and status in (None, 401):
        detail = f" ({status} {code})" if status else ""
        return UserError([Problem(target, "", f"the sign-in was refused{detail}", SIGN_IN_FIX)], "not signed in to Azure")
    if not isinstance(exc, HttpResponseError) or status != 403:
        return None
    if code in ("AuthorizationPermissionMismatch", "AuthorizationFailed"):
        fix = f"your identity needs the role '{role}'" + (f": {grant}" if grant else "")
        return UserError([Problem(target, "", f"access denied ({code})", fix)], "access denied")
    if code in ("AuthorizationFailure", "AuthorizationSourceIPMismatch"):
        return UserError([Problem(target, "", f"the account refuses requests from this network ({code}): it admits "
                                  "only its private network or its firewall's allowed addresses",
                                  "run this from inside the stack's virtual network (or a network peered or connected "
                                  "to it), or have your public IP added to the account's firewall")],
                         "refused by the account's network rules")
    if code == "KeyBasedAuthenticationNotPermitted":
        return UserError([Problem(target, "", "shared-key access is disabled on this account",
                                  f"sign in instead: {SIGN_IN_FIX}")], "shared keys disabled")
    return UserError([Problem(target, "", f"refused (403 {code or 'Forbidden'}): {_first_line(exc)}",
                              f"check your role ('{role}') and the account's network rules")], "refused by Azure")


def check_container(container_client, *, target: str, grant: str = "") -> bool:
    """One request (container properties) without retries and with short timeouts, so the
    usual failures show in seconds; True when the container exists. Every failure but a
    missing container raises the UserError `explain` gives."""
    from azure.core.exceptions import ResourceNotFoundError
    from azure.storage.blob import ContainerClient

    probe = ContainerClient.from_container_url(container_client.url, credential=container_client.credential,
                                               retry_total=0, connection_timeout=PROBE_CONNECT_TIMEOUT_S,
                                               read_timeout=PROBE_READ_TIMEOUT_S)
    try:
        probe.get_container_properties()
        return True
    except ResourceNotFoundError:
        return False
    except Exception as exc:
        problem = explain(exc, target=target, role=BLOB_DATA_ROLE, grant=grant)
        if problem is None:
            raise
        raise problem from None


def _header_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    return headers.get("x-ms-error-code")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:240]
