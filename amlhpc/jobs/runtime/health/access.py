"""Can this node's managed identity reach the job's storage? Checked before staging, so a
missing role assignment stops the job in seconds with the role named, instead of hours later
in the middle of a download or at the first checkpoint upload.

For each storage account the job uses (AMLHPC_STAGE_JSON inputs, AMLHPC_CHECKPOINT_JSON):
1. the identity (AZURE_CLIENT_ID, through DefaultAzureCredential) gets a token for Azure
   Storage (scope https://storage.azure.com/.default); failing that, the cluster has no such
   identity assigned;
2. datasets: one page of the input's blob listing (needs Storage Blob Data Reader);
3. checkpoints: a zero-byte probe blob written under the job's prefix and deleted again
   (needs Storage Blob Data Contributor).
Azure Storage answers 403 with the error code AuthorizationPermissionMismatch when the role is
missing and AuthorizationFailure when the account's network rules keep the node out; each
gets its own fix. The local rehearsal uses Azurite with an account key, so there is no
identity to check there.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from amlhpc.jobs.runtime.base.contract import BLOB_CONNECTION_STRING

STORAGE_SCOPE = "https://storage.azure.com/.default"
READER, CONTRIBUTOR = "Storage Blob Data Reader", "Storage Blob Data Contributor"


@dataclass(frozen=True)
class Target:
    """One container the job needs, and what it needs to do there."""

    account_url: str
    container: str
    prefix: str
    write: bool
    what: str


def targets(specs: list[Any], checkpoint: Any | None) -> list[Target]:
    """The staged inputs (read) and the checkpoint folder (write), from the launcher's parsed settings."""
    found = [Target(s.account_url, s.container, s.prefix, False, f"input {s.name!r}") for s in specs if s.account_url]
    if checkpoint is not None and checkpoint.account_url:
        found.append(Target(checkpoint.account_url, checkpoint.container, checkpoint.prefix, True, "checkpoints"))
    return found


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "error_code", "") or getattr(getattr(exc, "error", None), "code", "") or "")


def _explain(exc: BaseException, target: Target, client_id: str) -> str:
    role = CONTRIBUTOR if target.write else READER
    where = f"{target.account_url.rstrip('/')}/{target.container}"
    code = _code(exc)
    if code == "AuthorizationPermissionMismatch" or (getattr(exc, "status_code", None) == 403 and not code):
        return (f"{target.what}: the node's identity ({client_id or 'default'}) lacks '{role}' on {where}: assign the role "
                "to the cluster's identity on the storage account (role assignments take a few minutes to apply)")
    if code == "AuthorizationFailure":
        return (f"{target.what}: {where} refuses this node (AuthorizationFailure): the account's firewall or private "
                "endpoint does not admit the cluster's subnet")
    return f"{target.what}: {where} could not be reached: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def check_access(found: list[Target], environ: Mapping[str, str], *, credential_factory: Callable[[], Any],
                 client_factory: Callable[[Target, Any], Any], host: str | None = None) -> list[str]:
    """Problems found (empty: every container is reachable with the right role)."""
    if not found or environ.get(BLOB_CONNECTION_STRING):
        return []
    client_id = environ.get("AZURE_CLIENT_ID", "")
    credential = credential_factory()
    try:
        credential.get_token(STORAGE_SCOPE)
    except Exception as exc:  # noqa: BLE001 - every credential failure means the same to the user
        return [f"the node's identity ({client_id or 'no AZURE_CLIENT_ID'}) cannot get a token for Azure Storage "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}): assign the user-assigned "
                "identity to the compute cluster and set AZURE_CLIENT_ID to its client id (the stack does both)"]
    problems = []
    probe = f".amlhpc-access-probe-{host or socket.gethostname()}"
    for target in found:
        client = client_factory(target, credential)
        try:
            if target.write:
                name = f"{target.prefix.strip('/')}/{probe}".lstrip("/")
                client.upload_blob(name, b"", overwrite=True)
                client.delete_blob(name)
            else:
                next(iter(client.list_blobs(name_starts_with=target.prefix, results_per_page=1).by_page()), None)
        except Exception as exc:  # noqa: BLE001 - the storage error is the finding
            problems.append(_explain(exc, target, client_id))
    return problems
