"""Which job-wide all-reduce baseline a job is graded against: what its all-reduce crosses, and
whether it runs with SHARP.

A size can publish several baselines (`SkuFacts.health.multinode`): ND GB300 v6 has one inside an
NVL72 rack over multi-node NVLink (~937 GB/s) and one across racks over InfiniBand (~200 GB/s),
Azure/ai-infrastructure-on-azure skills/slurm/sku_performance_baseline/SKILL.md; ND H100 v5's
~450 GB/s is measured "SHARP / CollNet enabled" (the same file), which aml-hpc turns on only with a
recipe's `sharp: true` (NCCL_COLLNET_ENABLE=1, amlhpc/core/catalog/nccl.toml). Grading a two-rack
GB300 job against the one-rack band, or a job without SHARP against a SHARP figure, fails
healthy nodes; these pure functions pick the band that matches the job, or none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from amlhpc.jobs.runtime.node.skufacts import ANY_SCOPE, MultinodeBand, SkuFacts

SHARP_VARIABLE = "NCCL_COLLNET_ENABLE"
"""The variable that turns NCCL's CollNet (SHARP) on for a job."""
NVLINK_DOMAIN, INFINIBAND = "nvlink-domain", "infiniband"


@dataclass(frozen=True)
class Topology:
    scope: str
    """NVLINK_DOMAIN (every node in one multi-node NVLink domain) or INFINIBAND."""
    reason: str


def job_topology(sku: SkuFacts | None, node_domains: Sequence[str | None], node_count: int) -> Topology:
    """What the job's all-reduce crosses, from each node's NVLink domain (its fabric ClusterUUID,
    None where unknown). Unknown counts as InfiniBand: the lower band, so an unread domain never
    fails a healthy job against the one-rack figure."""
    if sku is None or not sku.nvlink_domain_vms:
        name = sku.name if sku else "this size"
        return Topology(INFINIBAND, f"{name} has no multi-node NVLink domain: the all-reduce crosses InfiniBand")
    known = [d for d in node_domains if d]
    if node_count > sku.nvlink_domain_vms:
        return Topology(INFINIBAND, f"{node_count} nodes are more than one NVLink domain holds ({sku.nvlink_domain_vms} VMs): "
                                    "the all-reduce crosses InfiniBand between racks")
    if len(set(known)) > 1:
        return Topology(INFINIBAND, f"the nodes sit in {len(set(known))} NVLink domains: the all-reduce crosses InfiniBand "
                                    "between them")
    if len(known) < node_count:
        return Topology(INFINIBAND, f"the NVLink domain of {node_count - len(known)} of {node_count} node(s) is unknown: "
                                    "graded as across InfiniBand")
    return Topology(NVLINK_DOMAIN, f"all {node_count} nodes in NVLink domain {known[0]}")


def sharp_on(environ: Mapping[str, str]) -> bool:
    """The job runs with SHARP (CollNet) on."""
    return environ.get(SHARP_VARIABLE, "").strip() == "1"


def choose_band(bands: Sequence[MultinodeBand], topology: Topology, sharp: bool) -> tuple[MultinodeBand | None, str]:
    """(the band to grade against, or None, and why). A band measured with SHARP applies only
    when the job runs with it; one measured without is a floor either way (SHARP only adds
    in-network reduction), and with SHARP on the SHARP band is preferred."""
    fitting = [b for b in bands if b.scope in (topology.scope, ANY_SCOPE)]
    usable = [b for b in fitting if sharp or not b.sharp]
    if usable:
        band = max(usable, key=lambda b: (b.sharp, b.busbw_gbytes_per_s[2]))
        how = "with SHARP" if band.sharp else "without SHARP"
        where = "" if band.scope == ANY_SCOPE else f" ({band.scope} baseline, measured {how})"
        return band, f"{topology.reason}{where}"
    if fitting:
        expected = fitting[0].busbw_gbytes_per_s[0]
        return None, (f"{topology.reason}; the published baseline (~{expected:g} GB/s) was measured with SHARP "
                      f"({SHARP_VARIABLE}=1), which this job does not turn on: reported, not graded")
    if bands:
        return None, f"{topology.reason}; no published baseline for an all-reduce that crosses {topology.scope}"
    return None, f"{topology.reason}; no published multi-node pass mark"
