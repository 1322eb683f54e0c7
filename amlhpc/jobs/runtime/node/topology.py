"""GPU-to-NUMA pinning: which GPU and which CPUs each local rank should use.

The NDv4 performance article (ND96asr_v4): GPUs sit two per NUMA domain in the order NUMA0 -> GPUs 2,3,
NUMA1 -> 0,1, NUMA2 -> 6,7, NUMA3 -> 4,5. Walking the domains in order gives
CUDA_VISIBLE_DEVICES=2,3,0,1,6,7,4,5; with ranks placed two per domain (`--map-by
ppr:2:numa`), local rank r then drives CUDA device r, which is attached to the CPUs it
runs on.

Where the facts come from, best first:
1. sysfs: every NVIDIA display/3D controller under /sys/bus/pci/devices (CUDA numbers
   them by PCI bus id when CUDA_DEVICE_ORDER=PCI_BUS_ID, which pinning sets), its
   `numa_node` and `local_cpulist`; the InfiniBand HCAs under /sys/class/infiniband the same
   way (reported, so a report shows which HCA is near which rank).
2. the catalog's map (AMLHPC_SKU_JSON `numa`), when sysfs has no usable NUMA facts
   (numa_node -1, or no PCI tree) and the catalog's CPUs exist on this machine.
3. nothing: no GPUs found, or an unknown layout; pinning reports why and changes nothing.

Each local rank gets its GPU(s) in that order and the CPUs local to them (the whole
domain, shared by the domain's ranks, as the NDv4 performance article's srun masks do, so data-loader workers
can use every core near the GPU), intersected with the CPUs this process may use.
An existing CUDA_VISIBLE_DEVICES (set by a user or a scheduler) is respected: the order is
kept and the CPU affinity follows it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.node.skufacts import SkuFacts

NVIDIA_VENDOR = "0x10de"
AMD_VENDOR = "0x1002"
# PCI class codes: 0x0300 VGA controller, 0x0302 3D controller (data-centre GPUs), 0x1200
# processing accelerator (AMD Instinct MI300X: "Processing accelerators ... [Instinct MI300X]"
# in lspci). NVSwitch bridges (0x0680) share NVIDIA's vendor id and AMD's platform devices
# (0x1080 crypto) AMD's: neither is counted as a GPU.
GPU_CLASS_PREFIXES = ("0x0300", "0x0302", "0x0380", "0x1200")
GPU_VENDORS = {NVIDIA_VENDOR: "nvidia", AMD_VENDOR: "amd"}


def parse_cpulist(text: str) -> frozenset[int]:
    """Linux cpulist ("0-23,48-71", "5", "") to a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            cpus.update(range(int(low), int(high) + 1))
        else:
            cpus.add(int(part))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """A set of CPUs as a compact cpulist ("0-23,48-71")."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    start: int | None = None
    prev = 0
    for cpu in ordered:
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:
            prev = cpu
        else:
            ranges.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = cpu
    if start is not None:
        ranges.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(ranges)


@dataclass(frozen=True)
class GpuLocation:
    index: int
    """CUDA device number in PCI bus order (nvidia-smi's index)."""
    pci_address: str | None
    numa_node: int | None
    cpus: frozenset[int]


@dataclass(frozen=True)
class HcaLocation:
    name: str
    pci_address: str | None
    numa_node: int | None


@dataclass(frozen=True)
class Topology:
    source: str
    """"sysfs", "catalog" or "none"."""
    gpus: tuple[GpuLocation, ...]
    hcas: tuple[HcaLocation, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def numa_order(self) -> tuple[int, ...]:
        """GPU indices walked NUMA domain by domain (the NDv4 performance article's CUDA_VISIBLE_DEVICES)."""
        return tuple(g.index for g in sorted(self.gpus, key=lambda g: (g.numa_node if g.numa_node is not None else 1 << 30, g.index)))


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _numa_node(device: Path) -> int | None:
    text = _read(device / "numa_node")
    try:
        node = int(text) if text is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def _device_cpus(device: Path, numa_node: int | None, sysfs: Path) -> frozenset[int]:
    text = _read(device / "local_cpulist")
    if text:
        return parse_cpulist(text)
    if numa_node is not None:
        text = _read(sysfs / "devices" / "system" / "node" / f"node{numa_node}" / "cpulist")
        if text:
            return parse_cpulist(text)
    return frozenset()


def sysfs_gpus(sysfs: Path, vendor: str | None = None) -> list[GpuLocation] | None:
    """GPUs on the PCI bus (NVIDIA and AMD Instinct, or only `vendor`'s: "nvidia" / "amd") in
    PCI bus order, as CUDA_DEVICE_ORDER=PCI_BUS_ID and HIP number them; None when there is no
    PCI tree."""
    bus = sysfs / "bus" / "pci" / "devices"
    try:
        entries = sorted(os.listdir(bus))
    except OSError:
        return None
    gpus: list[GpuLocation] = []
    for address in entries:
        device = bus / address
        found = GPU_VENDORS.get(_read(device / "vendor") or "")
        if found is None or (vendor is not None and found != vendor):
            continue
        if not (_read(device / "class") or "").startswith(GPU_CLASS_PREFIXES):
            continue
        node = _numa_node(device)
        gpus.append(GpuLocation(len(gpus), address, node, _device_cpus(device, node, sysfs)))
    return gpus


def sysfs_hcas(sysfs: Path) -> list[HcaLocation]:
    """InfiniBand devices under /sys/class/infiniband with the PCI device behind each."""
    root = sysfs / "class" / "infiniband"
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    hcas: list[HcaLocation] = []
    for name in names:
        layers = {_read(port / "link_layer") for port in (root / name / "ports").glob("*")}
        if layers and "InfiniBand" not in layers:
            continue  # Azure's accelerated-networking NIC is an mlx5 RDMA device on Ethernet
        device = root / name / "device"
        address = os.path.basename(os.path.realpath(device)) if device.exists() else None
        hcas.append(HcaLocation(name, address, _numa_node(device)))
    return hcas


def _catalog_gpus(sku: SkuFacts) -> list[GpuLocation]:
    gpus: list[GpuLocation] = []
    for domain in sku.numa or ():
        cpus = parse_cpulist(domain.cpulist)
        gpus.extend(GpuLocation(g, None, domain.node, cpus) for g in domain.gpu_ids)
    return sorted(gpus, key=lambda g: g.index)


def discover(sysfs: Path = Path("/sys"), sku: SkuFacts | None = None,
             available_cpus: frozenset[int] | None = None) -> Topology:
    """This node's GPU and HCA placement: sysfs first, the catalog's map as fallback."""
    available = frozenset(os.sched_getaffinity(0)) if available_cpus is None else available_cpus
    hcas = tuple(sysfs_hcas(sysfs))
    gpus = sysfs_gpus(sysfs, sku.gpu_vendor if sku else None)
    notes: list[str] = []
    if gpus and all(g.numa_node is not None and g.cpus for g in gpus):
        if sku is not None and sku.gpus and len(gpus) != sku.gpus:
            notes.append(f"sysfs shows {len(gpus)} GPU(s) but {sku.name} has {sku.gpus}")
        return Topology("sysfs", tuple(gpus), hcas, tuple(notes))
    if gpus == []:
        return Topology("none", (), hcas, ("no GPU on the PCI bus: nothing to pin",))
    # sysfs is missing or has no NUMA facts for the GPUs: try the catalog's published map.
    why = "no PCI tree in sysfs" if gpus is None else "sysfs has no NUMA node for the GPUs"
    if sku is None or not sku.numa:
        return Topology("none", tuple(gpus or ()), hcas, (f"{why} and the catalog has no NUMA map for this size",))
    catalog = _catalog_gpus(sku)
    catalog_cpus = frozenset().union(*(g.cpus for g in catalog))
    if gpus is not None and len(gpus) != len(catalog):
        return Topology("none", tuple(gpus), hcas,
                        (f"{why}; the catalog map of {sku.name} lists {len(catalog)} GPUs but {len(gpus)} are present",))
    if not catalog_cpus <= available:
        return Topology("none", tuple(gpus or ()), hcas,
                        (f"{why}; the catalog map of {sku.name} names CPUs {format_cpulist(catalog_cpus - available)} "
                         "this machine does not have",))
    return Topology("catalog", tuple(catalog), hcas, (f"{why}: using the catalog's map of {sku.name}",))


@dataclass(frozen=True)
class RankPin:
    """What one local rank gets."""

    local_rank: int
    gpu_indices: tuple[int, ...]
    """Physical GPU indices (PCI order) this rank drives."""
    cpus: frozenset[int]
    """CPUs to run on (empty: leave the affinity alone)."""
    numa_nodes: tuple[int, ...]
    hcas: tuple[str, ...]
    """InfiniBand devices on the same NUMA node(s), for reports."""


@dataclass(frozen=True)
class PinPlan:
    source: str
    cuda_visible_devices: str | None
    """Value to export, or None to leave CUDA_VISIBLE_DEVICES as it is."""
    ranks: tuple[RankPin, ...]
    notes: tuple[str, ...] = field(default=())

    def for_rank(self, local_rank: int) -> RankPin | None:
        return next((r for r in self.ranks if r.local_rank == local_rank), None)

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "cudaVisibleDevices": self.cuda_visible_devices,
            "ranks": [{"localRank": r.local_rank, "gpus": list(r.gpu_indices), "cpus": format_cpulist(r.cpus),
                       "numaNodes": list(r.numa_nodes), "hcas": list(r.hcas)} for r in self.ranks],
            "notes": list(self.notes),
        }


def _existing_order(value: str, gpus: Mapping[int, GpuLocation]) -> tuple[int, ...] | None:
    try:
        order = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        return None  # GPU UUIDs or MIG ids: we cannot map them to sysfs devices
    return order if order and all(i in gpus for i in order) else None


def plan_pinning(topology: Topology, local_world_size: int, available_cpus: frozenset[int],
                 existing_cuda_visible: str | None = None) -> PinPlan:
    """GPU(s) and CPUs for every local rank of this node."""
    if not topology.gpus or topology.source == "none":
        return PinPlan(topology.source, None, (), topology.notes)
    by_index = {g.index: g for g in topology.gpus}
    notes = list(topology.notes)
    export: str | None
    if existing_cuda_visible:
        order = _existing_order(existing_cuda_visible, by_index)
        if order is None:
            return PinPlan(topology.source, None, (), (*notes,
                           f"CUDA_VISIBLE_DEVICES={existing_cuda_visible} is not a list of this node's GPU indices: left as is, no CPU pinning"))
        notes.append(f"CUDA_VISIBLE_DEVICES already set ({existing_cuda_visible}): order kept, CPUs follow it")
        export = None
    else:
        order = topology.numa_order
        export = ",".join(str(i) for i in order)
    if local_world_size > len(order) or len(order) % local_world_size:
        notes.append(f"{local_world_size} local ranks do not divide {len(order)} GPUs evenly: no per-rank pinning")
        return PinPlan(topology.source, export, (), tuple(notes))
    per_rank = len(order) // local_world_size
    ranks = []
    for rank in range(local_world_size):
        mine = order[rank * per_rank:(rank + 1) * per_rank]
        nodes = tuple(sorted({node for i in mine if (node := by_index[i].numa_node) is not None}))
        cpus = frozenset().union(*(by_index[i].cpus for i in mine)) & available_cpus
        if not cpus:
            notes.append(f"local rank {rank}: none of the CPUs near GPU(s) {mine} are available to this process; affinity left alone")
        hcas = tuple(h.name for h in topology.hcas if h.numa_node is not None and h.numa_node in nodes)
        ranks.append(RankPin(rank, tuple(mine), cpus, nodes, hcas))
    return PinPlan(topology.source, export, tuple(ranks), tuple(notes))


@dataclass(frozen=True)
class Applied:
    env: dict[str, str]
    """Variables to set for the training command."""
    cpus: frozenset[int]
    """The affinity set on this process (empty: unchanged)."""
    plan: PinPlan


def apply_pinning(plan: PinPlan, local_rank: int, environ: Mapping[str, str],
                  set_affinity: Callable[[int, set[int]], None] = os.sched_setaffinity) -> Applied:
    """Set this process's CPU affinity (inherited by the command it starts) and return the
    environment the command needs (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER)."""
    env: dict[str, str] = {}
    if plan.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = plan.cuda_visible_devices
    if plan.ranks and environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        # Our GPU numbers are PCI bus order (nvidia-smi's); CUDA's default, FASTEST_FIRST,
        # may number the same GPUs differently.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    mine = plan.for_rank(local_rank)
    cpus = mine.cpus if mine else frozenset()
    if cpus:
        set_affinity(0, set(cpus))
    return Applied(env, cpus, plan)


def main(argv: list[str] | None = None) -> int:
    """`python -m amlhpc.jobs.runtime.node.topology [--local-world-size N]`: print this node's plan as JSON."""
    import argparse
    import json

    from amlhpc.jobs.runtime.base.errors import RuntimeInputError
    from amlhpc.jobs.runtime.node.skufacts import load_sku_facts

    parser = argparse.ArgumentParser(prog="python -m amlhpc.jobs.runtime.node.topology", description=main.__doc__)
    parser.add_argument("--local-world-size", type=int, default=None,
                        help="ranks on this node (default: LOCAL_WORLD_SIZE, else one per GPU)")
    parser.add_argument("--sysfs", type=Path, default=Path("/sys"), help="sysfs root (default /sys)")
    args = parser.parse_args(argv)
    try:
        sku = load_sku_facts()
    except RuntimeInputError as exc:
        print(exc.render(), file=sys.stderr)
        return ExitCode.USAGE
    available = frozenset(os.sched_getaffinity(0))
    topology = discover(args.sysfs, sku, available)
    size = args.local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or max(len(topology.gpus), 1)
    plan = plan_pinning(topology, size, available, os.environ.get("CUDA_VISIBLE_DEVICES"))
    print(json.dumps({"gpus": [{"index": g.index, "pci": g.pci_address, "numaNode": g.numa_node,
                                "cpus": format_cpulist(g.cpus)} for g in topology.gpus],
                      "hcas": [{"name": h.name, "pci": h.pci_address, "numaNode": h.numa_node} for h in topology.hcas],
                      "plan": plan.to_json()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
