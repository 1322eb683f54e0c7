"""Azure's published limits, as the simulation's configuration: defaults from Microsoft Learn.

Every number is a field, so a test or a benchmark can lower it (a small account that
throttles early) or raise it (an account Microsoft raised on request). The sources:

- Blob storage, per account: Learn "Scalability and performance targets for standard
  storage accounts" (learn.microsoft.com/azure/storage/common/scalability-targets-standard-account,
  read 2026-11-28; the page's table is the include `azure-storage-account-limits-standard`):
  20,000 requests per second; ingress 60 Gb/s and egress 120 Gb/s in the regions the page
  lists as large (25 and 50 Gb/s elsewhere). Past a target the service answers 503 Server
  Busy (or 500 Operation Timeout) and asks clients to back off exponentially.
- Blob storage, per blob and per block blob: Learn "Scalability and performance targets
  for Blob storage" (learn.microsoft.com/azure/storage/blobs/scalability-targets, read
  2026-11-28; its source dated 2023-01-11): a single blob's target request rate up to 500
  requests per second (the 2026 revision gives 3,000 for a block blob; 500 is the figure
  this project plans against, and the one its coordination must keep under); 50,000
  blocks in a block blob; blocks up to 4,000 MiB; Put Blob up to 5,000 MiB.
- Put Block: a blob holds at most 100,000 uncommitted blocks, its block ids have one
  length, and uncommitted blocks are discarded a week after the last successful Put Block
  (Learn REST "Put Block", read 2026-11-28).
- List Blobs returns at most 5,000 items a page, with a continuation marker (Learn REST
  "List Blobs"); Blob Batch carries at most 256 subrequests, and each subrequest counts
  as a transaction besides the batch itself (Learn REST "Blob Batch"; Azure update "Batch
  API for Blob Storage", 2019-10-23).
- Azure Resource Manager: Learn "Understand how Azure Resource Manager throttles
  requests" (learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling,
  read 2026-11-28; token buckets since 2024): per subscription, per principal and per
  operation type in a region, reads refill 25/s into a bucket of 250, writes 10/s into
  200, deletes 10/s into 200; a subscription-wide limit of 15 times those applies to all
  principals together; past them the answer is 429 with Retry-After.

Azure Storage documents no Retry-After on its 503s; the simulation sends one (`retry_after_s`,
configurable, None to send none) so that clients that honour it can be measured doing so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class BlobLimits:
    """One storage account's targets and Blob's hard limits (see the module docstring)."""

    account_requests_per_s: float = 20_000.0
    account_ingress_gbit_s: float = 60.0
    account_egress_gbit_s: float = 120.0
    blob_requests_per_s: float = 500.0
    burst_s: float = 1.0
    """A token bucket holds this many seconds of its rate: a burst up to it passes."""
    retry_after_s: float | None = 1.0
    """The Retry-After sent with a 503 (None: none, as Azure Storage documents)."""
    max_list_results: int = 5_000
    max_batch: int = 256
    max_committed_blocks: int = 50_000
    max_uncommitted_blocks: int = 100_000
    max_block_bytes: int = 4_000 * MIB
    max_put_blob_bytes: int = 5_000 * MIB
    max_block_id_bytes: int = 64
    uncommitted_ttl_s: float = 7 * 24 * 3600.0
    max_blob_name_chars: int = 1_024
    lease_min_s: int = 15
    lease_max_s: int = 60
    ingress_charge: Callable[[str, int], float] | None = None
    """What a write of `size` bytes to a blob (its name) takes from the account's ingress
    (None: its size). A simulation that scales its data down, and the ingress with it, charges
    its real-sized small records at the same scale, so they take the share they would really take."""

    def scaled(self, factor: float) -> BlobLimits:
        """These targets times `factor` (a smaller account for a small simulation)."""
        from dataclasses import replace

        return replace(self, account_requests_per_s=self.account_requests_per_s * factor,
                       account_ingress_gbit_s=self.account_ingress_gbit_s * factor,
                       account_egress_gbit_s=self.account_egress_gbit_s * factor,
                       blob_requests_per_s=self.blob_requests_per_s * factor)


@dataclass(frozen=True)
class ArmLimits:
    """Resource Manager's token buckets per principal per region, by operation type."""

    read_per_s: float = 25.0
    read_bucket: float = 250.0
    write_per_s: float = 10.0
    write_bucket: float = 200.0
    delete_per_s: float = 10.0
    delete_bucket: float = 200.0
    subscription_factor: float = 15.0
    """The subscription-wide bucket for all principals together: this many times a principal's."""

    def bucket(self, kind: str) -> tuple[float, float]:
        """(refill per second, capacity) of an operation type: read, write or delete."""
        return {"read": (self.read_per_s, self.read_bucket), "write": (self.write_per_s, self.write_bucket),
                "delete": (self.delete_per_s, self.delete_bucket)}[kind]


class TokenBucket:
    """Tokens refill at `rate` per second up to `capacity`; a request takes `cost` or is refused."""

    __slots__ = ("rate", "capacity", "tokens", "at")

    def __init__(self, rate: float, capacity: float, now: float = 0.0):
        self.rate, self.capacity, self.tokens, self.at = rate, capacity, capacity, now

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
            self.at = now

    def available(self, now: float, cost: float = 1.0) -> bool:
        self._refill(now)
        return self.tokens >= cost

    def take(self, now: float, cost: float = 1.0) -> bool:
        self._refill(now)
        if self.tokens < cost:
            return False
        self.tokens -= cost
        return True

    def wait_s(self, now: float, cost: float = 1.0) -> float:
        """Seconds until `cost` tokens are there."""
        self._refill(now)
        return max(0.0, (cost - self.tokens) / self.rate) if self.rate > 0 else float("inf")
