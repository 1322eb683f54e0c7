"""Stack configuration: parse `Pulumi.<stack>.yaml` once into a typed, validated object.

A stack's YAML is the single place a user edits. `load_stack_config()` reads it (offline
plan, tests, jobs) and `from_pulumi()` reads the same keys through `pulumi.Config` (under
the engine, so `pulumi config set` and `--config` work). Both end in `parse()`, which
collects every problem - types first, then the rules that need the SKU catalog - and
raises one `UserError` naming the file, the key, the bad value, what is allowed and the
command that fixes it. Nothing here imports Pulumi at module level: a bad config fails
before a single resource is registered.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from core import pricing, regions, skus
from core.errors import Problem, ProblemCollector, UserError
from infra import naming

PROJECT = "aml-hpc"
NAMESPACE = f"{PROJECT}:"
LOCATION_KEY = "azure-native:location"
EXPERIMENT_PREFIX = "exp-"
REPO_ROOT = Path(__file__).resolve().parent.parent

StackKind = Literal["environment", "experiment"]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


class SshConfig(_Model):
    """SSH to cluster nodes: key only. Omit the block (or leave publicKey empty) for no SSH."""

    enabled: bool | None = None
    """Defaults to true when a public key is given."""
    public_key: str | None = None
    """OpenSSH public key line (ssh-rsa / ssh-ed25519 / ecdsa-sha2-*)."""
    admin_user: str = "azureuser"
    password: str | None = None
    """Never accepted; declared so the error can say why instead of 'unknown key'."""

    @property
    def on(self) -> bool:
        return bool(self.public_key) if self.enabled is None else self.enabled


class ClusterConfig(_Model):
    """One AmlCompute GPU cluster."""

    name: str
    """2-16 characters; the cluster's name in the workspace. Changing it replaces the cluster."""
    sku: str
    """Azure VM size, one of core.skus.CATALOG. Changing it replaces the cluster."""
    min_nodes: int = Field(0, ge=0)
    """Nodes kept even when idle. Anything above 0 bills around the clock: needs allowIdleNodes."""
    max_nodes: int = Field(ge=1)
    idle_minutes: int = Field(10, ge=2, le=10080)
    """Idle time before a node is released."""
    priority: Literal["Dedicated", "LowPriority"] = "Dedicated"
    """LowPriority is cheaper but preemptible (jobs must checkpoint). Changing it replaces the cluster."""
    ssh: SshConfig | None = None
    allow_idle_nodes: bool = False
    """Opt-in for minNodes > 0."""
    allow_tcp_multi_node: bool = False
    """Opt-in for maxNodes > 1 on a size without InfiniBand (TCP only, scales badly)."""


class NetworkConfig(_Model):
    isolation: Literal["public", "private"] = "public"
    """private: our own VNet, private endpoints, no public network access, no node public IPs."""
    address_space: str | None = None
    """VNet CIDR (private isolation), e.g. 10.40.0.0/16."""
    compute_subnet: str | None = None
    """Defaults to the first half of addressSpace."""
    endpoint_subnet: str | None = None
    """Defaults to the second half of addressSpace."""


class PrincipalConfig(_Model):
    """A person, group or service principal granted data rights (e.g. to upload datasets)."""

    principal_id: str
    """Entra object id (a GUID): `az ad signed-in-user show --query id -o tsv` for yourself."""
    principal_type: Literal["User", "Group", "ServicePrincipal"] = "Group"


class StorageConfig(_Model):
    tier: Literal["StandardHot", "PremiumBlockBlob"] = "StandardHot"
    """Dataset account: Standard_LRS hot, or Premium_LRS BlockBlobStorage (lower latency).
    Changing it replaces the account, so the data would have to be copied: it is protected."""
    allow_shared_key_access: bool = False
    soft_delete_days: int = Field(14, ge=1, le=365)
    egress_gbps: float = Field(skus.STORAGE_ACCOUNT.egress_gbits_per_s_default, gt=0)
    """The account's egress limit, Gb/s; staging warns when nodes x per-node rate exceeds it."""
    ingress_gbps: float = Field(skus.STORAGE_ACCOUNT.ingress_gbits_per_s_default, gt=0)
    """The account's ingress limit, Gb/s; checkpoint uploads are capped below it."""
    data_contributors: list[PrincipalConfig] = Field(default_factory=list)
    """Who may upload datasets (Storage Blob Data Contributor on `datasets`); shared keys are off."""


class BudgetConfig(_Model):
    monthly_amount_usd: float = Field(gt=0)
    alert_emails: list[str] = Field(default_factory=list)
    thresholds_percent: list[int] = Field(default_factory=lambda: [50, 80, 100])


class MlRegistryConfig(_Model):
    enabled: bool = False
    regions: list[str] = Field(default_factory=list)
    """Extra replication regions; the stack's location is always included."""


class _RawConfig(_Model):
    """The `aml-hpc:` keys of a stack file, types only."""

    name_prefix: str = "amlhpc"
    owner: str
    cost_center: str | None = None
    environment: str | None = None
    environment_stack: str | None = None
    network: NetworkConfig = NetworkConfig()
    storage: StorageConfig = StorageConfig()
    clusters: list[ClusterConfig] = Field(default_factory=list)
    budget: BudgetConfig | None = None
    ml_registry: MlRegistryConfig = MlRegistryConfig()
    expires_at: str | date | datetime | None = None
    protect_data: bool | None = None
    prices: dict[str, float] = Field(default_factory=dict)
    names: dict[str, str] = Field(default_factory=dict)


_TOP_LEVEL_KEYS = {field.alias or name for name, field in _RawConfig.model_fields.items()}
_ENVIRONMENT_ONLY = {"network", "storage", "mlRegistry", "names"}
_TEXT_KEYS = {"namePrefix", "owner", "costCenter", "environment", "environmentStack", "expiresAt"}


class StackConfig(_Model):
    """A validated stack: what the components receive. Build with `parse()`."""

    stack: str
    source: str
    """The stack file this came from, for messages."""
    kind: StackKind
    location: str
    name_prefix: str
    owner: str
    cost_center: str | None
    environment: str
    """The environment this stack belongs to (its own name for environment stacks)."""
    environment_stack: str | None
    """Fully qualified environment stack an experiment references (org/project/stack)."""
    network: NetworkConfig
    storage: StorageConfig
    clusters: tuple[ClusterConfig, ...]
    budget: BudgetConfig | None
    ml_registry: MlRegistryConfig
    expires_at: datetime | None
    protect_data: bool
    prices: dict[str, float]
    names: naming.StackNames
    compute_subnet: str | None
    endpoint_subnet: str | None

    @property
    def is_experiment(self) -> bool:
        return self.kind == "experiment"

    def tags(self) -> dict[str, str]:
        """Tags every resource of this stack carries."""
        tags = {"owner": self.owner, "environment": self.environment, "stack": self.stack, "managed-by": "pulumi-aml-hpc"}
        if self.cost_center:
            tags["cost-center"] = self.cost_center
        if self.expires_at:
            tags["expiresAt"] = self.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        return tags

    def hourly_price(self, sku_name: str) -> skus.Price | None:
        """The stack's price override for a size, else the catalog's reference price."""
        return pricing.node_hour_price(sku_name, self.prices, location=self.location, reference=self.source)

    def price_table(self) -> dict[str, skus.Price]:
        """Prices of the stack's cluster sizes, for the outputs document."""
        return pricing.price_table((c.sku for c in self.clusters), self.prices, location=self.location,
                                   reference=self.source)


# --------------------------------------------------------------------------------------
# Reading


def stack_file(stack: str, root: Path = REPO_ROOT) -> Path:
    return root / f"Pulumi.{stack}.yaml"


def available_stacks(root: Path = REPO_ROOT) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in root.glob("Pulumi.*.yaml"))


def read_stack_file(stack: str, root: Path = REPO_ROOT) -> dict[str, Any]:
    """The `config:` mapping of a stack file, or a UserError naming what is wrong."""
    path = stack_file(stack, root)
    reference = path.name
    if not path.is_file():
        stacks = available_stacks(root)
        near = difflib.get_close_matches(stack, stacks, n=2, cutoff=0.5)
        raise UserError(
            [Problem(reference, "", f"stack file not found for stack {stack!r}",
                     (f"did you mean {' or '.join(near)}? " if near else "")
                     + f"stacks here: {', '.join(stacks) or 'none'}; create an experiment with "
                     "`make new-experiment NAME=... ENV=dev`")],
            "unknown stack",
        )
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError([Problem(reference, where, f"not valid YAML: {getattr(exc, 'problem', exc)}",
                                 "fix the YAML syntax (indentation, quotes) at that line")], "invalid stack file") from None
    if not isinstance(document, dict) or not isinstance(document.get("config", {}), dict):
        raise UserError([Problem(reference, "config", "must be a mapping of `namespace:key: value`",
                                 "see Pulumi.dev.yaml for the layout")], "invalid stack file")
    return dict(document.get("config") or {})


def load_stack_config(stack: str, root: Path = REPO_ROOT, now: datetime | None = None) -> StackConfig:
    """Read and validate `Pulumi.<stack>.yaml` (offline: plan, tests, jobs)."""
    return parse(stack, read_stack_file(stack, root), f"Pulumi.{stack}.yaml", now=now)


def from_pulumi() -> StackConfig:
    """Read the current stack's config through the Pulumi engine (honours `pulumi config set`)."""
    import json

    import pulumi

    stack = pulumi.get_stack()
    ours = pulumi.Config(PROJECT)
    flat: dict[str, Any] = {}
    for key in _TOP_LEVEL_KEYS:
        # The engine hands every value over as a string: objects, lists, numbers and
        # booleans JSON-encoded, text as is (so "1234" as a cost center stays text).
        raw = ours.get(key)
        if raw is None:
            continue
        if key in _TEXT_KEYS:
            flat[NAMESPACE + key] = raw
            continue
        try:
            flat[NAMESPACE + key] = json.loads(raw)
        except ValueError:
            flat[NAMESPACE + key] = raw  # the validator names the key and the bad value
    location = pulumi.Config("azure-native").get("location")
    if location is not None:
        flat[LOCATION_KEY] = location
    return parse(stack, flat, f"Pulumi.{stack}.yaml")


# --------------------------------------------------------------------------------------
# Validation


def fix_command(stack: str, path: str, value: str = "<value>") -> str:
    """The `pulumi config set` that sets `path` (e.g. aml-hpc:clusters[0].maxNodes)."""
    flag = " --path" if ("[" in path or "." in path.split(":", 1)[-1]) else ""
    return f"pulumi config set{flag} '{path}' {value} --stack {stack}"


def _key_path(loc: tuple[Any, ...]) -> str:
    out = NAMESPACE.rstrip(":")
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += (":" if i == 0 else ".") + str(part)
    return out


def _type_problems(reference: str, stack: str, exc: ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = _key_path(loc)
        if err["type"] == "extra_forbidden":
            *parent, key = loc
            allowed = _allowed_keys(tuple(parent))
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            problems.append(Problem(reference, path, f"unknown key {key!r}", f"{hint}allowed here: {', '.join(sorted(allowed))}"))
            continue
        if err["type"] == "missing":
            problems.append(Problem(reference, path, "is required", fix_command(stack, path)))
            continue
        bad = err.get("input")
        msg = err["msg"][:1].lower() + err["msg"][1:]
        problems.append(Problem(reference, path, f"{bad!r}: {msg}", fix_command(stack, path)))
    return problems


def _allowed_keys(parent: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = _RawConfig
    for part in parent:
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return []
        annotation = field.annotation
        inner = getattr(annotation, "__args__", (annotation,))
        model = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), model)
    return [f.alias or n for n, f in model.model_fields.items()]


_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_SSH_PUBLIC = re.compile(r"^(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]{20,}( .*)?$")
_EXPERIMENT_NAME = re.compile(r"^exp-[a-z0-9](?:[a-z0-9-]{0,18}[a-z0-9])?$")


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


def parse(stack: str, flat: dict[str, Any], reference: str, now: datetime | None = None) -> StackConfig:
    """Validate a flat `namespace:key -> value` mapping into a StackConfig, or raise UserError."""
    found = ProblemCollector(reference, f"stack {stack!r} has invalid configuration")
    kind: StackKind = "experiment" if stack.startswith(EXPERIMENT_PREFIX) else "environment"

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

    location = flat.get(LOCATION_KEY)
    if not location:
        found.add(LOCATION_KEY, "is required (the Azure region)", fix_command(stack, LOCATION_KEY, "swedencentral"))
    else:
        region_problem = regions.check(str(location))
        if region_problem:
            found.add(LOCATION_KEY, region_problem, "use the programmatic name, e.g. eastus, swedencentral")

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
    _check_clusters(found, stack, raw, cluster_index)
    _check_storage(found, stack, raw)
    _check_budget(found, stack, raw)
    _check_prices(found, raw)
    # a key set aside for its type error is not also reported as missing by the rules
    found.problems[first_rule:] = [p for p in found.problems[first_rule:]
                                   if not any(t == p.path or t.startswith((p.path + ".", p.path + "[")) for t in typed)]
    found.raise_if_any()

    environment = raw.environment or (stack if kind == "environment" else "")
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
        expires_at=expires,
        protect_data=raw.protect_data if raw.protect_data is not None else environment != "dev",
        prices=dict(raw.prices),
        names=names,
        compute_subnet=compute_subnet,
        endpoint_subnet=endpoint_subnet,
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
        if not _EXPERIMENT_NAME.match(stack):
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
    elif raw.environment_stack:
        found.add(f"{NAMESPACE}environmentStack", "is only for experiment stacks (exp-*)", f"remove it from Pulumi.{stack}.yaml")


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
    names = naming.StackNames.derive(safe_prefix, stack, location, known)
    if not prefix_problem:
        for field_name, message in names.problems():
            found.add(f"{NAMESPACE}namePrefix", f"the derived {field_name.replace('_', ' ')} name {message}",
                      "choose a shorter namePrefix or set aml-hpc:names.<key> explicitly")
    return names


def _check_network(found: ProblemCollector, stack: str, raw: _RawConfig) -> tuple[str | None, str | None]:
    net = raw.network
    base = f"{NAMESPACE}network"
    if net.isolation == "public":
        for key in ("address_space", "compute_subnet", "endpoint_subnet"):
            if getattr(net, key):
                found.add(f"{base}.{to_camel(key)}", "is only used with isolation: private",
                          f"remove it, or {fix_command(stack, base + '.isolation', 'private')}")
        return None, None
    if not net.address_space:
        found.add(f"{base}.addressSpace", "private isolation needs an address space for our VNet",
                  fix_command(stack, f"{base}.addressSpace", "10.40.0.0/16"))
        return None, None
    try:
        space = ipaddress.ip_network(net.address_space, strict=True)
    except ValueError as exc:
        found.add(f"{base}.addressSpace", f"{net.address_space!r} is not a valid CIDR block ({exc})",
                  "use a private range with its network address, e.g. 10.40.0.0/16")
        return None, None
    if not space.is_private or space.version != 4:
        found.add(f"{base}.addressSpace", f"{net.address_space!r} is not a private IPv4 range",
                  "use 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16 space")
        return None, None
    if space.prefixlen > 24:
        found.add(f"{base}.addressSpace", f"{net.address_space!r} is too small for a compute and an endpoint subnet",
                  "use a /24 or larger (a shorter prefix), e.g. 10.40.0.0/16")
        return None, None
    halves = list(space.subnets(prefixlen_diff=1))
    chosen = []
    for key, default in (("compute_subnet", halves[0]), ("endpoint_subnet", halves[1])):
        text = getattr(net, key)
        if text is None:
            chosen.append(default)
            continue
        try:
            subnet = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            found.add(f"{base}.{to_camel(key)}", f"{text!r} is not a valid CIDR block ({exc})", f"use e.g. {default}")
            return None, None
        if not subnet.subnet_of(space):  # type: ignore[arg-type]
            found.add(f"{base}.{to_camel(key)}", f"{text} is outside addressSpace {space}", f"use e.g. {default}")
            return None, None
        chosen.append(subnet)
    if chosen[0].overlaps(chosen[1]):
        found.add(f"{base}.endpointSubnet", f"{chosen[1]} overlaps computeSubnet {chosen[0]}", "give the subnets disjoint ranges")
    return str(chosen[0]), str(chosen[1])


_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def _check_storage(found: ProblemCollector, stack: str, raw: _RawConfig) -> None:
    for i, principal in enumerate(raw.storage.data_contributors):
        if not _GUID.match(principal.principal_id):
            found.add(f"{NAMESPACE}storage.dataContributors[{i}].principalId",
                      f"{principal.principal_id!r} is not an Entra object id (a GUID)",
                      "find it with `az ad signed-in-user show --query id -o tsv` or `az ad group show -g NAME --query id -o tsv`")


def _check_clusters(found: ProblemCollector, stack: str, raw: _RawConfig, index: list[int] | None = None) -> None:
    """index: each cluster's position in the stack file (clusters with type errors are left out)."""
    seen: dict[str, int] = {}
    for i, cluster in zip(index if index is not None else range(len(raw.clusters)), raw.clusters, strict=True):
        path = f"{NAMESPACE}clusters[{i}]"
        name_problem = naming.check("cluster", cluster.name)
        if name_problem:
            found.add(f"{path}.name", f"cluster name {name_problem}", fix_command(stack, f"{path}.name", "gpu-a100"))
        key = cluster.name.lower()
        if key in seen:
            found.add(f"{path}.name", f"duplicate cluster name {cluster.name!r} (also clusters[{seen[key]}])",
                      "cluster names are unique in a workspace, case-insensitively")
        seen.setdefault(key, i)

        try:
            sku = skus.get(cluster.sku)
        except skus.UnknownSkuError as exc:
            near = f"did you mean {' or '.join(exc.suggestions)}? " if exc.suggestions else ""
            found.add(f"{path}.sku", f"unknown VM size {cluster.sku!r}",
                      f"{near}known sizes: {', '.join(skus.names())}")
            sku = None

        if cluster.max_nodes < cluster.min_nodes:
            found.add(f"{path}.maxNodes", f"maxNodes {cluster.max_nodes} is below minNodes {cluster.min_nodes}",
                      fix_command(stack, f"{path}.maxNodes", str(cluster.min_nodes)))
        if cluster.min_nodes > 0 and not cluster.allow_idle_nodes:
            cost = ""
            if sku and sku.price:
                cost = f" (about ${cluster.min_nodes * sku.price.usd_per_hour * 24:,.0f}/day at {sku.price.region} on-demand)"
            found.add(f"{path}.minNodes", f"minNodes {cluster.min_nodes} keeps nodes running while idle{cost}",
                      f"set minNodes: 0, or opt in: {fix_command(stack, path + '.allowIdleNodes', 'true')}")
        if sku and cluster.max_nodes > 1 and not sku.infiniband and not cluster.allow_tcp_multi_node:
            ib = ", ".join(s for s in skus.names() if skus.get(s).infiniband)
            found.add(f"{path}.sku", f"{sku.name} has no InfiniBand, so {cluster.max_nodes} nodes would talk over TCP",
                      f"use an InfiniBand size ({ib}), set maxNodes: 1, or opt in: "
                      f"{fix_command(stack, path + '.allowTcpMultiNode', 'true')}")
        if cluster.ssh is not None:
            _check_ssh(found, stack, f"{path}.ssh", cluster.ssh)


def _check_ssh(found: ProblemCollector, stack: str, path: str, ssh: SshConfig) -> None:
    if ssh.password is not None:
        example_key = '"ssh-ed25519 AAAA..."'
        found.add(f"{path}.password", "password login is never enabled on cluster nodes",
                  f"remove the password and give a public key: {fix_command(stack, path + '.publicKey', example_key)}")
    key = (ssh.public_key or "").strip()
    if "PRIVATE KEY" in key:
        found.add(f"{path}.publicKey", "this is a private key; it must never be in a stack file",
                  "delete it from the file (and rotate it), then give the .pub line instead")
        return
    if ssh.on and not key:
        found.add(f"{path}.publicKey", "SSH is enabled but no public key is given (password login is not allowed)",
                  fix_command(stack, path + ".publicKey", '"$(cat ~/.ssh/id_ed25519.pub)"'))
    elif key and not _SSH_PUBLIC.match(key):
        found.add(f"{path}.publicKey", f"{key[:24]!r}... is not an OpenSSH public key line",
                  "paste the whole line of your .pub file (ssh-ed25519 AAAA... or ssh-rsa AAAA...)")
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", ssh.admin_user) or ssh.admin_user in {"root", "admin", "administrator"}:
        found.add(f"{path}.adminUser", f"{ssh.admin_user!r} is not an allowed admin user name",
                  "use a lowercase Linux user name other than root/admin, e.g. azureuser")


def _check_budget(found: ProblemCollector, stack: str, raw: _RawConfig) -> None:
    if raw.budget is None:
        return
    path = f"{NAMESPACE}budget"
    if not raw.budget.alert_emails:
        found.add(f"{path}.alertEmails", "a budget needs at least one email to alert",
                  fix_command(stack, f"{path}.alertEmails[0]", "ml-platform@example.com"))
    for i, email in enumerate(raw.budget.alert_emails):
        if not _EMAIL.match(email):
            found.add(f"{path}.alertEmails[{i}]", f"{email!r} is not an email address", "use name@domain")
    for i, pct in enumerate(raw.budget.thresholds_percent):
        if not 1 <= pct <= 1000:
            found.add(f"{path}.thresholdsPercent[{i}]", f"{pct} is outside 1-1000 percent", "use e.g. [50, 80, 100]")


def _check_prices(found: ProblemCollector, raw: _RawConfig) -> None:
    for sku_name, price in raw.prices.items():
        if sku_name not in skus.CATALOG:
            near = skus.suggest(sku_name)
            found.add(f"{NAMESPACE}prices.{sku_name}", f"unknown VM size {sku_name!r}",
                      f"did you mean {' or '.join(near)}?" if near else f"known sizes: {', '.join(skus.names())}")
        if price <= 0:
            found.add(f"{NAMESPACE}prices.{sku_name}", f"price {price} must be positive", "use USD per node-hour")


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
