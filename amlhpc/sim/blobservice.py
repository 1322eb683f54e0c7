"""A Blob service with Azure's semantics, on virtual time: what the simulated clients talk to.

Accounts hold containers, containers hold block blobs. Every operation is applied at one
virtual instant (its arrival), atomically, and answers as the REST API does - a status, an
error code (`x-ms-error-code`), headers - never an exception: the clients
(amlhpc.sim.blobclient, amlhpc.sim.blobhttp) turn answers into what the SDK or the stdlib
HTTP path would give the code under test.

Modelled (each rule is checked against Azurite in tests/sim/test_blob_vs_azurite.py where
Azurite implements it, and against the REST reference where it does not):

- ETags (a new one on every write) and Last-Modified (the service's clock, whole seconds);
- conditions: on a write, If-Match that fails -> 412 ConditionNotMet, If-None-Match: * on
  an existing blob -> 409 BlobAlreadyExists, If-None-Match: <etag> that matches -> 412;
  on a read, If-Match that fails -> 412, If-None-Match that matches -> 304;
- leases (acquire, renew, release, break, change; 15-60 s or infinite): a write or delete
  of a leased blob without the lease id -> 412 LeaseIdMissing, with another id -> 412
  LeaseIdMismatchWithBlobOperation, with an id when none is held -> 412
  LeaseNotPresentWithBlobOperation (LeaseLost once it expired); lease operations that
  conflict -> 409 with the REST reference's codes; a lease survives its blob's overwrite;
- block blobs: staged blocks (ids of one length per blob, at most 64 bytes, blocks up to
  4,000 MiB, at most 100,000 uncommitted), Put Block List (committed, uncommitted or
  latest; at most 50,000 committed; an id it cannot find -> 400 InvalidBlockList), which
  discards every uncommitted block it does not name, as Put Blob does; uncommitted blocks
  go a week after the blob's last Put Block; a blob with no committed content is not listed;
- List Blobs: by name, from a marker, at most 5,000 (or `maxresults`) entries a page with
  an opaque continuation marker, prefix, delimiter (BlobPrefix entries), metadata on request;
- Blob Batch: up to 256 deletes, each answered on its own;
- the account's targets (requests/s, ingress, egress) and each blob's (requests/s), as token
  buckets (amlhpc.sim.limits): beyond them 503 ServerBusy with the service's messages and a
  Retry-After, before anything is applied;
- every request counted per account, per blob (the container for listings), per
  principal, per operation and per virtual second (`Accounting`).

Not modelled: page and append blobs, snapshots, versions, soft delete, tags, tiers, SAS or
RBAC (every principal may do everything), container leases, the 500 OperationTimedOut
variant of throttling, and geo-replication.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from amlhpc.sim.limits import BlobLimits, TokenBucket

ANY = "*"


def same_etag(given: str, stored: str) -> bool:
    """An ETag condition holds with or without the quotes (listings give ETags unquoted)."""
    return given.strip('"') == stored.strip('"')


@dataclass
class Reply:
    """One answer of the service."""

    status: int
    code: str = ""
    """x-ms-error-code (empty on success)."""
    message: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    value: Any = None
    """What the operation returns (properties, bytes, a listing page, sub-replies)."""
    props: dict[str, Any] | None = None
    """Get Blob: the blob's properties, beside its bytes in `value`."""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass
class Lease:
    state: str = "available"
    """available, leased, expired, breaking, broken."""
    lease_id: str | None = None
    duration: int = 0
    """Seconds, -1 infinite."""
    until: float = 0.0
    """Virtual time it expires (leased) or breaks (breaking)."""


@dataclass
class Blob:
    name: str
    data: bytes = b""
    etag: str = ""
    modified: float = 0.0
    created: float = 0.0
    committed: bool = False
    """False: only uncommitted blocks exist (not listed, 404 to reads)."""
    metadata: dict[str, str] = field(default_factory=dict)
    content: dict[str, Any] = field(default_factory=dict)
    """content_type, content_encoding, content_md5 (bytes), content_disposition, ..."""
    blocks: list[tuple[str, int]] = field(default_factory=list)
    """Committed block list: (id, size)."""
    block_data: dict[str, bytes] = field(default_factory=dict)
    """Bytes of each committed block (what a later Put Block List may name again)."""
    uncommitted: dict[str, bytes] = field(default_factory=dict)
    last_put_block: float = 0.0
    block_id_length: int | None = None
    lease: Lease = field(default_factory=Lease)
    writes: list[tuple[float, str, str | None, str | None]] = field(default_factory=list)
    """The last writes that replaced its content: (time, new ETag, If-Match, If-None-Match) - for oracles."""
    shown: dict[str, Any] | None = None
    """Its properties as the service shows them, made once per change (a listing of 1,000 blobs
    read by 1,000 nodes builds each once, not a million times). Read-only to its readers."""

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass
class Container:
    name: str
    blobs: dict[str, Blob] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    """Committed blob names, sorted (the listing order)."""
    etag: str = ""
    modified: float = 0.0

    def _index(self, blob: Blob) -> None:
        i = bisect.bisect_left(self.names, blob.name)
        if not (i < len(self.names) and self.names[i] == blob.name):
            self.names.insert(i, blob.name)

    def _unindex(self, name: str) -> None:
        i = bisect.bisect_left(self.names, name)
        if i < len(self.names) and self.names[i] == name:
            del self.names[i]


def request_target(op: str, container: str, blob: str, kwargs: dict[str, Any]) -> str:
    """What a request is counted against and matched by: `container/blob`, or for a listing
    `container?list=prefix` (a listing loads the container's partition, not one blob)."""
    if blob:
        return f"{container}/{blob}"
    if op == "list_blobs":
        return f"{container}?list={kwargs.get('prefix') or ''}"
    return f"{container}?{op}"


class Peak:
    """Requests per virtual second of one target: the running second and the highest seen."""

    __slots__ = ("second", "count", "peak", "peak_at", "total")

    def __init__(self) -> None:
        self.second, self.count, self.peak, self.peak_at, self.total = -1, 0, 0, 0, 0

    def add(self, second: int, n: int = 1) -> None:
        if second != self.second:
            self.second, self.count = second, 0
        self.count += n
        self.total += n
        if self.count > self.peak:
            self.peak, self.peak_at = self.count, second


class Accounting:
    """Every request: per account, per blob (or container for listings), per principal, per
    operation, per virtual second; throttled answers apart."""

    def __init__(self) -> None:
        self.accounts: dict[str, Peak] = {}
        self.targets: dict[tuple[str, str], Peak] = {}
        self.principals: dict[str, Peak] = {}
        self.ops: Counter[str] = Counter()
        self.throttled: Counter[str] = Counter()
        self.per_second: Counter[int] = Counter()
        """All accounts together, by virtual second."""
        self.bytes_in = 0
        self.bytes_out = 0

    def count(self, now: float, account: str, target: str, principal: str, op: str, n: int = 1) -> None:
        second = int(now)
        self.accounts.setdefault(account, Peak()).add(second, n)
        self.targets.setdefault((account, target), Peak()).add(second, n)
        self.principals.setdefault(principal, Peak()).add(second, n)
        self.ops[op] += n
        self.per_second[second] += n

    def hottest(self, account: str | None = None) -> tuple[str, Peak] | None:
        found = [(name, peak) for (acct, name), peak in self.targets.items() if account in (None, acct)]
        return max(found, key=lambda item: (item[1].peak, item[0])) if found else None

    def total(self) -> int:
        return sum(self.ops.values())


class Account:
    def __init__(self, name: str, limits: BlobLimits, now: float):
        self.name = name
        self.limits = limits
        self.containers: dict[str, Container] = {}
        self.background_rps = 0.0
        self.requests = TokenBucket(limits.account_requests_per_s, limits.account_requests_per_s * limits.burst_s, now)
        ingress = limits.account_ingress_gbit_s * 1e9 / 8
        egress = limits.account_egress_gbit_s * 1e9 / 8
        self.ingress = TokenBucket(ingress, ingress * limits.burst_s, now)
        self.egress = TokenBucket(egress, egress * limits.burst_s, now)
        self.blob_buckets: dict[tuple[str, str], TokenBucket] = {}

    def set_background(self, rps: float) -> None:
        """Other jobs' traffic on the account: it takes this many requests/s of the target."""
        self.background_rps = rps
        self.requests.rate = max(0.0, self.limits.account_requests_per_s - rps)


class BlobService:
    """Every account of the simulated world (see the module docstring)."""

    def __init__(self, now: Callable[[], float], epoch: float, limits: BlobLimits | None = None):
        self._now = now
        self.epoch = epoch
        self.limits = limits or BlobLimits()
        self.accounts: dict[str, Account] = {}
        self.accounting = Accounting()
        self._etags = 0
        self.trace: Callable[[str, str], None] | None = None
        self.watchers: list[Callable[[str, str, str], None]] = []
        """Called with (op, container, blob) after every request the service applied: an oracle
        sees each write the moment it lands, not at its next look (two commits within one look
        left the first unseen, and its legitimate pruning read as a committed version deleted)."""

    # --- the world ------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self._now()

    def service_time(self, at: float | None = None) -> datetime:
        """The service's clock as Azure reports it (whole seconds, UTC)."""
        return datetime.fromtimestamp(int(self.epoch + (self.now if at is None else at)), UTC)

    def account(self, name: str, limits: BlobLimits | None = None) -> Account:
        if name not in self.accounts:
            self.accounts[name] = Account(name, limits or self.limits, self.now)
        return self.accounts[name]

    def create_container(self, account: str, container: str) -> Reply:
        acct = self.account(account)
        if container in acct.containers:
            return Reply(409, "ContainerAlreadyExists", "The specified container already exists.")
        acct.containers[container] = Container(container, etag=self._etag(), modified=self.now)
        return Reply(201)

    def _etag(self) -> str:
        self._etags += 1
        return f'"0x8DE{self._etags:013X}"'

    # --- the front door: throttling and counting, then the operation --------------------
    def call(self, account: str, op: str, principal: str, *, container: str = "", blob: str = "",
             size_in: int = 0, size_out: int = 0, subrequests: int = 0, **kwargs: Any) -> Reply:
        """Apply one request now. `op` names a method of this class (put_blob, list_blobs, ...)."""
        acct = self.accounts.get(account)
        if acct is None:
            return Reply(404, "ResourceNotFound", "The specified resource does not exist.")
        now = self.now
        target = request_target(op, container, blob, kwargs)
        cost = 1 + subrequests
        self.accounting.count(now, account, target, principal, op, cost)
        busy = self._throttle(acct, container, blob, cost, size_in, now)
        if busy is not None:
            self.accounting.throttled[target] += 1
            self.accounting.throttled["*account*" if "account" in busy.message else "*blob*"] += 1
            return busy
        if container and container not in acct.containers and op != "create_container":
            return Reply(404, "ContainerNotFound", "The specified container does not exist.")
        reply: Reply = getattr(self, op)(acct, container, blob, **kwargs)
        if reply.ok:
            self.accounting.bytes_in += size_in
            out = len(reply.value) if isinstance(reply.value, bytes | bytearray) else size_out
            self.accounting.bytes_out += out
            acct.egress.take(now, out) if out else None
        if self.trace is not None:
            self.trace(f"{op} {target}", f"{reply.status}{' ' + reply.code if reply.code else ''}")
        if reply.ok:
            for watch in self.watchers:
                watch(op, container, blob)
        return reply

    def _throttle(self, acct: Account, container: str, blob: str, cost: int, size_in: int, now: float) -> Reply | None:
        limits = acct.limits
        if not acct.requests.available(now, cost):
            return self._busy(acct.requests.wait_s(now, cost), "Operations per second is over the account limit.")
        charge = limits.ingress_charge(blob, size_in) if size_in and limits.ingress_charge else size_in
        if charge and not acct.ingress.available(now, charge):
            return self._busy(acct.ingress.wait_s(now, charge), "Ingress is over the account limit.")
        if not acct.egress.available(now, 1):
            return self._busy(acct.egress.wait_s(now, 1), "Egress is over the account limit.")
        bucket = None
        if blob:
            key = (container, blob)
            bucket = acct.blob_buckets.get(key)
            if bucket is None:
                bucket = acct.blob_buckets[key] = TokenBucket(limits.blob_requests_per_s,
                                                              limits.blob_requests_per_s * limits.burst_s, now)
            if not bucket.available(now, 1):
                return self._busy(bucket.wait_s(now, 1), "The server is busy.")
        acct.requests.take(now, cost)
        if charge:
            acct.ingress.take(now, charge)
        if bucket is not None:
            bucket.take(now, 1)
        return None

    def _busy(self, wait_s: float, message: str) -> Reply:
        headers = {}
        if self.limits.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, round(max(wait_s, self.limits.retry_after_s))))
        return Reply(503, "ServerBusy", message, headers)

    # --- helpers --------------------------------------------------------------------------
    def _live(self, cont: Container, name: str) -> Blob | None:
        blob = cont.blobs.get(name)
        if blob is None:
            return None
        self._expire(blob)
        return blob

    def _expire(self, blob: Blob) -> None:
        lease = blob.lease
        if lease.state == "available" and not blob.uncommitted:
            return
        now = self.now
        if lease.state == "leased" and lease.duration > 0 and now >= lease.until:
            lease.state = "expired"
            blob.shown = None
        elif lease.state == "breaking" and now >= lease.until:
            lease.state = "broken"
            blob.shown = None
        if blob.uncommitted and now - blob.last_put_block >= self.limits.uncommitted_ttl_s:
            blob.uncommitted.clear()
            blob.block_id_length = None if not blob.blocks else blob.block_id_length

    @staticmethod
    def _not_found() -> Reply:
        return Reply(404, "BlobNotFound", "The specified blob does not exist.")

    def _write_conditions(self, blob: Blob | None, if_match: str | None, if_none_match: str | None) -> Reply | None:
        exists = blob is not None and blob.committed
        if if_match is not None:
            if not exists:
                return Reply(412, "ConditionNotMet", "The condition specified using HTTP conditional header(s) is not met.") \
                    if if_match != ANY else self._not_found()
            if if_match != ANY and not same_etag(if_match, blob.etag):  # type: ignore[union-attr]
                return Reply(412, "ConditionNotMet", "The condition specified using HTTP conditional header(s) is not met.")
        if if_none_match is not None and exists:
            if if_none_match == ANY:
                return Reply(409, "BlobAlreadyExists", "The specified blob already exists.")
            if same_etag(if_none_match, blob.etag):  # type: ignore[union-attr]
                return Reply(412, "ConditionNotMet", "The condition specified using HTTP conditional header(s) is not met.")
        return None

    @staticmethod
    def _read_conditions(blob: Blob, if_match: str | None, if_none_match: str | None) -> Reply | None:
        if if_match is not None and if_match != ANY and not same_etag(if_match, blob.etag):
            return Reply(412, "ConditionNotMet", "The condition specified using HTTP conditional header(s) is not met.")
        if if_none_match is not None and (if_none_match == ANY or same_etag(if_none_match, blob.etag)):
            return Reply(304, "ConditionNotMet", "The condition specified using HTTP conditional header(s) is not met.")
        return None

    def _lease_check(self, blob: Blob | None, lease_id: str | None) -> Reply | None:
        """A write's lease rule (see the module docstring)."""
        if blob is None:
            return None
        state = blob.lease.state
        if state in ("leased", "breaking"):
            if lease_id is None:
                return Reply(412, "LeaseIdMissing", "There is currently a lease on the blob and no lease ID was specified "
                                                    "in the request.")
            if lease_id != blob.lease.lease_id:
                return Reply(412, "LeaseIdMismatchWithBlobOperation", "The lease ID specified did not match the lease ID "
                                                                      "for the blob.")
            return None
        if lease_id is not None:
            if state == "expired" and lease_id == blob.lease.lease_id:
                return Reply(412, "LeaseLost", "A lease ID was specified, but the lease for the blob has expired.")
            return Reply(412, "LeaseNotPresentWithBlobOperation", "There is currently no lease on the blob.")
        return None

    def _commit(self, blob: Blob, data: bytes, metadata: dict[str, str] | None, content: dict[str, Any] | None,
                if_match: str | None = None, if_none_match: str | None = None) -> None:
        now = self.now
        blob.data = data
        blob.etag = self._etag()
        blob.writes = [*blob.writes[-3:], (now, blob.etag, if_match, if_none_match)]
        blob.shown = None
        if not blob.committed:
            blob.created = now
        blob.committed = True
        blob.modified = now
        blob.metadata = dict(metadata or {})
        blob.content = dict(content or {})
        if blob.lease.state in ("expired", "broken"):
            blob.lease.lease_id = None  # an expired lease can no longer be renewed once the blob changed

    def properties(self, container: str, blob: Blob) -> dict[str, Any]:
        """What Get Blob Properties and a listing tell of a blob (the same dict until it changes)."""
        if blob.shown is None:
            blob.shown = self._shown(container, blob)
        return blob.shown

    def _shown(self, container: str, blob: Blob) -> dict[str, Any]:
        lease = blob.lease
        locked = lease.state in ("leased", "breaking")
        return {"name": blob.name, "container": container, "size": blob.size, "etag": blob.etag,
                "last_modified": self.service_time(blob.modified), "creation_time": self.service_time(blob.created),
                "metadata": dict(blob.metadata), "content": dict(blob.content),
                "lease": {"status": "locked" if locked else "unlocked", "state": lease.state,
                          "duration": ("infinite" if lease.duration == -1 else "fixed") if locked else None}}

    # --- blob operations (called through `call`) ----------------------------------------
    def put_blob(self, acct: Account, container: str, name: str, *, data: bytes, metadata: dict[str, str] | None = None,
                 content: dict[str, Any] | None = None, if_match: str | None = None, if_none_match: str | None = None,
                 lease_id: str | None = None) -> Reply:
        cont = acct.containers[container]
        if len(name) > self.limits.max_blob_name_chars or not name:
            return Reply(400, "InvalidResourceName", "The specifed resource name contains invalid characters.")
        if len(data) > self.limits.max_put_blob_bytes:
            return Reply(413, "RequestBodyTooLarge", "The request body is too large and exceeds the maximum permissible limit.")
        blob = self._live(cont, name)
        refused = self._write_conditions(blob, if_match, if_none_match) or self._lease_check(blob, lease_id)
        if refused:
            return refused
        if blob is None:
            blob = cont.blobs[name] = Blob(name)
        blob.uncommitted.clear()
        blob.blocks = []
        blob.block_data = {}
        blob.block_id_length = None
        content = dict(content or {})
        content.setdefault("content_md5", hashlib.md5(data).digest())  # Put Blob: the service computes it
        self._commit(blob, bytes(data), metadata, content, if_match, if_none_match)
        cont._index(blob)
        return Reply(201, value=self.properties(container, blob))

    def get_blob(self, acct: Account, container: str, name: str, *, offset: int = 0, length: int | None = None,
                 if_match: str | None = None, if_none_match: str | None = None, lease_id: str | None = None) -> Reply:
        blob = self._live(acct.containers[container], name)
        if blob is None or not blob.committed:
            return self._not_found()
        refused = self._read_conditions(blob, if_match, if_none_match)
        if refused:
            return refused
        if lease_id is not None and (blob.lease.state not in ("leased", "breaking") or blob.lease.lease_id != lease_id):
            return Reply(412, "LeaseIdMismatchWithBlobOperation", "The lease ID specified did not match the lease ID "
                                                                  "for the blob.")
        if offset and offset >= blob.size:
            return Reply(416, "InvalidRange", "The range specified is invalid for the current size of the resource.")
        end = blob.size if length is None else min(blob.size, offset + length)
        partial = offset > 0 or length is not None
        return Reply(206 if partial else 200, value=blob.data[offset:end], props=self.properties(container, blob))

    def get_properties(self, acct: Account, container: str, name: str, *, if_match: str | None = None,
                       if_none_match: str | None = None) -> Reply:
        blob = self._live(acct.containers[container], name)
        if blob is None or not blob.committed:
            return self._not_found()
        return self._read_conditions(blob, if_match, if_none_match) or Reply(200, value=self.properties(container, blob))

    def delete_blob(self, acct: Account, container: str, name: str, *, if_match: str | None = None,
                    if_none_match: str | None = None, lease_id: str | None = None) -> Reply:
        cont = acct.containers[container]
        blob = self._live(cont, name)
        if blob is None or not blob.committed:
            return self._not_found()
        refused = self._write_conditions(blob, if_match, if_none_match) or self._lease_check(blob, lease_id)
        if refused:
            return refused
        del cont.blobs[name]
        cont._unindex(name)
        return Reply(202)

    def set_metadata(self, acct: Account, container: str, name: str, *, metadata: dict[str, str],
                     if_match: str | None = None, if_none_match: str | None = None, lease_id: str | None = None) -> Reply:
        blob = self._live(acct.containers[container], name)
        if blob is None or not blob.committed:
            return self._not_found()
        refused = self._write_conditions(blob, if_match, if_none_match) or self._lease_check(blob, lease_id)
        if refused:
            return refused
        blob.metadata = dict(metadata)
        blob.etag, blob.modified, blob.shown = self._etag(), self.now, None
        return Reply(200, value=self.properties(container, blob))

    def set_content(self, acct: Account, container: str, name: str, *, content: dict[str, Any],
                    if_match: str | None = None, if_none_match: str | None = None, lease_id: str | None = None) -> Reply:
        blob = self._live(acct.containers[container], name)
        if blob is None or not blob.committed:
            return self._not_found()
        refused = self._write_conditions(blob, if_match, if_none_match) or self._lease_check(blob, lease_id)
        if refused:
            return refused
        blob.content = dict(content)
        blob.etag, blob.modified, blob.shown = self._etag(), self.now, None
        return Reply(200, value=self.properties(container, blob))

    # --- blocks ---------------------------------------------------------------------------
    def put_block(self, acct: Account, container: str, name: str, *, block_id: str, data: bytes,
                  lease_id: str | None = None) -> Reply:
        cont = acct.containers[container]
        limits = self.limits
        try:
            raw = base64.b64decode(block_id, validate=True)
        except ValueError:
            return Reply(400, "InvalidQueryParameterValue", "Value for one of the query parameters specified in the "
                                                            "request URI is invalid. (blockid)")
        if not raw or len(raw) > limits.max_block_id_bytes:
            return Reply(400, "InvalidQueryParameterValue", "Value for one of the query parameters specified in the "
                                                            "request URI is invalid. (blockid)")
        if len(data) > limits.max_block_bytes:
            return Reply(413, "RequestBodyTooLarge", "The request body is too large and exceeds the maximum permissible limit.")
        blob = self._live(cont, name)
        refused = self._lease_check(blob, lease_id)
        if refused:
            return refused
        if blob is None:
            blob = cont.blobs[name] = Blob(name)
        if blob.block_id_length is not None and len(raw) != blob.block_id_length:
            return Reply(400, "InvalidBlobOrBlock", "The specified blob or block content is invalid.")
        if block_id not in blob.uncommitted and len(blob.uncommitted) >= limits.max_uncommitted_blocks:
            return Reply(409, "BlockCountExceedsLimit", "The uncommitted block count cannot exceed the maximum limit of "
                                                        "100,000 blocks.")
        blob.block_id_length = len(raw)
        blob.uncommitted[block_id] = bytes(data)
        blob.last_put_block = self.now
        return Reply(201)

    def put_block_list(self, acct: Account, container: str, name: str, *, blocks: list[tuple[str, str]],
                       metadata: dict[str, str] | None = None, content: dict[str, Any] | None = None,
                       if_match: str | None = None, if_none_match: str | None = None, lease_id: str | None = None) -> Reply:
        """`blocks`: (id, where) with where committed, uncommitted or latest."""
        cont = acct.containers[container]
        blob = self._live(cont, name)
        refused = self._write_conditions(blob, if_match, if_none_match) or self._lease_check(blob, lease_id)
        if refused:
            return refused
        if len(blocks) > self.limits.max_committed_blocks:
            return Reply(409, "BlockCountExceedsLimit", "The committed block count cannot exceed the maximum limit of "
                                                        "50,000 blocks.")
        committed = blob.block_data if blob is not None else {}
        uncommitted = blob.uncommitted if blob is not None else {}
        chosen: list[tuple[str, bytes]] = []
        for block_id, where in blocks:
            found = None
            if where in ("uncommitted", "latest") and block_id in uncommitted:
                found = uncommitted[block_id]
            elif where in ("committed", "latest") and block_id in committed:
                found = committed[block_id]
            if found is None:
                return Reply(400, "InvalidBlockList", "The specified block list is invalid.")
            chosen.append((block_id, found))
        if blob is None:
            blob = cont.blobs[name] = Blob(name)
        self._commit(blob, b"".join(data for _, data in chosen), metadata, content, if_match, if_none_match)
        blob.blocks = [(block_id, len(data)) for block_id, data in chosen]
        blob.block_data = dict(chosen)
        blob.uncommitted.clear()
        cont._index(blob)
        return Reply(201, value=self.properties(container, blob))

    def get_block_list(self, acct: Account, container: str, name: str, *, kind: str = "all") -> Reply:
        blob = self._live(acct.containers[container], name)
        if blob is None:
            return self._not_found()
        committed = list(blob.blocks) if kind in ("all", "committed") else []
        uncommitted = [(b, len(d)) for b, d in blob.uncommitted.items()] if kind in ("all", "uncommitted") else []
        return Reply(200, value=(committed, uncommitted))

    # --- leases -----------------------------------------------------------------------------
    def lease(self, acct: Account, container: str, name: str, *, action: str, lease_id: str | None = None,
              proposed_id: str | None = None, duration: int = -1, break_period: int | None = None) -> Reply:
        blob = self._live(acct.containers[container], name)
        if blob is None or not blob.committed:
            return self._not_found()
        lease, now = blob.lease, self.now
        state = lease.state
        blob.shown = None  # whatever the action, the lease it shows may change
        if action == "acquire":
            if duration != -1 and not self.limits.lease_min_s <= duration <= self.limits.lease_max_s:
                return Reply(400, "InvalidHeaderValue", "The value for one of the HTTP headers is not in the correct format.")
            if state == "leased" and proposed_id != lease.lease_id:
                return Reply(409, "LeaseAlreadyPresent", "There is already a lease present.")
            if state == "breaking":
                return Reply(409, "LeaseIsBreakingAndCannotBeAcquired", "There is already a breaking lease present.")
            lease.state, lease.lease_id, lease.duration = "leased", proposed_id or self._guid(), duration
            lease.until = now + duration if duration > 0 else float("inf")
            return Reply(201, headers={"x-ms-lease-id": lease.lease_id})
        if action == "renew":
            if lease.lease_id is None or state == "available":
                return Reply(409, "LeaseNotPresentWithLeaseOperation", "There is currently no lease on the blob.")
            if lease_id != lease.lease_id:
                return Reply(409, "LeaseIdMismatchWithLeaseOperation", "The lease ID specified did not match the lease ID "
                                                                       "for the blob.")
            if state == "broken":
                return Reply(409, "LeaseIsBrokenAndCannotBeRenewed", "The lease ID matched, but the lease has been broken "
                                                                     "explicitly and cannot be renewed.")
            if state == "breaking":
                return Reply(409, "LeaseIsBreakingAndCannotBeAcquired", "The lease ID matched, but the lease is currently "
                                                                        "in breaking state and cannot be acquired until it "
                                                                        "is broken.")
            lease.state = "leased"
            lease.until = now + lease.duration if lease.duration > 0 else float("inf")
            return Reply(200, headers={"x-ms-lease-id": lease.lease_id})
        if action == "release":
            if lease.lease_id is None or state == "available":
                return Reply(409, "LeaseNotPresentWithLeaseOperation", "There is currently no lease on the blob.")
            if lease_id != lease.lease_id:
                return Reply(409, "LeaseIdMismatchWithLeaseOperation", "The lease ID specified did not match the lease ID "
                                                                       "for the blob.")
            blob.lease = Lease()
            blob.shown = None
            return Reply(200)
        if action == "change":
            if state not in ("leased",):
                return Reply(409, "LeaseNotPresentWithLeaseOperation", "There is currently no lease on the blob.")
            if lease_id != lease.lease_id and proposed_id != lease.lease_id:
                return Reply(409, "LeaseIdMismatchWithLeaseOperation", "The lease ID specified did not match the lease ID "
                                                                       "for the blob.")
            lease.lease_id = proposed_id
            return Reply(200, headers={"x-ms-lease-id": lease.lease_id or ""})
        if action == "break":
            if state == "available":
                return Reply(409, "LeaseNotPresentWithLeaseOperation", "There is currently no lease on the blob.")
            if state in ("expired", "broken"):
                lease.state = "broken"
                return Reply(202, headers={"x-ms-lease-time": "0"})
            if state == "leased" and lease.duration == -1:
                period = float(break_period or 0)
            else:
                remaining = max(0.0, lease.until - now)
                period = remaining if break_period is None else min(float(break_period), remaining)
            if period <= 0:
                lease.state = "broken"
                return Reply(202, headers={"x-ms-lease-time": "0"})
            lease.state, lease.until = "breaking", now + period
            return Reply(202, headers={"x-ms-lease-time": str(int(period))})
        return Reply(400, "InvalidHeaderValue", f"unknown lease action {action}")

    def _guid(self) -> str:
        raw = secrets.token_hex(16)
        return f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"

    # --- listing and batches ------------------------------------------------------------
    def list_blobs(self, acct: Account, container: str, _blob: str = "", *, prefix: str = "", marker: str | None = None,
                   max_results: int | None = None, delimiter: str | None = None, metadata: bool = False) -> Reply:
        cont = acct.containers[container]
        page = min(max_results or self.limits.max_list_results, self.limits.max_list_results)
        names = cont.names
        start = bisect.bisect_left(names, prefix)
        if marker:
            try:
                after = base64.urlsafe_b64decode(marker.split("!", 2)[2].encode()).decode()
            except (IndexError, ValueError):
                return Reply(400, "OutOfRangeInput", "One of the request inputs is out of range.")
            start = max(start, bisect.bisect_left(names, after))
        items: list[dict[str, Any]] = []
        seen_prefixes: set[str] = set()
        next_marker = None
        i = start
        while i < len(names):
            name = names[i]
            if not name.startswith(prefix):
                break
            if len(items) >= page:
                next_marker = "2!" + str(len(name)) + "!" + base64.urlsafe_b64encode(name.encode()).decode()
                break
            if delimiter:
                cut = name.find(delimiter, len(prefix))
                if cut >= 0:
                    folder = name[:cut + len(delimiter)]
                    if folder not in seen_prefixes:
                        seen_prefixes.add(folder)
                        items.append({"prefix": folder})
                    i = bisect.bisect_left(names, folder + "\U0010ffff")
                    continue
            blob = cont.blobs[name]
            self._expire(blob)
            items.append(self.properties(container, blob))
            i += 1
        return Reply(200, value={"items": items, "next_marker": next_marker, "prefix": prefix, "marker": marker,
                                 "metadata": metadata})

    def batch_delete(self, acct: Account, container: str, _blob: str = "", *,
                     requests: list[dict[str, Any]]) -> Reply:
        if len(requests) > self.limits.max_batch:
            return Reply(400, "ExceedsMaxBatchRequestCount", f"The batch operation exceeds the maximum number of "
                                                             f"subrequests ({self.limits.max_batch}).")
        answers = [self.delete_blob(acct, container, r["name"], if_match=r.get("if_match"), lease_id=r.get("lease_id"))
                   for r in requests]
        return Reply(202, value=answers)
