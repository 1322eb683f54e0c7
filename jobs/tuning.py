"""Communication and placement tuning per VM size, driven only by the SKU catalog.

`tune(sku, nodes, distribution, recipe_env, allow_tcp)` returns the environment variables a
job needs on that size, each with its reason, plus warnings. The rules:

- InfiniBand sizes: NCCL and UCX over RDMA with PCI relaxed ordering (the NDv4 performance article), GPUs
  numbered in PCI order so a NUMA map and topology file line up, NCCL's bootstrap on
  eth0, the size's NCCL topology file when the catalog names one, HPC-X's hcoll off
  (it must be off when NCCL does the collectives, the NDv4 performance article), UCX on RC verbs.
  NCCL_IB_DISABLE is never set on an InfiniBand size; a recipe that sets it loses it with
  a warning (NCCL would silently fall back to TCP without an error).
- Sizes without InfiniBand: one node is fine; several nodes talk TCP and scale badly
  (Azure's large-scale training guide), so that is refused unless the user passes --allow-tcp.
- GPU-NUMA pinning facts travel to the runtime in AMLHPC_SKU_JSON (the catalog record
  as it is) and AMLHPC_PIN; the runtime reads the real topology from sysfs first.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from core import skus
from core.errors import Problem, UserError
from jobs.runtime import contract

NCCL_TOPO_DIR = "/opt/aml-hpc/nccl-topo"
"""Where our training images install the NDv4/NDv5 NCCL topology files (images/catalog.py
NCCL_TOPO_DIR; a test keeps the two equal)."""

FORBIDDEN_ON_INFINIBAND = ("NCCL_IB_DISABLE",)


@dataclass(frozen=True)
class Tuning:
    env: dict[str, str]
    reasons: dict[str, str]
    warnings: list[str] = field(default_factory=list)


def sku_json(sku: skus.Sku) -> str:
    """AMLHPC_SKU_JSON: the catalog record as it is (field names and units of core/skus.py)."""
    return json.dumps(dataclasses.asdict(sku), sort_keys=True, separators=(",", ":"))


def check_multi_node(sku: skus.Sku, nodes: int, cluster: str, allow_tcp: bool, reference: str) -> None:
    """Refuse several nodes on a size without InfiniBand unless the user opted in."""
    if nodes > 1 and not sku.infiniband and not allow_tcp:
        ib = ", ".join(n for n in skus.names() if skus.get(n).infiniband)
        raise UserError([Problem(reference, "nodes",
                                 f"{nodes} nodes of {sku.name} (cluster {cluster!r}) have no InfiniBand: gradients would go over TCP, "
                                 "which scales badly (Azure's large-scale training guide)",
                                 f"use 1 node, a cluster of an InfiniBand size ({ib}), or pass --allow-tcp to accept it")],
                        "multi-node job without InfiniBand")


def tune(sku: skus.Sku, nodes: int, distribution: str, recipe_env: dict[str, str] | None = None,
         pin: str = "auto") -> Tuning:
    """Environment for `nodes` x `sku`; recipe values win except where they would break IB."""
    env: dict[str, str] = {}
    reasons: dict[str, str] = {}
    warnings: list[str] = []

    def put(name: str, value: str, why: str) -> None:
        env[name] = value
        reasons[name] = why

    put(contract.SKU_JSON, sku_json(sku), "the size's facts for health thresholds, pinning and staging rates")
    put(contract.PIN, pin, "GPU order and CPU affinity per local rank (sysfs first, catalog map as fallback)")
    put("CUDA_DEVICE_ORDER", "PCI_BUS_ID", "GPU ids follow PCI order, so NUMA maps and topology files refer to the same GPUs (the NDv4 performance article)")
    if sku.infiniband:
        put("NCCL_IB_PCI_RELAXED_ORDERING", "1", "RDMA with PCI relaxed ordering: needed for full IB bandwidth on Azure VMs (the NDv4 performance article)")
        put("UCX_IB_PCI_RELAXED_ORDERING", "on", "same for UCX (MPI point-to-point) (the NDv4 performance article)")
        put("NCCL_SOCKET_IFNAME", "eth0", "NCCL's bootstrap and out-of-band traffic on the Ethernet NIC, not IPoIB or docker0")
        put("UCX_TLS", "rc,sm,self", "UCX over InfiniBand RC verbs between nodes (the NDv4 performance article: rc), shared memory within a node")
        put("OMPI_MCA_coll_hcoll_enable", "0", "HPC-X hierarchical collectives must be off when NCCL does the collectives (the NDv4 performance article)")
        put("NCCL_DEBUG", "INFO", "the log then shows `NET/IB : Using` - proof NCCL did not fall back to sockets")
        put("NCCL_DEBUG_SUBSYS", "INIT,NET", "keep NCCL's INFO log to initialisation and transport choice")
        if sku.nccl_topo_file:
            put("NCCL_TOPO_FILE", f"{NCCL_TOPO_DIR}/{sku.nccl_topo_file}",
                f"{sku.name} VMs hide the real PCI topology; NCCL needs the published map to pair GPUs with HCAs")
        if distribution == "mpi":
            put("OMPI_MCA_pml", "ucx", "OpenMPI point-to-point over UCX (the NDv4 performance article)")
            put("OMPI_MCA_btl", "^openib,smcuda", "no legacy openib/smcuda transports next to UCX (the NDv4 performance article)")
    elif nodes > 1:
        put("NCCL_SOCKET_IFNAME", "eth0", "no InfiniBand: all NCCL traffic on the Ethernet NIC")
        put("NCCL_SOCKET_NTHREADS", "4", "more socket threads per connection for TCP all-reduce (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD <= 64)")
        put("NCCL_NSOCKS_PERTHREAD", "4", "several sockets per thread so one TCP stream does not cap the bandwidth")
        warnings.append(f"{sku.name} has no InfiniBand: {nodes} nodes will all-reduce over TCP and scale poorly (Azure's large-scale training guide)")

    for name, value in (recipe_env or {}).items():
        if sku.infiniband and name in FORBIDDEN_ON_INFINIBAND:
            warnings.append(f"dropped {name}={value} from the recipe: {sku.name} has InfiniBand and NCCL must use it")
            continue
        if name in env and env[name] != value:
            warnings.append(f"recipe sets {name}={value} (tuning default {env[name]}): the recipe wins")
        env[name] = value
        reasons[name] = "set by the recipe"
    return Tuning(env, reasons, warnings)
