"""Blob clients for the runtime: one way to reach a container, on Azure and on Azurite.

- Azure: the account URL from the stack outputs (`storage.blobEndpoint`) and
  `DefaultAzureCredential`, which on a cluster node picks the managed identity named by
  `AZURE_CLIENT_ID` (amlhpc/jobs/plan/build.py sets it) and on a laptop the `az login` session.
- Azurite (tests, local rehearsal): a connection string, read from an environment
  variable (`AMLHPC_BLOB_CONNECTION_STRING` by default). It holds an account key, so it
  is never printed, logged or put in an exception message; `safe_endpoint()` gives the
  part that may be shown.

Retries: the storage SDK's `ExponentialRetry` (an azure-core `HTTPPolicy`) tuned for
staging at scale, with a capped exponential backoff of our own. Throttling arrives as 503 ServerBusy / 500 OperationTimedOut, which the
policy retries; dropped connections arrive as ServiceRequestError (before the request
reached the server) or ServiceResponseError (mid-response), counted separately. The SDK's
defaults (15 s first backoff, 3 read retries) are tuned for interactive use; a node
pulling thousands of blobs wants a short first backoff with exponential growth and
jitter (so a fleet does not retry in lock step) and more patience for dropped reads.
A `Retry-After` header on a throttled answer is obeyed (up to `max_retry_after_s`): the
storage SDK's own policy ignores it. Every number is in `RetrySettings`, so tests and
benchmarks can shorten the waits; staging's own reads (amlhpc.jobs.runtime.blob.blobhttp) use the
same settings.

Connections: requests' default pool keeps 10 connections per host; with more download
threads than that, connections are torn down and re-opened for every request (and
urllib3 warns). The transport here keeps as many as there are threads, and reads
response bodies in 1 MiB pieces instead of azure-core's 4 KiB (see RESPONSE_READ_BYTES).

Standard library plus azure-storage-blob / azure-core / azure-identity: ships in the image.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from amlhpc.jobs.runtime.base.contract import BLOB_CONNECTION_STRING as CONNECTION_STRING_VARIABLE

if TYPE_CHECKING:  # the SDK is imported where a policy is built: a process that never builds one skips it
    from azure.core.exceptions import AzureError
    from azure.core.pipeline.transport import HttpRequest, HttpResponse
    from azure.storage.blob import ExponentialRetry

CLIENT_ID_VARIABLE = "AZURE_CLIENT_ID"
RESPONSE_READ_BYTES = 1 << 20
"""Bytes per read of a response body. azure-core's default is 4 KiB, which costs a Python
loop iteration per 4 KiB: on a 2-core machine that alone held a download to 31-60 MB/s;
1 MiB reads gave 116-142 MB/s (bench/RESULTS.md)."""


class BlobConfigError(ValueError):
    """How to reach Blob storage is missing or malformed. The message never holds a secret."""


@dataclass(frozen=True)
class RetrySettings:
    """Retry budget and backoff for every Blob request (see the module docstring).

    Backoff before retry k (k = 0, 1, ...): min(initial_backoff_s * backoff_factor ** k,
    max_backoff_s), scaled by a random factor in [1 - jitter, 1 + jitter]. The defaults
    wait about 1, 2, 4, 8, 16, 30, 30 ... s: a few minutes of throttling are ridden out.
    """

    total: int = 10
    """Retries of one request, all causes together."""
    connect: int = 6
    """Of those, for errors before the server got the request (refused, reset on connect)."""
    read: int = 6
    """Of those, for errors after the request was sent (connection dropped mid-response)."""
    status: int = 8
    """Of those, for retryable statuses (408, 500, 502, 503 ServerBusy, 504)."""
    initial_backoff_s: float = 1.0
    backoff_factor: float = 2.0
    max_backoff_s: float = 30.0
    jitter: float = 0.3
    """Fraction of each backoff that is randomised, so a fleet does not retry in lock step."""
    connection_timeout_s: float = 20.0
    read_timeout_s: float = 60.0
    """A stalled socket is given up (and retried) after this long without a byte."""
    max_retry_after_s: float = 120.0
    """The longest `Retry-After` obeyed; a server asking for more gets this."""

    @classmethod
    def fast(cls) -> RetrySettings:
        """Millisecond backoffs for tests and benchmarks against a local Azurite (Retry-After still obeyed)."""
        return cls(initial_backoff_s=0.01, backoff_factor=2.0, max_backoff_s=0.2, connection_timeout_s=5.0,
                   read_timeout_s=10.0)

    def backoff_s(self, count: int, rng: random.Random | None = None, retry_after_s: float | None = None) -> float:
        """Seconds before retry `count` (0-based); at least what the server asked for in Retry-After."""
        base = min(self.initial_backoff_s * self.backoff_factor ** count, self.max_backoff_s)
        wait = base * (rng or random).uniform(1 - self.jitter, 1 + self.jitter)
        if retry_after_s is not None and retry_after_s > 0:
            wait = max(wait, min(retry_after_s, self.max_retry_after_s))
        return wait

    def policy(self) -> ExponentialRetry:
        """The storage SDK retry policy configured from these settings."""
        return _retry_policy_class()(self)


def _retry_policy_class() -> Callable[[RetrySettings], ExponentialRetry]:
    from azure.storage.blob import ExponentialRetry

    class StagingRetry(ExponentialRetry):
        """The storage SDK's retry (which knows storage's retryable errors) with our backoff curve."""

        def __init__(self, settings: RetrySettings):
            # The SDK annotates both backoff arguments int; they are only stored, as get_backoff_time
            # below computes every backoff from `settings`.
            super().__init__(initial_backoff=settings.initial_backoff_s,  # type: ignore[arg-type]
                             increment_base=settings.backoff_factor,  # type: ignore[arg-type]
                             random_jitter_range=0, retry_total=settings.total, retry_connect=settings.connect,
                             retry_read=settings.read, retry_status=settings.status)
            self.settings = settings

        # The SDK annotates `request` and `response` as the pipeline's wrappers but its send() passes
        # the HTTP request and response inside them (azure/storage/blob/_shared/policies.py).
        def increment(self, settings: dict[str, Any], request: HttpRequest,
                      response: HttpResponse | None = None, error: AzureError | None = None) -> bool:
            # Remember what a throttled answer asked for; the SDK's sleep() only sees `settings`.
            settings["retry_after"] = parse_retry_after(response.headers.get("Retry-After")) if response is not None else None
            return super().increment(settings, request, response=response, error=error)

        def get_backoff_time(self, settings: dict[str, Any]) -> float:
            return self.settings.backoff_s(settings["count"], retry_after_s=settings.pop("retry_after", None))

    return StagingRetry


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date (RFC 9110 section 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    import time

    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True)
class ConnectionParts:
    """What a storage connection string names. `account_key` is a secret: never print it."""

    blob_endpoint: str
    account_name: str | None
    account_key: str | None = field(repr=False)


def parse_connection_string(connection_string: str) -> ConnectionParts:
    """The blob endpoint, account and key of a connection string (BlobConfigError when malformed)."""
    parts = dict(p.split("=", 1) for p in connection_string.split(";") if "=" in p)
    account = parts.get("AccountName") or None
    endpoint = parts.get("BlobEndpoint")
    if not endpoint and account:
        suffix = parts.get("EndpointSuffix", "core.windows.net")
        endpoint = f"{parts.get('DefaultEndpointsProtocol', 'https')}://{account}.blob.{suffix}"
    if not endpoint or not endpoint.startswith(("https://", "http://")):
        raise BlobConfigError(
            "the Blob connection string is malformed (expected 'DefaultEndpointsProtocol=...;AccountName=...;"
            "AccountKey=...;BlobEndpoint=...'); for Azurite take it from `amlhpc.jobs.local.azurite`")
    return ConnectionParts(endpoint.rstrip("/"), account, parts.get("AccountKey") or None)


def _transport(max_connections: int, retry: RetrySettings):
    import requests
    from azure.core.pipeline.transport import RequestsTransport

    session = requests.Session()
    # Retries belong to the storage policy above; urllib3's own would double them.
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=max(10, max_connections), max_retries=0)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    return RequestsTransport(session=session, session_owner=True, connection_data_block_size=RESPONSE_READ_BYTES,
                             connection_timeout=retry.connection_timeout_s, read_timeout=retry.read_timeout_s)


def safe_endpoint(account_url: str | None = None, connection_string: str | None = None) -> str:
    """The account endpoint for messages: scheme, host, path; never a key, SAS or query."""
    if connection_string:
        parts = dict(p.split("=", 1) for p in connection_string.split(";") if "=" in p)
        if parts.get("BlobEndpoint"):
            account_url = parts["BlobEndpoint"]
        elif parts.get("AccountName"):
            suffix = parts.get("EndpointSuffix", "core.windows.net")
            account_url = f"{parts.get('DefaultEndpointsProtocol', 'https')}://{parts['AccountName']}.blob.{suffix}"
        else:
            return "<connection string>"
    if not account_url:
        return "<unknown endpoint>"
    split = urlsplit(account_url)
    return f"{split.scheme}://{split.netloc}{split.path}".rstrip("/")


def credential_from_env(env: Mapping[str, str] | None = None):
    """DefaultAzureCredential for a node (managed identity by AZURE_CLIENT_ID) or a workstation."""
    from azure.identity import DefaultAzureCredential

    env = os.environ if env is None else env
    client_id = env.get(CLIENT_ID_VARIABLE) or None
    return DefaultAzureCredential(managed_identity_client_id=client_id, exclude_interactive_browser_credential=True)


_made_here = threading.local()


@contextlib.contextmanager
def use(factory: Callable[[str, str | None], object]) -> Iterator[None]:
    """Make this thread's container clients with `factory(container, account_url)` instead (a
    simulation's clients, amlhpc/sim): the one seam through which every client is made."""
    previous = getattr(_made_here, "factory", None)
    _made_here.factory = factory
    try:
        yield
    finally:
        _made_here.factory = previous


def container_client(container: str, *, account_url: str | None = None, connection_string: str | None = None,
                     credential=None, retry: RetrySettings | None = None, max_connections: int = 32):
    """A ContainerClient for `container`.

    With `connection_string` (Azurite) it wins over `account_url`; otherwise `account_url`
    is required and `credential` defaults to `credential_from_env()`. A thread under `use`
    gets its factory's client.
    """
    factory = getattr(_made_here, "factory", None)
    if factory is not None:
        return factory(container, account_url)
    from azure.storage.blob import ContainerClient

    retry = retry or RetrySettings()
    options = {
        "retry_policy": retry.policy(),
        "transport": _transport(max_connections, retry),
        # Single GETs up to 8 MiB, ranges of 8 MiB after that: staging does its own ranging,
        # this only shapes whole-blob reads such as manifests and metadata probes.
        "max_single_get_size": 8 << 20,
        "max_chunk_get_size": 8 << 20,
    }
    if connection_string:
        try:
            return ContainerClient.from_connection_string(connection_string, container, **options)
        except ValueError:
            # The SDK's message is generic, and the string itself must not be echoed.
            raise BlobConfigError(
                "the Blob connection string is malformed (expected 'DefaultEndpointsProtocol=...;AccountName=...;"
                "AccountKey=...;BlobEndpoint=...'); for Azurite take it from `amlhpc.jobs.local.azurite`"
            ) from None
    if not account_url:
        raise BlobConfigError(
            f"no Blob endpoint for container {container!r}: give the account URL (the stack output "
            f"storage.blobEndpoint) or set {CONNECTION_STRING_VARIABLE} for Azurite"
        )
    if not account_url.startswith(("https://", "http://")):
        raise BlobConfigError(f"account URL {safe_endpoint(account_url)!r} must start with https://")
    return ContainerClient(account_url, container, credential=credential or credential_from_env(), **options)


def container_client_from_env(container: str, account_url: str | None = None, env: Mapping[str, str] | None = None,
                              connection_string_variable: str = CONNECTION_STRING_VARIABLE, **kwargs):
    """Azurite when `connection_string_variable` is set in `env`, else Azure with DefaultAzureCredential."""
    env = os.environ if env is None else env
    connection_string = env.get(connection_string_variable) or None
    if getattr(_made_here, "factory", None) is not None:
        return container_client(container, account_url=account_url)
    credential = None if connection_string else kwargs.pop("credential", None) or credential_from_env(env)
    return container_client(container, account_url=account_url, connection_string=connection_string,
                            credential=credential, **kwargs)
