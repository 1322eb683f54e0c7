"""InfiniBand ports present, ACTIVE and at the size's rate, from sysfs.

The ports come from amlhpc.jobs.runtime.node.rdma (/sys/class/infiniband). Only InfiniBand ports count:
Azure's accelerated-networking NIC is an mlx5 device too, with an Ethernet link layer.

Expected per node: `ib_hcas` ports at `ib_gbits_per_s_per_hca` (the catalog). A port in
INIT has a link but no subnet-manager configuration (traffic cannot flow); a port below
the rate trained down (bad cable or transceiver); fewer ports than HCAs means a device
is missing. Each of those fails, because NCCL would silently route around it or fall
back to TCP and the job would crawl instead of failing.
"""

from __future__ import annotations

from pathlib import Path

from amlhpc.jobs.runtime.health.grading import FAIL, PASS, SKIP
from amlhpc.jobs.runtime.health.results import CheckResult
from amlhpc.jobs.runtime.node.rdma import infiniband_ports
from amlhpc.jobs.runtime.node.skufacts import SkuFacts


def ib_ports(sysfs: Path) -> list[dict]:
    """Every InfiniBand port (amlhpc.jobs.runtime.node.rdma reads them): {hca, port, state, phys_state,
    rate_gbits, rate_text}."""
    return [{"hca": p.device, "port": p.port, "state": p.state, "phys_state": p.phys_state,
             "rate_gbits": p.rate_gbits, "rate_text": p.rate_text} for p in infiniband_ports(sysfs)]


def check_infiniband(sysfs: Path, sku: SkuFacts | None) -> list[CheckResult]:
    """One result per port plus one for the port count."""
    if sku is None:
        ports = ib_ports(sysfs)
        return [CheckResult("infiniband", "node", SKIP, len(ports), "ports",
                            detail="no SKU facts (AMLHPC_SKU_JSON) to compare the ports with")]
    if not sku.infiniband:
        return [CheckResult("infiniband", "node", SKIP, detail=f"{sku.name} has no InfiniBand")]
    ports = ib_ports(sysfs)
    results = []
    for port in ports:
        subject = f"{port['hca']}/{port['port']}"
        problems = []
        if port["state"] != "ACTIVE":
            hint = " (link up but not configured by the subnet manager)" if port["state"] == "INIT" else ""
            problems.append(f"state {port['state'] or 'unknown'}{hint}")
        if port["phys_state"] and port["phys_state"] != "LinkUp":
            problems.append(f"physical state {port['phys_state']}")
        rate = port["rate_gbits"]
        if rate is None:
            problems.append(f"unreadable rate {port['rate_text']!r}")
        elif rate < sku.ib_gbits_per_s_per_hca:
            problems.append(f"rate {rate:g} Gb/s below {sku.ib_generation or ''} {sku.ib_gbits_per_s_per_hca} Gb/s".replace("  ", " "))
        results.append(CheckResult("infiniband", subject, FAIL if problems else PASS, rate, "Gb/s",
                                   float(sku.ib_gbits_per_s_per_hca), "; ".join(problems) or port["state"]))
    active = sum(1 for r in results if r.status == PASS)
    count_status = PASS if len(ports) >= sku.ib_hcas else FAIL
    detail = f"{len(ports)} InfiniBand port(s), {active} healthy, {sku.name} has {sku.ib_hcas}"
    if not ports:
        detail += ": no /sys/class/infiniband ports (driver not loaded, or the image lacks the IB user space?)"
    results.insert(0, CheckResult("infiniband", "node", count_status, float(len(ports)), "ports",
                                  float(sku.ib_hcas), detail))
    return results
