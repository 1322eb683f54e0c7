"""Did NCCL pick InfiniBand, or fall back to TCP sockets? From NCCL's own init log, and the
causes that make it fall back, found before anything runs.

NCCL with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS containing INIT or NET) logs its choice when
a communicator starts, one line per process, for example (NVIDIA's format):

    host:38:38 [0] NCCL INFO NET/IB : Using [0]mlx5_ib0:1/IB [1]mlx5_ib1:1/IB ; OOB eth0:10.0.0.4<0>
    host:38:38 [0] NCCL INFO Using network IB
or, when it falls back:
    host:38:38 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
    host:38:38 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.4<0>
    host:38:38 [0] NCCL INFO Using network Socket

On an InfiniBand size a job of several nodes then moves its gradients over the Ethernet NIC at
a fraction of the fabric's speed, without any error. `parse_init_log` reads the choice and the
evidence of why; `static_causes` finds the usual causes without starting NCCL (NCCL_IB_DISABLE
inherited from the image or the recipe, NCCL_NET=Socket, libibverbs missing from the image, no
InfiniBand port on the node); `preflight` turns them into the message the launcher stops the
job with (exit code ExitCode.NCCL_SOCKETS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from amlhpc.jobs.runtime.node.rdma import rdma_ports
from amlhpc.jobs.runtime.node.topology import sysfs_gpus

__all__ = ["NetChoice", "parse_init_log", "static_causes", "preflight", "verdict"]

_USING_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
_NET_IB = re.compile(r"NCCL INFO NET/IB ?: Using (.*)")
_NET_SOCKET = re.compile(r"NCCL INFO NET/Socket ?: Using (.*)")
_IB_DEVICE = re.compile(r"\[\d+\](\S+?)/(IB|RoCE)")
_SOCKET_DEVICE = re.compile(r"\[\d+\]([^:\s]+):")
_EVIDENCE = (
    (re.compile(r"Failed to open libibverbs"), "libibverbs could not be loaded: the image lacks the InfiniBand user space "
                                               "(rdma-core / DOCA-OFED libibverbs and the mlx5 provider)"),
    (re.compile(r"NCCL_IB_DISABLE set by environment to 1"), "NCCL_IB_DISABLE=1 is set in the job's environment"),
    (re.compile(r"NET/IB ?: No device found"), "NCCL found no usable InfiniBand device"),
    (re.compile(r"[Nn]et/IB: call to devices\(\) returned 0 devices"), "NCCL found no usable InfiniBand device"),
    (re.compile(r"NCCL_NET set by environment to Socket", re.IGNORECASE), "NCCL_NET=Socket is set in the job's environment"),
)


@dataclass(frozen=True)
class NetChoice:
    """What NCCL's init log says about the inter-node transport."""

    transport: str | None
    """"IB" (verbs, including RoCE), "Socket", another plugin's name, or None (no init lines)."""
    devices: tuple[str, ...] = ()
    """The ports or interfaces NCCL listed (mlx5_ib0:1, eth0)."""
    roce: tuple[str, ...] = ()
    """Ports NCCL uses over Ethernet (RoCE), e.g. an accelerated-networking NIC."""
    evidence: tuple[str, ...] = ()
    """Why it fell back, as far as the log says."""
    lines: tuple[str, ...] = field(default=(), repr=False)

    @property
    def rdma(self) -> bool:
        return self.transport is not None and self.transport.upper().startswith("IB")


def parse_init_log(text: str) -> NetChoice:
    """The transport and its evidence from NCCL INFO lines (any number of processes mixed)."""
    network = ib = socket = None
    evidence: list[str] = []
    kept: list[str] = []
    for line in text.splitlines():
        if "NCCL" not in line:
            continue
        if (match := _USING_NETWORK.search(line)) and network is None:
            network = match.group(1)
            kept.append(line.strip())
        elif (match := _NET_IB.search(line)) and ib is None:
            ib = match.group(1)
            kept.append(line.strip())
        elif (match := _NET_SOCKET.search(line)) and socket is None:
            socket = match.group(1)
            kept.append(line.strip())
        for pattern, meaning in _EVIDENCE:
            if pattern.search(line) and meaning not in evidence:
                evidence.append(meaning)
                kept.append(line.strip())
    if network is not None:
        transport = "IB" if network.upper().startswith("IB") else network
    elif ib is not None:
        transport = "IB"  # NCCL before 2.6 logged no "Using network" line
    elif socket is not None:
        transport = "Socket"
    else:
        transport = None
    devices: tuple[str, ...] = ()
    roce: tuple[str, ...] = ()
    if transport == "IB" and ib is not None:
        found = _IB_DEVICE.findall(ib.split(";")[0])
        devices = tuple(name for name, _ in found)
        roce = tuple(name for name, kind in found if kind == "RoCE")
    elif transport == "Socket" and socket is not None:
        devices = tuple(_SOCKET_DEVICE.findall(socket))
    return NetChoice(transport, devices, roce, tuple(evidence) if transport != "IB" else (), tuple(kept))


def _libibverbs_loadable() -> bool:
    for name in ("libibverbs.so.1", ctypes.util.find_library("ibverbs")):
        if not name:
            continue
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def static_causes(environ: Mapping[str, str], sysfs: Path = Path("/sys"),
                  libibverbs_loadable: Callable[[], bool] = _libibverbs_loadable) -> list[str]:
    """What would make NCCL use sockets on this node, found without starting NCCL."""
    causes = []
    if environ.get("NCCL_IB_DISABLE", "").strip() not in ("", "0"):
        causes.append(f"NCCL_IB_DISABLE={environ['NCCL_IB_DISABLE']} is set in the job's environment (inherited from the "
                      "image or set by the recipe): unset it")
    net = environ.get("NCCL_NET", "").strip()
    if net and not net.upper().startswith("IB"):
        causes.append(f"NCCL_NET={net} is set in the job's environment: unset it (NCCL then picks InfiniBand)")
    ports = rdma_ports(sysfs)
    infiniband = [p for p in ports if p.infiniband]
    if not infiniband:
        others = ", ".join(f"{p.name} ({p.link_layer})" for p in ports)
        causes.append("this node shows no InfiniBand port in /sys/class/infiniband"
                      + (f" (only {others})" if others else "") + ": the InfiniBand driver is not loaded on the host, "
                      "or the cluster's nodes are not on the InfiniBand fabric; replace the node or recreate the cluster")
    elif not any(p.state == "ACTIVE" for p in infiniband):
        causes.append("no InfiniBand port is ACTIVE (" + ", ".join(f"{p.name} {p.state or '?'}" for p in infiniband)
                      + "): the link is down or has no subnet manager configuration; replace the node")
    if not libibverbs_loadable():
        causes.append("libibverbs.so.1 cannot be loaded in this container: the image lacks the InfiniBand user space "
                      "(use the aml-hpc images, or install rdma-core / DOCA-OFED user space in yours)")
    return causes


def _fallback_message(sku_name: str, causes: Iterable[str]) -> str:
    listed = list(causes)
    why = "; ".join(listed) if listed else "NCCL's log gives no reason: run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET"
    return (f"NCCL would move data between nodes over TCP sockets on {sku_name}, an InfiniBand size "
            f"(many times slower, without an error): {why}")


def preflight(sku_name: str, infiniband: bool, node_count: int, environ: Mapping[str, str], sysfs: Path = Path("/sys"),
              libibverbs_loadable: Callable[[], bool] = _libibverbs_loadable) -> str | None:
    """The message to stop a multi-node job on an InfiniBand size with, or None when nothing forces a
    fallback. A machine with no NVIDIA GPU on its PCI bus is not the size's hardware (a CPU
    rehearsal): there is nothing to check."""
    if not infiniband or node_count < 2 or not sysfs_gpus(sysfs):
        return None
    causes = static_causes(environ, sysfs, libibverbs_loadable)
    return _fallback_message(sku_name, causes) if causes else None


def verdict(choice: NetChoice, sku_name: str, infiniband: bool, node_count: int, environ: Mapping[str, str],
            sysfs: Path = Path("/sys"), libibverbs_loadable: Callable[[], bool] = _libibverbs_loadable) -> tuple[str, str]:
    """("pass" | "warn" | "fail" | "skip" | "info", detail) for what NCCL chose on this size."""
    if choice.transport is None:
        return "skip", "NCCL logged no transport choice (no NCCL communicator, or NCCL_DEBUG below INFO)"
    listed = ", ".join(choice.devices) or "?"
    if not infiniband:
        return "info", f"NCCL network {choice.transport} ({listed}); {sku_name} has no InfiniBand"
    if choice.rdma:
        note = f"NCCL uses InfiniBand ({listed})"
        if choice.roce:
            return "warn", note + f"; it also took Ethernet RDMA port(s) {', '.join(choice.roce)}: set NCCL_IB_HCA to the InfiniBand ports"
        return "pass", note
    causes = list(choice.evidence) or static_causes(environ, sysfs, libibverbs_loadable)
    message = _fallback_message(sku_name, causes).replace("would move", "moves") + f" [network {choice.transport}: {listed}]"
    return ("fail" if node_count > 1 else "warn"), message
