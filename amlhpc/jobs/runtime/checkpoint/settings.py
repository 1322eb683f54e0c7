"""AMLHPC_CHECKPOINT_JSON: where checkpoints go and how the launcher treats them.

    {"account_url": "https://<account>.blob.core.windows.net/",  # or AMLHPC_BLOB_CONNECTION_STRING (Azurite)
     "container": "checkpoints", "prefix": "<experiment>/<name>",
     "keep": 3,               # versions kept in Blob, >= 1
     "cap_mbps": 2300,        # per uploading node, Mb/s; 0 or null: no cap
     "interval_s": 600,       # background upload period
     "writers": "rank0",      # optional: "rank0" (rank 0 writes, e.g. DDP), "per_node" or "per_rank"
                              #   (sharded, e.g. DeepSpeed ZeRO: every node uploads its own stream)
     "ingress_gbps": 25,      # optional: account ingress, to warn when writers x cap exceeds it
     "local_keep": 2,         # optional: complete versions kept on each node's NVMe (versioned checkpoints)
     "local_restarts": 3,     # optional: in-job restarts before the job ends for a new attempt (0: none)
     "agree_s": 300,          # optional: how long nodes wait for each other to agree on a restart
     "accounts": ["ckpt0", "ckpt1"]}  # optional: storage accounts the parts are striped over, in order
                              #   (the stack output checkpointAccounts); the first holds the records,
                              #   manifests and `latest`. Absent: every part in account_url's account.

The NDv4 performance article caps each writer so that writers x cap stays under the
account's ingress (8 x 2300 Mb/s < 20 Gb/s); the job builder derives `cap_mbps` that way,
and the launcher warns when `ingress_gbps` is given and the product exceeds it.

Standard library only: ships in the image.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from amlhpc.jobs.runtime.base.contract import CHECKPOINT_JSON
from amlhpc.jobs.runtime.base.errors import RuntimeInputError, RuntimeProblem, load_json_object

WRITERS = ("rank0", "per_node", "per_rank")
VERSIONS_STREAM = "versions"
"""The stream of versioned (torch.distributed.checkpoint) checkpoints, under the prefix."""
_ACCOUNT_NAME = re.compile(r"^[a-z0-9]{3,24}$")
_CONTAINER_NAME = re.compile(r"^(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*$")
_FIX = "the job builder sets it from the stack's checkpoints container; resubmit, or correct the JSON by hand"


@dataclass(frozen=True)
class CheckpointSettings:
    container: str
    prefix: str
    account_url: str | None = None
    keep: int = 3
    cap_mbps: float | None = None
    interval_s: float = 600.0
    writers: str = "rank0"
    ingress_gbps: float | None = None
    local_keep: int = 2
    local_restarts: int = 3
    agree_s: float = 300.0
    accounts: tuple[str, ...] = ()
    """Storage accounts the checkpoint's parts are striped over, in order (empty: account_url's)."""

    def account_urls(self) -> list[tuple[str, str]]:
        """(account, blob endpoint) per striped account: the endpoint suffix of account_url (a
        sovereign cloud's too), else the public cloud's."""
        host = (self.account_url or "").split("//", 1)[-1].split("/", 1)[0]
        suffix = host.split(".", 1)[1] if host.count(".") >= 2 else "blob.core.windows.net"
        return [(name, f"https://{name}.{suffix}/") for name in self.accounts]

    def stream(self, node_index: int) -> str:
        """The blob prefix this node writes its checkpoint folder to and restores it from."""
        return self.prefix if self.writers == "rank0" else f"{self.prefix}/node-{node_index}"

    @property
    def versions_stream(self) -> str:
        """The blob prefix of versioned checkpoints: one stream for the job, every node's parts in it."""
        return f"{self.prefix}/{VERSIONS_STREAM}"

    def is_writer(self, node_index: int) -> bool:
        """Whether this node uploads its checkpoint folder (node 0 only when rank 0 writes it)."""
        return self.writers != "rank0" or node_index == 0

    def ingress_warning(self, nodes: int) -> str | None:
        """The NDv4 performance article's rule: writers x cap must stay below the account's ingress."""
        if not self.ingress_gbps:
            return None
        writers = 1 if self.writers == "rank0" else nodes
        if not self.cap_mbps:
            return (f"checkpoint uploads are not capped: {writers} writer(s) may exceed the account ingress of "
                    f"{self.ingress_gbps:g} Gb/s and be throttled; set cap_mbps below {self.ingress_gbps * 1000 / writers:.0f}")
        total_gbps = writers * self.cap_mbps / 1000
        if total_gbps > self.ingress_gbps:
            return (f"{writers} checkpoint writer(s) x {self.cap_mbps:g} Mb/s = {total_gbps:g} Gb/s exceeds the account "
                    f"ingress of {self.ingress_gbps:g} Gb/s: uploads will be throttled; set cap_mbps below "
                    f"{self.ingress_gbps * 1000 / writers:.0f}")
        return None


def _number(problems: list[RuntimeProblem], data: Mapping, key: str, minimum: float, integer: bool = False):
    value = data.get(key)
    if value is None:
        return None
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        problems.append(RuntimeProblem(CHECKPOINT_JSON, key, f"must be {kind}, got {value!r}", _FIX))
        return None
    if value < minimum:
        problems.append(RuntimeProblem(CHECKPOINT_JSON, key, f"must be >= {minimum:g}, got {value!r}", _FIX))
        return None
    return value


def parse_settings(text: str, reference: str = CHECKPOINT_JSON) -> CheckpointSettings:
    """Parse AMLHPC_CHECKPOINT_JSON; RuntimeInputError names every bad key."""
    data = load_json_object(text, reference, _FIX)
    problems: list[RuntimeProblem] = []
    container = data.get("container")
    if not isinstance(container, str) or not _CONTAINER_NAME.match(container):
        problems.append(RuntimeProblem(reference, "container", f"{container!r} is not a valid container name",
                                       "3-63 lowercase letters, digits and single hyphens, e.g. 'checkpoints' "
                                       "(the stack output storage.containers.checkpoints)"))
    prefix = data.get("prefix")
    if not isinstance(prefix, str) or not prefix.strip("/"):
        problems.append(RuntimeProblem(reference, "prefix", f"must name the job's folder in the container, got {prefix!r}",
                                       "e.g. 'cosmoflow/run-1'; a re-run with the same prefix resumes from it"))
    elif any(part in ("", ".", "..") for part in prefix.strip("/").split("/")):
        problems.append(RuntimeProblem(reference, "prefix", f"{prefix!r} has empty, '.' or '..' segments", "use a/b/c"))
    account_url = data.get("account_url")
    if account_url is not None and (not isinstance(account_url, str) or not account_url.startswith(("https://", "http://"))):
        # Not echoed: a connection string or SAS pasted here by mistake would be a secret in the log.
        problems.append(RuntimeProblem(reference, "account_url", "must be the blob endpoint URL (https://...)",
                                       "the stack output storage.blobEndpoint, e.g. https://<account>.blob.core.windows.net/"))
    keep = _number(problems, data, "keep", 1, integer=True)
    cap = _number(problems, data, "cap_mbps", 0)
    interval = _number(problems, data, "interval_s", 1)
    ingress = _number(problems, data, "ingress_gbps", 0)
    local_keep = _number(problems, data, "local_keep", 2, integer=True)
    local_restarts = _number(problems, data, "local_restarts", 0, integer=True)
    agree = _number(problems, data, "agree_s", 1)
    accounts = data.get("accounts") or []
    if not isinstance(accounts, list) or not all(isinstance(a, str) and _ACCOUNT_NAME.match(a) for a in accounts) \
            or len(set(accounts)) != len(accounts):
        problems.append(RuntimeProblem(reference, "accounts", f"must be a list of distinct storage account names, got "
                                       f"{accounts!r}", "the stack output checkpointAccounts, e.g. [\"ckpt0\", \"ckpt1\"]"))
        accounts = []
    writers = data.get("writers", "rank0")
    if writers not in WRITERS:
        problems.append(RuntimeProblem(reference, "writers", f"must be one of {', '.join(WRITERS)}, got {writers!r}",
                                       "'rank0' when rank 0 writes the checkpoint (DDP), 'per_node'/'per_rank' when "
                                       "ranks write shards (DeepSpeed ZeRO)"))
    if problems or not isinstance(container, str) or not isinstance(prefix, str):
        raise RuntimeInputError(problems, title=f"{reference} is not usable")
    return CheckpointSettings(container, prefix.strip("/"), account_url, keep if keep is not None else 3,
                              cap or None, float(interval) if interval is not None else 600.0, writers, ingress or None,
                              local_keep if local_keep is not None else 2,
                              local_restarts if local_restarts is not None else 3,
                              float(agree) if agree is not None else 300.0, tuple(accounts))


def settings_from_env(environ: Mapping[str, str] | None = None) -> CheckpointSettings | None:
    """The settings, or None when AMLHPC_CHECKPOINT_JSON is unset (no checkpointing)."""
    environ = os.environ if environ is None else environ
    text = environ.get(CHECKPOINT_JSON, "").strip()
    return parse_settings(text) if text else None


def container_from_settings(settings: CheckpointSettings, environ: Mapping[str, str] | None = None):
    """A ContainerClient: Azurite through AMLHPC_BLOB_CONNECTION_STRING, else managed identity.
    With striped accounts, the first account's (it holds the records, manifests and `latest`)."""
    from amlhpc.jobs.runtime.blob import blobio

    urls = settings.account_urls()
    return blobio.container_client_from_env(settings.container, urls[0][1] if urls else settings.account_url,
                                            env=environ)


def stripes_from_settings(settings: CheckpointSettings, primary, environ: Mapping[str, str] | None = None):
    """(account, ContainerClient) per striped account, `primary` for the first; [] unstriped.
    Under a connection string (Azurite) every account is that one account's container."""
    from amlhpc.jobs.runtime.blob import blobio

    urls = settings.account_urls()
    return [(name, primary if k == 0 else blobio.container_client_from_env(settings.container, url, env=environ))
            for k, (name, url) in enumerate(urls)] if len(urls) > 1 else []
