"""Communication and placement tuning per VM size, from the catalogs.

`tune(sku, nodes, distribution, recipe_env, pin, opt_ins)` returns the environment variables a
job needs on that size, each with its reason, plus warnings. The rules:

- Every size: GPUs numbered in PCI order (CUDA_DEVICE_ORDER), so the NUMA map, the topology
  file and nvidia-smi refer to the same GPUs; the size's facts and the pinning mode for the
  runtime (AMLHPC_SKU_JSON, AMLHPC_PIN).
- The NCCL/UCX/MPI settings Azure uses for the size, each with its source
  (amlhpc/core/catalog/nccl.toml via amlhpc.core.nccl): topology and graph files, NCCL_IGNORE_CPU_AFFINITY,
  relaxed ordering, UCX_TLS paired with UCX_NET_DEVICES, hopper.conf on ND H100/H200 v5, SHARP
  when the recipe opts in. Values that depend on the node (file locations, device names) are
  listed in AMLHPC_NCCL_RESOLVE; the in-job launcher adapts them (amlhpc/jobs/runtime/node/nccl_env.py).
  Topology files travel in the job's code snapshot (amlhpc/jobs/plan/build.py), so they reach the job
  whatever its image.
- NCCL_IB_DISABLE is never set on an InfiniBand size; a recipe that sets it loses it with a
  warning (NCCL would silently fall back to TCP).
- Sizes without InfiniBand: one node is fine; several nodes talk TCP and scale badly
  (Azure's large-scale training guide), so that is refused unless the user passes --allow-tcp.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from amlhpc.core import nccl, skus
from amlhpc.core.errors import Problem, UserError
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.node import nccl_env

NCCL_TOPO_DIR = nccl_env.IMAGE_TOPO_DIR
"""Where the training images install the topology files (amlhpc/images/catalog.py NCCL_TOPO_DIR; a
test keeps the two equal). Jobs point at the copy in their code snapshot first."""

FORBIDDEN_ON_INFINIBAND = ("NCCL_IB_DISABLE",)
DISTRIBUTION_TYPE = {"deepspeed": "pytorch"}
"""Azure ML runs a deepspeed recipe as a pytorch distribution (amlhpc/jobs/plan/build.py)."""


@dataclass(frozen=True)
class Tuning:
    env: dict[str, str]
    reasons: dict[str, str]
    warnings: list[str] = field(default_factory=list)


def sku_json(sku: skus.Sku) -> str:
    """AMLHPC_SKU_JSON: the catalog record as it is (field names and units of amlhpc/core/skus.py)."""
    return json.dumps(dataclasses.asdict(sku), sort_keys=True, separators=(",", ":"))


def check_multi_node(sku: skus.Sku, nodes: int, cluster: str, allow_tcp: bool, reference: str) -> None:
    """Refuse several nodes on a size without InfiniBand unless the user opted in."""
    if nodes > 1 and not sku.infiniband and not allow_tcp:
        ib = ", ".join(n for n in skus.names() if skus.get(n).infiniband and not skus.get(n).retired)
        raise UserError([Problem(reference, "nodes",
                                 f"{nodes} nodes of {sku.name} (cluster {cluster!r}) have no InfiniBand: gradients would go over TCP, "
                                 "which scales badly (Azure's large-scale training guide)",
                                 f"use 1 node, a cluster of an InfiniBand size ({ib}), or pass --allow-tcp to accept it")],
                        "multi-node job without InfiniBand")


def catalog_value(setting: nccl.Setting) -> str:
    """The value the job carries: topology files point into the code snapshot (resolved on the node)."""
    if setting.resolve == "topology":
        return f"{nccl_env.SNAPSHOT_TOPO_DIR}/{setting.value}"
    return setting.value


def tune(sku: skus.Sku, nodes: int, distribution: str, recipe_env: dict[str, str] | None = None,
         pin: str = "auto", opt_ins: Iterable[str] = ()) -> Tuning:
    """Environment for `nodes` x `sku`; recipe values win except where they would break IB."""
    env: dict[str, str] = {}
    reasons: dict[str, str] = {}
    warnings: list[str] = []
    resolve: dict[str, str] = {}
    wanted = set(opt_ins)

    def put(name: str, value: str, why: str) -> None:
        env[name] = value
        reasons[name] = why

    put(contract.SKU_JSON, sku_json(sku), "the size's facts for health thresholds, pinning and staging rates")
    put(contract.PIN, pin, "GPU order and CPU affinity per local rank (sysfs first, catalog map as fallback)")
    put("CUDA_DEVICE_ORDER", "PCI_BUS_ID", "GPU ids follow PCI order, so NUMA maps and topology files refer to the same GPUs")
    for setting in nccl.for_size(sku.name, DISTRIBUTION_TYPE.get(distribution, distribution), wanted):
        put(setting.name, catalog_value(setting), f"{setting.why} ({nccl.cite(setting.source)})")
        if setting.resolve:
            resolve[setting.name] = setting.resolve
    for missing in sorted(wanted - nccl.available_opt_ins(sku.name)):
        warnings.append(f"{missing}: true has no effect on {sku.name}: the catalog has no {missing} settings for it "
                        f"(amlhpc/core/catalog/nccl.toml lists them for {', '.join(_sizes_with(missing)) or 'no size'})")
    if not sku.infiniband and nodes > 1:
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
        resolve.pop(name, None)  # the recipe's own value is used as it is
    if resolve:
        put(nccl_env.RESOLVE_VAR, json.dumps(resolve, sort_keys=True, separators=(",", ":")),
            "values the launcher adapts to the node: topology files found in the snapshot or image, InfiniBand device names")
    return Tuning(env, reasons, warnings)


def _sizes_with(opt_in: str) -> list[str]:
    return sorted({size for s in nccl.SETTINGS if s.opt_in == opt_in for size in s.sizes})


# ---------------------------------------------------------------------------------------
# docs/tuning.md: the catalog as a table (a test keeps the document equal to it)

TABLE_BEGIN = "<!-- BEGIN nccl table: generated by `python -m amlhpc.jobs.plan.tuning` from amlhpc/core/catalog/nccl.toml -->"
TABLE_END = "<!-- END nccl table -->"


def _short(size: str) -> str:
    return size.removeprefix("Standard_")


def docs_table() -> str:
    """The variables per size (one column per size), then each value's source and reason."""
    sizes = [n for n in skus.names() if any(n in s.sizes for s in nccl.SETTINGS)]
    names = list(dict.fromkeys(s.name for s in nccl.SETTINGS))
    lines = [TABLE_BEGIN, "", "| variable | " + " | ".join(_short(s) for s in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for name in names:
        cells = []
        for size in sizes:
            values = [s for s in nccl.SETTINGS if s.name == name and size in s.sizes]
            cells.append("<br>".join(f"`{s.value}`" + (f" ({s.opt_in})" if s.opt_in else "")
                                     + (f" ({', '.join(s.distributions)})" if s.distributions else "") for s in values) or "")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines += ["", "| variable | sizes | resolved on the node | source | why |", "|---|---|---|---|---|"]
    for s in nccl.SETTINGS:
        source = nccl.SOURCES[s.source]
        lines.append(f"| `{s.name}={s.value}` | {', '.join(_short(z) for z in s.sizes)} | {s.resolve or '-'} "
                     f"| [{source.title}]({source.url}) ({source.as_of}) | {s.why} |")
    lines += ["", TABLE_END]
    return "\n".join(lines)


def main() -> None:
    """Rewrite the generated table in docs/tuning.md."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "docs" / "tuning.md"
    text = path.read_text()
    start, end = text.index(TABLE_BEGIN), text.index(TABLE_END) + len(TABLE_END)
    path.write_text(text[:start] + docs_table() + text[end:])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
