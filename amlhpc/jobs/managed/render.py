"""The submit side of a managed run: from the planned training job to the controller job
that supervises it (`python -m amlhpc.jobs submit RECIPE --managed`).

What is submitted is the controller job only, on the stack's controller cluster (stack
output `controller`) as the controller identity. Its code snapshot is the training job's
(the recipe's `code` folders) plus amlhpc/jobs/managed and one rendered training job template per
cluster the run may use (`managed/training-job.yml` for the recipe's cluster,
`managed/training-job-<cluster>.yml` for each of `managed.fallback_clusters`); the
controller submits every attempt from its cluster's template with the code asset of its
own job, so the run uploads its code once. Settings - the rules included - travel in
AMLHPC_MANAGED_JSON (controller.py): the controller's job definition is the only place
its orders come from.

The controller's environment is the stack's `aml-hpc-controller` environment: an image
built from amlhpc/images/controller/Dockerfile (a pinned Python base, the controller's SDKs from
hashed pins) and registered like the training images, so Azure ML builds nothing and
reaches no package index at run time.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from amlhpc.core import atomic, invocation
from amlhpc.core.errors import Problem, UserError
from amlhpc.core.outputs import StackOutputs
from amlhpc.jobs.managed import causes, shrink
from amlhpc.jobs.managed.policy import DEFAULT_TEMPLATE, Policy, Target
from amlhpc.jobs.managed.record import iso, now_utc, record_name
from amlhpc.jobs.managed.settings import MANAGED_JSON
from amlhpc.jobs.plan import build
from amlhpc.jobs.recipes.schema import Recipe
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.workloads import env as workload_env

TEMPLATE_PATH = DEFAULT_TEMPLATE
"""Where the recipe's cluster's training job template sits in the controller's snapshot."""
CONTROLLER_ENVIRONMENT = "aml-hpc-controller"
"""The stack's registered environment for the controller (amlhpc/images/controller/Dockerfile)."""
SUPERVISION_CONTAINER = "supervision"
"""The logical container of the run records (stack outputs storage.containers)."""
CONTROLLER_CODE = ("amlhpc/jobs/managed", "amlhpc/jobs/runtime")


def template_path(cluster: str, primary: bool) -> str:
    return TEMPLATE_PATH if primary else f"managed/training-job-{cluster}.yml"


@dataclass(frozen=True)
class ManagedPlan:
    run: str
    """The managed run's name: the first controller job's name and the checkpoint prefix's last part."""
    recipe: str
    training: build.JobPlan
    policy: Policy
    controller_job: str
    cluster: str
    identity_client_id: str
    storage: dict[str, str]
    """account_url, container (checkpoints), prefix (the checkpoint prefix), writers, supervision,
    supervision_account_url (the coordination account's endpoint)."""
    workspace: dict[str, str]
    timeout_s: int
    environment: str
    """The controller's environment: azureml:aml-hpc-controller:<tag> (or an image reference)."""
    secret: str
    """Signs the attempts' evidence; kept in the controller's job definition only."""
    fallbacks: tuple[build.JobPlan, ...] = ()
    resume_token: dict[str, str] | None = None
    shrink_skipped: tuple[int, ...] = ()
    """Counts from managed.min_nodes up that the global batch does not split over (not used)."""

    @property
    def record_blob(self) -> str:
        return f"{self.storage['supervision']}/{record_name(self.storage['prefix'])}"

    @property
    def templates(self) -> dict[str, build.JobPlan]:
        """Snapshot path -> the training job planned for that target."""
        plans = (self.training, *self.fallbacks)
        return {t.template: plan for t, plan in zip(self.policy.targets, plans, strict=True)}

    def settings(self) -> dict[str, Any]:
        """AMLHPC_MANAGED_JSON: what the controller needs to know."""
        return {"run": self.run, "recipe": self.recipe, "experiment": self.training.experiment,
                "workspace": self.workspace, "storage": self.storage, "policy": self.policy.to_json(),
                "secret": self.secret, "resume": self.resume_token}


def plan_managed(recipe: Recipe, outputs: StackOutputs, training: build.JobPlan, *, max_restarts: int | None = None,
                 resume: str | None = None, secret: str | None = None, allow_tcp: bool = False) -> ManagedPlan:
    """The controller's plan for a planned training job; UserError names what is missing.
    `secret`: the run's evidence secret when resuming (the earlier controller's), else new."""
    reference = recipe.reference
    problems = []
    if contract.CHECKPOINT_JSON not in training.environment_variables:
        problems.append(Problem(reference, "checkpoint.enabled", "a managed run resumes from checkpoints, and the "
                                "recipe turns them off", "set checkpoint.enabled: true (or --set checkpoint.enabled=true)"))
    if outputs.controller is None:
        problems.append(Problem(f"stack {outputs.stack!r} outputs", "controller", "the stack declares no controller "
                                "cluster for managed runs", f"enable aml-hpc:controller in Pulumi.{outputs.environment}"
                                ".yaml (it is on by default) and deploy the environment stack"))
    if max_restarts is not None and not 0 <= max_restarts <= 100:
        problems.append(Problem("command line", "--max-restarts", f"{max_restarts} is outside 0..100",
                                "e.g. --max-restarts 3"))
    supervision = outputs.storage.containers.get(SUPERVISION_CONTAINER)
    if supervision is None:
        problems.append(Problem(f"stack {outputs.stack!r} outputs", f"storage.containers.{SUPERVISION_CONTAINER}",
                                "the stack has no container for managed runs' records (one jobs cannot write)",
                                f"deploy the environment stack {outputs.environment!r} with this version"))
    environment = outputs.registry.environment_ids.get(CONTROLLER_ENVIRONMENT) or \
        outputs.registry.environments.get(CONTROLLER_ENVIRONMENT)
    if environment is None:
        problems.append(Problem(f"stack {outputs.stack!r} outputs", f"registry.environments.{CONTROLLER_ENVIRONMENT}",
                                "the stack registers no controller image (Azure ML must not build the controller's "
                                "environment: prod reaches no package index)",
                                f"build it (`{invocation.command('images', 'build --stack ' + outputs.stack)}`), then deploy the stack"))
    unknown = [c for c in recipe.managed.fallback_clusters if c not in outputs.clusters]
    if unknown:
        problems.append(Problem(reference, "managed.fallback_clusters", f"{', '.join(unknown)}: not a cluster of stack "
                                f"{outputs.stack!r}", f"clusters: {', '.join(outputs.clusters)}"))
    batch = shrink.batch_of(training.training_command, training.processes_per_node, _deepspeed_config(training))
    shrink_nodes, skipped = shrink.counts(training.instance_count, recipe.managed.min_nodes, batch)
    problems += _shrink_problems(reference, recipe, training, batch, shrink_nodes, skipped)
    if problems:
        raise UserError(problems, "cannot submit a managed run")
    assert outputs.controller is not None and environment is not None and supervision is not None
    checkpoint = json.loads(training.environment_variables[contract.CHECKPOINT_JSON])
    run = resume or training.name
    limits = [(recipe.cost.ceiling_usd, f"{reference}: cost.ceiling_usd")]
    if outputs.budget is not None:
        limits.append((outputs.budget.monthly_amount_usd, f"stack {outputs.stack!r} monthly budget"))
    limit = min(((v, s) for v, s in limits if v is not None), default=(None, ""))
    fallbacks = tuple(build.plan_job(recipe, outputs, cluster=c, nodes=training.instance_count,
                                     processes_per_node=training.processes_per_node, allow_tcp=allow_tcp,
                                     hours=training.estimate.hours, name=training.name, resume=resume)
                      for c in recipe.managed.fallback_clusters if c != training.cluster)
    targets = tuple(Target(plan.cluster, plan.instance_count, plan.estimate.usd_per_node_hour, plan.priority,
                           template_path(plan.cluster, i == 0), outputs.clusters[plan.cluster].max_nodes)
                    for i, plan in enumerate((training, *fallbacks)))
    m = recipe.managed
    policy = Policy(nodes=training.instance_count, usd_per_node_hour=training.estimate.usd_per_node_hour,
                    expected_hours=training.estimate.hours,
                    max_restarts=m.max_restarts if max_restarts is None else max_restarts,
                    retry_on=tuple(m.retry_on), backoff_s=m.backoff_s, backoff_max_s=m.backoff_max_s,
                    limit_usd=limit[0], limit_source=limit[1], controller_usd_per_hour=outputs.controller.usd_per_hour,
                    targets=targets, queue_timeout_s=m.queue_timeout_s,
                    fallback_after_preemptions=m.fallback_after_preemptions,
                    checkpoint_interval_s=recipe.checkpoint.interval_s, straggler_factor=m.straggler_factor,
                    straggler_looks=m.straggler_looks, stall_s=m.stall_s,
                    silent_node_s=m.silent_node_s, shrink_nodes=shrink_nodes)
    backoffs = sum(policy.backoff(n) for n in range(1, policy.max_restarts + 1))
    longest = max(plan.timeout_s for plan in (training, *fallbacks))
    return ManagedPlan(
        run=run, recipe=recipe.name, training=training, policy=policy,
        controller_job=run if resume is None else f"{run}-c{secrets.token_hex(2)}",
        cluster=outputs.controller.cluster, identity_client_id=outputs.controller.identity.client_id,
        storage={"account_url": outputs.storage.blob_endpoint, "container": checkpoint["container"],
                 "prefix": checkpoint["prefix"], "writers": checkpoint.get("writers", "rank0"),
                 "supervision": supervision, "supervision_account_url": outputs.coordination_endpoint()},
        workspace={"subscription_id": outputs.subscription_id, "resource_group": outputs.resource_group,
                   "name": outputs.workspace},
        timeout_s=int((policy.max_restarts + 1) * longest + backoffs + 3600),
        environment=environment, secret=secret or secrets.token_hex(32), fallbacks=fallbacks,
        resume_token={"token": secrets.token_hex(8), "at": iso(now_utc()) or ""} if resume else None,
        shrink_skipped=skipped)


def _deepspeed_config(training: build.JobPlan) -> dict[str, Any] | None:
    raw = training.environment_variables.get(workload_env.DEEPSPEED_JSON)
    return json.loads(raw).get("config") if raw else None


def _shrink_problems(reference: str, recipe: Recipe, training: build.JobPlan, batch: shrink.Batch,
                     shrink_nodes: tuple[int, ...], skipped: tuple[int, ...]) -> list[Problem]:
    """What stops shrink-and-continue from keeping the global batch (managed.min_nodes below the nodes)."""
    floor, nodes = recipe.managed.min_nodes, training.instance_count
    if floor is None or floor >= nodes:
        return []
    if batch.global_batch is None:
        return [Problem(reference, "command", f"managed.min_nodes {floor} lets a restart run on fewer than {nodes} "
                        f"nodes, and the command does not name its global batch ({shrink.GLOBAL_BATCH_FLAG}): on fewer "
                        "nodes it would train with a smaller one",
                        f"add {shrink.GLOBAL_BATCH_FLAG} N to the command (now micro batch {batch.micro_batch} x "
                        f"accumulation {batch.accumulation} x {batch.ranks_per_node * nodes} ranks = {batch.now(nodes)}), "
                        "with N a multiple of the micro batch x ranks of every count you allow")]
    if not batch.splits_over(nodes):
        return [Problem(reference, "command", f"{shrink.GLOBAL_BATCH_FLAG} {batch.global_batch} does not split over "
                        f"{nodes} nodes x {batch.ranks_per_node} ranks x micro batch {batch.micro_batch}",
                        f"use a multiple of {batch.micro_batch * batch.ranks_per_node * nodes}")]
    if not shrink_nodes:
        return [Problem(reference, "managed.min_nodes", f"{shrink.GLOBAL_BATCH_FLAG} {batch.global_batch} splits over "
                        f"none of {', '.join(map(str, skipped))} nodes ({batch.ranks_per_node} ranks each, micro batch "
                        f"{batch.micro_batch}): the run could never shrink",
                        "choose a global batch those counts divide, or a min_nodes that divides it (or drop min_nodes)")]
    return []


# --- documents --------------------------------------------------------------------------


def training_template(mplan: ManagedPlan, plan: build.JobPlan | None = None) -> dict[str, Any]:
    """The training job every attempt on a cluster is made from (name, run id and code set per attempt)."""
    plan = plan or mplan.training
    plan = replace(plan, tags={**plan.tags, "managed_run": mplan.run, "record": mplan.record_blob})
    document = build.to_job_dict(plan, "..")
    document["code"] = ".."  # the snapshot root, seen from managed/; each attempt uses the controller's code asset
    return document


def controller_job(mplan: ManagedPlan, code_path: str | Path):
    """The controller's CommandJob (azure-ai-ml public entities)."""
    from azure.ai.ml.entities import (
        CommandJob,
        CommandJobLimits,
        JobResourceConfiguration,
        ManagedIdentityConfiguration,
    )

    plan = mplan.training
    return CommandJob(
        name=mplan.controller_job,
        display_name=f"{mplan.recipe} managed run (controller)",
        experiment_name=plan.experiment,
        description=f"aml-hpc managed run {mplan.run}: supervises {plan.instance_count} x {plan.sku} on {plan.cluster}",
        tags={"managed_run": mplan.run, "role": "controller", "recipe": mplan.recipe, "stack": plan.stack,
              "record": mplan.record_blob, "estimated_usd": plan.tags.get("estimated_usd", "")},
        code=str(code_path),
        command="python -m amlhpc.jobs.managed.controller",
        environment=mplan.environment,
        environment_variables={MANAGED_JSON: json.dumps(mplan.settings(), separators=(",", ":")),
                               "AZURE_CLIENT_ID": mplan.identity_client_id},
        compute=mplan.cluster,
        resources=JobResourceConfiguration(instance_count=1),
        identity=ManagedIdentityConfiguration(client_id=mplan.identity_client_id),
        limits=CommandJobLimits(timeout=mplan.timeout_s),
    )


def controller_document(mplan: ManagedPlan, code_path: str | Path) -> dict[str, Any]:
    return build.command_job_document(controller_job(mplan, code_path))


def to_yaml(mplan: ManagedPlan, code_path: str | Path) -> str:
    """The jobs as one YAML stream: the controller job, then the training job template of each cluster."""
    import yaml

    head = (f"# managed run {mplan.run}: the controller job (what is submitted), then the training job template"
            f"{'s of its clusters' if mplan.fallbacks else ''}\n"
            f"# each attempt is its cluster's template named {mplan.run}-a<n>, with the controller's code;\n"
            f"# attempts: 1 + up to {mplan.policy.max_restarts} restarts on "
            f"{', '.join(map(str, mplan.policy.retry_on))}\n"
            + "".join(f"# {line}\n" for line in describe_shrink(mplan)))
    documents = [controller_document(mplan, code_path)]
    documents += [training_template(mplan, plan) for plan in mplan.templates.values()]
    return head + yaml.safe_dump_all(documents, sort_keys=False, width=120)


def validate(mplan: ManagedPlan, code_path: str | Path) -> None:
    """Load both documents back with azure-ai-ml's own schema (load_job), as `az ml job
    create -f` would; UserError names the document and the SDK's complaint."""
    import tempfile

    import yaml
    from azure.ai.ml import load_job

    problems = []
    with tempfile.TemporaryDirectory(prefix="amlhpc-managed-") as tmp:
        (Path(tmp) / "managed").mkdir()
        documents = [("controller job", controller_document(mplan, code_path), Path(tmp) / "c.yml")]
        documents += [(f"training job template for {plan.cluster}", training_template(mplan, plan), Path(tmp) / path)
                      for path, plan in mplan.templates.items()]
        for label, document, path in documents:
            path.write_text(yaml.safe_dump(document, sort_keys=False))
            try:
                load_job(path)
            except Exception as exc:  # noqa: BLE001 - the SDK raises several kinds; all mean the same here
                problems.append(Problem(label, "", f"azure-ai-ml rejects it: {str(exc).splitlines()[0][:300]}",
                                        "report this: the renderer produced a job Azure ML would refuse"))
    if problems:
        raise UserError(problems, "managed run does not validate")


# --- the snapshot -----------------------------------------------------------------------


def snapshot(mplan: ManagedPlan, root: Path = build.REPO_ROOT, dest_root: Path = build.SNAPSHOT_ROOT) -> Path:
    """The controller's code: the training snapshot, amlhpc/jobs/managed and the training template,
    content-addressed like build.snapshot."""
    import yaml

    base = build.snapshot(tuple(dict.fromkeys((*mplan.training.code_dirs, *CONTROLLER_CODE))), root, dest_root)
    templates = {path: yaml.safe_dump(training_template(mplan, plan), sort_keys=False, width=120)
                 for path, plan in mplan.templates.items()}
    digest = hashlib.sha256(base.name.encode() + b"\0" + json.dumps(templates, sort_keys=True).encode()).hexdigest()[:16]
    dest = dest_root / f"managed-{digest}"
    if not dest.is_dir():
        with atomic.new_folder(dest) as tmp:  # a failed copy leaves no .tmp-* behind
            shutil.copytree(base, tmp, dirs_exist_ok=True)
            for path, text in templates.items():
                (tmp / path).parent.mkdir(parents=True, exist_ok=True)
                (tmp / path).write_text(text)
    return dest


def describe_shrink(mplan: ManagedPlan) -> list[str]:
    """The shrink-and-continue rule of the run, for the submit summary (empty: it never shrinks)."""
    counts = mplan.policy.shrink_nodes
    if not counts:
        return []
    lines = [f"shrink-and-continue: after a lost node, an attempt that cannot get {mplan.training.instance_count} nodes "
             f"is followed by one on {', then '.join(map(str, counts))} (managed.min_nodes), before the next cluster; "
             "the command's --global-batch is kept"]
    if mplan.shrink_skipped:
        lines.append(f"not {', '.join(map(str, mplan.shrink_skipped))} nodes: the global batch does not split over them")
    return lines


def describe_retry(policy: Policy) -> list[str]:
    """One line per retried cause, for the submit summary."""
    lines = []
    for entry in policy.retry_on:
        cause = causes.CAUSES.get(entry) if isinstance(entry, str) else None
        lines.append(f"{entry}: {cause.summary}" if cause else f"exit status {entry} of the training")
    return lines
