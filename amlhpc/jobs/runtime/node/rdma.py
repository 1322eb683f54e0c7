"""The node's RDMA ports, from sysfs: one record per port of every device under
/sys/class/infiniband, InfiniBand or not.

Each port folder holds one-line files: `link_layer` ("InfiniBand" or "Ethernet"), `state`
("4: ACTIVE"), `phys_state` ("5: LinkUp"), `rate` ("400 Gb/sec (4X NDR)") and, where the
driver keeps them, `counters/link_downed`. Azure's nodes carry InfiniBand HCAs (mlx5_ib0...)
and, on newer hosts, the accelerated-networking NIC as an RDMA device with an Ethernet link
layer (mlx5_an0): health checks, NCCL and UCX must tell the two apart.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

INFINIBAND = "InfiniBand"
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: str
    link_layer: str
    """"InfiniBand", "Ethernet", or "" when the driver does not say (old kernels: InfiniBand)."""
    state: str
    """"ACTIVE", "INIT", "DOWN", ... (the name after "4: ")."""
    phys_state: str
    rate_gbits: float | None
    rate_text: str
    link_downed: int | None = None
    """How often the link went down since the counters were reset (sysfs counters/link_downed)."""

    @property
    def infiniband(self) -> bool:
        return self.link_layer in (INFINIBAND, "")

    @property
    def name(self) -> str:
        """"mlx5_ib0:1", as NCCL_IB_HCA and UCX_NET_DEVICES spell a port."""
        return f"{self.device}:{self.port}"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def state_name(text: str) -> str:
    """'4: ACTIVE' -> 'ACTIVE'; 'LinkUp' stays."""
    return text.split(":", 1)[1].strip() if ":" in text else text


def rdma_ports(sysfs: Path = Path("/sys")) -> list[RdmaPort]:
    """Every port of every RDMA device, sorted by device and port number."""
    root = sysfs / "class" / "infiniband"
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return []
    ports = []
    for device in devices:
        try:
            numbers = sorted(os.listdir(root / device / "ports"), key=lambda p: int(p) if p.isdigit() else 0)
        except OSError:
            continue
        for number in numbers:
            folder = root / device / "ports" / number
            rate_text = _read(folder / "rate")
            match = _RATE.match(rate_text)
            downed = _read(folder / "counters" / "link_downed")
            ports.append(RdmaPort(device, number, _read(folder / "link_layer"), state_name(_read(folder / "state")),
                                  state_name(_read(folder / "phys_state")), float(match.group(1)) if match else None,
                                  rate_text, int(downed) if downed.isdigit() else None))
    return ports


def infiniband_ports(sysfs: Path = Path("/sys"), *, active_only: bool = False) -> list[RdmaPort]:
    """The InfiniBand ports (never an Ethernet RDMA device such as mlx5_an0)."""
    return [p for p in rdma_ports(sysfs) if p.infiniband and (p.state == "ACTIVE" or not active_only)]
