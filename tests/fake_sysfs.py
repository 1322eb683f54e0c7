"""Fake sysfs trees for the runtime tests: PCI devices, NUMA nodes and InfiniBand ports laid
out like the NDv4 performance article's Standard_ND96asr_v4 (or broken in the ways real nodes break)."""

from __future__ import annotations

from pathlib import Path

# The NDv4 performance article (check_app_pinning.py on ND96asr_v4): NUMA node -> (cores, GPU ids).
NDV4_ARTICLE_LAYOUT = {0: ("0-23", (2, 3)), 1: ("24-47", (0, 1)), 2: ("48-71", (6, 7)), 3: ("72-95", (4, 5))}


def pci_device(root: Path, address: str, vendor: str, pci_class: str, numa: int, cpulist: str | None) -> Path:
    device = root / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(pci_class + "\n")
    (device / "numa_node").write_text(f"{numa}\n")
    if cpulist is not None:
        (device / "local_cpulist").write_text(cpulist + "\n")
    return device


def ib_port(root: Path, hca: str, port: int = 1, *, state: str = "4: ACTIVE", phys_state: str = "5: LinkUp",
            rate: str = "200 Gb/sec (4X HDR)", link_layer: str = "InfiniBand") -> Path:
    folder = root / "class" / "infiniband" / hca / "ports" / str(port)
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in (("state", state), ("phys_state", phys_state), ("rate", rate), ("link_layer", link_layer)):
        (folder / name).write_text(value + "\n")
    return folder


def build_nd96asr_sysfs(root: Path, *, numa_known: bool = True, gpus: int = 8, hcas: int = 8) -> Path:
    """GPUs 0-7 at PCI domains 0001-0008 (CUDA's PCI order), one HDR HCA next to each GPU
    with an ACTIVE port, plus devices that must not count: an NVSwitch bridge, and the
    accelerated-networking NIC (an mlx5 device with an Ethernet port)."""
    gpu_node = {g: node for node, (_, ids) in NDV4_ARTICLE_LAYOUT.items() for g in ids}
    for gpu in range(gpus):
        node = gpu_node[gpu]
        cpulist = NDV4_ARTICLE_LAYOUT[node][0] if numa_known else None
        pci_device(root, f"{gpu + 1:04x}:00:00.0", "0x10de", "0x030200", node if numa_known else -1, cpulist)
    for hca in range(hcas):
        node = gpu_node[hca]
        cpulist = NDV4_ARTICLE_LAYOUT[node][0] if numa_known else None
        device = pci_device(root, f"{0x101 + hca:04x}:00:00.0", "0x15b3", "0x020700", node if numa_known else -1, cpulist)
        ib_port(root, f"mlx5_ib{hca}")
        (root / "class" / "infiniband" / f"mlx5_ib{hca}" / "device").symlink_to(device)
    pci_device(root, "0009:00:00.0", "0x10de", "0x068000", 0, "0-23")  # NVSwitch: not a GPU
    nic = pci_device(root, "c05b:00:02.0", "0x15b3", "0x020000", -1, None)
    ib_port(root, "mlx5_an0", link_layer="Ethernet", rate="40 Gb/sec (4X QDR)")
    (root / "class" / "infiniband" / "mlx5_an0" / "device").symlink_to(nic)
    for node, (cpulist, _) in NDV4_ARTICLE_LAYOUT.items():
        folder = root / "devices" / "system" / "node" / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpulist + "\n")
    return root
