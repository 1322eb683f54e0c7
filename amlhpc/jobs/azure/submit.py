"""Everything that talks to Azure ML: the only module that calls MLClient.

Each function receives an MLClient (tests pass a pytest-mock fake and assert what it
received); `connect()` makes the real one from the stack outputs with the credential of
amlhpc/jobs/azure/credentials.py. Azure errors that mean bad input (unknown job, not logged in, no
role, unreachable) become UserError with the fix.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from amlhpc.core import invocation, skus
from amlhpc.core.errors import Problem, UserError
from amlhpc.core.outputs import StackOutputs
from amlhpc.jobs.plan import quota as quota_mod
from amlhpc.jobs.plan.build import JobPlan, to_command_job
from amlhpc.jobs.workloads import env as workload_env

Printer = Callable[[str], None]


def connect(outputs: StackOutputs):
    """MLClient for the stack's workspace, signed in up front (amlhpc/jobs/azure/credentials.py: az login,
    managed identity, OIDC...; no sign-in fails within seconds with the fix)."""
    from amlhpc.jobs.azure import credentials

    signed_in = credentials.credential(credentials.MANAGEMENT)  # before the SDK's long import
    from azure.ai.ml import MLClient

    return MLClient(signed_in, outputs.subscription_id, outputs.resource_group, outputs.workspace)


NOT_FOUND_JOB = f"check the job name (`{invocation.command('jobs', 'status')}` needs the exact name printed by submit) and --stack"
NOT_FOUND_SUBMIT = ("something the job names does not exist in the workspace (the cluster, the environment or a "
                    "datastore): check the name in the message against the stack's outputs, deploy the stack "
                    "(`pulumi up`), or pick another --cluster")


def _service_message(exc) -> tuple[str, str]:
    """(error code, first line of the message) from an Azure error, without the SDK's noise."""
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None) or getattr(exc, "error_code", None) or type(exc).__name__
    message = getattr(error, "message", None) or getattr(exc, "message", None) or str(exc)
    first = next((line.strip() for line in str(message).splitlines() if line.strip() and not line.startswith("(")), str(message))
    return str(code), first[:400]


@contextmanager
def azure_errors(what: str, workspace: str, not_found: str = NOT_FOUND_JOB):
    """Turn Azure's errors that mean bad input (not found, rejected, conflict, invalid) and
    authentication failures into one UserError block with the fix."""
    from azure.ai.ml.exceptions import ValidationException
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceExistsError,
        ResourceNotFoundError,
        ServiceRequestError,
    )

    where = f"workspace {workspace!r}"
    try:
        yield
    except ResourceNotFoundError as exc:
        raise UserError([Problem(where, what, f"not found: {_service_message(exc)[1]}", not_found)], "not found") from None
    except ValidationException as exc:
        raise UserError([Problem(where, what, f"azure-ai-ml refused the job before sending it: {_service_message(exc)[1]}",
                                 "fix the recipe value the message names; `--dry-run` prints the job as Azure ML YAML")],
                        "invalid job") from None
    except ResourceExistsError as exc:
        code, message = _service_message(exc)
        raise UserError([Problem(where, what, f"conflict ({code}): {message}",
                                 "a job of that name exists or the resource is being changed: submit again "
                                 "(a new name is generated), or pass another --set name")], "conflict") from None
    except (ClientAuthenticationError, HttpResponseError, ServiceRequestError) as exc:
        from amlhpc.jobs.azure import credentials

        # sign-in, access and network failures: one explanation each, with the role or the fix
        known = credentials.explain(exc, target=f"{where}: {what}", role=credentials.WORKSPACE_ROLE,
                                    grant="ask an owner of the workspace (or its resource group) to assign it")
        if known is not None:
            raise known from None
        if not isinstance(exc, HttpResponseError):
            raise
        code, message = _service_message(exc)
        if exc.status_code == 409:
            raise UserError([Problem(where, what, f"conflict ({code}): {message}",
                                     "the resource is being changed or the name is taken: wait and submit again")],
                            "conflict") from None
        if exc.status_code == 400:
            raise UserError([Problem(where, what, f"Azure ML rejected it ({code}): {message}",
                                     "fix the value the message names (`--dry-run` prints the job as Azure ML YAML)")],
                            "rejected by Azure ML") from None
        raise


def submit(ml_client, plan: JobPlan, code_path: str | Path, *, follow: bool = False, echo: Printer = print):
    """Create the job, print its Studio URL, optionally stream its logs until it ends."""
    job = to_command_job(plan, code_path)
    with azure_errors(f"job {plan.name}", plan.stack, not_found=NOT_FOUND_SUBMIT):
        created = ml_client.jobs.create_or_update(job, experiment_name=plan.experiment)
    echo(f"submitted {created.name} ({plan.instance_count} x {plan.sku}, {plan.processes_per_node} processes per node)")
    if getattr(created, "studio_url", None):
        echo(f"studio: {created.studio_url}")
    if follow:
        stream(ml_client, created.name, plan.stack)
    return created


def status(ml_client, name: str, workspace: str) -> dict[str, Any]:
    with azure_errors(f"job {name}", workspace):
        job = ml_client.jobs.get(name)
    return {"name": job.name, "status": job.status, "display_name": getattr(job, "display_name", None),
            "experiment": getattr(job, "experiment_name", None), "compute": getattr(job, "compute", None),
            "created": str((getattr(job, "creation_context", None) and job.creation_context.created_at) or ""),
            "studio_url": getattr(job, "studio_url", None), "tags": dict(getattr(job, "tags", None) or {})}


def stream(ml_client, name: str, workspace: str) -> None:
    with azure_errors(f"job {name}", workspace):
        ml_client.jobs.stream(name)


def services(ml_client, name: str, workspace: str, node_index: int = 0) -> dict[str, Any]:
    """The job services node `node_index` of a running job exposes (azure-ai-ml's
    JobOperations.show_services: name -> ServiceInstance with type, status, endpoint, port, error)."""
    with azure_errors(f"job {name}", workspace):
        return dict(ml_client.jobs.show_services(name, node_index=node_index) or {})


def cancel(ml_client, name: str, workspace: str) -> None:
    with azure_errors(f"job {name}", workspace):
        poller = ml_client.jobs.begin_cancel(name)
        poller.result()


def download(ml_client, name: str, workspace: str, path: Path, output_name: str | None = None, everything: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with azure_errors(f"job {name}", workspace):
        ml_client.jobs.download(name, download_path=str(path), output_name=output_name, all=everything)
    return path


def _field(obj: Any, *names: str) -> Any:
    """An attribute under any of its names: azure-ai-ml's Usage entity keeps the service's
    camelCase keys (currentValue) next to its own unset snake_case ones, and its name as a dict."""
    for name in names:
        value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
        if value is not None:
            return value
    return None


def usages(ml_client, location: str) -> list[quota_mod.UsageRow]:
    """The region's usage rows as plain data (name, type, id, used, limit)."""
    rows = []
    with azure_errors("compute usage", location):
        for usage in ml_client.compute.list_usage(location=location):
            name = _field(_field(usage, "name") or {}, "value", "localized_value", "localizedValue")
            limit = _field(usage, "limit")
            if not name or limit is None:
                continue
            rows.append(quota_mod.UsageRow(str(name), str(_field(usage, "type") or ""), str(_field(usage, "id") or ""),
                                           int(_field(usage, "current_value", "currentValue") or 0), int(limit)))
    return rows


def quota(ml_client, outputs: StackOutputs, requests: Iterable[tuple[str, str, str, int]]) -> list[quota_mod.QuotaLine]:
    """Needed vs available vCPUs per quota bucket for (cluster, sku, priority, nodes) requests.

    The family comes from the catalog; Azure's size list for the region confirms it (and
    that the size is offered there at all).
    """
    requests = list(requests)
    unknown = [(cluster, sku) for cluster, sku, _, _ in requests if sku.lower() not in {n.lower() for n in skus.names()}]
    if unknown:
        raise UserError([Problem(f"stack {outputs.stack!r} outputs", f"clusters.{cluster}.sku", f"unknown VM size {sku!r}",
                                 f"this checkout's catalog knows {', '.join(skus.names())}: update the checkout, "
                                 "or redeploy the stack with a size it knows") for cluster, sku in unknown],
                        "unknown VM size")
    with azure_errors("VM sizes", outputs.location):
        sizes = {s.name.lower(): s for s in ml_client.compute.list_sizes(location=outputs.location)}
    missing = [sku for _, sku, _, _ in requests if sku.lower() not in sizes]
    if missing:
        raise UserError([Problem(f"region {outputs.location}", "vmSize", f"{sku} is not offered for Azure ML compute here",
                                 "pick a region that offers it, or another size") for sku in sorted(set(missing))],
                        "VM size not available")
    needs = quota_mod.needs(requests)
    return quota_mod.compare(needs, usages(ml_client, outputs.location))


def cluster_nodes(ml_client, cluster: str) -> list[Any]:
    """The cluster's nodes (AmlComputeNodeInformation: node_id, node_state, IP addresses, port)."""
    return list(ml_client.compute.list_nodes(cluster))


BUSY_NODE_STATES = ("running", "preparing")
"""AmlCompute node states of a node that holds a job (idle and leaving nodes hold none)."""


def controller_load(ml_client, cluster: str, workspace: str) -> tuple[int, int | None]:
    """(nodes of the controller cluster holding a managed run's controller, the cluster's maxNodes or None)."""
    with azure_errors(f"cluster {cluster}", workspace):
        nodes = cluster_nodes(ml_client, cluster)
        compute = ml_client.compute.get(cluster)
    busy = sum(1 for node in nodes if str(getattr(node, "node_state", "")).lower() in BUSY_NODE_STATES)
    max_nodes = getattr(compute, "max_instances", None)
    return busy, max_nodes if isinstance(max_nodes, int) else None


ACTIVE_JOB_STATES = ("NotStarted", "Queued", "Preparing", "Provisioning", "Starting", "Running", "Finalizing")
"""Azure ML job statuses of a job that has not ended."""


def active_checkpoint_caps(ml_client, account_url: str, workspace: str) -> list[tuple[str, float]]:
    """(job name, Gb/s) of every active job that checkpoints to `account_url`, from the caps its
    environment carries (amlhpc.jobs.plan.build puts them in AMLHPC_CHECKPOINT_JSON)."""
    from amlhpc.jobs.plan.limits import job_checkpoint_gbps

    found = []
    with azure_errors("active jobs", workspace):
        for job in ml_client.jobs.list():
            if getattr(job, "status", None) not in ACTIVE_JOB_STATES:
                continue
            resources = getattr(job, "resources", None)
            nodes = int(getattr(resources, "instance_count", None) or 1)
            cap = job_checkpoint_gbps(getattr(job, "environment_variables", None) or {}, nodes)
            if cap is not None and cap[0] == account_url:
                found.append((str(job.name), cap[1]))
    return found


def study_jobs(ml_client, study: str, workspace: str) -> list[Any]:
    """Jobs tagged with this scaling study (the service cannot filter by tag: filter here)."""
    with azure_errors(f"study {study}", workspace):
        return [job for job in ml_client.jobs.list() if (getattr(job, "tags", None) or {}).get("study") == study]


def job_metrics(ml_client, name: str, workspace: str) -> dict[str, Any] | None:
    """The run summary the training code wrote (outputs/aml-hpc/metrics.json), or None."""
    with tempfile.TemporaryDirectory(prefix="amlhpc-metrics-") as tmp:
        download(ml_client, name, workspace, Path(tmp))
        for found in Path(tmp).rglob(Path(workload_env.METRICS_FILE).name):
            if found.parent.name == Path(workload_env.METRICS_FILE).parent.name:
                return json.loads(found.read_text())
    return None
