"""parse(): a stack's keys to a StackConfig, every problem collected (types first, then the rules)."""

from __future__ import annotations

import difflib
from datetime import UTC, date, datetime
from typing import Any, Literal

from pydantic import ValidationError

from amlhpc.core import invocation, regions, skus
from amlhpc.core.errors import ProblemCollector
from amlhpc.core.storage_load import MAX_CHECKPOINT_ACCOUNTS, checkpoint_accounts_needed
from amlhpc.infra import naming
from amlhpc.infra.config.clusters import (
    _check_budget,
    _check_clusters,
    _check_controller,
    _check_prices,
)
from amlhpc.infra.config.hardening import _check_hardening
from amlhpc.infra.config.models import (
    _ENVIRONMENT_ONLY,
    _TOP_LEVEL_KEYS,
    EXPERIMENT_NAME_FORMAT,
    EXPERIMENT_PREFIX,
    LOCATION_KEY,
    NAME_SUFFIX_KEY,
    NAMESPACE,
    PROJECT,
    ClusterConfig,
    StackConfig,
    StackKind,
    _RawConfig,
)
from amlhpc.infra.config.network import (
    _check_network,
    _check_registry,
    _check_seat,
    default_registry_sku,
)
from amlhpc.infra.config.problems import _check_principals, _type_problems, fix_command


def parse_expires_at(value: Any) -> datetime:
    """ISO 8601 date or date-time; naive times are UTC. Raises ValueError."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a date")
    text = value.strip().replace("Z", "+00:00")
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _our_keys(found: ProblemCollector, stack: str, flat: dict[str, Any]) -> dict[str, Any]:
    """The aml-hpc: keys without their namespace; unknown or needlessly encrypted ones are problems."""
    ours: dict[str, Any] = {}
    for key, value in flat.items():
        if not key.startswith(NAMESPACE):
            continue
        short = key[len(NAMESPACE) :]
        if short not in _TOP_LEVEL_KEYS:
            near = difflib.get_close_matches(short, sorted(_TOP_LEVEL_KEYS), n=1)
            found.add(key, f"unknown key {short!r}",
                      (f"did you mean '{NAMESPACE}{near[0]}'? " if near else "") + f"known keys: {', '.join(sorted(_TOP_LEVEL_KEYS))}")
            continue
        if isinstance(value, dict) and set(value) == {"secure"}:
            found.add(key, "is encrypted, but this key holds no secret", f"set it in plain text: {fix_command(stack, key)}")
            continue
        ours[short] = value
    return ours


def _check_location(found: ProblemCollector, stack: str, location: Any, ours: dict[str, Any]) -> None:
    """The region must be one of Azure's (amlhpc/core/regions.py), whether or not a cluster is
    declared: a misspelled region would otherwise reach Azure Resource Manager at `up`."""
    if not location:
        found.add(LOCATION_KEY, "is required (the Azure region)", fix_command(stack, LOCATION_KEY, "swedencentral"))
        return
    region_problem = regions.check(str(location))
    if region_problem:
        found.add(LOCATION_KEY, region_problem, "use the programmatic name, e.g. eastus, swedencentral")
        return
    unlisted = regions.unlisted(str(location))
    given = ours.get("clusters")
    clusters = given if isinstance(given, list) else []
    opted_in = ours.get("allowUnlistedRegion") is True or any(
        isinstance(c, dict) and c.get("allowUnlistedRegion") is True for c in clusters)  # a cluster's opt-in says the same
    if unlisted and not opted_in:
        near = difflib.get_close_matches(str(location), sorted(regions.KNOWN), n=1, cutoff=0.85)  # a typo's distance
        found.add(LOCATION_KEY, unlisted,
                  (f"did you mean {near[0]}? {fix_command(stack, LOCATION_KEY, near[0])}; " if near else
                   "use one of Azure's regions (az account list-locations -o table); ")
                  + f"for a region opened after the list was read: {fix_command(stack, NAMESPACE + 'allowUnlistedRegion', 'true')}")


def parse(stack: str, flat: dict[str, Any], reference: str, now: datetime | None = None,
          deploying: bool = False) -> StackConfig:
    """Validate a flat `namespace:key -> value` mapping into a StackConfig, or raise UserError.

    `deploying`: the engine is about to create resources (from_pulumi, the lifecycle
    emulator): an environment stack must then carry its aml-hpc:nameSuffix."""
    found = ProblemCollector(reference, f"stack {stack!r} has invalid configuration")
    kind: StackKind = "experiment" if stack.startswith(EXPERIMENT_PREFIX) else "environment"

    ours = _our_keys(found, stack, flat)
    location = flat.get(LOCATION_KEY)
    _check_location(found, stack, location, ours)

    # Type errors and rule errors are reported together: the keys (or list items) with a
    # type error are set aside and the rules check everything else.
    typed: list[str] = []
    try:
        raw = _RawConfig.model_validate(ours)
        cluster_index = list(range(len(raw.clusters)))
    except ValidationError as exc:
        type_problems = _type_problems(reference, stack, exc)
        found.extend(type_problems)
        typed = [problem.path for problem in type_problems]
        raw, cluster_index = _well_typed_part(ours, exc)
    location = location if isinstance(location, str) and location else "eastus"  # names need one; its problem is listed
    first_rule = len(found.problems)

    _check_kind(found, stack, kind, ours, raw)
    expires = _check_expiry(found, stack, kind, raw)
    names = _check_names(found, stack, raw, location)
    compute_subnet, endpoint_subnet = _check_network(found, stack, raw)
    _check_registry(found, stack, raw)
    hardening = _check_hardening(found, stack, raw, location, compute_subnet, endpoint_subnet, now)
    _check_clusters(found, stack, raw, cluster_index)
    _check_storage(found, stack, raw)
    _check_principals(found, raw.submitters, f"{NAMESPACE}submitters")
    _check_name_suffix(found, stack, kind, raw, deploying)
    _check_seat(found, stack, raw, deploying)
    _check_budget(found, stack, raw, cluster_index)
    _check_prices(found, raw)
    _check_controller(found, stack, raw)
    # a key set aside for its type error is not also reported as missing by the rules
    found.problems[first_rule:] = [p for p in found.problems[first_rule:]
                                   if not any(t == p.path or t.startswith((p.path + ".", p.path + "[")) for t in typed)]
    found.raise_if_any()

    environment = stack if kind == "environment" else (raw.environment or "")
    return StackConfig(
        stack=stack,
        source=reference,
        kind=kind,
        location=location,
        name_prefix=raw.name_prefix,
        owner=raw.owner,
        cost_center=raw.cost_center,
        environment=environment,
        environment_stack=(raw.environment_stack or f"organization/{PROJECT}/{environment}") if kind == "experiment" else None,
        network=raw.network,
        storage=raw.storage,
        clusters=tuple(_canonical_cluster(c) for c in raw.clusters),
        budget=raw.budget,
        ml_registry=raw.ml_registry,
        controller=raw.controller,
        expires_at=expires,
        protect_data=raw.protect_data if raw.protect_data is not None else environment != "dev",
        prices=dict(raw.prices),
        name_suffix=raw.name_suffix,
        workspace_storage_auth=raw.workspace_storage_auth or _default_storage_auth(environment),
        submitters=tuple(raw.submitters),
        names=names,
        checkpoint_accounts=raw.checkpoint_accounts,
        container_registry_sku=raw.container_registry.sku or default_registry_sku(raw),
        compute_subnet=compute_subnet,
        endpoint_subnet=endpoint_subnet,
        **hardening,
    )


def _well_typed_part(ours: dict[str, Any], exc: ValidationError) -> tuple[_RawConfig, list[int]]:
    """The config without the keys (and cluster entries) that failed type validation, so the
    rules can still check the rest; with the original index of each remaining cluster."""
    bad_keys: set[str] = set()
    bad_clusters: set[int] = set()
    for err in exc.errors():
        loc = err["loc"]
        if loc and loc[0] == "clusters" and len(loc) > 1 and isinstance(loc[1], int):
            bad_clusters.add(loc[1])
        elif loc:
            bad_keys.add(str(loc[0]))
    rest = {k: v for k, v in ours.items() if k not in bad_keys}
    cluster_index = []
    if isinstance(rest.get("clusters"), list):
        cluster_index = [i for i in range(len(rest["clusters"])) if i not in bad_clusters]
        rest["clusters"] = [rest["clusters"][i] for i in cluster_index]
    if "owner" not in rest or "owner" in bad_keys:
        rest["owner"] = "(missing)"  # required; its problem is already listed
    try:
        return _RawConfig.model_validate(rest), cluster_index
    except ValidationError:  # nothing sensible left to check: the type problems stand alone
        return _RawConfig(owner="(missing)"), []


def _canonical_cluster(cluster: ClusterConfig) -> ClusterConfig:
    """Clusters with the catalog's exact spelling of the size (Azure is case-insensitive)."""
    return cluster.model_copy(update={"sku": skus.get(cluster.sku).name})


def _check_kind(found: ProblemCollector, stack: str, kind: StackKind, ours: dict[str, Any], raw: _RawConfig) -> None:
    if kind == "experiment":
        if not EXPERIMENT_NAME_FORMAT.match(stack):
            found.add("", f"experiment stack name {stack!r} is not exp-<name> with 1-20 lowercase letters, digits or hyphens",
                      "rename the stack file, e.g. Pulumi.exp-bert-sweep.yaml")
        if not raw.environment:
            found.add(f"{NAMESPACE}environment", "is required on experiment stacks (the environment whose workspace it uses)",
                      fix_command(stack, f"{NAMESPACE}environment", "dev"))
        for key in sorted(_ENVIRONMENT_ONLY & set(ours)):
            found.add(f"{NAMESPACE}{key}", "belongs to the environment stack; experiment stacks add clusters only",
                      f"move it to Pulumi.{raw.environment or '<environment>'}.yaml")
        if not raw.clusters:
            found.add(f"{NAMESPACE}clusters", "an experiment stack must declare at least one cluster",
                      "add a cluster: name, sku, maxNodes (see Pulumi.dev.yaml)")
    else:
        if raw.environment_stack:
            found.add(f"{NAMESPACE}environmentStack", "is only for experiment stacks (exp-*)",
                      f"remove it from Pulumi.{stack}.yaml")
        if raw.environment is not None and raw.environment != stack:
            # The environment of an environment stack is its name everywhere: its GitHub
            # environment, identity, state and the policy's "outside dev" all follow the name.
            found.add(f"{NAMESPACE}environment", f"{raw.environment!r} is not this stack: an environment stack belongs "
                      f"to the environment it is named after ({stack!r}), whatever this key says",
                      f"remove aml-hpc:environment from Pulumi.{stack}.yaml")
    if kind == "experiment":
        _check_environment_stack(found, stack, raw)


def _check_environment_stack(found: ProblemCollector, stack: str, raw: _RawConfig) -> None:
    """An experiment's target is one fact, `environment`: the GitHub environment it deploys in
    (reviewers, identity, state, published outputs) follows it, so reading another
    environment's outputs under a `dev` label would put clusters into prod's workspace with
    dev's reviewers.
    `environmentStack` may only spell the same stack fully qualified."""
    given, environment = raw.environment_stack, raw.environment
    if not given or not environment:
        return
    parts = given.split("/")
    same = parts[-1] == environment and (len(parts) == 1 or (len(parts) == 3 and parts[1] == PROJECT))
    if not same:
        found.add(f"{NAMESPACE}environmentStack",
                  f"{given!r} is not the stack of aml-hpc:environment {environment!r}: an experiment deploys into "
                  "the environment it names, with that environment's reviewers, identity and state",
                  f"remove aml-hpc:environmentStack from Pulumi.{stack}.yaml (it defaults to "
                  f"organization/{PROJECT}/{environment}); to target another environment set aml-hpc:environment")


def _check_expiry(found: ProblemCollector, stack: str, kind: StackKind, raw: _RawConfig) -> datetime | None:
    key = f"{NAMESPACE}expiresAt"
    if raw.expires_at is None:
        if kind == "experiment":
            found.add(key, "is required on experiment stacks (teardown destroys them after it)",
                      fix_command(stack, key, "2026-12-31T00:00:00Z"))
        return None
    if kind == "environment":
        found.add(key, "is only for experiment stacks (exp-*); environment stacks are never torn down by date",
                  f"remove it from Pulumi.{stack}.yaml")
        return None
    try:
        return parse_expires_at(raw.expires_at)
    except ValueError:
        found.add(key, f"{raw.expires_at!r} is not an ISO 8601 date or date-time",
                  f"use e.g. 2026-12-31 or 2026-12-31T18:00:00Z: {fix_command(stack, key, '2026-12-31T00:00:00Z')}")
        return None


def _check_names(found: ProblemCollector, stack: str, raw: _RawConfig, location: str) -> naming.StackNames:
    prefix_problem = naming.check("namePrefix", raw.name_prefix)
    if prefix_problem:
        found.add(f"{NAMESPACE}namePrefix", prefix_problem, fix_command(stack, f"{NAMESPACE}namePrefix", "amlhpc"))
    for key, value in raw.names.items():
        if key not in naming.StackNames.OVERRIDABLE:
            near = difflib.get_close_matches(key, list(naming.StackNames.OVERRIDABLE), n=1)
            found.add(f"{NAMESPACE}names.{key}", f"unknown name key {key!r}",
                      (f"did you mean {near[0]!r}? " if near else "") + f"allowed: {', '.join(naming.StackNames.OVERRIDABLE)}")
            continue
        _, kind = naming.StackNames.OVERRIDABLE[key]
        problem = naming.check(kind, value)  # type: ignore[arg-type]
        if problem:
            found.add(f"{NAMESPACE}names.{key}", problem, fix_command(stack, f"{NAMESPACE}names.{key}"))
    safe_prefix = raw.name_prefix if not prefix_problem else "amlhpc"
    known = {k: v for k, v in raw.names.items() if k in naming.StackNames.OVERRIDABLE}
    suffix = raw.name_suffix if raw.name_suffix and naming.check("nameSuffix", raw.name_suffix) is None else None
    count = raw.checkpoint_accounts.accounts() if raw.checkpoint_accounts else 0
    names = naming.StackNames.derive(safe_prefix, stack, location, known, suffix=suffix, checkpoint_accounts=count)
    if not prefix_problem:
        for field_name, message in names.problems():
            found.add(f"{NAMESPACE}namePrefix", f"the derived {field_name.replace('_', ' ')} name {message}",
                      "choose a shorter namePrefix or set aml-hpc:names.<key> explicitly")
    return names


def _check_storage(found: ProblemCollector, stack: str, raw: _RawConfig) -> None:
    _check_principals(found, raw.storage.data_contributors, f"{NAMESPACE}storage.dataContributors")
    accounts = raw.checkpoint_accounts
    if accounts is None:
        return
    key = f"{NAMESPACE}checkpointAccounts"
    if accounts.model_params is not None and accounts.checkpoint_gb is not None:
        found.add(f"{key}.checkpointGb", "gives the checkpoint's size a second time (modelParams gives it too)",
                  f"keep one of modelParams and checkpointGb in Pulumi.{stack}.yaml")
    if accounts.count is not None and accounts.checkpoint_bytes() is not None:
        needed = accounts.model_copy(update={"count": None}).accounts()
        if accounts.count < needed:
            found.add(f"{key}.count", f"{accounts.count} account(s) cannot take the checkpoint within "
                      f"{accounts.interval_s} s: its size needs {needed} at {accounts.ingress_gbps:g} Gb/s each",
                      f"set count to {needed} or more, or remove count and let the size decide")
    size = accounts.checkpoint_bytes()
    if accounts.count is None and size is not None:
        needed = checkpoint_accounts_needed(size, accounts.interval_s, accounts.ingress_gbps)
        if needed > MAX_CHECKPOINT_ACCOUNTS:
            found.add(key, f"a {size / 1e12:,.2f} TB checkpoint needs {needed} accounts within {accounts.interval_s} s, "
                      f"more than the {MAX_CHECKPOINT_ACCOUNTS} one stack declares",
                      "raise intervalS, or split the run's checkpoints over experiment stacks")


def _default_storage_auth(environment: str) -> Literal["identity", "accessKey"]:
    from amlhpc.infra import quirks

    return quirks.default_workspace_storage_auth(environment)  # type: ignore[return-value]


def _check_name_suffix(found: ProblemCollector, stack: str, kind: StackKind, raw: _RawConfig, deploying: bool) -> None:
    if raw.name_suffix is not None:
        problem = naming.check("nameSuffix", raw.name_suffix)
        if problem:
            found.add(NAME_SUFFIX_KEY, problem,
                      f"remove it and let the tooling make one: {invocation.module('amlhpc.infra.adopt', 'suffix --stack ' + stack)}")
    elif deploying and kind == "environment":
        found.add(NAME_SUFFIX_KEY, "is not set: without it every copy of this repository asks Azure for the same "
                  "globally unique storage, Key Vault and registry names",
                  f"run `{invocation.deploy('preview', stack)}` once (it writes one), or "
                  f"{invocation.module('amlhpc.infra.adopt', 'suffix --stack ' + stack)}; "
                  "commit the stack file")


def check_experiment_against_environment(experiment: StackConfig, environment: StackConfig) -> None:
    """An experiment's clusters join the environment's workspace: names must not collide."""
    found = ProblemCollector(experiment.source, f"stack {experiment.stack!r} conflicts with {environment.source}")
    taken = {c.name.lower(): c.name for c in environment.clusters}
    for i, cluster in enumerate(experiment.clusters):
        if cluster.name.lower() in taken:
            found.add(f"{NAMESPACE}clusters[{i}].name",
                      f"cluster {cluster.name!r} already exists in environment {environment.stack!r}'s workspace",
                      f"pick a name not taken in {environment.source} (taken: {', '.join(sorted(taken.values()))})")
    if environment.kind != "environment":
        found.add(f"{NAMESPACE}environment", f"{environment.stack!r} is not an environment stack", "name dev, prod or another environment")
    found.raise_if_any()
