"""The checks `doctor` runs, each a function of what it needs (clients, a command runner, the
environment), so a test can hand it fakes at the seams: ARM and Azure ML through a fake
transport, the Pulumi CLI through a fake runner.

`diagnose()` runs them in order; a check whose prerequisite failed (no sign-in, no stack)
is skipped and says which one. Statuses: pass, fail (the deploy or a submit will fail:
fix it first), warn (may work; read the detail), skip.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from amlhpc.core import invocation
from amlhpc.core.errors import UserError
from amlhpc.core.permissions import MODEL
from amlhpc.core.version import __version__
from amlhpc.doctor.arm import MANAGEMENT_SCOPE, Arm, ArmError, token_claims

Status = Literal["pass", "fail", "warn", "skip"]

# Built-in role definition ids ("Azure built-in roles", learn.microsoft.com: Privileged and
# AI + machine learning, read 2026-11).
OWNER = "8e3af657-a8ff-443c-a75c-2fe8c4bcb635"
CONTRIBUTOR = "b24988ac-6180-42a0-ab88-20f7382dd24c"
USER_ACCESS_ADMINISTRATOR = "18d7d88d-d35e-4fb5-a5c3-7773c20a72d9"
AZUREML_DATA_SCIENTIST = "f6c7c914-8db3-469d-8ca1-694a8f32e121"
SUBMITTER = "submitter"
"""Stands for the stack's custom submitter role (its GUID is derived per subscription)."""
ROLE_NAMES = {OWNER: "Owner", CONTRIBUTOR: "Contributor", USER_ACCESS_ADMINISTRATOR: "User Access Administrator",
              AZUREML_DATA_SCIENTIST: "AzureML Data Scientist", SUBMITTER: "aml-hpc job submitter"}

PROVIDER_OF_MODULE = {
    "machinelearningservices": "Microsoft.MachineLearningServices", "storage": "Microsoft.Storage",
    "keyvault": "Microsoft.KeyVault", "containerregistry": "Microsoft.ContainerRegistry",
    "network": "Microsoft.Network", "privatedns": "Microsoft.Network",
    "operationalinsights": "Microsoft.OperationalInsights", "applicationinsights": "Microsoft.Insights",
    "monitor": "Microsoft.Insights", "insights": "Microsoft.Insights",
    "managedidentity": "Microsoft.ManagedIdentity", "consumption": "Microsoft.Consumption",
    "compute": "Microsoft.Compute", "authorization": "Microsoft.Authorization", "resources": "Microsoft.Resources",
}
"""azure-native module -> the resource provider namespace its resources are created by."""
ALWAYS_REGISTERED = {"Microsoft.Authorization", "Microsoft.Resources"}
SUBSCRIPTION_VARIABLES = ("ARM_SUBSCRIPTION_ID", "AZURE_SUBSCRIPTION_ID")
PASSPHRASE_VARIABLES = ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE")


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    found: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {"check": self.name, "status": self.status, "found": self.found, "fix": self.fix}


@dataclass
class Target:
    """What the stack declares (its offline plan), as far as the checks need it."""

    stack: str
    outputs: Any
    """amlhpc.core.outputs.StackOutputs of the plan (synthetic subscription and ids)."""
    providers: list[str]
    submitters: list[str]
    """Object ids in aml-hpc:submitters of the stack's environment."""
    environment_file: str


@dataclass
class Seams:
    """Everything outside this process the checks talk to."""

    credential: Callable[[], Any]
    arm: Callable[[Any], Arm] = Arm
    ml_client: Callable[[Any, str, Any], Any] | None = None
    run: Callable[[Sequence[str]], subprocess.CompletedProcess[str]] = field(
        default=lambda argv: subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False))
    which: Callable[[str], str | None] = shutil.which
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def needed_providers(resource_types: Sequence[str]) -> list[str]:
    """Resource provider namespaces the plan's azure-native resources are created by."""
    found = set()
    for token in resource_types:
        if token.startswith("azure-native:"):
            module = token.split(":")[1]
            found.add(PROVIDER_OF_MODULE.get(module, f"Microsoft.{module}"))
    return sorted(found - ALWAYS_REGISTERED)


def python_check() -> Check:
    return Check("Python", "pass", f"aml-hpc {__version__} on Python {platform.python_version()} ({sys.executable})")


def sign_in(seams: Seams) -> tuple[Check, Any, dict[str, Any]]:
    """(check, credential or None, the token's claims)."""
    try:
        credential = seams.credential()
        token = credential.get_token(MANAGEMENT_SCOPE).token
    except UserError as exc:
        return Check("Azure sign-in", "fail", exc.problems[0].message, exc.problems[0].hint), None, {}
    except Exception as exc:  # noqa: BLE001 - any credential failure is this check's answer
        return Check("Azure sign-in", "fail", f"no credential produced a token: {str(exc).splitlines()[0][:160]}",
                     "az login (or a managed identity / workload identity in CI)"), None, {}
    claims = token_claims(token)
    who = claims.get("upn") or claims.get("unique_name") or claims.get("appid") or "a principal"
    oid = claims.get("oid", "")
    detail = f"signed in as {who}" + (f" (object id {oid}, tenant {claims.get('tid', '?')})" if oid else "")
    return Check("Azure sign-in", "pass", detail), credential, claims


def choose_subscription(seams: Seams, target: Target | None) -> tuple[str | None, str]:
    """(subscription id, where it came from): the environment, the az CLI's default, or a
    deployed stack's outputs."""
    for name in SUBSCRIPTION_VARIABLES:
        if seams.environ.get(name):
            return seams.environ[name], name
    if seams.which("az"):
        result = seams.run(["az", "account", "show", "--query", "id", "-o", "tsv"])
        if result.returncode == 0 and result.stdout.strip():
            return result.stdout.strip(), "az account show"
    return None, ""


def subscription_check(arm: Arm, subscription_id: str | None, source: str) -> Check:
    if not subscription_id:
        return Check("subscription", "fail", "no subscription chosen",
                     "az account set --subscription <id> (or export ARM_SUBSCRIPTION_ID=<id>)")
    try:
        sub = arm.subscription(subscription_id)
    except ArmError as exc:
        return Check("subscription", "fail", f"{subscription_id} (from {source}): {exc.status} {exc.code}",
                     "az account list -o table; az account set --subscription <one you can use>")
    state = sub.get("state", "?")
    found = f"{sub.get('displayName', '?')} ({subscription_id}, from {source}): {state}"
    if state != "Enabled":
        return Check("subscription", "fail", found, "use an enabled subscription, or re-enable this one in the portal")
    return Check("subscription", "pass", found)


def pulumi_cli_check(seams: Seams, sdk_version: str) -> Check:
    if not seams.which("pulumi"):
        return Check("Pulumi CLI", "fail", "pulumi is not on PATH",
                     "curl -fsSL https://get.pulumi.com | sh  (then open a new shell)")
    result = seams.run(["pulumi", "version"])
    cli = result.stdout.strip().lstrip("v")
    if result.returncode != 0 or not cli:
        return Check("Pulumi CLI", "fail", f"`pulumi version` failed: {result.stderr.strip()[:160]}",
                     "reinstall it: curl -fsSL https://get.pulumi.com | sh")
    if _version_tuple(cli) < _version_tuple(sdk_version):
        return Check("Pulumi CLI", "warn", f"CLI {cli} is older than the Pulumi SDK {sdk_version} this kit pins",
                     f"curl -fsSL https://get.pulumi.com | sh -s -- --version {sdk_version}")
    return Check("Pulumi CLI", "pass", f"pulumi {cli} (SDK {sdk_version})")


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("-")[0].split("."):
        parts.append(int(piece) if piece.isdigit() else 0)
    return tuple(parts)


def pulumi_backend_check(seams: Seams) -> Check:
    if not seams.which("pulumi"):
        return Check("Pulumi backend", "skip", "needs the Pulumi CLI")
    result = seams.run(["pulumi", "whoami", "--verbose"])
    if result.returncode != 0:
        return Check("Pulumi backend", "fail", f"not logged in to a state backend: {result.stderr.strip()[:160]}",
                     "preview, up and down keep the state in the project's .pulumi-state/ by default; or: pulumi login azblob://<container>"
                     "?storage_account=<account> (docs/deploying.md, step 2)")
    backend = next((line.split(":", 1)[1].strip() for line in result.stdout.splitlines()
                    if line.lower().startswith("backend url")), "?")
    if not any(seams.environ.get(name) for name in PASSPHRASE_VARIABLES):
        return Check("Pulumi backend", "fail", f"backend {backend}; no secrets passphrase in the environment",
                     "export PULUMI_CONFIG_PASSPHRASE='...' (or PULUMI_CONFIG_PASSPHRASE_FILE): it encrypts the stack's "
                     "secrets; keep it safe")
    return Check("Pulumi backend", "pass", f"backend {backend}; secrets passphrase set")


def providers_check(arm: Arm, subscription_id: str, needed: Sequence[str]) -> Check:
    try:
        states = {k.lower(): v for k, v in arm.providers(subscription_id).items()}
    except ArmError as exc:
        return Check("resource providers", "fail", f"cannot list them: {exc.status} {exc.code}",
                     "sign in with an identity that can read the subscription")
    missing = [ns for ns in needed if states.get(ns.lower()) != "Registered"]
    if missing:
        shown = ", ".join(f"{ns} ({states.get(ns.lower()) or 'NotRegistered'})" for ns in missing)
        names = " ".join(ns.removeprefix("Microsoft.") for ns in missing)
        return Check("resource providers", "fail", f"not registered: {shown}",
                     f"for p in {names}; do az provider register -n Microsoft.$p; done")
    return Check("resource providers", "pass", f"{len(needed)} registered: {', '.join(needed)}")


def _covers(scope: str, target: str) -> bool:
    scope = scope.rstrip("/").lower()
    target = target.rstrip("/").lower()
    return scope in ("", "/") or scope.startswith("/providers/microsoft.management/") or target == scope \
        or target.startswith(scope + "/")


def names(role_ids: set[str]) -> str:
    """Role definition ids as their names (built-in ones this check knows), or "none"."""
    return ", ".join(sorted(ROLE_NAMES.get(i, f"custom or other role {i}") for i in role_ids)) or "none"


def _roles_at(assignments: Sequence[dict[str, Any]], target: str) -> set[str]:
    return {a.get("roleDefinitionId", "").rsplit("/", 1)[-1].lower() for a in assignments
            if _covers(a.get("scope", ""), target)}


def roles_checks(arm: Arm, subscription_id: str, object_id: str, target: Target) -> list[Check]:
    """Deploy: Owner, or Contributor and User Access Administrator (the program assigns roles),
    on the resource group or above. Submit: Owner, Contributor, AzureML Data Scientist or the
    stack's aml-hpc job submitter role on the workspace or above."""
    if not object_id:
        return [Check("roles to deploy", "skip", "the sign-in names no object id (oid)"),
                Check("roles to submit", "skip", "the sign-in names no object id (oid)")]
    try:
        assignments = arm.role_assignments(subscription_id, object_id)
    except ArmError as exc:
        skip = f"cannot list your role assignments: {exc.status} {exc.code}"
        return [Check("roles to deploy", "warn", skip, "ask an Owner which roles you have on the subscription"),
                Check("roles to submit", "warn", skip, "")]
    o = target.outputs
    group = f"/subscriptions/{subscription_id}/resourceGroups/{o.resource_group}"
    workspace = f"{group}/providers/Microsoft.MachineLearningServices/workspaces/{o.workspace}"
    at_group, at_workspace = _roles_at(assignments, group), _roles_at(assignments, workspace)
    checks = []
    if OWNER in at_group or {CONTRIBUTOR, USER_ACCESS_ADMINISTRATOR} <= at_group:
        checks.append(Check("roles to deploy", "pass", f"on {o.resource_group}: {names(at_group)}"))
    else:
        checks.append(Check("roles to deploy", "fail",
                            f"on {o.resource_group} (or above) you have: {names(at_group)}; deploying needs Owner, or "
                            "Contributor and User Access Administrator (the stack assigns roles)",
                            f"an Owner runs: az role assignment create --assignee {object_id} --role Owner "
                            f"--scope /subscriptions/{subscription_id}"))
    submitter = MODEL.role("submitter").guid_in(subscription_id).lower()
    if submitter in at_workspace:
        at_workspace = (at_workspace - {submitter}) | {SUBMITTER}
    if at_workspace & {OWNER, CONTRIBUTOR, AZUREML_DATA_SCIENTIST, SUBMITTER}:
        checks.append(Check("roles to submit", "pass", f"on {o.workspace}: {names(at_workspace)}"))
    elif object_id.lower() in {s.lower() for s in target.submitters}:
        checks.append(Check("roles to submit", "warn", f"none on {o.workspace} yet; aml-hpc:submitters lists you, so "
                            f"the next `{invocation.deploy('up', target.stack)}` grants {MODEL.role('submitter').name}",
                            invocation.deploy("up", target.stack)))
    else:
        checks.append(Check("roles to submit", "fail", f"on {o.workspace} you have: {names(at_workspace)}",
                            f"add yourself (or a group you are in) to aml-hpc:submitters in {target.environment_file} "
                            f"and `{invocation.deploy('up', target.stack)}`: principalId {object_id}"))
    return checks


def quota_check(ml_client: Any, target: Target) -> Check:
    from amlhpc.jobs.azure import submit

    o = target.outputs
    requests = [(name, c.sku, c.priority, c.max_nodes) for name, c in o.clusters.items()]
    if not requests:
        return Check("GPU quota", "skip", f"stack {target.stack} declares no GPU cluster")
    try:
        lines = submit.quota(ml_client, o, requests)
    except UserError as exc:
        return Check("GPU quota", "fail", exc.problems[0].message, exc.problems[0].hint)
    short = [line for line in lines if line.ok is False]
    unknown = [line for line in lines if line.ok is None]
    found = "; ".join(f"{line.quota_name} needs {line.needed} vCPUs, {line.available if line.available is not None else 'no limit'} "
                      f"available" for line in lines)
    if short:
        return Check("GPU quota", "fail", f"in {o.location}: {found}", " ".join(line.hint(o.location) for line in short))
    if unknown:
        return Check("GPU quota", "warn", f"in {o.location}: Azure reported no usage for "
                     f"{', '.join(line.quota_name for line in unknown)}",
                     "check Azure portal > Quotas > Machine learning for the region")
    return Check("GPU quota", "pass", f"in {o.location}: {found}")


def submitters_check(target: Target, object_id: str) -> Check:
    listed = [s.lower() for s in target.submitters]
    key = "aml-hpc:submitters"
    if not listed:
        return Check("submitters", "fail", f"{target.environment_file} lists no {key}: nobody can submit jobs to "
                     f"{target.stack} (the code upload to the keyless workspace storage needs a data role Owners and "
                     "Contributors do not have; only `workspaceStorageAuth: accessKey` lets them)",
                     f"add to {target.environment_file}: {key}: [{{principalId: <object id>, principalType: Group}}] "
                     f"(yours: az ad signed-in-user show --query id -o tsv), then {invocation.deploy('up', target.stack)}")
    if object_id and object_id.lower() in listed:
        return Check("submitters", "pass", f"{len(listed)} in {key}, you among them")
    return Check("submitters", "warn" if object_id else "pass",
                 f"{len(listed)} in {key}" + (f"; you ({object_id}) are not listed by id (a listed group may include "
                                              "you)" if object_id else ""),
                 f"add your object id or your team's group to {key} in {target.environment_file}" if object_id else "")


def diagnose(target_or_problem: Target | UserError, seams: Seams, sdk_version: str) -> list[Check]:
    """Every check, in order."""
    checks = [python_check()]
    target = target_or_problem if isinstance(target_or_problem, Target) else None
    if target is None:
        problem = target_or_problem.problems[0]  # type: ignore[union-attr]
        checks.append(Check("stack", "fail", f"{problem.reference}: {problem.path + ': ' if problem.path else ''}"
                            f"{problem.message}", problem.hint))
    else:
        checks.append(Check("stack", "pass", f"{target.stack}: {target.outputs.location}, resource group "
                            f"{target.outputs.resource_group}, clusters {', '.join(target.outputs.clusters) or 'none'}"))
    checks.append(pulumi_cli_check(seams, sdk_version))
    checks.append(pulumi_backend_check(seams))
    signed, credential, claims = sign_in(seams)
    checks.append(signed)
    azure = ["subscription", "resource providers", "roles to deploy", "roles to submit", "GPU quota"]
    if credential is None:
        checks += [Check(name, "skip", "needs an Azure sign-in") for name in azure]
    else:
        arm = seams.arm(credential)
        subscription, source = choose_subscription(seams, target)
        sub_check = subscription_check(arm, subscription, source)
        checks.append(sub_check)
        if sub_check.status != "pass" or subscription is None:
            checks += [Check(name, "skip", "needs a subscription") for name in azure[1:]]
        elif target is None:
            checks += [Check(name, "skip", "needs a valid stack") for name in azure[1:]]
        else:
            checks.append(providers_check(arm, subscription, target.providers))
            checks += roles_checks(arm, subscription, claims.get("oid", ""), target)
            client = (seams.ml_client or _ml_client)(credential, subscription, target.outputs)
            checks.append(quota_check(client, target))
    if target is not None:
        checks.append(submitters_check(target, claims.get("oid", "")))
    else:
        checks.append(Check("submitters", "skip", "needs a valid stack"))
    return checks


def _ml_client(credential: Any, subscription_id: str, outputs: Any) -> Any:
    from azure.ai.ml import MLClient

    return MLClient(credential, subscription_id, outputs.resource_group, outputs.workspace)
