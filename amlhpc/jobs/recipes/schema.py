"""The recipe schema: what a YAML file under amlhpc/jobs/recipes/ may say, validated with pydantic.

A recipe describes a training run independently of any stack: the command, how it is
distributed, which image, its inputs and outputs, and the platform switches (health gate,
pinning, checkpoints, profiling, services, cost ceiling). `amlhpc.jobs.plan.build` combines it with a
stack's outputs and the SKU catalog. No azure-ai-ml import here: amlhpc/jobs/plan/build.py is the only module that makes its objects.

Keys are snake_case. Every field has a default except `name` and `command`; defaults are
chosen for InfiniBand GPU clusters (see each field's docstring for why).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from amlhpc.core.values import Hours, Usd, checked
from amlhpc.jobs.managed import causes

SHM_SIZE_DEFAULT = "3100m"
"""Docker's /dev/shm for the job. Azure ML's default (2 GB) starves PyTorch data loader
workers and NCCL's shared-memory transport; NAG's CosmoFlow tutorial and Azure's large-scale training guide use 3100m."""

_SHM = re.compile(r"^[1-9][0-9]*[bkmg]$")
_NAME = re.compile(r"^[a-z][a-z0-9-]{1,40}$")
_INPUT_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MOUNT_PATH = re.compile(r"^(/[A-Za-z0-9_][A-Za-z0-9._-]*)+$")
# Host folders a recipe may never bind into the job's container: the node's system, its
# container runtime and its credentials (a `-v /var/run/docker.sock:...` is root on the node).
_SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/root", "/run",
                "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var")

PACKAGE_ROOT = Path(__file__).resolve().parents[3]
"""The folder holding `amlhpc/` (a clone, or site-packages)."""


def display_path(path: Path) -> str:
    """A file as messages name it: inside aml-hpc's package by its package path
    (amlhpc/jobs/recipes/cosmoflow.yaml), else relative to the current folder when below it
    (./train.yaml, recipes/train.yaml), else absolute."""
    path = path.resolve()
    if (PACKAGE_ROOT / "amlhpc") in path.parents:
        return path.relative_to(PACKAGE_ROOT).as_posix()
    relative = os.path.relpath(path)
    if relative.startswith(".."):
        return str(path)
    return relative if os.sep in relative else f".{os.sep}{relative}"


Distribution = Literal["pytorch", "mpi", "tensorflow", "deepspeed"]
Framework = Literal["pytorch", "tensorflow"]
InputMode = Literal["stage", "download", "ro_mount"]
Placement = Literal["local", "shared", "replica"]
HealthMode = Literal["gate", "warn", "off"]
ModelDim = Annotated[int, checked("model_dim")]
Batch = Annotated[int, checked("batch")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvironmentRef(_Model):
    """Which image the job runs in: exactly one of the three."""

    registered: str | None = None
    """An image from amlhpc/images/ registered in the stack (`registry.environments` in the stack
    outputs), e.g. aml-hpc-pytorch. The job pins the exact image reference the stack names."""
    curated: str | None = None
    """An Azure ML curated environment in the `azureml` registry, e.g.
    acpt-pytorch-2.2-cuda12.1 (latest label)."""
    image: str | None = None
    """Any image reference (registry/repository:tag or @sha256:...)."""

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvironmentRef:
        given = [k for k in ("registered", "curated", "image") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of registered, curated, image (got {given or 'none'})")
        return self


class InputSpec(_Model):
    """A dataset the job reads, from the stack's `datasets` datastore/container."""

    path: str | None = None
    """Folder (blob prefix) inside the datasets container. Required: a recipe may leave it
    empty to force the user to pass `--set inputs.<name>.path=...`."""
    version: int | None = Field(default=None, ge=1)
    """The dataset version to read (`jobs data upload` writes each version under `<path>/v<k>/`).
    For mode stage, unset means the newest committed version when the job stages, and every
    node stages the same one. For download / ro_mount, Azure ML mounts a folder, `<path>/v<k>/`:
    unset, `jobs submit` pins the latest committed version in the job (a folder with no
    committed version is mounted whole)."""
    mode: InputMode = "stage"
    """stage: Azure ML mounts nothing; the in-job launcher copies the blobs to node-local
    scratch (NVMe RAID0) with transparent gunzip, sharded over nodes - the fast path for
    data read many times (NAG's CosmoFlow tutorial). download / ro_mount: Azure ML's own input modes."""
    placement: Placement = "local"
    """For mode stage: local (each node gets its share; each rank a file list), replica
    (every node gets everything) or shared (BeeOND: staged once into `shared_dir`)."""
    shared_dir: str = "/mnt/beeond"
    """Where the BeeOND file system is mounted on the nodes (placement shared). It becomes a
    `docker -v DIR:DIR` argument of the job, so it must be a plain absolute folder below a data
    mount (e.g. /mnt/beeond), never a system folder, and take no spaces, colons or options."""

    @field_validator("shared_dir")
    @classmethod
    def _shared_dir(cls, value: str) -> str:
        return check_mount_path(value)


def check_mount_path(value: str) -> str:
    """A host folder safe to hand to `docker -v DIR:DIR`, or ValueError naming what is wrong."""
    fix = "use a folder below the nodes' data mounts, e.g. /mnt/beeond (jobs beeond start --mount)"
    if not _MOUNT_PATH.match(value) or any(part in (".", "..") for part in value.split("/")):
        raise ValueError(f"{value!r} is not a plain absolute folder (letters, digits, '.', '_', '-' between "
                         f"slashes; no spaces, colons, commas, '..' or trailing slash): {fix}")
    top = "/" + value.split("/")[1]
    if value.count("/") < 2 or top in _SYSTEM_DIRS:
        raise ValueError(f"{value!r} would bind a system folder of the node into the job's container: {fix}")
    return value


class OutputSpec(_Model):
    """A named job output (uri_folder). Azure ML's `outputs/` folder is always captured too."""

    mode: Literal["upload", "rw_mount"] = "upload"
    datastore: str = "checkpoints"
    """A datastore key of the stack outputs' `datastores` (datasets or checkpoints)."""
    path: str | None = None
    """Folder in the datastore; default <recipe>/<job name>/<output name>."""


class TensorBoardService(_Model):
    log_dir: str = "outputs/tensorboard"


SSH_KEY_LINE = re.compile(r"^(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]{20,}( .*)?$")


class SshService(_Model):
    """SSH into the job's containers (Azure ML's SshJobService): `jobs connect RUN` prints the
    `az ml job connect-ssh` command that reaches a node through the workspace (no public IP)."""

    public_keys: str
    """OpenSSH public key line(s), one per line: who may connect (never a private key)."""

    @field_validator("public_keys")
    @classmethod
    def _public_key_lines(cls, value: str) -> str:
        lines = [line.strip() for line in value.splitlines() if line.strip()]
        if not lines or "PRIVATE KEY" in value or not all(SSH_KEY_LINE.match(line) for line in lines):
            raise ValueError("must be OpenSSH public key line(s) (the .pub file: ssh-ed25519 AAAA...), never a private key")
        return "\n".join(lines)


class Services(_Model):
    """Interactive job services (Azure's large-scale training guide): each runs on every node when enabled.
    `jobs connect RUN` prints their endpoints while the job runs."""

    tensorboard: TensorBoardService | None = None
    ssh: SshService | None = None
    jupyter_lab: bool = False
    vs_code: bool = False


class Profiling(_Model):
    enabled: bool = False
    """Turns on the PyTorch profiler in the training code (AMLHPC_PROFILE_DIR)."""
    dir: str = "outputs/tensorboard/profiler"
    """Trace folder; put it under the TensorBoard service's log_dir to see it there."""


class Checkpoint(_Model):
    enabled: bool = True
    keep: int = Field(3, ge=1)
    """Complete checkpoint versions kept in the checkpoints container."""
    interval_s: int = Field(600, ge=10)
    """How often the launcher uploads the checkpoint directory while training runs."""
    writers: Literal["rank0", "per_node", "per_rank"] | None = None
    """Who writes checkpoint files, for the upload cap (the NDv4 performance article: writers x cap below the
    account's ingress). Default: per_rank for deepspeed (ZeRO shards), else rank0."""
    cap_mbps: int | None = Field(None, ge=1)
    """Per-writer upload cap in Mb/s; default: 90 % of the account ingress / writers."""
    local_keep: int = Field(2, ge=2, le=20)
    """Versioned checkpoints (common.save_state) kept on each node's NVMe. At least 2: a rank is at
    most one version behind the others, so two always leave one every node holds whole."""
    local_restarts: int = Field(3, ge=0, le=100)
    """In-job restarts (amlhpc/jobs/runtime/launch/restart.py): after a crashed rank, an NCCL error or a hang, the
    launchers restart the training inside the same Azure ML job from the newest version every node
    holds locally. After this many the job ends (exit 11) for a managed run to resubmit; 0: off."""
    agree_s: int = Field(300, ge=10)
    """How long nodes wait for each other to agree on an in-job restart; a node that does not answer
    is lost (exit 10)."""


class Watchdog(_Model):
    """The launcher's hang watchdog (amlhpc/jobs/runtime/launch/watchdog.py): stop a training that no
    longer reports progress (launcher exit 7) instead of letting it hold the nodes."""

    enabled: bool = True
    hang_s: int | None = Field(None, ge=10)
    """No progress for this long is a hang. Default: two checkpoint upload intervals, at
    least 10 minutes - a hang then costs at most about two intervals of node time, and a
    slow first step or a validation pass is not taken for one."""
    startup_s: int | None = Field(None, ge=10)
    """Optional: a limit from each run's start (the first, and each in-job restart) to its first
    reported step. Default: 3x hang_s and at least 5 minutes for the first run; for a restart,
    3x the first run's time to its first step, at least hang_s and 30 s."""
    check_s: int | None = Field(None, ge=1)
    """Optional: how often each node's launcher looks at its ranks' progress and writes its
    heartbeat. Default: hang_s / 6, within 1 to 60 s. Stragglers are named from these
    heartbeats, a window of steps apart: a short job needs a look per window of its steps."""

    def hang_seconds(self, checkpoint_interval_s: int) -> int:
        return self.hang_s or max(600, 2 * checkpoint_interval_s)


class Managed(_Model):
    """Supervision for `python -m amlhpc.jobs submit --managed` (amlhpc/jobs/managed, docs/managed-jobs.md)."""

    max_restarts: int = Field(3, ge=0, le=100)
    """Attempts after the first; --max-restarts wins."""
    retry_on: list[str | int] = Field(default_factory=lambda: list[str | int](causes.DEFAULT_RETRY_ON))
    """Causes that are retried (see amlhpc/jobs/managed/causes.py), and exit statuses of the training's own
    that mean "try again" (e.g. 75). Default: preempted, node_failure, service_error, health_gate,
    staging, hang, nccl_fallback."""
    backoff_s: int = Field(60, ge=0)
    """Wait before the first restart; doubled for each further one."""
    backoff_max_s: int = Field(900, ge=0)
    fallback_clusters: list[str] = Field(default_factory=list)
    """Clusters of the stack to move to, in order, after a queue timeout or repeated preemption
    (e.g. the Dedicated twin of a LowPriority cluster); all attempts share one cost limit."""
    queue_timeout_s: int | None = Field(None, ge=60)
    """An attempt queued longer than this is canceled and resubmitted on the next cluster."""
    fallback_after_preemptions: int = Field(2, ge=1)
    """Preemptions on one cluster after which the next attempt goes to the next cluster."""
    straggler_factor: float | None = Field(1.5, gt=1)
    """The slowdown to name: a node whose own work per step stays this many times its peers'
    median is named a straggler after `straggler_looks` windows of steps in a row, by a
    noise-robust rule (docs/managed-jobs.md, "Nodes to distrust, stragglers"; null: off)."""
    straggler_looks: int = Field(3, ge=1)
    stall_s: int = Field(900, ge=60)
    """An attempt Azure ML reports Paused, Unknown or NotResponding this long is canceled and retried."""
    silent_node_s: int | None = Field(1800, ge=120)
    """An attempt Azure ML reports Running while one of its nodes wrote no new heartbeat for
    this long (its launcher is frozen or its host gone, and no peer's watchdog ended the job) is
    canceled and resubmitted, the node named to distrust (null: off). Keep it above
    watchdog.hang_s plus checkpoint.agree_s: an in-job restart writes no heartbeat."""
    min_nodes: int | None = Field(None, ge=1)
    """Shrink-and-continue: when a node is lost and the cluster has no capacity for the full
    count, a restart may run on as few as this many nodes (default: the recipe's `nodes`, no
    shrinking), trying each smaller count the global batch splits over before the fallback
    clusters; a later restart asks for the full count again. The command must name its
    global batch (`--global-batch N`: more gradient accumulation per rank on fewer nodes;
    submit refuses otherwise) and the versioned checkpoint reshards into the smaller world
    (docs/managed-jobs.md)."""

    @field_validator("retry_on")
    @classmethod
    def _retry_on(cls, value: list[str | int]) -> list[str | int]:
        wrong = [problem for problem in map(causes.check_retry_entry, value) if problem]
        if wrong:
            allowed = ", ".join(c for c in causes.CAUSES if c not in causes.NEVER_RETRIED)
            raise ValueError(f"{'; '.join(wrong)} (causes: {allowed}; or an exit status 1-255)")
        return value


class Cost(_Model):
    expected_hours: Hours = 1.0
    """Wall-clock estimate used by `estimate` and by submit's ceiling check."""
    ceiling_usd: Usd | None = None
    """Submit refuses (unless --yes) when the estimate exceeds it."""
    preemptions_per_node_hour: Annotated[float | None, checked("per_node_hour")] = None
    """For goodput planning on a LowPriority cluster: the preemptions per node-hour you assume
    (Azure publishes none; `estimate --preemption-rate` wins)."""


class ModelShape(_Model):
    """A transformer's shape, for the parameter count and activation memory."""

    hidden_size: ModelDim
    num_layers: ModelDim
    num_heads: ModelDim
    intermediate_size: ModelDim | None = None
    """Default 4 x hidden_size."""
    vocab_size: ModelDim = 30522
    max_position: ModelDim = 512
    seq_len: ModelDim = 128


class DeepSpeedSpec(_Model):
    """DeepSpeed settings (distribution: deepspeed); see amlhpc/jobs/plan/deepspeed.py."""

    model: ModelShape
    zero_stage: Literal["auto", 0, 1, 2, 3] = "auto"
    """auto: by model size (Azure's large-scale training guide: <300M 0, <1B 1, <10B 2, else 3), raised until the
    model states fit the GPU; CPU offload only when even stage 3 does not fit."""
    micro_batch: Batch = 8
    grad_accum: Batch = 1
    activation_checkpointing: bool = False
    tensorboard: bool = True
    flops_profiler: bool = False
    autotune: bool = False
    """Run the autotuning mode instead of training: tries micro-batch x grad-accum x ZeRO
    stage for a few steps each and writes the fastest ds_config to outputs."""
    ort: bool = False
    """Wrap the model in ONNX Runtime's ORTModule before DeepSpeed (the NDv4 performance article's order); the
    image must ship onnxruntime-training."""


class LocalRequirements(_Model):
    """What `python -m amlhpc.jobs run RECIPE --local` checks before it starts anything; every unmet
    requirement is reported at once, within seconds (amlhpc/jobs/local/requirements.py)."""

    modules: list[str] = Field(default_factory=list)
    """Python modules the training command imports, found with importlib.util.find_spec
    (nothing is imported), e.g. torch, transformers, horovod.tensorflow."""
    gpu: bool = False
    """The command needs an NVIDIA GPU; without this a rehearsal runs on CPU over gloo."""
    network: list[str] = Field(default_factory=list)
    """host:port the job downloads from at run time (e.g. github.com:443), checked with a
    TCP connect of at most a second or two."""
    hint: str = ""
    """What to do instead when a requirement is unmet (printed with the refusal)."""

    @field_validator("network")
    @classmethod
    def _host_ports(cls, value: list[str]) -> list[str]:
        for item in value:
            host, _, port = item.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"{item!r} is not host:port, e.g. github.com:443")
        return value


class LocalProfile(_Model):
    """How `python -m amlhpc.jobs run RECIPE --local` rehearses the recipe on one small machine (2
    cores, 24 GiB, no GPU): a smaller model, CPU-sized messages, fewer steps, a small
    dataset. Which value wins: command-line flags > --set > this profile > the recipe."""

    overrides: dict[str, Any] = Field(default_factory=dict)
    """Recipe keys (dotted, as for --set) changed for the rehearsal, e.g. command or
    deepspeed.model.hidden_size; validated like the recipe itself."""
    nodes: int | None = Field(None, ge=1)
    """Simulated nodes (default 2)."""
    processes_per_node: int | None = Field(None, ge=1)
    """Processes per simulated node (default 2)."""
    data: dict[str, str] = Field(default_factory=dict)
    """Input name -> a command that writes a small dataset into `{dir}`; run (and uploaded)
    when the input has no blobs in the local Blob yet and no --data was given."""
    requires: LocalRequirements = LocalRequirements()

    @field_validator("overrides")
    @classmethod
    def _override_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if key.split(".")[0] in ("name", "local") or any(not part for part in key.split(".")):
                raise ValueError(f"{key!r} cannot be overridden by the local profile (use recipe keys such as command)")
        return value

    @field_validator("data")
    @classmethod
    def _data_commands(cls, value: dict[str, str]) -> dict[str, str]:
        for name, command in value.items():
            if "{dir}" not in command:
                raise ValueError(f"data.{name}: the command must write into {{dir}}")
        return value


class Recipe(_Model):
    """One training run, stack-independent."""

    name: str
    description: str = ""
    code: list[str] = Field(default_factory=lambda: ["amlhpc/jobs/runtime", "amlhpc/jobs/workloads"])
    """Folders copied into the job's code snapshot: the team's own (relative to the recipe
    file's folder, else to the project; or absolute), whose contents become the job's working
    folder as Azure ML's `code:` does, and aml-hpc's (`amlhpc/jobs/workloads`), kept at their
    package path. aml-hpc's runtime always travels too (see docs/jobs.md)."""
    command: str
    """The training command; it runs under `python -m amlhpc.jobs.runtime.launch -- <command>`.
    May reference `${{inputs.<name>}}` for download/ro_mount inputs."""
    framework: Framework = "pytorch"
    distribution: Distribution = "pytorch"
    environment: EnvironmentRef = EnvironmentRef(registered="aml-hpc-pytorch")
    cluster: str | None = None
    """Preferred cluster name; --cluster wins. Default: the stack's first InfiniBand cluster."""
    nodes: int = Field(1, ge=1)
    processes_per_node: int | None = Field(None, ge=1)
    """Default: one per GPU (tensorflow distribution: one per node)."""
    inputs: dict[str, InputSpec] = Field(default_factory=dict)
    outputs: dict[str, OutputSpec] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    shm_size: str = SHM_SIZE_DEFAULT
    services: Services = Services()
    prepare: str | None = None
    """Shell command run once per node (local rank 0) before the launcher; the other ranks
    wait for it - what Batch AI's job preparation did (Microsoft's Batch AI cluster article)."""
    profiling: Profiling = Profiling()
    health: HealthMode = "gate"
    """gate: a failing node stops the job before training; warn: report and go on; off."""
    pin: Literal["auto", "off"] = "auto"
    max_clocks: bool = False
    """Set GPU application clocks to their maximum for the job and reset them after (the NDv4 performance article);
    needs the rights to change clocks on the node, otherwise it is reported and skipped."""
    checkpoint: Checkpoint = Checkpoint()
    watchdog: Watchdog = Watchdog()
    managed: Managed = Managed()
    cost: Cost = Cost()
    timeout_hours: Hours | None = None
    """Azure ML kills the job after this; default: 2 x cost.expected_hours, at least 1 h."""
    deepspeed: DeepSpeedSpec | None = None
    experiment: str | None = None
    """Azure ML experiment name; default: the recipe name."""
    tags: dict[str, str] = Field(default_factory=dict)
    sharp: bool = False
    """In-network all-reduce (SHARP / CollNet) on sizes that have it (ND H100/H200 v5): the
    settings of Azure's hopper.conf (amlhpc/core/catalog/nccl.toml, opt_in sharp). Needs the NCCL SHARP
    plugin in the image and a SHARP-enabled fabric, so it is off unless asked for."""
    local: LocalProfile = LocalProfile()
    """The rehearsal profile (`python -m amlhpc.jobs run NAME --local`); ignored by submit."""
    _source: Path | None = PrivateAttr(default=None)
    """The file the recipe was read from (set by amlhpc.jobs.recipes.load)."""

    @property
    def source(self) -> Path | None:
        """The recipe's file (absolute), or None for a recipe built in code."""
        return self._source

    @property
    def reference(self) -> str:
        """The recipe's file as error messages name it: aml-hpc's own by its package path, a
        team's relative to the current folder (./train.yaml, recipes/train.yaml), else absolute."""
        return display_path(self._source) if self._source is not None else f"recipe {self.name!r}"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be 2-41 lowercase letters, digits or hyphens, starting with a letter")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is empty: give the training command, e.g. python -m amlhpc.jobs.workloads.cosmoflow.train ...")
        return value

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, value: str) -> str:
        if not _SHM.match(value):
            raise ValueError("must be a number with a unit b, k, m or g, e.g. 3100m or 16g")
        return value

    @field_validator("inputs")
    @classmethod
    def _input_names(cls, value: dict[str, InputSpec]) -> dict[str, InputSpec]:
        for key in value:
            if not _INPUT_NAME.match(key):
                raise ValueError(f"input name {key!r} must be lowercase letters, digits or _ (it becomes AMLHPC_DATA_DIR_{key.upper()})")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        if self.distribution == "deepspeed" and self.deepspeed is None:
            raise ValueError("distribution deepspeed needs a `deepspeed:` block (at least deepspeed.model)")
        if self.framework == "tensorflow" and self.distribution in ("pytorch", "deepspeed"):
            raise ValueError(f"framework tensorflow cannot use distribution {self.distribution} (use mpi for Horovod, or tensorflow)")
        if self.framework == "pytorch" and self.distribution == "tensorflow":
            raise ValueError("framework pytorch cannot use distribution tensorflow (it sets TF_CONFIG, not torch.distributed's "
                             "variables): use pytorch, deepspeed or mpi, or set framework: tensorflow")
        return self

    @model_validator(mode="after")
    def _min_nodes(self) -> Recipe:
        if self.managed.min_nodes is not None and self.managed.min_nodes > self.nodes:
            raise ValueError(f"managed.min_nodes {self.managed.min_nodes} is more than nodes {self.nodes}: the floor for "
                             "shrink-and-continue cannot exceed the job's node count")
        return self

    @model_validator(mode="after")
    def _local_data_are_inputs(self) -> Recipe:
        unknown = sorted(set(self.local.data) - set(self.inputs))
        if unknown:
            raise ValueError(f"local.data names {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not "
                             f"an input of this recipe (inputs: {', '.join(self.inputs) or 'none'})")
        return self

    @property
    def checkpoint_writers(self) -> str:
        if self.checkpoint.writers:
            return self.checkpoint.writers
        return "per_rank" if self.distribution == "deepspeed" else "rank0"
