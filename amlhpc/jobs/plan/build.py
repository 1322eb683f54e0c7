"""Recipe + stack outputs + SKU catalog -> an Azure ML command job. The only module that
makes azure-ai-ml objects.

Two steps, so the local rehearsal can reuse the first without azure-ai-ml:

1. `plan_job(recipe, outputs, ...) -> JobPlan`: pure. Picks the cluster, nodes and
   processes per node, checks them against the catalog, tunes the environment for the
   size (amlhpc.jobs.plan.tuning), plans inputs (staged by the launcher, or Azure ML download /
   ro_mount), checkpoints, services, DeepSpeed, cost; raises one UserError for bad input.
2. `to_command_job(plan, code_path) -> azure.ai.ml.entities.Command` and `to_yaml(...)`:
   the Azure ML entity, and its YAML (what `--dry-run` prints; `load_job` and
   `az ml job create -f` read it).

The command every process runs is `python -m amlhpc.jobs.runtime.launch -- <recipe command>`,
wrapped, when the recipe has a `prepare` step, in a small shell barrier that runs it once
per node (local rank 0) while the other local ranks wait.

Code snapshot: Azure ML uploads one folder. `snapshot()` assembles the recipe's `code`
folders (default amlhpc/jobs/runtime and amlhpc/jobs/workloads, plus the __init__.py of amlhpc and amlhpc/jobs) into
`.scratch/code-snapshots/<content hash>/`, so the job imports `amlhpc.jobs.runtime...` and
`amlhpc.jobs.workloads...` exactly as in this checkout; the training image also carries
amlhpc/jobs/runtime, but the snapshot comes first on sys.path (the job's working directory), so
launcher and training code always match the submitted commit. The NCCL topology and graph
files (amlhpc/images/common/nccl-topo) travel in the snapshot too, under `nccl-topo/`: a job finds
them whatever its image (a curated or plain `image:` environment has no /opt/aml-hpc), and
the launcher points NCCL_TOPO_FILE at the copy it finds (amlhpc/jobs/runtime/node/nccl_env.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from amlhpc.core import atomic, invocation, project, skus
from amlhpc.core.errors import Problem, ProblemCollector, UserError
from amlhpc.core.outputs import StackOutputs
from amlhpc.core.storage_load import CHECKPOINT_INGRESS_SHARE
from amlhpc.core.values import NumberError, check_number, check_run_name
from amlhpc.jobs.plan import cost as cost_mod
from amlhpc.jobs.plan import deepspeed as ds_mod
from amlhpc.jobs.plan import limits as limits_mod
from amlhpc.jobs.plan import tuning
from amlhpc.jobs.recipes.schema import Recipe
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.node.nccl_env import SNAPSHOT_TOPO_DIR
from amlhpc.jobs.workloads import env as workload_env

REPO_ROOT = Path(__file__).resolve().parents[3]
SNAPSHOT_ROOT = project.scratch() / "code-snapshots"
TOPOLOGY_SOURCE = Path("amlhpc") / "images" / "common" / "nccl-topo"
"""The topology files the images install; the snapshot carries the same files."""
PREPARE_TIMEOUT_S = 3600
_INPUT_REF = re.compile(r"\$\{\{\s*inputs\.([A-Za-z0-9_]+)\s*\}\}")
AML_DISTRIBUTION = {"pytorch": "pytorch", "deepspeed": "pytorch", "mpi": "mpi", "tensorflow": "tensorflow"}
"""DeepSpeed launches through torch.distributed (no ssh hostfile, which DeepSpeed's own launcher needs)."""


@dataclass(frozen=True)
class JobPlan:
    """Everything the job is, before it becomes an azure-ai-ml entity (plain data)."""

    name: str
    recipe: str
    stack: str
    experiment: str
    display_name: str
    command: str
    """What every process runs (launcher, prepare barrier, input variables included)."""
    training_command: str
    """The recipe's command alone (what the launcher execs)."""
    distribution: str
    """Azure ML distribution type: pytorch, mpi or tensorflow."""
    recipe_distribution: str
    instance_count: int
    processes_per_node: int
    cluster: str
    sku: str
    priority: str
    environment: dict[str, str]
    """{"image": ref}, or {"reference": "azureml:<name>:<version>" (registered in the stack's
    workspace) or "azureml://registries/..." (curated)}."""
    environment_variables: dict[str, str]
    env_reasons: dict[str, str]
    inputs: dict[str, dict[str, str]]
    """Azure ML inputs (download / ro_mount): name -> {type, path, mode}."""
    staged_inputs: list[dict[str, Any]]
    """AMLHPC_STAGE_JSON entries (mode stage)."""
    outputs: dict[str, dict[str, str]]
    services: dict[str, dict[str, str]]
    shm_size: str
    docker_args: str | None
    code_dirs: tuple[str, ...]
    """What the snapshot holds: aml-hpc's folders by their package path (amlhpc/jobs/runtime),
    kept at that path; the team's by their absolute path, whose contents go to the top."""
    tags: dict[str, str]
    timeout_s: int
    identity_client_id: str
    estimate: cost_mod.Estimate
    deepspeed: ds_mod.MemoryPlan | None = None
    warnings: list[str] = field(default_factory=list)
    recipe_file: str = ""
    """The recipe's file as messages name it (Recipe.reference)."""

    @property
    def world_size(self) -> int:
        return self.instance_count * self.processes_per_node


def job_name(recipe: str, now: datetime | None = None) -> str:
    """Unique, readable job name: <recipe>-<UTC time>-<4 hex>."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{recipe}-{stamp}-{secrets.token_hex(2)}"


def pick_cluster(recipe: Recipe, outputs: StackOutputs, requested: str | None) -> str:
    """--cluster wins, then the recipe's cluster, then the stack's first InfiniBand cluster."""
    names = list(outputs.clusters)
    wanted = requested or recipe.cluster
    if wanted is not None:
        if wanted in outputs.clusters:
            return wanted
        source = "--cluster" if requested else f"{recipe.reference}: cluster"
        import difflib

        near = difflib.get_close_matches(wanted, names, n=1)
        raise UserError([Problem(f"stack {outputs.stack!r}", source, f"unknown cluster {wanted!r}",
                                 (f"did you mean {near[0]!r}? " if near else "") + f"clusters in {outputs.stack}: {', '.join(names) or 'none'}")],
                        "unknown cluster")
    if not names:
        raise UserError([Problem(f"stack {outputs.stack!r}", "clusters", "the stack has no clusters",
                                 f"add one to Pulumi.{outputs.stack}.yaml (aml-hpc:clusters) and deploy, or use an experiment stack")],
                        "no cluster")
    infiniband = [n for n in names if outputs.clusters[n].infiniband]
    return (infiniband or names)[0]


@dataclass(frozen=True)
class _Shape:
    """Where and how wide the job runs."""

    cluster: str
    sku: skus.Sku
    priority: str
    nodes: int
    processes_per_node: int


class _EnvBuilder:
    """Environment variables with the reason each one is set (shown by --dry-run)."""

    def __init__(self, env: dict[str, str], reasons: dict[str, str]):
        self.env, self.reasons = dict(env), dict(reasons)

    def put(self, key: str, value: str, why: str) -> None:
        self.env[key] = value
        self.reasons[key] = why


def plan_job(recipe: Recipe, outputs: StackOutputs, *, cluster: str | None = None, nodes: int | None = None,
             processes_per_node: int | None = None, allow_tcp: bool = False, hours: float | None = None,
             name: str | None = None, resume: str | None = None, extra_tags: dict[str, str] | None = None,
             now: datetime | None = None, root: Path = REPO_ROOT) -> JobPlan:
    """Plan the job; every bad input is collected and raised as one UserError."""
    reference = recipe.reference
    found = ProblemCollector(reference, f"cannot build job {recipe.name!r} for stack {outputs.stack!r}")
    _check_caller_values(found, hours, resume)
    shape = _shape(recipe, outputs, cluster, nodes, processes_per_node, found)
    tuning.check_multi_node(shape.sku, shape.nodes, shape.cluster, allow_tcp, reference)

    environment = _environment(recipe, outputs, found)
    image_warning = _check_image_fits(recipe, shape.sku, found)
    code_dirs = _code_dirs(recipe, root, found)
    input_warnings: list[str] = []
    aml_inputs, staged, input_env, shared_dirs = _inputs(recipe, outputs, found, input_warnings)
    outs = _outputs(recipe, outputs, found)
    found.raise_if_any()

    run_name = name or job_name(recipe.name, now)
    run_key = resume or run_name
    tuned = tuning.tune(shape.sku, shape.nodes, recipe.distribution, recipe.env, recipe.pin,
                        opt_ins={"sharp"} if recipe.sharp else set())
    warnings = list(tuned.warnings) + ([image_warning] if image_warning else []) + input_warnings
    if shape.sku.retired:
        warnings.append(f"{shape.sku.retirement}; move cluster {shape.cluster!r} to a current size")
    env = _EnvBuilder(tuned.env, tuned.reasons)
    _runtime_variables(env, recipe, outputs, shape, staged, shared_dirs)
    _checkpoint_variables(env, recipe, outputs, shape, run_key, warnings)
    memory = _deepspeed(env, recipe, shape, environment, warnings)

    est = cost_mod.estimate(shape.sku.name, shape.nodes, hours or recipe.cost.expected_hours, outputs.stack_prices(),
                            shape.priority)
    timeout_h = recipe.timeout_hours or max(1.0, 2 * (hours or recipe.cost.expected_hours))
    warnings += [w for w in (limits_mod.rdma_nodes_warning(shape.cluster, shape.sku, shape.nodes, outputs.location),
                             limits_mod.telemetry_warning(int(timeout_h * 3600), env.env)) if w]
    tags = _tags(recipe, outputs, shape, est, run_key, extra_tags)
    return JobPlan(
        name=run_name, recipe=recipe.name, stack=outputs.stack, experiment=recipe.experiment or recipe.name,
        display_name=f"{recipe.name} {shape.nodes}x{shape.sku.name.removeprefix('Standard_')}",
        command=_command(recipe, input_env), training_command=" ".join(recipe.command.split()),
        distribution=AML_DISTRIBUTION[recipe.distribution], recipe_distribution=recipe.distribution,
        instance_count=shape.nodes, processes_per_node=shape.processes_per_node, cluster=shape.cluster,
        sku=shape.sku.name, priority=shape.priority, environment=environment, environment_variables=env.env,
        env_reasons=env.reasons, inputs=aml_inputs, staged_inputs=staged, outputs=outs, services=_services(recipe),
        shm_size=recipe.shm_size, docker_args=" ".join(f"-v {d}:{d}" for d in shared_dirs) or None,
        code_dirs=tuple(code_dirs), tags=tags, timeout_s=int(timeout_h * 3600),
        identity_client_id=outputs.identity.client_id, estimate=est, deepspeed=memory, warnings=warnings,
        recipe_file=reference,
    )


def _check_caller_values(found: ProblemCollector, hours: float | None, resume: str | None) -> None:
    """--hours and --resume as a caller passes them (the CLI checks them too): a finite, sane
    number of hours and a plain job name, since the name becomes the checkpoint prefix."""
    if hours is not None:
        try:
            check_number(hours, "hours")
        except NumberError as exc:
            found.add("--hours", str(exc), "pass the expected wall-clock hours, e.g. --hours 2.5")
    if resume is not None:
        try:
            check_run_name(resume, "job name")
        except ValueError as exc:
            found.add("--resume", str(exc), "pass the earlier job's name, e.g. --resume cosmoflow-20260101-120000-ab12")
    found.raise_if_any()


def _shape(recipe: Recipe, outputs: StackOutputs, cluster: str | None, nodes: int | None,
           processes_per_node: int | None, found: ProblemCollector) -> _Shape:
    """Cluster, size, node count and processes per node, checked against the cluster and catalog."""
    cluster_name = pick_cluster(recipe, outputs, cluster)
    target = outputs.clusters[cluster_name]
    try:
        sku = skus.get(target.sku)
    except skus.UnknownSkuError as exc:
        raise UserError([Problem(f"stack {outputs.stack!r} outputs", f"clusters.{cluster_name}.sku",
                                 f"unknown VM size {target.sku!r}" + (f" (did you mean {' or '.join(exc.suggestions)}?)"
                                                                      if exc.suggestions else ""),
                                 f"this checkout's catalog knows {', '.join(skus.names())}: update the checkout, "
                                 "or redeploy the stack with a size it knows")], "unknown VM size") from None
    node_count = nodes if nodes is not None else recipe.nodes
    if node_count < 1:
        found.add("nodes", f"{node_count} nodes", "pass --nodes 1 or more")
    elif node_count > target.max_nodes:
        found.add("nodes", f"{node_count} nodes requested but cluster {cluster_name!r} scales to at most {target.max_nodes}",
                  f"pass --nodes {target.max_nodes} or fewer, or raise maxNodes in Pulumi.{outputs.stack}.yaml and deploy")
    ppn = processes_per_node or recipe.processes_per_node or (1 if recipe.distribution == "tensorflow" else sku.gpus)
    if ppn > sku.gpus:
        found.add("processes_per_node", f"{ppn} processes per node but {sku.name} has {sku.gpus} GPU{'s' if sku.gpus != 1 else ''}",
                  f"use at most {sku.gpus} (one process per GPU): --set processes_per_node={sku.gpus}")
    found.raise_if_any()
    return _Shape(cluster_name, sku, target.priority, node_count, ppn)


def _runtime_variables(env: _EnvBuilder, recipe: Recipe, outputs: StackOutputs, shape: _Shape,
                       staged: list[dict[str, Any]], shared_dirs: list[str]) -> None:
    """What the in-job launcher reads (amlhpc/jobs/runtime/base/contract.py)."""
    if recipe.distribution in ("pytorch", "deepspeed"):
        # Azure ML's pytorch launcher sets RANK/LOCAL_RANK/WORLD_SIZE; the local size lets
        # every process find its node (rank // local size) without guessing.
        env.put("LOCAL_WORLD_SIZE", str(shape.processes_per_node), "processes per node, for node-local staging and barriers")
    env.put(contract.HEALTH, recipe.health, "health gate before training (recipe: health)")
    env.put(contract.REPORT_DIR, contract.DEFAULT_REPORT_DIR, "per-node JSON reports, uploaded with outputs/")
    env.put("AZURE_CLIENT_ID", outputs.identity.client_id, "the cluster's managed identity for Blob access from the node")
    if staged:
        env.put(contract.STAGE_JSON, json.dumps(staged, separators=(",", ":")), "inputs the launcher stages from Blob")
    if shared_dirs:
        env.put(contract.SHARED_DIR, shared_dirs[0], "BeeOND mount for placement: shared")
    if recipe.profiling.enabled:
        env.put(workload_env.PROFILE_DIR, recipe.profiling.dir, "PyTorch profiler traces for TensorBoard (recipe: profiling)")
    if recipe.watchdog.enabled:
        hang_s = recipe.watchdog.hang_seconds(recipe.checkpoint.interval_s)
        env.put(contract.WATCHDOG_JSON, json.dumps({"hang_s": hang_s, "startup_s": recipe.watchdog.startup_s,
                                                    **({"check_s": recipe.watchdog.check_s} if recipe.watchdog.check_s else {})},
                                                   separators=(",", ":")),
                f"hang watchdog: no progress for {hang_s}s stops the job, exit 7 (recipe: watchdog)")


def _checkpoint_variables(env: _EnvBuilder, recipe: Recipe, outputs: StackOutputs, shape: _Shape, run_key: str,
                          warnings: list[str]) -> None:
    if not recipe.checkpoint.enabled:
        if shape.priority == "LowPriority":
            warnings.append(f"cluster {shape.cluster!r} is low priority and checkpoints are off: a preempted job fails and starts over")
        return
    # One process per node uploads (amlhpc/jobs/runtime/checkpoint/), so the cap is per node and the
    # writers that share the account's ingress are nodes, not ranks. Versioned checkpoints
    # (common.save_state) are written by every rank, so every node uploads its parts.
    writers = shape.nodes
    # Striped over the stack's checkpoint accounts (stack output checkpointAccounts, in order; absent:
    # the dataset account): each node spreads its parts evenly over them, so its cap is its share of
    # every account's ingress together.
    accounts = list(outputs.checkpoint_accounts or [])
    ingress = outputs.storage.ingress_gbps * max(1, len(accounts))
    cap = recipe.checkpoint.cap_mbps or max(1, int(ingress * 1000 * CHECKPOINT_INGRESS_SHARE / writers))
    host = outputs.storage.blob_endpoint.split("//", 1)[-1].split("/", 1)[0]
    account_url = f"https://{accounts[0]}.{host.split('.', 1)[1]}/" if accounts else outputs.storage.blob_endpoint
    env.put(contract.CHECKPOINT_JSON, json.dumps({
        "account_url": account_url, "container": outputs.storage.containers["checkpoints"],
        **({"accounts": accounts} if len(accounts) > 1 else {}),
        "prefix": f"{recipe.name}/{run_key}", "keep": recipe.checkpoint.keep, "cap_mbps": cap,
        "interval_s": recipe.checkpoint.interval_s, "writers": recipe.checkpoint_writers,
        "ingress_gbps": outputs.storage.ingress_gbps, "local_keep": recipe.checkpoint.local_keep,
        "local_restarts": recipe.checkpoint.local_restarts, "agree_s": recipe.checkpoint.agree_s},
        separators=(",", ":")),
        f"checkpoints to Blob: {writers} writer(s) x {cap} Mb/s under {CHECKPOINT_INGRESS_SHARE:.0%} of "
        f"{ingress:g} Gb/s ingress" + (f" ({len(accounts)} accounts striped)" if len(accounts) > 1 else ""))


def _deepspeed(env: _EnvBuilder, recipe: Recipe, shape: _Shape, environment: dict[str, str],
               warnings: list[str]) -> ds_mod.MemoryPlan | None:
    if recipe.deepspeed is None or recipe.distribution != "deepspeed":
        return None
    world = shape.nodes * shape.processes_per_node
    memory = ds_mod.plan_memory(recipe.deepspeed, shape.sku, world)
    if not memory.fits:
        warnings.append(f"DeepSpeed memory estimate {memory.total_gib:,.1f} GiB per GPU exceeds {memory.usable_gib:,.1f} GiB "
                        "even with offload: add nodes, enable deepspeed.activation_checkpointing or lower deepspeed.micro_batch")
    tb_dir = recipe.services.tensorboard.log_dir if recipe.services.tensorboard else "outputs/tensorboard"
    plan = {"config": ds_mod.ds_config(recipe.deepspeed, shape.sku, memory, tensorboard_dir=tb_dir, job_name=recipe.name),
            "memory": memory.to_json(), "model": recipe.deepspeed.model.model_dump(),
            "autotune": ds_mod.autotune_space(recipe.deepspeed, shape.sku, world) if recipe.deepspeed.autotune else None,
            "ort": recipe.deepspeed.ort}
    env.put(workload_env.DEEPSPEED_JSON, json.dumps(plan, separators=(",", ":")),
            f"ds_config: ZeRO {memory.stage}{' + CPU offload' if memory.offload else ''} ({'; '.join(memory.reasons)}; "
            "model states per DeepSpeed's estimators)")
    if recipe.deepspeed.ort and "acpt" not in json.dumps(environment).lower():
        warnings.append("deepspeed.ort needs onnxruntime-training in the image (Azure's ACPT images have it); "
                        "the job stops at start with a clear message if it is missing")
    return memory


def _command(recipe: Recipe, input_env: dict[str, str]) -> str:
    """What every process runs: the launcher around the recipe's command (and its prepare step)."""
    launch = ("python -m amlhpc.jobs.runtime.launch " + ("--max-clocks " if recipe.max_clocks else "")
              + "-- " + " ".join(recipe.command.split()))
    if input_env:
        launch = "env " + " ".join(f"{k}={v}" for k, v in input_env.items()) + " " + launch
    return _with_prepare(recipe.prepare, launch) if recipe.prepare else launch


def _tags(recipe: Recipe, outputs: StackOutputs, shape: _Shape, est: cost_mod.Estimate, run_key: str,
          extra: dict[str, str] | None) -> dict[str, str]:
    tags = {"recipe": recipe.name, "stack": outputs.stack, "cluster": shape.cluster, "sku": shape.sku.name,
            "nodes": str(shape.nodes), "processes_per_node": str(shape.processes_per_node),
            "distribution": recipe.distribution, "estimated_usd": f"{est.usd:.2f}",
            "checkpoint_prefix": f"{recipe.name}/{run_key}" if recipe.checkpoint.enabled else "",
            **recipe.tags, **(extra or {})}
    return {k: v for k, v in tags.items() if v != ""}


def _environment(recipe: Recipe, outputs: StackOutputs, found: ProblemCollector) -> dict[str, str]:
    ref = recipe.environment
    if ref.image:
        return {"image": ref.image}
    if ref.curated:
        return {"reference": f"azureml://registries/azureml/environments/{ref.curated}/labels/latest"}
    registered = outputs.registry.environments
    if ref.registered not in registered:
        found.add("environment.registered",
                  f"environment {ref.registered!r} is not registered in stack {outputs.stack!r} "
                  f"(registry.environments has: {', '.join(registered) or 'none'})",
                  f"build and register the images (`{invocation.command('images', 'build --stack ' + outputs.stack)}`, then `{invocation.deploy('up', outputs.stack)}`), "
                  "or name an image directly: --set environment.registered=null --set environment.image=REGISTRY/REPO:TAG")
        return {}
    if ref.registered in outputs.registry.environment_ids:
        # The environment the stack registered for this image (Azure ML never rebuilds it).
        return {"reference": outputs.registry.environment_ids[ref.registered]}
    return {"image": registered[ref.registered]}


def _image_spec(recipe: Recipe):
    """The amlhpc/images/ image the recipe's environment names (registered name or an image reference
    into its repository), or None for a curated or foreign image."""
    from amlhpc.images import catalog

    ref = recipe.environment
    if ref.registered:
        try:
            return catalog.by_name(ref.registered)
        except KeyError:
            return None
    if ref.image:
        repository = ref.image.split("@", 1)[0].rsplit(":", 1)[0] if "/" in ref.image else ""
        return next((s for s in catalog.IMAGES if repository.endswith("/" + s.repository)), None)
    return None


def _check_image_fits(recipe: Recipe, sku: skus.Sku, found: ProblemCollector) -> str:
    """Refuse an image built for other GPUs or another CPU architecture than the cluster's (a
    CUDA 13 image on V100 allocates nodes on which every kernel fails); name the image that fits.
    Returns a warning when the image cannot be checked (curated or foreign)."""
    from amlhpc.images import catalog

    spec = _image_spec(recipe)
    if spec is None:
        which = recipe.environment.curated or recipe.environment.image or recipe.environment.registered
        return (f"environment {which!r} is not an amlhpc/images/ image: whether it supports {sku.name}'s GPUs "
                f"({sku.gpu_vendor} {sku.gpu_arch}) and {sku.host_arch} hosts is not checked")
    why = spec.runs_on(sku.gpu_vendor, sku.gpu_arch, sku.host_arch)
    if not why:
        return ""
    same = catalog.fitting(sku.gpu_vendor, sku.gpu_arch, sku.host_arch, spec.framework)
    other = catalog.fitting(sku.gpu_vendor, sku.gpu_arch, sku.host_arch)
    if same:
        hint = f"use {same[0].name}: --set environment.registered={same[0].name}"
    elif other:
        names = ", ".join(s.name for s in other)
        hint = (f"no {spec.framework} image of amlhpc/images/ runs on {sku.name}; {names} does ({other[0].gpu_archs_why}): "
                f"run a {other[0].framework} recipe there, or pin a base that supports {sku.gpu_arch} in amlhpc/images/pins.toml "
                "and declare it in amlhpc/images/catalog.py")
    else:
        hint = f"no image of amlhpc/images/ runs on {sku.name}: add one to amlhpc/images/catalog.py"
    found.add("environment", f"image {spec.name} cannot run on {sku.name}: {why}", hint)
    return ""


JOB_FOLDERS = ("outputs", "logs", "user_logs", "system_logs", "scratch")
"""What a job writes into its working folder (Azure ML's outputs/ and logs, the rehearsal's
scratch): code of the same name at the snapshot's top would mix with them."""
_SKIPPED = {"__pycache__", ".git"}
"""Never copied into a snapshot: bytecode and a repository's history."""
RUNTIME_CODE = "amlhpc/jobs/runtime"
"""The launcher every job runs (`python -m amlhpc.jobs.runtime.launch`): in every snapshot."""


def _code_dirs(recipe: Recipe, root: Path, found: ProblemCollector) -> list[str]:
    """The recipe's `code:` folders, each found in the recipe file's folder, then the project,
    then aml-hpc's package (`root`); absolute paths as given. aml-hpc's runtime is added when
    the recipe does not list it: the job cannot start without it."""
    recipe_dir = recipe.source.parent if recipe.source is not None else None
    places = [p for p in (recipe_dir, project.root(), root) if p is not None]
    package = (root / "amlhpc").resolve()
    dirs: list[str] = []
    for i, given in enumerate(recipe.code):
        path = _find_folder(given, places)
        if path is None:
            looked = "it is not a folder" if Path(given).expanduser().is_absolute() else \
                "looked in " + ", ".join(dict.fromkeys(_shown_folder(p) for p in places[:2])) + " and aml-hpc's package"
            found.add(f"code[{i}]", f"{given!r} is not a folder ({looked})",
                      "give a folder relative to the recipe file or the project (e.g. src), an absolute path, "
                      "or one of aml-hpc's (amlhpc/jobs/workloads)")
            continue
        entry = path.relative_to(root.resolve()).as_posix() if package in (path, *path.parents) else str(path)
        if entry not in dirs:
            dirs.append(entry)
    if RUNTIME_CODE not in dirs:
        dirs.insert(0, RUNTIME_CODE)
    _check_code_layout(dirs, found)
    return dirs


def _shown_folder(folder: Path) -> str:
    """A folder as a message names it: relative to the current one when near, else absolute."""
    relative = os.path.relpath(folder)
    if relative == ".":
        return "./"
    return (relative if relative.split(os.sep).count("..") <= 2 else str(folder.resolve())) + "/"


def _find_folder(given: str, places: list[Path]) -> Path | None:
    path = Path(given).expanduser()
    if path.is_absolute():
        return path.resolve() if path.is_dir() else None
    for place in places:
        candidate = (place / path).resolve()
        if candidate.is_dir():
            return candidate
    return None


def _check_code_layout(dirs: list[str], found: ProblemCollector) -> None:
    """The team's folders share the snapshot's top level with each other and with `amlhpc/`
    (and the NCCL topology folder): two files of the same name would silently overwrite."""
    owners: dict[str, str] = {"amlhpc": "aml-hpc's runtime", SNAPSHOT_TOPO_DIR: "aml-hpc's NCCL topology files",
                              **{name: "what the job writes there" for name in JOB_FOLDERS}}
    for entry in dirs:
        if not Path(entry).is_absolute():
            continue
        for child in sorted(Path(entry).iterdir()):
            if child.name == "__pycache__":
                continue
            if child.name in owners:
                found.add("code", f"{child} would land where {owners[child.name]} is in the job's code snapshot "
                          f"(both are {child.name!r} at its top)", "rename one of them, or move it into a subfolder")
            else:
                owners[child.name] = str(child)


def _inputs(recipe: Recipe, outputs: StackOutputs, found: ProblemCollector, warnings: list[str]):
    aml: dict[str, dict[str, str]] = {}
    staged: list[dict[str, Any]] = []
    env: dict[str, str] = {}
    shared: list[str] = []
    datastore = outputs.datastores["datasets"]
    for name, spec in recipe.inputs.items():
        if not spec.path:
            found.add(f"inputs.{name}.path", f"input {name!r} has no path in the datasets container",
                      f"pass --set inputs.{name}.path=FOLDER (upload it first: {invocation.command('jobs', f'data upload DIR --stack {outputs.stack} --prefix FOLDER')})")
            continue
        prefix = spec.path.strip("/")
        if spec.mode == "stage":
            staged.append({"name": name, "account_url": outputs.storage.blob_endpoint,
                           "container": outputs.storage.containers["datasets"], "prefix": prefix + "/",
                           "mode": spec.placement, "egress_gbps": outputs.storage.egress_gbps,
                           "version": spec.version if spec.version is not None else "latest"})
            if spec.placement == "shared" and spec.shared_dir not in shared:
                shared.append(spec.shared_dir)
        else:
            # Azure ML mounts a folder, not a manifest: one version is its own folder.
            folder = f"{prefix}/v{spec.version}" if spec.version is not None else prefix
            if spec.version is None:
                warnings.append(f"input {name!r} ({spec.mode}) reads the folder {prefix}/ whole; a dataset uploaded "
                                f"with `jobs data upload` keeps each version under {prefix}/v<k>/: set "
                                f"inputs.{name}.version=K to read one (`jobs data versions` lists them)")
            aml[name] = {"type": "uri_folder", "path": f"azureml://datastores/{datastore}/paths/{folder}/", "mode": spec.mode}
            env[contract.data_dir_var(name)] = "${{inputs." + name + "}}"
    for ref in sorted(set(_INPUT_REF.findall(recipe.command))):
        if ref not in recipe.inputs:
            found.add("command", f"references ${{{{inputs.{ref}}}}} but the recipe declares no input {ref!r}",
                      f"add inputs.{ref} (path, mode) or remove the reference; declared: {', '.join(recipe.inputs) or 'none'}")
        elif recipe.inputs[ref].mode == "stage":
            found.add("command", f"references ${{{{inputs.{ref}}}}} but input {ref!r} is staged (Azure ML mounts nothing)",
                      f"read ${contract.data_dir_var(ref)} in the training code, or use mode download/ro_mount")
    return aml, staged, env, shared


def _outputs(recipe: Recipe, outputs: StackOutputs, found: ProblemCollector) -> dict[str, dict[str, str]]:
    result = {}
    for name, spec in recipe.outputs.items():
        if spec.datastore not in outputs.datastores:
            found.add(f"outputs.{name}.datastore", f"unknown datastore {spec.datastore!r}",
                      f"use one of the stack's datastores: {', '.join(outputs.datastores)}")
            continue
        path = (spec.path or f"{recipe.name}/${{{{name}}}}/{name}").strip("/")
        result[name] = {"type": "uri_folder", "mode": spec.mode,
                        "path": f"azureml://datastores/{outputs.datastores[spec.datastore]}/paths/{path}/"}
    return result


def _services(recipe: Recipe) -> dict[str, dict[str, str]]:
    services: dict[str, dict[str, str]] = {}
    if recipe.services.tensorboard:
        services["tensorboard"] = {"type": "tensor_board", "log_dir": recipe.services.tensorboard.log_dir, "nodes": "all"}
    if recipe.services.ssh:
        services["ssh"] = {"type": "ssh", "ssh_public_keys": recipe.services.ssh.public_keys, "nodes": "all"}
    if recipe.services.jupyter_lab:
        services["jupyter_lab"] = {"type": "jupyter_lab", "nodes": "all"}
    if recipe.services.vs_code:
        services["vs_code"] = {"type": "vs_code", "nodes": "all"}
    return services


def _with_prepare(prepare: str, launch: str, timeout_s: int = PREPARE_TIMEOUT_S) -> str:
    """Run `prepare` once per node (local rank 0), the other local ranks wait, then exec launch.

    The barrier lives in node-local scratch and is keyed by the Azure ML run id, so a retry
    of the same job does not rebuild what a finished prepare already made.
    """
    prepare_one_line = " ".join(prepare.split())
    script = "\n".join([
        "set -eo pipefail",
        'lr="${LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-0}}"',
        'd="${AMLHPC_SCRATCH:-${TMPDIR:-/tmp}}/.amlhpc-prepare-${AZUREML_RUN_ID:-job}"',
        'mkdir -p "$d"',
        'if [ "$lr" = 0 ]; then',
        '  if [ ! -e "$d/ok" ]; then',
        '    rm -f "$d/failed"',
        '    echo "[aml-hpc] prepare (once per node) starting" >&2',
        f'    if ( {prepare_one_line} ) 2>&1 | tee "$d/log"; then touch "$d/ok"; else touch "$d/failed";'
        ' echo "[aml-hpc] prepare failed on $(hostname); log: $d/log" >&2; exit 1; fi',
        "  fi",
        "else",
        "  n=0",
        '  until [ -e "$d/ok" ]; do',
        '    if [ -e "$d/failed" ]; then echo "[aml-hpc] prepare failed on this node (local rank 0)" >&2; exit 1; fi',
        f'    n=$((n+1)); if [ "$n" -gt {timeout_s} ]; then echo "[aml-hpc] prepare did not finish in {timeout_s}s" >&2; exit 1; fi',
        "    sleep 1",
        "  done",
        "fi",
        f"exec {launch}",
    ])
    return "bash -c " + shlex.quote(script)


# ---------------------------------------------------------------------------------------
# Code snapshot


def snapshot(code_dirs: tuple[str, ...] | list[str], root: Path = REPO_ROOT, dest_root: Path = SNAPSHOT_ROOT) -> Path:
    """Copy the code folders, the __init__.py of amlhpc and amlhpc/jobs, and the NCCL topology files into a
    content-addressed folder; reuse it if present. A folder of aml-hpc's (relative, under
    `root`) keeps its package path; a team's (absolute) gives its contents to the top, as
    Azure ML's `code:` makes a folder's contents the job's working folder."""
    files: list[tuple[str, Path]] = []
    for package in ("amlhpc", "amlhpc/jobs"):
        init = root / package / "__init__.py"
        if init.is_file():
            files.append((f"{package}/__init__.py", init))
    for path in sorted((root / TOPOLOGY_SOURCE).glob("*.xml")):
        files.append((f"{SNAPSHOT_TOPO_DIR}/{path.name}", path))
    for entry in code_dirs:
        team = Path(entry).is_absolute()
        source = Path(entry) if team else root / entry
        base = source if team else root
        for path in sorted(source.rglob("*")):
            if path.is_file() and not _SKIPPED.intersection(path.relative_to(base).parts) \
                    and not path.name.endswith((".pyc", ".pyo")):
                files.append((path.relative_to(base).as_posix(), path))
    digest = hashlib.sha256()
    for rel, path in sorted(files):
        digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    dest = dest_root / digest.hexdigest()[:16]
    if not dest.is_dir():
        with atomic.new_folder(dest) as tmp:  # a failed copy (a full disk) leaves no .tmp-* behind
            for rel, path in files:
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    return dest


# ---------------------------------------------------------------------------------------
# azure-ai-ml


def to_command_job(plan: JobPlan, code_path: str | Path):
    """The Azure ML CommandJob for a plan (code_path: the snapshot folder to upload), built from
    azure-ai-ml's public entities only."""
    from azure.ai.ml import (
        Input,
        MpiDistribution,
        Output,
        PyTorchDistribution,
        TensorFlowDistribution,
    )
    from azure.ai.ml.entities import (
        CommandJob,
        CommandJobLimits,
        Environment,
        JobResourceConfiguration,
        JupyterLabJobService,
        ManagedIdentityConfiguration,
        SshJobService,
        TensorBoardJobService,
        VsCodeJobService,
    )

    if plan.distribution == "mpi":
        distribution = MpiDistribution(process_count_per_instance=plan.processes_per_node)
    elif plan.distribution == "tensorflow":
        distribution = TensorFlowDistribution(worker_count=plan.world_size, parameter_server_count=0)
    else:
        distribution = PyTorchDistribution(process_count_per_instance=plan.processes_per_node)
    environment = Environment(image=plan.environment["image"]) if "image" in plan.environment else plan.environment["reference"]
    service_types = {"tensor_board": TensorBoardJobService, "jupyter_lab": JupyterLabJobService, "vs_code": VsCodeJobService,
                     "ssh": SshJobService}
    services = {}
    for key, spec in plan.services.items():
        kwargs = {k: v for k, v in spec.items() if k != "type"}
        services[key] = service_types[spec["type"]](**kwargs)
    return CommandJob(
        name=plan.name,
        display_name=plan.display_name,
        experiment_name=plan.experiment,
        description=f"aml-hpc recipe {plan.recipe} on {plan.stack}/{plan.cluster}",
        tags=dict(plan.tags),
        code=str(code_path),
        command=plan.command,
        environment=environment,
        environment_variables=dict(plan.environment_variables),
        compute=plan.cluster,
        resources=JobResourceConfiguration(instance_count=plan.instance_count, shm_size=plan.shm_size,
                                           docker_args=plan.docker_args),
        distribution=distribution,
        inputs={k: Input(type=v["type"], path=v["path"], mode=v["mode"]) for k, v in plan.inputs.items()},
        outputs={k: Output(type=v["type"], path=v["path"], mode=v["mode"]) for k, v in plan.outputs.items()},
        services=services or None,
        identity=ManagedIdentityConfiguration(client_id=plan.identity_client_id),
        limits=CommandJobLimits(timeout=plan.timeout_s),
    )


def command_job_document(job, inline_environment: tuple[str, ...] = ()) -> dict[str, Any]:
    """A CommandJob as Azure ML's command-job YAML document (plain dict), as the SDK's own
    `dump` writes it, without the empty blocks it adds. `inline_environment`: the keys an
    inline environment keeps (the SDK's anonymous name/version is derived on submit)."""
    import io

    import yaml

    code = job.code  # the SDK's dump makes a relative code path absolute (this machine's): keep the caller's
    stream = io.StringIO()
    job.dump(stream)
    document = yaml.safe_load(stream.getvalue())
    if isinstance(code, str) and document.get("code") and not Path(code).is_absolute():
        document["code"] = code
    if inline_environment:
        document["environment"] = {k: v for k, v in document["environment"].items() if k in inline_environment}
    for key in ("properties", "parameters"):
        if not document.get(key):
            document.pop(key, None)
    if isinstance(document.get("resources"), dict) and not document["resources"].get("properties"):
        document["resources"].pop("properties", None)
    return {"$schema": "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json", **document}


def to_job_dict(plan: JobPlan, code_path: str | Path) -> dict[str, Any]:
    """The job as Azure ML's command-job YAML document (plain dict)."""
    inline = ("image",) if "image" in plan.environment else ()
    return command_job_document(to_command_job(plan, code_path), inline)


def to_yaml(plan: JobPlan, code_path: str | Path) -> str:
    import yaml

    return yaml.safe_dump(to_job_dict(plan, code_path), sort_keys=False, width=120)
