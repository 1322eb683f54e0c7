"""The simulated Blob clients: the part of azure-storage-blob's API that the project calls.

`ContainerClient`, `BlobClient`, `BlobLeaseClient` and the downloader here take the same
arguments and give the same results as azure-storage-blob 12's for every call the runtime,
the managed controller and the dataset upload make (grep the code for what they call:
upload_blob, download_blob().readall()/chunks(), list_blobs(name_starts_with, include),
walk_blobs, get_blob_client, delete_blob, delete_blobs, get_blob_properties,
set_blob_metadata, set_http_headers, stage_block, commit_block_list, get_block_list,
acquire_lease and the lease's renew/release/break_lease/change, exists, create_container),
conditions through `etag` + `match_condition` (azure.core.MatchConditions) or `overwrite`,
and leases through `lease=`.

Errors are the real azure.core.exceptions, chosen as the SDK chooses them (its generated
layer maps 404, 409, 304 and 401; its `process_storage_error` maps ConditionNotMet to
ResourceModifiedError): ResourceNotFoundError (404), ResourceExistsError (409),
ResourceModifiedError (a condition not met: 412, and 304 on a read), else
HttpResponseError, each with `status_code`, `reason`, `error_code` and the service's
message; `delete_blobs` raises PartialBatchErrorException when a subrequest fails (its
`raise_on_any_failure` default). Connection errors that outlive the retries are
azure.core's ServiceRequestError / ServiceResponseError.

Every request goes through the world's network (amlhpc.sim.network): latency, faults, and
the SDK's retry loop with the product's RetrySettings, on virtual time.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobBlock, ContentSettings

from amlhpc.jobs.runtime.blob.blobio import RetrySettings
from amlhpc.sim.blobservice import ANY, Reply
from amlhpc.sim.network import Dropped, Network, Unreachable

STATUS_REASONS = {200: "OK", 201: "Created", 202: "Accepted", 206: "Partial Content", 304: "Not Modified",
                  400: "Bad Request", 404: "Not Found", 409: "Conflict", 412: "Precondition Failed",
                  413: "Request Entity Too Large", 416: "Range Not Satisfiable", 503: "Service Unavailable"}
MAX_SINGLE_GET = 32 << 20
"""azure-storage-blob's max_single_get_size default: the first GET of a download."""
MAX_BATCH = 256


class _Response:
    """Enough of azure.core's HttpResponse for HttpResponseError and its readers."""

    def __init__(self, reply: Reply, url: str, content_type: str = "application/xml"):
        self.status_code = reply.status
        self.reason = STATUS_REASONS.get(reply.status, "Error")
        self.headers = {"x-ms-error-code": reply.code, "Content-Type": content_type, **reply.headers}
        self.content_type = content_type
        self.request = None
        self.url = url
        self._body = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{reply.code}</Code>'
                      f"<Message>{reply.message}</Message></Error>") if content_type == "application/xml" else \
            json.dumps({"error": {"code": reply.code, "message": reply.message}})

    def text(self, encoding: str | None = None) -> str:
        return self._body

    def body(self) -> bytes:
        return self._body.encode()


def storage_error(reply: Reply, url: str) -> HttpResponseError:
    """The exception azure-storage-blob raises for this answer."""
    from azure.storage.blob import StorageErrorCode

    response = _Response(reply, url)
    kind: type[HttpResponseError] = {404: ResourceNotFoundError, 409: ResourceExistsError,
                                     401: ClientAuthenticationError}.get(reply.status,
                                                                                                         HttpResponseError)
    if reply.status in (304, 412) and reply.code == "ConditionNotMet":
        kind = ResourceModifiedError  # the SDK's process_storage_error: a condition not met, 304 included
    error = kind(message=f"{reply.message}\nErrorCode:{reply.code}", response=response)
    try:
        error.error_code = StorageErrorCode(reply.code)  # type: ignore[attr-defined]
    except ValueError:
        error.error_code = reply.code  # type: ignore[attr-defined]
    return error


def conditions(etag: str | None, match_condition: MatchConditions | None) -> tuple[str | None, str | None]:
    """(If-Match, If-None-Match) as azure-core's MatchConditions make them."""
    if match_condition == MatchConditions.IfNotModified:
        return etag, None
    if match_condition == MatchConditions.IfModified:
        return None, etag
    if match_condition == MatchConditions.IfPresent:
        return ANY, None
    if match_condition == MatchConditions.IfMissing:
        return None, ANY
    return None, None


def _lease_id(lease: Any) -> str | None:
    if lease is None:
        return None
    return lease if isinstance(lease, str) else lease.id


def _content(settings: ContentSettings | None) -> dict[str, Any]:
    if settings is None:
        return {}
    return {k: getattr(settings, k) for k in ("content_type", "content_encoding", "content_language", "content_md5",
                                               "content_disposition", "cache_control") if getattr(settings, k)}


class LeaseState:
    __slots__ = ("status", "state", "duration")

    def __init__(self, lease: dict[str, Any]):
        self.status, self.state, self.duration = lease["status"], lease["state"], lease["duration"]


class BlobProperties:
    """The fields of azure.storage.blob.BlobProperties the code reads (attributes and item access),
    read from the service's answer when first asked for (a listing of 1,000 blobs makes 1,000)."""

    __slots__ = ("_p", "_with_metadata", "_metadata", "_etag")

    def __init__(self, props: dict[str, Any], with_metadata: bool = True):
        self._p = props
        self._with_metadata = with_metadata
        self._metadata: dict[str, str] | None = None
        self._etag: str | None = None

    @property
    def name(self) -> str:
        return self._p["name"]

    @property
    def container(self) -> str:
        return self._p["container"]

    @property
    def size(self) -> int:
        return self._p["size"]

    @property
    def etag(self) -> str:
        return self._etag if self._etag is not None else self._p["etag"]

    @etag.setter
    def etag(self, value: str) -> None:
        self._etag = value

    @property
    def last_modified(self) -> datetime:
        return self._p["last_modified"]

    @property
    def creation_time(self) -> datetime:
        return self._p["creation_time"]

    @property
    def metadata(self) -> dict[str, str]:
        if self._metadata is None:
            self._metadata = self._p["metadata"].copy() if self._with_metadata else {}
        return self._metadata

    @property
    def lease(self) -> LeaseState:
        return LeaseState(self._p["lease"])

    blob_type = "BlockBlob"
    deleted = False
    snapshot = None
    version_id = None

    @property
    def content_settings(self) -> ContentSettings:
        content = dict(self._p["content"])
        md5 = content.get("content_md5")
        if md5 is not None:
            content["content_md5"] = bytearray(md5)
        return ContentSettings(**content)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __repr__(self) -> str:
        return f"BlobProperties(name={self.name!r}, size={self.size}, etag={self.etag})"


class BlobPrefix:
    """A virtual folder of `walk_blobs` (name and prefix, as the SDK's)."""

    def __init__(self, prefix: str, container: str):
        self.name = self.prefix = prefix
        self.container = container


class _Endpoint:
    """What the clients of one container share: the network, the account, the retry settings."""

    def __init__(self, network: Network, account: str, container: str, retry: RetrySettings):
        self.network, self.account, self.container, self.retry = network, account, container, retry

    @property
    def url(self) -> str:
        return f"https://{self.account}.blob.core.windows.net/{self.container}"

    def request(self, op: str, blob: str = "", **kwargs: Any) -> Reply:
        try:
            return self.network.retrying(self.account, op, container=self.container, blob=blob, retry=self.retry,
                                         **kwargs)
        except Unreachable as exc:
            raise ServiceRequestError(str(exc)) from None
        except Dropped as exc:
            raise ServiceResponseError(str(exc)) from None

    def checked(self, op: str, blob: str = "", ok: Iterable[int] = (), **kwargs: Any) -> Reply:
        reply = self.request(op, blob, **kwargs)
        if not reply.ok and reply.status not in ok:
            raise storage_error(reply, f"{self.url}/{blob}" if blob else self.url)
        return reply


def _write_result(props: dict[str, Any]) -> dict[str, Any]:
    return {"etag": props["etag"], "last_modified": props["last_modified"], "client_request_id": None,
            "request_id": None, "version": "2025-11-05", "date": props["last_modified"], "request_server_encrypted": True}


class StorageStreamDownloader:
    """The result of download_blob: the first GET is made when it is created (as the SDK does)."""

    def __init__(self, endpoint: _Endpoint, blob: str, offset: int, length: int | None, if_match: str | None,
                 if_none_match: str | None, lease_id: str | None):
        self._endpoint, self.name, self.container = endpoint, blob, endpoint.container
        first = MAX_SINGLE_GET if length is None else min(length, MAX_SINGLE_GET)
        reply = endpoint.checked("get_blob", blob, offset=offset, length=first, if_match=if_match,
                                 if_none_match=if_none_match, lease_id=lease_id)
        assert reply.props is not None
        self.properties = BlobProperties(reply.props)
        self._first = reply.value
        total = self.properties.size
        self.size = (total - offset) if length is None else min(length, total - offset)
        self._offset = offset
        self._etag = self.properties.etag

    def chunks(self) -> Iterator[bytes]:
        yield self._first
        got = len(self._first)
        while got < self.size:
            piece = min(MAX_SINGLE_GET, self.size - got)
            reply = self._endpoint.checked("get_blob", self.name, offset=self._offset + got, length=piece,
                                           if_match=self._etag)
            yield reply.value
            got += len(reply.value)

    def readall(self) -> bytes:
        return b"".join(self.chunks())


class BlobLeaseClient:
    """A lease, as the SDK's: its id follows the service's answers (none after a release), and an
    operation without an id fails in the client (ValueError), before any request."""

    def __init__(self, blob: BlobClient, lease_id: str | None = None):
        self._blob = blob
        self.id = lease_id
        self.etag: str | None = None
        self.last_modified: datetime | None = None

    def _lease(self, action: str, **kwargs: Any) -> Reply:
        return self._blob._endpoint.checked("lease", self._blob.blob_name, action=action, **kwargs)

    def _needs_id(self) -> str:
        if self.id is None:
            raise ValueError("No value for given attribute")
        return self.id

    def acquire(self, lease_duration: int = -1, **kwargs: Any) -> None:
        reply = self._lease("acquire", proposed_id=self.id, duration=lease_duration)
        self.id = reply.headers["x-ms-lease-id"]

    def renew(self, **kwargs: Any) -> None:
        reply = self._lease("renew", lease_id=self._needs_id())
        self.id = reply.headers.get("x-ms-lease-id")

    def release(self, **kwargs: Any) -> None:
        self._lease("release", lease_id=self._needs_id())
        self.id = None

    def change(self, proposed_lease_id: str, **kwargs: Any) -> None:
        reply = self._lease("change", lease_id=self._needs_id(), proposed_id=proposed_lease_id)
        self.id = reply.headers.get("x-ms-lease-id")

    def break_lease(self, lease_break_period: int | None = None, **kwargs: Any) -> int:
        reply = self._lease("break", break_period=lease_break_period)
        return int(reply.headers.get("x-ms-lease-time", "0"))


class BlobClient:
    def __init__(self, endpoint: _Endpoint, blob_name: str):
        self._endpoint = endpoint
        self.blob_name = blob_name
        self.container_name = endpoint.container
        self.account_name = endpoint.account

    @property
    def url(self) -> str:
        return f"{self._endpoint.url}/{self.blob_name}"

    def upload_blob(self, data: bytes | str | Iterable[bytes], blob_type: str = "BlockBlob", length: int | None = None,
                    metadata: dict[str, str] | None = None, *, overwrite: bool = False,
                    content_settings: ContentSettings | None = None, etag: str | None = None,
                    match_condition: MatchConditions | None = None, lease: Any = None,
                    **_options: Any) -> dict[str, Any]:
        if isinstance(data, str):
            data = data.encode(_options.get("encoding", "UTF-8"))
        elif not isinstance(data, bytes | bytearray | memoryview):
            data = b"".join(data)
        if_match, if_none_match = conditions(etag, match_condition)
        if not overwrite and if_match is None and if_none_match is None:
            if_none_match = ANY
        content = _content(content_settings)
        reply = self._endpoint.checked("put_blob", self.blob_name, data=bytes(data), metadata=metadata,
                                       content=content, if_match=if_match, if_none_match=if_none_match,
                                       lease_id=_lease_id(lease), size_in=len(data))
        return _write_result(reply.value)

    def download_blob(self, offset: int | None = None, length: int | None = None, *, etag: str | None = None,
                      match_condition: MatchConditions | None = None, lease: Any = None,
                      **_options: Any) -> StorageStreamDownloader:
        if_match, if_none_match = conditions(etag, match_condition)
        return StorageStreamDownloader(self._endpoint, self.blob_name, offset or 0, length, if_match, if_none_match,
                                       _lease_id(lease))

    def get_blob_properties(self, *, etag: str | None = None, match_condition: MatchConditions | None = None,
                            **_options: Any) -> BlobProperties:
        if_match, if_none_match = conditions(etag, match_condition)
        reply = self._endpoint.checked("get_properties", self.blob_name, if_match=if_match, if_none_match=if_none_match)
        return BlobProperties(reply.value)

    def exists(self, **_options: Any) -> bool:
        reply = self._endpoint.request("get_properties", self.blob_name)
        if reply.status == 404:
            return False
        if not reply.ok:
            raise storage_error(reply, self.url)
        return True

    def delete_blob(self, delete_snapshots: str | None = None, *, etag: str | None = None,
                    match_condition: MatchConditions | None = None, lease: Any = None, **_options: Any) -> None:
        if_match, if_none_match = conditions(etag, match_condition)
        self._endpoint.checked("delete_blob", self.blob_name, if_match=if_match, if_none_match=if_none_match,
                               lease_id=_lease_id(lease))

    def set_blob_metadata(self, metadata: dict[str, str] | None = None, *, etag: str | None = None,
                          match_condition: MatchConditions | None = None, lease: Any = None,
                          **_options: Any) -> dict[str, Any]:
        if_match, if_none_match = conditions(etag, match_condition)
        reply = self._endpoint.checked("set_metadata", self.blob_name, metadata=dict(metadata or {}), if_match=if_match,
                                       if_none_match=if_none_match, lease_id=_lease_id(lease))
        return _write_result(reply.value)

    def set_http_headers(self, content_settings: ContentSettings | None = None, *, etag: str | None = None,
                         match_condition: MatchConditions | None = None, lease: Any = None,
                         **_options: Any) -> dict[str, Any]:
        if_match, if_none_match = conditions(etag, match_condition)
        reply = self._endpoint.checked("set_content", self.blob_name, content=_content(content_settings),
                                       if_match=if_match, if_none_match=if_none_match, lease_id=_lease_id(lease))
        return _write_result(reply.value)

    def stage_block(self, block_id: str, data: bytes | str, length: int | None = None, *, lease: Any = None,
                    **_options: Any) -> dict[str, Any]:
        body = data.encode() if isinstance(data, str) else bytes(data)
        encoded = base64.b64encode(str(block_id).encode()).decode()
        self._endpoint.checked("put_block", self.blob_name, block_id=encoded, data=body, lease_id=_lease_id(lease),
                               size_in=len(body))
        return {"content_md5": hashlib.md5(body).digest(), "request_server_encrypted": True}

    def commit_block_list(self, block_list: list[BlobBlock | str], content_settings: ContentSettings | None = None,
                          metadata: dict[str, str] | None = None, *, etag: str | None = None,
                          match_condition: MatchConditions | None = None, lease: Any = None,
                          **_options: Any) -> dict[str, Any]:
        groups: dict[str, list[tuple[str, str]]] = {"committed": [], "uncommitted": [], "latest": []}
        for block in block_list:
            if isinstance(block, BlobBlock):
                where = str(getattr(block.state, "value", block.state)).lower()
                groups[where if where in groups else "latest"].append((_encoded(block.id), where))
            else:
                groups["latest"].append((_encoded(block), "latest"))
        if_match, if_none_match = conditions(etag, match_condition)
        reply = self._endpoint.checked("put_block_list", self.blob_name,
                                       blocks=groups["committed"] + groups["uncommitted"] + groups["latest"],
                                       metadata=metadata, content=_content(content_settings), if_match=if_match,
                                       if_none_match=if_none_match, lease_id=_lease_id(lease))
        return _write_result(reply.value)

    def get_block_list(self, block_list_type: str = "committed", **_options: Any) -> tuple[list[BlobBlock], list[BlobBlock]]:
        reply = self._endpoint.checked("get_block_list", self.blob_name, kind=block_list_type)
        committed, uncommitted = reply.value

        def blocks(items: list[tuple[str, int]], state: str) -> list[BlobBlock]:
            found = []
            for encoded, size in items:
                block = BlobBlock(base64.b64decode(encoded).decode(), state)  # type: ignore[arg-type]
                block.size = size
                found.append(block)
            return found
        return blocks(committed, "committed"), blocks(uncommitted, "uncommitted")

    def acquire_lease(self, lease_duration: int = -1, lease_id: str | None = None, **_options: Any) -> BlobLeaseClient:
        lease = BlobLeaseClient(self, lease_id)
        lease.acquire(lease_duration)
        return lease


def _encoded(block_id: str) -> str:
    return base64.b64encode(str(block_id).encode()).decode()


class ContainerClient:
    """A simulated container (see the module docstring)."""

    def __init__(self, network: Network, account: str, container: str, retry: RetrySettings | None = None):
        self._endpoint = _Endpoint(network, account, container, retry or RetrySettings())
        self.container_name = container
        self.account_name = account

    @property
    def url(self) -> str:
        return self._endpoint.url

    def get_blob_client(self, blob: str | BlobProperties) -> BlobClient:
        return BlobClient(self._endpoint, blob if isinstance(blob, str) else blob.name)

    def create_container(self, **_options: Any) -> ContainerClient:
        self._endpoint.network.service.create_container(self.account_name, self.container_name)
        return self

    def exists(self, **_options: Any) -> bool:
        return self.container_name in self._endpoint.network.service.account(self.account_name).containers

    def upload_blob(self, name: str, data: bytes | str | Iterable[bytes], blob_type: str = "BlockBlob",
                    length: int | None = None, metadata: dict[str, str] | None = None, **kwargs: Any) -> BlobClient:
        blob = self.get_blob_client(name)
        blob.upload_blob(data, blob_type, length, metadata, **kwargs)
        return blob

    def download_blob(self, blob: str, offset: int | None = None, length: int | None = None,
                      **kwargs: Any) -> StorageStreamDownloader:
        return self.get_blob_client(blob).download_blob(offset, length, **kwargs)

    def delete_blob(self, blob: str, delete_snapshots: str | None = None, **kwargs: Any) -> None:
        self.get_blob_client(blob).delete_blob(delete_snapshots, **kwargs)

    def delete_blobs(self, *blobs: str | dict[str, Any] | BlobProperties, raise_on_any_failure: bool = True,
                     **_options: Any) -> Iterator[_Response]:
        if len(blobs) > MAX_BATCH:
            raise ValueError(f"The maximum number of blobs that can be deleted in a single request is {MAX_BATCH}.")
        if not blobs:
            return iter(())
        requests = []
        for item in blobs:
            if isinstance(item, dict):
                requests.append({"name": item["name"], "if_match": conditions(item.get("etag"),
                                                                               item.get("match_condition"))[0],
                                 "lease_id": _lease_id(item.get("lease_id"))})
            else:
                requests.append({"name": item if isinstance(item, str) else item.name})
        reply = self._endpoint.checked("batch_delete", requests=requests, subrequests=len(requests))
        parts = [_Response(answer, f"{self.url}/{r['name']}") for answer, r in zip(reply.value, requests, strict=True)]
        if raise_on_any_failure and any(not answer.ok for answer in reply.value):
            from azure.storage.blob import PartialBatchErrorException

            raise PartialBatchErrorException(message="There is a partial failure in the batch operation.",
                                             response=_Response(Reply(202), self.url), parts=parts)
        return iter(parts)

    def _pages(self, prefix: str, include: Any, delimiter: str | None,
               results_per_page: int | None) -> Iterator[BlobProperties | BlobPrefix]:
        metadata = bool(include) and ("metadata" in ([include] if isinstance(include, str) else list(include)))
        marker: str | None = None
        while True:
            reply = self._endpoint.checked("list_blobs", prefix=prefix or "", marker=marker, max_results=results_per_page,
                                           delimiter=delimiter, metadata=metadata)
            listed_metadata = reply.value["metadata"]
            for item in reply.value["items"]:
                if "prefix" in item:
                    yield BlobPrefix(item["prefix"], self.container_name)
                else:
                    props = BlobProperties(item, listed_metadata)
                    props.etag = props.etag.strip('"')  # List Blobs gives ETags unquoted, unlike the headers
                    yield props
            marker = reply.value["next_marker"]
            if not marker:
                return

    def list_blobs(self, name_starts_with: str | None = None, include: Any = None, *,
                   results_per_page: int | None = None, **_options: Any) -> Iterator[BlobProperties]:
        return self._pages(name_starts_with or "", include, None, results_per_page)  # type: ignore[return-value]

    def walk_blobs(self, name_starts_with: str | None = None, include: Any = None, delimiter: str = "/",
                   *, results_per_page: int | None = None, **_options: Any) -> Iterator[BlobProperties | BlobPrefix]:
        return self._pages(name_starts_with or "", include, delimiter, results_per_page)
