"""The submit side of a managed run: from the planned training job to the controller job
that supervises it (`python -m jobs submit RECIPE --managed`).

What is submitted is the controller job only, on the stack's controller cluster (stack
output `controller`) as the controller identity. Its code snapshot is the training job's
(the recipe's `code` folders) plus jobs/managed and the rendered training job template
(`managed/training-job.yml`); the controller submits every attempt from that template
with the code asset of its own job, so the run uploads its code once. Settings travel in
AMLHPC_MANAGED_JSON (controller.py).

The controller's environment is Azure ML's CPU base image with the three SDKs it needs,
pinned to the versions of this checkout's uv.lock; Azure ML builds it once per set of pins.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from core.errors import Problem, UserError
from core.outputs import StackOutputs
from jobs import build
from jobs.managed import causes
from jobs.managed.controller import MANAGED_JSON
from jobs.managed.policy import Policy
from jobs.managed.record import record_name
from jobs.recipes.schema import Recipe
from jobs.runtime import contract

TEMPLATE_PATH = "managed/training-job.yml"
"""Where the training job template sits in the controller's snapshot."""
CONTROLLER_IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:20241202.v1"
"""Azure ML's CPU base image (Ubuntu 22.04, conda), a released tag from its release notes
(Azure/AzureML-Containers images/openmpi4.1.0-ubuntu22.04/release-notes.md, read 2026-11)."""
CONTROLLER_PACKAGES = ("azure-ai-ml", "azure-identity", "azure-storage-blob")
CONTROLLER_PYTHON = "3.11"
CONTROLLER_CODE = ("jobs/managed", "jobs/runtime")


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
    """account_url, container, prefix (the checkpoint prefix), writers."""
    workspace: dict[str, str]
    timeout_s: int

    @property
    def record_blob(self) -> str:
        return f"{self.storage['container']}/{record_name(self.storage['prefix'])}"

    def settings(self) -> dict[str, Any]:
        """AMLHPC_MANAGED_JSON: what the controller needs to know."""
        return {"run": self.run, "recipe": self.recipe, "experiment": self.training.experiment,
                "workspace": self.workspace, "storage": self.storage, "template": TEMPLATE_PATH,
                "policy": self.policy.to_json()}


def plan_managed(recipe: Recipe, outputs: StackOutputs, training: build.JobPlan, *, max_restarts: int | None = None,
                 resume: str | None = None) -> ManagedPlan:
    """The controller's plan for a planned training job; UserError names what is missing."""
    reference = f"jobs/recipes/{recipe.name}.yaml"
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
    if problems:
        raise UserError(problems, "cannot submit a managed run")
    assert outputs.controller is not None
    checkpoint = json.loads(training.environment_variables[contract.CHECKPOINT_JSON])
    run = resume or training.name
    limits = [(recipe.cost.ceiling_usd, f"{reference}: cost.ceiling_usd")]
    if outputs.budget is not None:
        limits.append((outputs.budget.monthly_amount_usd, f"stack {outputs.stack!r} monthly budget"))
    limit = min(((v, s) for v, s in limits if v is not None), default=(None, ""))
    policy = Policy(nodes=training.instance_count, usd_per_node_hour=training.estimate.usd_per_node_hour,
                    expected_hours=training.estimate.hours,
                    max_restarts=recipe.managed.max_restarts if max_restarts is None else max_restarts,
                    retry_on=tuple(recipe.managed.retry_on), backoff_s=recipe.managed.backoff_s,
                    backoff_max_s=recipe.managed.backoff_max_s, limit_usd=limit[0], limit_source=limit[1],
                    controller_usd_per_hour=outputs.controller.usd_per_hour)
    backoffs = sum(policy.backoff(n) for n in range(1, policy.max_restarts + 1))
    return ManagedPlan(
        run=run, recipe=recipe.name, training=training, policy=policy,
        controller_job=run if resume is None else f"{run}-c{secrets.token_hex(2)}",
        cluster=outputs.controller.cluster, identity_client_id=outputs.controller.identity.client_id,
        storage={"account_url": outputs.storage.blob_endpoint, "container": checkpoint["container"],
                 "prefix": checkpoint["prefix"], "writers": checkpoint.get("writers", "rank0")},
        workspace={"subscription_id": outputs.subscription_id, "resource_group": outputs.resource_group,
                   "name": outputs.workspace},
        timeout_s=int((policy.max_restarts + 1) * training.timeout_s + backoffs + 3600))


# --- documents --------------------------------------------------------------------------


def training_template(mplan: ManagedPlan) -> dict[str, Any]:
    """The training job every attempt is made from (name, run id and code set per attempt)."""
    plan = replace(mplan.training, tags={**mplan.training.tags, "managed_run": mplan.run})
    document = build.to_job_dict(plan, "..")
    document["code"] = ".."  # the snapshot root, seen from managed/; each attempt uses the controller's code asset
    return document


def controller_packages(lock: Path = build.REPO_ROOT / "uv.lock") -> dict[str, str]:
    """The controller's SDK versions: exactly this checkout's (uv.lock)."""
    # the project itself has no locked version (core/version.py writes it): only the packages
    found = {p["name"]: p["version"] for p in tomllib.loads(lock.read_text()).get("package", []) if "version" in p}
    missing = [name for name in CONTROLLER_PACKAGES if name not in found]
    if missing:
        raise UserError([Problem(str(lock), "package", f"{', '.join(missing)} not locked",
                                 "run `make bootstrap` (uv lock) in a complete checkout")], "incomplete checkout")
    return {name: found[name] for name in CONTROLLER_PACKAGES}


def controller_job(mplan: ManagedPlan, code_path: str | Path):
    """The controller's CommandJob (azure-ai-ml public entities)."""
    from azure.ai.ml.entities import (
        CommandJob,
        CommandJobLimits,
        Environment,
        JobResourceConfiguration,
        ManagedIdentityConfiguration,
    )

    pins = controller_packages()
    conda = {"name": "aml-hpc-controller", "channels": ["conda-forge"],
             "dependencies": [f"python={CONTROLLER_PYTHON}", "pip",
                              {"pip": [f"{name}=={version}" for name, version in pins.items()]}]}
    plan = mplan.training
    return CommandJob(
        name=mplan.controller_job,
        display_name=f"{mplan.recipe} managed run (controller)",
        experiment_name=plan.experiment,
        description=f"aml-hpc managed run {mplan.run}: supervises {plan.instance_count} x {plan.sku} on {plan.cluster}",
        tags={"managed_run": mplan.run, "role": "controller", "recipe": mplan.recipe, "stack": plan.stack,
              "record": mplan.record_blob, "estimated_usd": plan.tags.get("estimated_usd", "")},
        code=str(code_path),
        command="python -m jobs.managed.controller",
        environment=Environment(image=CONTROLLER_IMAGE, conda_file=conda),
        environment_variables={MANAGED_JSON: json.dumps(mplan.settings(), separators=(",", ":")),
                               "AZURE_CLIENT_ID": mplan.identity_client_id},
        compute=mplan.cluster,
        resources=JobResourceConfiguration(instance_count=1),
        identity=ManagedIdentityConfiguration(client_id=mplan.identity_client_id),
        limits=CommandJobLimits(timeout=mplan.timeout_s),
    )


def controller_document(mplan: ManagedPlan, code_path: str | Path) -> dict[str, Any]:
    # an inline environment: Azure ML names and versions it by content on submit
    return build.command_job_document(controller_job(mplan, code_path), ("image", "conda_file"))


def to_yaml(mplan: ManagedPlan, code_path: str | Path) -> str:
    """Both jobs as one YAML stream: the controller job, then the training job template."""
    import yaml

    head = (f"# managed run {mplan.run}: the controller job (what is submitted), then the training job template\n"
            f"# each attempt is the template named {mplan.run}-a<n>, with the controller's code;\n"
            f"# attempts: 1 + up to {mplan.policy.max_restarts} restarts on "
            f"{', '.join(map(str, mplan.policy.retry_on))}\n")
    return head + yaml.safe_dump_all([controller_document(mplan, code_path), training_template(mplan)],
                                     sort_keys=False, width=120)


def validate(mplan: ManagedPlan, code_path: str | Path) -> None:
    """Load both documents back with azure-ai-ml's own schema (load_job), as `az ml job
    create -f` would; UserError names the document and the SDK's complaint."""
    import tempfile

    import yaml
    from azure.ai.ml import load_job

    problems = []
    with tempfile.TemporaryDirectory(prefix="amlhpc-managed-") as tmp:
        (Path(tmp) / "managed").mkdir()
        for label, document, path in (("controller job", controller_document(mplan, code_path), Path(tmp) / "c.yml"),
                                      ("training job template", training_template(mplan), Path(tmp) / TEMPLATE_PATH)):
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
    """The controller's code: the training snapshot, jobs/managed and the training template,
    content-addressed like build.snapshot."""
    import yaml

    base = build.snapshot(tuple(dict.fromkeys((*mplan.training.code_dirs, *CONTROLLER_CODE))), root, dest_root)
    template = yaml.safe_dump(training_template(mplan), sort_keys=False, width=120)
    digest = hashlib.sha256(base.name.encode() + b"\0" + template.encode()).hexdigest()[:16]
    dest = dest_root / f"managed-{digest}"
    if not dest.is_dir():
        tmp = dest_root / f".tmp-{secrets.token_hex(4)}"
        shutil.copytree(base, tmp)
        (tmp / TEMPLATE_PATH).parent.mkdir(parents=True, exist_ok=True)
        (tmp / TEMPLATE_PATH).write_text(template)
        try:
            tmp.rename(dest)
        except OSError:  # made concurrently by another submit
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def describe_retry(policy: Policy) -> list[str]:
    """One line per retried cause, for the submit summary."""
    lines = []
    for entry in policy.retry_on:
        cause = causes.CAUSES.get(entry) if isinstance(entry, str) else None
        lines.append(f"{entry}: {cause.summary}" if cause else f"exit status {entry} of the training")
    return lines
