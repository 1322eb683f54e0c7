"""Goodput of a training run as this project builds it: how much of the wall time is useful work,
given how often the run is interrupted and by what, what a checkpoint holds the training, how
long each kind of recovery takes - and the checkpoint interval of each tier that loses least.

The system modelled (docs/managed-jobs.md, "Goodput"):

- two checkpoint tiers. The node tier: the training saves a version into the node's NVMe every
  `node_interval_s`; the save holds the training only for the copy of its state into host
  memory (the stall), the write goes on in the background, and a save waits for the one before
  it (so the interval is at least the write's time). Blob: the launcher uploads the newest
  local version every `blob_interval_s`, in the background, from the node tier's files (no
  stall); an upload takes the state's size at the job's upload rate, so Blob holds a version
  at most one upload's time plus one interval old;
- three failure classes, from the causes of Meta's Llama 3 report (CAUSES):
  - a process fault (a software bug, an NCCL timeout, a dependency): the hosts are fine; the
    launchers restart the training inside the job from the node tier (an in-job restart);
  - a device fault (a GPU, its memory, its system processor): the process dies and its host
    stays up; as built, the launchers first restart in-job on the same node `local_restarts`
    times (each restart fails again on the bad GPU), then the job ends and the managed run's
    controller submits a new one that restores from Blob;
  - a host loss (the host, its network, its power): the host goes silent; the other nodes
    stop the job when its heartbeat has been silent for the watchdog's `hang_s`, and the
    controller submits a new job that restores from Blob;
  and, on low-priority clusters, preemption (a host-class end after a warning).
- the recovery of each class: detection + (an in-job restart and the node tier's load) or
  (the controller's next look, its backoff, a new job's start and the Blob restore);
- the work lost per failure: half a node-tier interval for every class; for a device fault or
  a host loss whose node held a part the newest version needs (every node does with per-node
  or per-rank writers; one node in `nodes` with rank 0 writing everything), also what Blob
  lags behind the node tier (half a Blob interval plus one upload); the others' parts reach
  Blob on the way out, so then only the upload's time is added.

Expected goodput, by renewal (failures end periods of training, each followed by a recovery;
a failure during a recovery starts it over):

    G = (1 - stall/I_n - blob_stall/I_b - sum_c rate_c x lost_c(I_n, I_b)) / (1 + sum_c rate_c x R'_c)

with lost_c the training a failure undoes and R'_c its recovery's expected wall time
((e^(rate x R_c) - 1) / rate). The intervals enter only the numerator, whose first-order
optimum is Young's and Daly's.

The interval of least loss per tier is Young's sqrt(2 x delta x M) (J. W. Young, "A first
order approximation to the optimum checkpoint interval", CACM 17(9), 1974), refined by Daly
(J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
FGCS 22(3), 2006), with, per tier, delta its stall and M the mean time between the failures
whose loss depends on it: every failure for the node tier; for Blob, the device faults and
host losses that need Blob's periodic version. An upload stalls no training, so Young's Blob
interval is 0: the advice is then as often as uploads complete (one upload's time; an upload
that finds no newer version than the last costs nothing, so a Blob interval shorter than the
node tier's does no harm: Blob then lags the node tier by half an interval and an upload).

Pure: no I/O, no SDK. The figures measured on this system are in FIGURES with their sources;
the job-specific inputs come from amlhpc/jobs/plan/goodput.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

LLAMA3_SOURCE = ("Meta, \"The Llama 3 Herd of Models\" (arXiv 2407.21783, 2024-07), section 3.3.4 and Table 5: "
                 "419 unexpected interruptions in 54 days of pre-training on 16,384 H100 GPUs")
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54

MAX_EXPONENT = 700.0
"""Past e^700 a float overflows (e^709.8 is the largest): a recovery that long against the failure
rate is taken as never ending, not as an OverflowError."""

MIN_BLOB_INTERVAL_S = 10.0
"""The smallest checkpoint.interval_s a recipe takes: the shortest Blob interval advised."""

PROCESS, DEVICE, HOST = "process", "device", "host"
CLASSES = (PROCESS, DEVICE, HOST)


@dataclass(frozen=True)
class Cause:
    name: str
    count: int
    """Interruptions of this root cause in Table 5 (its printed share is count / 419, except Faulty
    GPU's, printed 30.1 % for 148 of 419)."""
    kind: str
    why: str


CAUSES: tuple[Cause, ...] = (
    Cause("Faulty GPU", 148, DEVICE, "the GPU fails; the host stays up"),
    Cause("GPU HBM3 memory", 72, DEVICE, "the GPU's memory fails"),
    Cause("Software bug", 54, PROCESS, "the training or its stack fails; the hosts are fine"),
    Cause("Network switch/cable", 35, HOST, "the node drops off the fabric"),
    Cause("Host maintenance", 32, HOST, "unplanned maintenance takes the host away"),
    Cause("GPU SRAM memory", 19, DEVICE, "the GPU's on-chip memory fails"),
    Cause("GPU system processor", 17, DEVICE, "the GPU's system processor fails"),
    Cause("NIC", 7, HOST, "the node's network card fails"),
    Cause("NCCL watchdog timeouts", 7, PROCESS, "a collective times out; restarted in-job"),
    Cause("Silent data corruption", 6, DEVICE, "a GPU computes wrong results"),
    Cause("GPU thermal interface + sensor", 6, DEVICE, "the GPU overheats or misreports"),
    Cause("SSD", 3, HOST, "the node's disk fails (its node tier with it)"),
    Cause("Power supply", 3, HOST, "the host loses power"),
    Cause("Server chassis", 2, HOST, "the host fails"),
    Cause("IO expansion board", 2, HOST, "the host's I/O fails"),
    Cause("Dependency", 2, PROCESS, "a service the training depends on fails"),
    Cause("CPU", 2, HOST, "the host's CPU fails"),
    Cause("System memory", 2, HOST, "the host's memory fails"),
)
LLAMA3_INTERRUPTIONS = sum(c.count for c in CAUSES)
"""419: Table 5's causes add up to the report's count of unexpected interruptions."""
FAILURES_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_GPUS * LLAMA3_DAYS * 24)
"""1.97e-5: assumed the same per GPU at every size (Azure publishes no failure rate)."""
SHARES: dict[str, float] = {k: sum(c.count for c in CAUSES if c.kind == k) / LLAMA3_INTERRUPTIONS for k in CLASSES}
"""process 63/419 (15 %), device 268/419 (64 %), host 88/419 (21 %)."""


@dataclass(frozen=True)
class Figures:
    """What this system's recovery steps take, measured (or, where nothing here can measure them,
    assumed), each with its source in FIGURE_SOURCES. Replace them with your own measurements."""

    stall_gbps_per_gpu: float = 14.8 / 12.5
    write_gbps_per_gpu: float = 0.5
    verify_gbps_per_node: float = 1.56
    verified_versions: int = 2
    in_job_restart_s: float = 12.1
    new_job_s: float = 600.0
    blob_stall_s: float = 0.0
    preemption_grace_s: float = 30.0


FIGURES = Figures()
FIGURE_SOURCES: dict[str, str] = {
    "stall_gbps_per_gpu": "the state per GPU over the time its save held the training: 14.8 GB (llama3.2-1b) held "
                          "12.5 s on one H200 (bench/RESULTS.md, \"What a checkpoint holds the training\", 2026-11-26)",
    "write_gbps_per_gpu": "the background write behind it, DCP's FileSystemWriter with fsync in one thread, ~0.5 GB/s on "
                          "the same machine (a save waits for the one before it)",
    "verify_gbps_per_node": "SHA-256 in one thread (hashlib), 1.56 GB/s on the GPU machine's CPU: before agreeing on an "
                            "in-job restart each node checks every file of its kept versions (launch/restart.py)",
    "verified_versions": "the versions each node keeps and checks (checkpoint.local_keep, 2 by default)",
    "in_job_restart_s": "fault to the first step after an in-job restart, the warm standby on and the fault as it comes "
                        "(median of 5, bench/RESULTS.md \"Recovery benchmark\", restart part): 2 simulated nodes, a "
                        "tiny state; the node tier's verification of a real state is added at verify_gbps_per_node",
    "new_job_s": "assumed: Azure ML's queue, node allocation, image pull, staging and the process group of a new job "
                 "(the rehearsal measures only the part after the node exists: bench/RESULTS.md)",
    "blob_stall_s": "an upload reads the node tier's files in the background: no training stall measured or modelled",
    "preemption_grace_s": "Azure's notice before a low-priority node is taken (Scheduled Events' Preempt, 30 s)",
}


@dataclass(frozen=True)
class Inputs:
    nodes: int
    gpus_per_node: int
    state_gb: float
    """The whole training state (every rank's part), GB."""
    upload_gbps: float
    """The job's checkpoint upload rate, Gb/s (writers x per-writer cap, at most the account's ingress)."""
    restore_gbps: float
    """The job's Blob download rate, Gb/s (the account's egress)."""
    blob_interval_s: float
    """The recipe's checkpoint.interval_s: how often the launcher uploads."""
    writers: str = "rank0"
    hang_s: float = 1800.0
    """The watchdog's limit: a silent host is found after this long."""
    poll_s: float = 30.0
    """The managed controller's look."""
    backoff_s: float = 60.0
    """The controller's first wait before a new attempt."""
    local_restarts: int = 3
    managed: bool = True
    """False: a plain job; nothing submits a new job after a device fault or host loss."""
    preemptions_per_node_hour: float = 0.0
    failures_per_gpu_hour: float = FAILURES_PER_GPU_HOUR
    figures: Figures = field(default_factory=Figures)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class ClassPlan:
    """One failure class: how often, what it costs."""

    kind: str
    per_hour: float
    detect_s: float
    recovery_s: float
    """Detection + restart + restore: the wall time from the failure to training again."""
    needs_blob: float
    """Share of these failures that lose the node tier's newest version (Blob's periodic version restores)."""

    @property
    def mtbf_h(self) -> float:
        return 1 / self.per_hour if self.per_hour > 0 else math.inf


@dataclass(frozen=True)
class Plan:
    inputs: Inputs
    classes: tuple[ClassPlan, ...]
    stall_s: float
    """The node tier's stall per checkpoint."""
    write_s: float
    """Its background write: the shortest node-tier interval."""
    upload_s: float
    """One Blob upload: the shortest Blob interval."""
    node_young_s: float
    node_daly_s: float
    node_interval_s: float
    """Advised: Daly's, at least the write's time."""
    blob_young_s: float
    blob_interval_s: float
    """Advised: Daly's, at least one upload (uploads never overlap) and MIN_BLOB_INTERVAL_S."""
    goodput: float
    """At the advised intervals."""
    goodput_recipe: float
    """At the advised node-tier interval and the recipe's Blob interval."""

    @property
    def per_hour(self) -> float:
        return sum(c.per_hour for c in self.classes)

    @property
    def mtbi_h(self) -> float:
        return 1 / self.per_hour if self.per_hour > 0 else math.inf

    def of(self, kind: str) -> ClassPlan:
        return next(c for c in self.classes if c.kind == kind)

    def to_json(self) -> dict:
        """The plan as JSON carries it: camelCase keys, every figure finite or null (null: never,
        or unbounded - no failure expected, no rate limit known)."""
        data = {camel(k): finite(v) for k, v in asdict(self).items() if k not in ("inputs", "classes")}
        data["mtbiHours"] = finite(self.mtbi_h)
        data["classes"] = [{**{camel(k): finite(v) for k, v in asdict(c).items()}, "mtbfHours": finite(c.mtbf_h)}
                           for c in self.classes]
        data["inputs"] = {camel(k): finite(v) for k, v in asdict(self.inputs).items() if k != "figures"}
        data["figures"] = {camel(k): finite(v) for k, v in asdict(self.inputs.figures).items()}
        return data


def camel(name: str) -> str:
    """node_interval_s -> nodeIntervalS: the JSON keys of the project's documents."""
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest)


def finite(value):
    """A float to 6 significant digits (a rate of 1.97e-5 per GPU-hour keeps its digits), None where infinite."""
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else None
    return value


def young(delta_s: float, mtbi_s: float) -> float:
    return math.sqrt(2 * delta_s * mtbi_s) if math.isfinite(mtbi_s) else math.inf


def daly(delta_s: float, mtbi_s: float) -> float:
    """Daly's higher-order optimum (for delta < 2M; else the mean time between interruptions)."""
    if not math.isfinite(mtbi_s):
        return math.inf
    if delta_s >= 2 * mtbi_s:
        return mtbi_s
    x = math.sqrt(delta_s / (2 * mtbi_s))
    return math.sqrt(2 * delta_s * mtbi_s) * (1 + x / 3 + x * x / 9) - delta_s


def rates(i: Inputs) -> dict[str, float]:
    """Failures per hour of the job by class (preemption counted with host losses)."""
    per_hour = i.failures_per_gpu_hour * i.gpus
    out = {k: per_hour * SHARES[k] for k in CLASSES}
    out["preemption"] = i.preemptions_per_node_hour * i.nodes
    return out


def classes(i: Inputs) -> tuple[ClassPlan, ...]:
    f = i.figures
    node_gb = i.state_gb / max(i.nodes, 1)
    local_restore = f.verified_versions * node_gb / f.verify_gbps_per_node if f.verify_gbps_per_node > 0 else 0.0
    in_job = f.in_job_restart_s + local_restore
    blob_restore = (i.state_gb * 8 / i.restore_gbps if i.restore_gbps > 0 else 0.0) + (
        node_gb / f.verify_gbps_per_node if f.verify_gbps_per_node > 0 else 0.0)
    upload = i.state_gb * 8 / i.upload_gbps if i.upload_gbps > 0 else 0.0
    new_job = i.poll_s / 2 + i.backoff_s + f.new_job_s + blob_restore
    holds_part = 1.0 if i.writers in ("per_node", "per_rank") else 1.0 / max(i.nodes, 1)
    r = rates(i)
    device_detect = i.local_restarts * in_job  # as built: restarted in-job on the bad GPU until the restarts run out
    preempt_part = holds_part if upload > f.preemption_grace_s else 0.0  # a part uploads on the way out if it can
    return (
        ClassPlan(PROCESS, r[PROCESS], 0.0, in_job, 0.0),
        ClassPlan(DEVICE, r[DEVICE], device_detect, device_detect + new_job, holds_part),
        ClassPlan(HOST, r[HOST], i.hang_s, i.hang_s + new_job, holds_part),
        ClassPlan("preemption", r["preemption"], f.preemption_grace_s, f.preemption_grace_s + new_job, preempt_part),
    )


def lost_work_s(c: ClassPlan, node_interval_s: float, blob_interval_s: float, upload_s: float) -> float:
    """Expected training one failure of class `c` undoes: half a node-tier interval, and when
    the version must come from Blob's periodic upload, what Blob lags behind (an upload and half
    a Blob interval)."""
    if c.kind == PROCESS or c.needs_blob == 0:  # (and no infinite Blob interval times 0)
        return node_interval_s / 2
    return node_interval_s / 2 + c.needs_blob * (upload_s + blob_interval_s / 2)


def recovery_wall_s(c: ClassPlan, upload_s: float, per_second: float) -> float:
    """Expected wall time from a failure of class `c` to training again: its recovery (plus, when
    the nodes that remain upload the newest version on the way out, that upload), started over
    by any failure during it (at `per_second`, every class together): (e^(rate R) - 1) / rate."""
    recovery = c.recovery_s + (0.0 if c.kind == PROCESS else (1 - c.needs_blob) * upload_s)
    if per_second <= 0:
        return recovery
    exponent = per_second * recovery
    if exponent > MAX_EXPONENT:  # a failure all but surely comes before the recovery ends: it never does
        return math.inf
    return math.expm1(exponent) / per_second


def lost_s(c: ClassPlan, node_interval_s: float, blob_interval_s: float, upload_s: float, per_second: float = 0.0) -> float:
    """Expected wall time one failure of class `c` costs: its recovery and the work it undoes."""
    return recovery_wall_s(c, upload_s, per_second) + lost_work_s(c, node_interval_s, blob_interval_s, upload_s)


def goodput(i: Inputs, cls: tuple[ClassPlan, ...], stall_s: float, node_interval_s: float, blob_interval_s: float,
            upload_s: float) -> float:
    """Useful share of the wall time (never below 0), by renewal: failures end periods of
    training (mean 1/rate) in which the stalls and the undone work are lost, each followed by a
    recovery:

        G = (1 - stall/I_n - blob_stall/I_b - sum rate_c x lost_work_c) / (1 + sum rate_c x recovery_wall_c)
    """
    if node_interval_s <= 0 or blob_interval_s <= 0:
        return 0.0
    failing = [c for c in cls if c.per_hour > 0]  # a class that never fails costs nothing (and no 0 x inf)
    per_second = sum(c.per_hour for c in failing) / 3600
    training = 1 - stall_s / node_interval_s - i.figures.blob_stall_s / blob_interval_s
    training -= sum(c.per_hour / 3600 * lost_work_s(c, node_interval_s, blob_interval_s, upload_s) for c in failing)
    waiting = sum(c.per_hour / 3600 * recovery_wall_s(c, upload_s, per_second) for c in failing)
    if not training > 0 or math.isinf(waiting):  # the failures undo all the work, or a recovery never ends
        return 0.0
    return training / (1 + waiting)


def make(i: Inputs) -> Plan:
    f = i.figures
    per_gpu_gb = i.state_gb / max(i.gpus, 1)
    stall = per_gpu_gb / f.stall_gbps_per_gpu if f.stall_gbps_per_gpu > 0 else 0.0
    write = per_gpu_gb / f.write_gbps_per_gpu if f.write_gbps_per_gpu > 0 else 0.0
    upload = i.state_gb * 8 / i.upload_gbps if i.upload_gbps > 0 else 0.0
    cls = classes(i)
    every = sum(c.per_hour for c in cls)
    node_m = 3600 / every if every > 0 else math.inf
    node_young, node_daly = young(stall, node_m), daly(stall, node_m)
    node = max(node_daly, write) if math.isfinite(node_daly) else math.inf
    blob_rate = sum(c.per_hour * c.needs_blob for c in cls)
    blob_m = 3600 / blob_rate if blob_rate > 0 else math.inf
    blob_young = young(f.blob_stall_s, blob_m)
    blob = max(daly(f.blob_stall_s, blob_m), upload, MIN_BLOB_INTERVAL_S)
    best = goodput(i, cls, stall, node, blob, upload)  # infinite intervals (nothing fails) lose nothing
    at_recipe = goodput(i, cls, stall, node, max(i.blob_interval_s, upload), upload)
    return Plan(i, cls, stall, write, upload, node_young, node_daly, node, blob_young, blob, best, at_recipe)


def at_scale(nodes: int, gpus_per_node: int, failures_per_gpu_hour: float = FAILURES_PER_GPU_HOUR) -> dict[str, float]:
    """Hours between failures of each class for a job of `nodes` x `gpus_per_node` GPUs (the plan of a cluster)."""
    i = Inputs(nodes=nodes, gpus_per_node=gpus_per_node, state_gb=0.0, upload_gbps=0.0, restore_gbps=0.0,
               blob_interval_s=1.0, failures_per_gpu_hour=failures_per_gpu_hour)
    return {k: (1 / v if v > 0 else math.inf) for k, v in rates(i).items() if k != "preemption"}

