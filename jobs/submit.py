"""Everything that talks to Azure ML: the only module that calls MLClient.

Each function receives an MLClient (tests pass a pytest-mock fake and assert what it
received); `connect()` makes the real one from the stack outputs with the credential of
jobs/credentials.py. Azure errors that mean bad input (unknown job, not logged in, no
role, unreachable) become UserError with the fix.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.errors import Problem, UserError
from core.outputs import StackOutputs
from jobs import quota as quota_mod
from jobs.build import JobPlan, to_command_job
from jobs.workloads import env as workload_env

Printer = Callable[[str], None]


def connect(outputs: StackOutputs):
    """MLClient for the stack's workspace, signed in up front (jobs/credentials.py: az login,
    managed identity, OIDC...; no sign-in fails within seconds with the fix)."""
    from jobs import credentials

    signed_in = credentials.credential(credentials.MANAGEMENT)  # before the SDK's long import
    from azure.ai.ml import MLClient

    return MLClient(signed_in, outputs.subscription_id, outputs.resource_group, outputs.workspace)


@contextmanager
def azure_errors(what: str, workspace: str):
    """Turn Azure's 'not found' and authentication failures into UserError with the fix."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
    )

    try:
        yield
    except ResourceNotFoundError:
        raise UserError([Problem(f"workspace {workspace!r}", what, "not found",
                                 "check the job name (`python -m jobs status` needs the exact name printed by submit) and --stack")],
                        "not found") from None
    except (ClientAuthenticationError, HttpResponseError, ServiceRequestError) as exc:
        from jobs import credentials

        known = credentials.explain(exc, target=f"workspace {workspace!r}: {what}", role=credentials.WORKSPACE_ROLE,
                                    grant="ask an owner of the workspace (or its resource group) to assign it")
        if known is None:
            raise
        raise known from None


def submit(ml_client, plan: JobPlan, code_path: str | Path, *, follow: bool = False, echo: Printer = print):
    """Create the job, print its Studio URL, optionally stream its logs until it ends."""
    job = to_command_job(plan, code_path)
    with azure_errors(f"job {plan.name}", plan.stack):
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


def cancel(ml_client, name: str, workspace: str) -> None:
    with azure_errors(f"job {name}", workspace):
        poller = ml_client.jobs.begin_cancel(name)
        poller.result()


def download(ml_client, name: str, workspace: str, path: Path, output_name: str | None = None, everything: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with azure_errors(f"job {name}", workspace):
        ml_client.jobs.download(name, download_path=str(path), output_name=output_name, all=everything)
    return path


def usage_by_name(ml_client, location: str) -> dict[str, tuple[int, int]]:
    """{quota name: (current vCPUs, limit)} for the region."""
    result = {}
    with azure_errors("compute usage", location):
        for usage in ml_client.compute.list_usage(location=location):
            name = getattr(getattr(usage, "name", None), "value", None)
            if name and usage.limit is not None:
                result[name] = (int(usage.current_value or 0), int(usage.limit))
    return result


def quota(ml_client, outputs: StackOutputs, requests: Iterable[tuple[str, str, str, int]]) -> list[quota_mod.QuotaLine]:
    """Needed vs available vCPUs per family for (cluster, sku, priority, nodes) requests.

    The family comes from the catalog; Azure's size list for the region confirms it (and
    that the size is offered there at all).
    """
    requests = list(requests)
    with azure_errors("VM sizes", outputs.location):
        sizes = {s.name.lower(): s for s in ml_client.compute.list_sizes(location=outputs.location)}
    missing = [sku for _, sku, _, _ in requests if sku.lower() not in sizes]
    if missing:
        raise UserError([Problem(f"region {outputs.location}", "vmSize", f"{sku} is not offered for Azure ML compute here",
                                 "pick a region that offers it, or another size") for sku in sorted(set(missing))],
                        "VM size not available")
    needs = quota_mod.needs(requests)
    return quota_mod.compare(needs, usage_by_name(ml_client, outputs.location))


def cluster_nodes(ml_client, cluster: str) -> list[Any]:
    """The cluster's nodes (AmlComputeNodeInformation: node_id, node_state, IP addresses, port)."""
    return list(ml_client.compute.list_nodes(cluster))


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
