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

from core import availability, pricing, project, regions, skus
from core.errors import Problem, ProblemCollector, UserError
from core.values import Gbps, Usd, UsdPerHour
from infra import naming

PROJECT = "aml-hpc"
NAMESPACE = f"{PROJECT}:"
LOCATION_KEY = "azure-native:location"
EXPERIMENT_PREFIX = "exp-"
REPO_ROOT = project.root()
"""The project folder: its Pulumi.<stack>.yaml files (core/project.py finds it)."""

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
    """3-24 letters, digits and hyphens, starting with a letter, a letter after the last hyphen; the cluster's name in the workspace. Changing it replaces the cluster."""
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
    allow_unlisted_region: bool = False
    """Opt-in for a size core/catalog/availability.toml does not list in the stack's region
    (the lists are a snapshot; Azure adds regions). Retired sizes stay refused."""


OutboundMode = Literal["AllowOnlyApprovedOutbound", "AllowInternetOutbound"]

DEFAULT_FQDN_RULES: dict[str, str] = {
    "pypi.org": "pip's index, for recipes and jobs that pip-install at start",
    "files.pythonhosted.org": "where pip downloads what pypi.org lists",
}
"""Hosts a managed, approved-only network lets jobs reach unless the stack says otherwise, and
why. Not here on purpose: general-purpose code and file hosts (github.com, gist, paste and
tunnel services), where a job could push data as easily as it pulls code - a team that needs
one adds it to the stack's fqdnRules and to infra/policy/outbound.toml, where the platform
team reviews it (docs/isolation.md); nvcr.io (images are built by ACR Tasks outside the
managed VNet and pulled from our registry through its private endpoint) and conda (our
environments never build)."""


class PrincipalConfig(_Model):
    """A person, group or service principal granted data rights (e.g. to upload datasets)."""

    principal_id: str
    """Entra object id (a GUID): `az ad signed-in-user show --query id -o tsv` for yourself."""
    principal_type: Literal["User", "Group", "ServicePrincipal"] = "Group"


class BastionConfig(_Model):
    """Azure Bastion in our VNet: SSH to the jump box from a browser or the az CLI, no public IP on it."""

    sku: Literal["Basic", "Standard"] = "Standard"
    """Standard adds native-client tunnels (`az network bastion ssh|tunnel`); Basic is portal-only."""
    subnet: str | None = None
    """AzureBastionSubnet, /26 or larger; defaults to the first free /26 of addressSpace."""


UNHELD_PUBLIC_KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHeqTzDP/AxWFuCsp6odf6CTDVd5ZLGRcfvg7yG3jlaz "
                     "aml-hpc-unheld-key-replace-with-your-break-glass-key")
"""The jump box admin key Pulumi.prod.yaml ships with: its private half was discarded when it
was generated, so nobody holds it. People sign in with Entra ID (`jumpBox.logins`); replace
it with your own break-glass key if you want one. Deploying a jump box whose only way in is
this key is refused."""


class JumpBoxConfig(_Model):
    """A small Linux VM inside our VNet to run `jobs submit`, `make images` and `pulumi` from.

    People sign in with their Entra ID (the AADSSHLoginForLinux extension, through Bastion);
    the admin key is a break-glass credential, a public key and never a secret."""

    public_key: str | None = None
    """OpenSSH public key line of the admin (break-glass) account: SSH by key only, as on
    cluster nodes. Required; changing it replaces the VM."""
    admin_user: str = "azureuser"
    size: str = "Standard_D2s_v5"
    subnet: str | None = None
    """Defaults to the first free /28 of addressSpace after the Bastion subnet's."""
    logins: list[PrincipalConfig] = Field(default_factory=list)
    """People and groups who sign in with Entra ID: Virtual Machine User Login on the jump box,
    Reader on its network interface and on the Bastion (what `az network bastion ssh` reads)."""


class HandOffConfig(_Model):
    """A corporate network that reaches our VNet through a VPN gateway, ExpressRoute or
    peering that is managed outside this program (the network team's)."""

    via: Literal["VPN", "ExpressRoute", "Peering"]
    address_prefixes: list[str] = Field(default_factory=list)
    """The client networks that arrive through it (CIDRs, outside addressSpace)."""


class CiRunnersConfig(_Model):
    """A subnet (NSG, outbound through NAT) for self-hosted CI runners registered outside Pulumi."""

    subnet: str | None = None
    """Defaults to the first free /27 of addressSpace after the jump box's."""


class WayInConfig(_Model):
    """Seats for people (Bastion with a jump box, or a declared hand-off) and for CI."""

    bastion: BastionConfig | None = None
    jump_box: JumpBoxConfig | None = None
    ci_runners: CiRunnersConfig | None = None
    hand_off: HandOffConfig | None = None


class EncryptionConfig(_Model):
    """Customer-managed key for the workspace: a Key Vault key; set when the workspace is created."""

    customer_managed_key: bool = False
    key_size: Literal[3072, 4096] = 3072
    """RSA key size in bits: Microsoft recommends at least 3072 for Azure ML, so 2048 is refused."""
    cosmos_db_principal_id: str | None = None
    """Object id of the 'Azure Cosmos DB' service principal in your tenant, which must be able to
    use the key: `az ad sp show --id a232010e-820c-4083-83bb-3ace5fc29d0b --query id -o tsv`."""


class DiagnosticsConfig(_Model):
    """Diagnostic settings of the workspace, Key Vault and storage, to the Log Analytics workspace."""

    enabled: bool = True
    retention_days: int = Field(30, ge=30, le=730)
    """Log Analytics retention; ingestion and retention beyond 31 days are billed."""
    storage_reads: bool = False
    """Also log every blob read (StorageRead): training reads produce millions of entries."""


class LocksConfig(_Model):
    dataset_storage: bool | None = None
    """CanNotDelete lock on the dataset account; defaults to protectData (on outside dev)."""


class ManagedNetworkSettings(_Model):
    """The managed VNet a stack declares, resolved from `network` with its defaults."""

    outbound: OutboundMode
    fqdn_rules: tuple[str, ...]
    firewall_sku: Literal["Standard", "Basic"] | None


class WayInSubnets(_Model):
    """The way in a stack declares, with every subnet resolved to a CIDR."""

    bastion: str | None = None
    bastion_sku: Literal["Basic", "Standard"] = "Standard"
    jump_box: str | None = None
    ci_runners: str | None = None


class NetworkConfig(_Model):
    isolation: Literal["public", "private", "managed"] = "public"
    """private: our own VNet for the nodes, private endpoints, no public network access, no node
    public IPs. managed: the nodes in Azure ML's managed VNet (outbound rules below), our VNet
    only for the private endpoints people and CI use. docs/isolation.md compares them."""
    address_space: str | None = None
    """VNet CIDR (private and managed isolation), e.g. 10.40.0.0/16."""
    compute_subnet: str | None = None
    """Private isolation only; defaults to the first half of addressSpace."""
    endpoint_subnet: str | None = None
    """Defaults to the second half of addressSpace."""
    outbound: OutboundMode | None = None
    """Managed isolation: AllowOnlyApprovedOutbound (default) or AllowInternetOutbound. Azure
    never lets a workspace go back (approved-only -> internet, or managed -> none)."""
    fqdn_rules: list[str] | None = None
    """Managed, approved-only: hosts jobs may reach (ports 80/443). Default DEFAULT_FQDN_RULES;
    [] for none. Any FQDN rule makes Azure deploy a firewall in the managed VNet (billed)."""
    firewall_sku: Literal["Standard", "Basic"] | None = None
    """The managed VNet's Azure Firewall for FQDN rules (Azure's default: Standard)."""
    way_in: WayInConfig | None = None
    """How people and CI reach a private or managed stack (docs/isolation.md)."""


class StorageConfig(_Model):
    tier: Literal["StandardHot", "PremiumBlockBlob"] = "StandardHot"
    """Dataset account: Standard_LRS hot, or Premium_LRS BlockBlobStorage (lower latency).
    Changing it replaces the account, so the data would have to be copied: it is protected."""
    allow_shared_key_access: bool = False
    soft_delete_days: int = Field(14, ge=1, le=365)
    egress_gbps: Gbps = skus.STORAGE_ACCOUNT.egress_gbits_per_s_default
    """The account's egress limit, Gb/s; staging warns when nodes x per-node rate exceeds it."""
    ingress_gbps: Gbps = skus.STORAGE_ACCOUNT.ingress_gbits_per_s_default
    """The account's ingress limit, Gb/s; checkpoint uploads are capped below it."""
    data_contributors: list[PrincipalConfig] = Field(default_factory=list)
    """Who may upload datasets (Storage Blob Data Contributor on `datasets`); shared keys are off."""


class BudgetConfig(_Model):
    monthly_amount_usd: Usd
    alert_emails: list[str] = Field(default_factory=list)
    thresholds_percent: list[int] = Field(default_factory=lambda: [50, 80, 100])


CONTROLLER_SKU = "Standard_D2s_v3"
CONTROLLER_USD_PER_HOUR = 0.096
"""Standard_D2s_v3, Linux, pay-as-you-go in eastus: Azure Retail Prices API
(prices.azure.com, serviceName 'Virtual Machines', type Consumption), as recorded in 2024-06."""
CONTROLLER_PRICE_REGION = "eastus"
"""The region of CONTROLLER_USD_PER_HOUR's row."""


class ControllerConfig(_Model):
    """The CPU cluster that managed runs' controller jobs run on (docs/managed-jobs.md).
    Scales to zero: it costs nothing while no managed run is active."""

    enabled: bool = True
    name: str = "jobs-controller"
    """The cluster's name in the workspace (2-16 characters, not one of `clusters`)."""
    sku: str = CONTROLLER_SKU
    """A small CPU size: a controller only polls Azure ML and Blob."""
    max_nodes: int = Field(4, ge=1, le=100)
    """Managed runs that can be supervised at once (one node each)."""
    idle_minutes: int = Field(5, ge=2, le=10080)
    usd_per_hour: UsdPerHour | None = None
    """Price of one node-hour; required for a size other than the default."""

    @property
    def price(self) -> float:
        return self.usd_per_hour or CONTROLLER_USD_PER_HOUR

    def price_source(self, stack_file: str) -> str:
        return (f"{stack_file}: aml-hpc:controller.usdPerHour" if self.usd_per_hour
                else f"Azure Retail Prices API, {self.sku} Linux pay-as-you-go, {CONTROLLER_PRICE_REGION}, 2024-06")


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
    controller: ControllerConfig = ControllerConfig()
    expires_at: str | date | datetime | None = None
    protect_data: bool | None = None
    prices: dict[str, UsdPerHour] = Field(default_factory=dict)
    names: dict[str, str] = Field(default_factory=dict)
    encryption: EncryptionConfig = EncryptionConfig()
    diagnostics: DiagnosticsConfig | None = None
    hbi_workspace: bool = False
    locks: LocksConfig = LocksConfig()
    # Redeploys and access: per-stack name suffix, workspace storage access, job submitters.
    name_suffix: str | None = None
    workspace_storage_auth: Literal["identity", "accessKey"] | None = None
    submitters: list[PrincipalConfig] = Field(default_factory=list)


_TOP_LEVEL_KEYS = {field.alias or name for name, field in _RawConfig.model_fields.items()}
_ENVIRONMENT_ONLY = {"network", "storage", "mlRegistry", "names", "encryption", "diagnostics", "hbiWorkspace", "locks",
                     "nameSuffix", "workspaceStorageAuth", "submitters", "controller"}
_TEXT_KEYS = {"namePrefix", "owner", "costCenter", "environment", "environmentStack", "expiresAt", "nameSuffix",
              "workspaceStorageAuth"}
NAME_SUFFIX_KEY = f"{NAMESPACE}nameSuffix"
"""Random characters every global name of an environment carries, generated once per stack
and kept in its stack file (infra/adopt.py), so two copies of this repository never ask
Azure for the same storage account, Key Vault, registry or ML registry name."""


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
    controller: ControllerConfig
    expires_at: datetime | None
    protect_data: bool
    prices: dict[str, float]
    names: naming.StackNames
    name_suffix: str | None
    """The stack file's aml-hpc:nameSuffix (None: derived names use a hash; deploys refuse)."""
    workspace_storage_auth: Literal["identity", "accessKey"]
    """How Azure ML reaches its own storage (infra.quirks.default_workspace_storage_auth)."""
    submitters: tuple[PrincipalConfig, ...]
    """People, groups or CI identities that submit jobs (workspace and storage roles)."""
    compute_subnet: str | None
    endpoint_subnet: str | None
    encryption: EncryptionConfig = EncryptionConfig()
    diagnostics: DiagnosticsConfig | None = None
    hbi_workspace: bool = False
    lock_dataset_storage: bool = False
    managed_network: ManagedNetworkSettings | None = None
    """Set under managed isolation."""
    way_in: WayInSubnets | None = None

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
    return parse(stack, flat, f"Pulumi.{stack}.yaml", deploying=True)


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


def _check_location(found: ProblemCollector, stack: str, location: Any) -> None:
    if not location:
        found.add(LOCATION_KEY, "is required (the Azure region)", fix_command(stack, LOCATION_KEY, "swedencentral"))
        return
    region_problem = regions.check(str(location))
    if region_problem:
        found.add(LOCATION_KEY, region_problem, "use the programmatic name, e.g. eastus, swedencentral")


def parse(stack: str, flat: dict[str, Any], reference: str, now: datetime | None = None,
          deploying: bool = False) -> StackConfig:
    """Validate a flat `namespace:key -> value` mapping into a StackConfig, or raise UserError.

    `deploying`: the engine is about to create resources (from_pulumi, the lifecycle
    emulator): an environment stack must then carry its aml-hpc:nameSuffix."""
    found = ProblemCollector(reference, f"stack {stack!r} has invalid configuration")
    kind: StackKind = "experiment" if stack.startswith(EXPERIMENT_PREFIX) else "environment"

    ours = _our_keys(found, stack, flat)
    location = flat.get(LOCATION_KEY)
    _check_location(found, stack, location)

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
    hardening = _check_hardening(found, stack, raw, location, compute_subnet, endpoint_subnet, now)
    _check_clusters(found, stack, raw, cluster_index)
    _check_storage(found, stack, raw)
    _check_principals(found, raw.submitters, f"{NAMESPACE}submitters")
    _check_name_suffix(found, stack, kind, raw, deploying)
    _check_seat(found, stack, raw, deploying)
    _check_budget(found, stack, raw)
    _check_prices(found, raw)
    _check_controller(found, stack, raw)
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
        controller=raw.controller,
        expires_at=expires,
        protect_data=raw.protect_data if raw.protect_data is not None else environment != "dev",
        prices=dict(raw.prices),
        name_suffix=raw.name_suffix,
        workspace_storage_auth=raw.workspace_storage_auth or _default_storage_auth(environment),
        submitters=tuple(raw.submitters),
        names=names,
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
    if kind == "experiment":
        _check_environment_stack(found, stack, raw)


def _check_environment_stack(found: ProblemCollector, stack: str, raw: _RawConfig) -> None:
    """An experiment's target is one fact, `environment`: the GitHub environment it deploys in
    (reviewers, identity, state) follows it, so a StackReference to another environment's
    stack under a `dev` label would put clusters into prod's workspace with dev's reviewers.
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
    names = naming.StackNames.derive(safe_prefix, stack, location, known, suffix=suffix)
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
                found.add(f"{base}.{to_camel(key)}", "is only used with isolation: private or managed",
                          f"remove it, or {fix_command(stack, base + '.isolation', 'private')}")
        return None, None
    managed = net.isolation == "managed"
    if managed and net.compute_subnet:
        found.add(f"{base}.computeSubnet", "is only used with isolation: private: clusters in a managed network "
                  "take no subnet (Azure places them in the workspace's managed VNet)", "remove it")
        return None, None
    if not net.address_space:
        found.add(f"{base}.addressSpace", f"{net.isolation} isolation needs an address space for our VNet",
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
    if not managed and chosen[0].overlaps(chosen[1]):
        found.add(f"{base}.endpointSubnet", f"{chosen[1]} overlaps computeSubnet {chosen[0]}", "give the subnets disjoint ranges")
    return (None if managed else str(chosen[0])), str(chosen[1])


_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def _check_storage(found: ProblemCollector, stack: str, raw: _RawConfig) -> None:
    _check_principals(found, raw.storage.data_contributors, f"{NAMESPACE}storage.dataContributors")


def _check_principals(found: ProblemCollector, principals: list[PrincipalConfig], path: str) -> None:
    for i, principal in enumerate(principals):
        if not _GUID.match(principal.principal_id):
            found.add(f"{path}[{i}].principalId",
                      f"{principal.principal_id!r} is not an Entra object id (a GUID)",
                      "find it with `az ad signed-in-user show --query id -o tsv` or `az ad group show -g NAME --query id -o tsv`")


def _default_storage_auth(environment: str) -> Literal["identity", "accessKey"]:
    from infra import quirks

    return quirks.default_workspace_storage_auth(environment)  # type: ignore[return-value]


def _check_name_suffix(found: ProblemCollector, stack: str, kind: StackKind, raw: _RawConfig, deploying: bool) -> None:
    if raw.name_suffix is not None:
        problem = naming.check("nameSuffix", raw.name_suffix)
        if problem:
            found.add(NAME_SUFFIX_KEY, problem,
                      f"remove it and let the tooling make one: python -m infra.adopt suffix --stack {stack}")
    elif deploying and kind == "environment":
        found.add(NAME_SUFFIX_KEY, "is not set: without it every copy of this repository asks Azure for the same "
                  "globally unique storage, Key Vault and registry names",
                  f"run `make preview STACK={stack}` once (it writes one), or python -m infra.adopt suffix --stack {stack}; "
                  "commit the stack file")


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
        if sku is not None and not sku.azureml.amlcompute:
            runnable = ", ".join(s for s in skus.names() if skus.get(s).azureml.amlcompute and not skus.get(s).retired)
            found.add(f"{path}.sku", sku.azureml_problem,
                      f"choose a size AmlCompute runs ({runnable}); the catalog entry says how to run {sku.name} instead")
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
    _check_budget_notifications(found, raw.budget.thresholds_percent, path)


def _check_budget_notifications(found: ProblemCollector, thresholds: list[int], path: str) -> None:
    """Azure takes at most five notifications per budget; the forecast alert is one of them."""
    from infra import quirks

    actual = len(set(thresholds))
    if actual + 1 > quirks.BUDGET_MAX_NOTIFICATIONS:
        found.add(f"{path}.thresholdsPercent",
                  f"{actual} thresholds plus the forecast alert make {actual + 1} notifications; an Azure budget "
                  f"takes at most {quirks.BUDGET_MAX_NOTIFICATIONS} notifications",
                  f"keep at most {quirks.BUDGET_MAX_NOTIFICATIONS - 1} thresholds, e.g. [50, 80, 95, 100]")


def _check_prices(found: ProblemCollector, raw: _RawConfig) -> None:
    for sku_name, price in raw.prices.items():
        if sku_name not in skus.CATALOG:
            near = skus.suggest(sku_name)
            found.add(f"{NAMESPACE}prices.{sku_name}", f"unknown VM size {sku_name!r}",
                      f"did you mean {' or '.join(near)}?" if near else f"known sizes: {', '.join(skus.names())}")
        if price <= 0:
            found.add(f"{NAMESPACE}prices.{sku_name}", f"price {price} must be positive", "use USD per node-hour")


# --------------------------------------------------------------------------------------
# Hardening: managed network, a way in, customer-managed key, diagnostics, locks, regions


def _check_hardening(found: ProblemCollector, stack: str, raw: _RawConfig, location: str,
                     compute_subnet: str | None, endpoint_subnet: str | None,
                     now: datetime | None) -> dict[str, Any]:
    """Validate the hardening options; return the StackConfig fields they resolve to."""
    _check_cluster_regions(found, raw, location, (now or datetime.now(UTC)).date())
    _check_managed_ssh(found, raw)
    _check_encryption(found, stack, raw)
    protect = raw.protect_data if raw.protect_data is not None else (raw.environment or stack) != "dev"
    lock = raw.locks.dataset_storage if raw.locks.dataset_storage is not None else protect
    return {
        "encryption": raw.encryption,
        "diagnostics": raw.diagnostics if raw.diagnostics and raw.diagnostics.enabled else None,
        "hbi_workspace": raw.hbi_workspace,
        "lock_dataset_storage": lock,
        "managed_network": _check_managed_network(found, stack, raw),
        "way_in": _check_way_in(found, stack, raw, compute_subnet, endpoint_subnet),
    }


def _check_cluster_regions(found: ProblemCollector, raw: _RawConfig, location: str, today: date) -> None:
    """A cluster's size must be offered in the stack's region (core/catalog/availability.toml)."""
    for i, cluster in enumerate(raw.clusters):
        try:
            size = skus.get(cluster.sku).name
        except skus.UnknownSkuError:
            continue  # reported by _check_clusters
        problem = availability.problem(size, location, today)
        if problem and not (cluster.allow_unlisted_region and not availability.retired(size, today)):
            found.add(f"{NAMESPACE}clusters[{i}].sku", *problem)


def _check_managed_ssh(found: ProblemCollector, raw: _RawConfig) -> None:
    """Nodes in Azure ML's managed VNet have no public IP and no route from our VNet: SSH (and
    so `jobs beeond`) cannot reach them. Microsoft documents SSH into managed-network compute
    for compute instances only (`az ml compute connect-ssh`)."""
    if raw.network.isolation != "managed":
        return
    for i, cluster in enumerate(raw.clusters):
        if cluster.ssh is not None and cluster.ssh.on:
            found.add(f"{NAMESPACE}clusters[{i}].ssh", "nodes in a managed network cannot be reached by SSH: they have "
                      "no public IP and our VNet has no route into Azure ML's managed VNet",
                      "remove the ssh block, or use isolation: private (SSH from the jump box; docs/isolation.md)")


_FQDN = re.compile(r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
_STORAGE_SUFFIXES = (".core.windows.net", ".storage.azure.net")


def _check_managed_network(found: ProblemCollector, stack: str, raw: _RawConfig) -> ManagedNetworkSettings | None:
    net = raw.network
    base = f"{NAMESPACE}network"
    if net.isolation != "managed":
        for key in ("outbound", "fqdn_rules", "firewall_sku"):
            if getattr(net, key) is not None:
                found.add(f"{base}.{to_camel(key)}", "is only used with isolation: managed",
                          f"remove it, or {fix_command(stack, base + '.isolation', 'managed')}")
        return None
    outbound = net.outbound or "AllowOnlyApprovedOutbound"
    if outbound == "AllowInternetOutbound":
        if net.fqdn_rules:
            found.add(f"{base}.fqdnRules", "only apply with outbound: AllowOnlyApprovedOutbound "
                      "(AllowInternetOutbound already lets jobs reach every host)",
                      f"remove them, or {fix_command(stack, base + '.outbound', 'AllowOnlyApprovedOutbound')}")
        if net.firewall_sku is not None:
            found.add(f"{base}.firewallSku", "only matters for FQDN rules under outbound: AllowOnlyApprovedOutbound",
                      "remove it")
        return ManagedNetworkSettings(outbound=outbound, fqdn_rules=(), firewall_sku=None)
    rules = list(DEFAULT_FQDN_RULES) if net.fqdn_rules is None else net.fqdn_rules
    seen: set[str] = set()
    for i, host in enumerate(rules):
        path = f"{base}.fqdnRules[{i}]"
        name = host.strip().lower()
        if "://" in name or "/" in name or ":" in name:
            found.add(path, f"{host!r} is not a host name (no scheme, port or path: FQDN rules allow 80 and 443)",
                      "write just the host, e.g. pypi.org")
        elif name.startswith("*"):
            found.add(path, f"{host!r} is a wildcard: it lets jobs send data to every host under "
                      f"{name.lstrip('*.')!r} (any bucket, tunnel or tenant anyone can create there)",
                      "list the exact hosts jobs need (e.g. my-bucket.s3.us-east-1.amazonaws.com), or bake what "
                      "jobs download into the image")
        elif not _FQDN.match(name):
            found.add(path, f"{host!r} is not a fully qualified host name", "e.g. pypi.org")
        elif name.endswith(_STORAGE_SUFFIXES):
            found.add(path, f"{host!r} is an Azure Storage endpoint: an approved-only managed network reaches storage "
                      "through private endpoints, never FQDN rules", "remove it; the dataset account gets a private "
                      "endpoint rule already (add other accounts as outbound private endpoints)")
        elif name in seen:
            found.add(path, f"{host!r} is listed twice", "remove the duplicate")
        seen.add(name)
    if net.firewall_sku is not None and not rules:
        found.add(f"{base}.firewallSku", "no FQDN rules, so Azure deploys no firewall for it to size", "remove it")
    return ManagedNetworkSettings(outbound=outbound, fqdn_rules=tuple(h.strip().lower() for h in rules),
                                  firewall_sku=(net.firewall_sku or "Standard") if rules else None)


# Smallest useful subnet per way in: Azure Bastion needs a /26 named AzureBastionSubnet; a jump
# box needs a handful of addresses (Azure keeps 5 per subnet); runners a few dozen.
_WAY_IN_SLOTS = (("bastion", "Bastion", 26), ("jump_box", "jump box", 28), ("ci_runners", "CI runner", 27))


def _check_way_in(found: ProblemCollector, stack: str, raw: _RawConfig, compute_subnet: str | None,
                  endpoint_subnet: str | None) -> WayInSubnets | None:
    net, way_in = raw.network, raw.network.way_in
    base = f"{NAMESPACE}network.wayIn"
    if way_in is None:
        return None
    if net.isolation == "public":
        found.add(base, "a public stack needs no way in: its workspace and storage take Entra ID sign-ins from anywhere",
                  f"remove it, or {fix_command(stack, NAMESPACE + 'network.isolation', 'managed')}")
        return None
    if way_in.bastion and not way_in.jump_box:
        found.add(f"{base}.bastion", "Bastion connects to a VM, and this way in declares none",
                  f"add a jump box: {fix_command(stack, base + '.jumpBox.publicKey', chr(34) + '$(cat ~/.ssh/id_ed25519.pub)' + chr(34))}")
    if way_in.jump_box:
        box = way_in.jump_box
        _check_ssh(found, stack, f"{base}.jumpBox", SshConfig(enabled=True, public_key=box.public_key, admin_user=box.admin_user))
        if not re.fullmatch(r"Standard_[A-Za-z0-9_]+", box.size):
            found.add(f"{base}.jumpBox.size", f"{box.size!r} is not an Azure VM size name", "e.g. Standard_D2s_v5")
    if not net.address_space or endpoint_subnet is None:
        return None  # the address space problem is reported already
    space = ipaddress.ip_network(net.address_space)
    taken = [ipaddress.ip_network(s) for s in (compute_subnet, endpoint_subnet) if s]
    wanted = {key: getattr(way_in, key) for key, _, _ in _WAY_IN_SLOTS}
    chosen: dict[str, str | None] = {}
    for key, label, prefix in _WAY_IN_SLOTS:  # explicit ranges first: defaults fill around them
        part = wanted[key]
        if part is None or part.subnet is None:
            continue
        path = f"{base}.{to_camel(key)}.subnet"
        try:
            subnet = ipaddress.ip_network(part.subnet, strict=True)
        except ValueError as exc:
            found.add(path, f"{part.subnet!r} is not a valid CIDR block ({exc})", "e.g. 10.40.0.0/26")
            continue
        clash = next((t for t in taken if t.overlaps(subnet)), None)
        if not subnet.subnet_of(space):  # type: ignore[arg-type]
            found.add(path, f"{subnet} is outside addressSpace {space}", "pick a range inside addressSpace")
        elif subnet.prefixlen > prefix:
            found.add(path, f"{subnet} is too small for the {label} subnet", f"use a /{prefix} or larger")
        elif clash is not None:
            found.add(path, f"{subnet} overlaps {clash}, already used in this VNet", "give every subnet its own range")
        else:
            taken.append(subnet)
            chosen[key] = str(subnet)
    for key, label, prefix in _WAY_IN_SLOTS:  # then fixed slots, so enabling one later moves no other
        part = wanted[key]
        if part is not None and part.subnet is not None:
            continue
        slot = _first_free(space, taken, prefix)
        if slot is None:
            if part is not None:
                half = next(ipaddress.ip_network(endpoint_subnet).subnets(prefixlen_diff=1))
                found.add(f"{base}.{to_camel(key)}", f"addressSpace {space} has no free /{prefix} for the {label} "
                          "subnet: the compute and endpoint subnets use all of it (by default they take its halves)",
                          f"give the endpoints less room, e.g. {fix_command(stack, NAMESPACE + 'network.endpointSubnet', str(half))}, "
                          f"or set {to_camel(key)}.subnet")
            continue
        taken.append(slot)
        if part is not None:
            chosen[key] = str(slot)
    return WayInSubnets(bastion=chosen.get("bastion"), bastion_sku=way_in.bastion.sku if way_in.bastion else "Standard",
                        jump_box=chosen.get("jump_box"), ci_runners=chosen.get("ci_runners"))


def _check_seat(found: ProblemCollector, stack: str, raw: _RawConfig, deploying: bool) -> None:
    """A private or managed stack takes no public traffic: people need a seat inside our VNet
    (Bastion with a jump box) or a declared hand-off from their own network (VPN, ExpressRoute,
    peering), and on deploy someone must be able to use the seat."""
    net = raw.network
    if net.isolation == "public":
        return
    base = f"{NAMESPACE}network.wayIn"
    way_in = net.way_in or WayInConfig()
    box, hand_off = way_in.jump_box, way_in.hand_off
    if hand_off is not None:
        _check_hand_off(found, stack, hand_off, net.address_space, f"{base}.handOff")
    if box is not None:
        _check_principals(found, box.logins, f"{base}.jumpBox.logins")
        if box.logins and way_in.bastion and way_in.bastion.sku == "Basic":
            found.add(f"{base}.bastion.sku", "Entra ID sign-in to the jump box goes through Bastion's native-client "
                      "tunnel (az network bastion ssh --auth-type AAD), which Basic does not have",
                      fix_command(stack, f"{base}.bastion.sku", "Standard"))
    if way_in.bastion and not box:
        return  # "Bastion connects to a VM" is reported by _check_way_in
    if not ((way_in.bastion and box) or hand_off):
        key = '"$(cat ~/.ssh/id_ed25519.pub)"'
        found.add(base, f"isolation: {net.isolation} turns public access to the workspace, storage and registries "
                  "off, and this stack declares no way in for people: nobody could submit a job, open studio or "
                  "upload data",
                  f"add Bastion and a jump box: {fix_command(stack, base + '.bastion.sku', 'Standard')} and "
                  f"{fix_command(stack, base + '.jumpBox.publicKey', key)}; or declare the hand-off from your "
                  f"network: {fix_command(stack, base + '.handOff.via', 'VPN')} and "
                  f"{fix_command(stack, base + '.handOff.addressPrefixes[0]', '<your network CIDR>')} "
                  "(docs/isolation.md, A way in)")
        return
    if deploying and box is not None and hand_off is None and not box.logins \
            and (box.public_key or "").strip() == UNHELD_PUBLIC_KEY:
        found.add(f"{base}.jumpBox.logins", "nobody can sign in to the jump box: it names no Entra ID logins, and its "
                  "admin key is the shipped one, whose private half nobody holds",
                  "name who uses it: "
                  f"{fix_command(stack, base + '.jumpBox.logins[0].principalId', '<object id>')} (a group: az ad group "
                  "show -g NAME --query id -o tsv), or replace jumpBox.publicKey with your own break-glass key")


def _check_hand_off(found: ProblemCollector, stack: str, hand_off: HandOffConfig, address_space: str | None,
                    path: str) -> None:
    if not hand_off.address_prefixes:
        found.add(f"{path}.addressPrefixes", f"a {hand_off.via} hand-off names the networks it brings in",
                  fix_command(stack, f"{path}.addressPrefixes[0]", "<your network CIDR>"))
    try:
        space = ipaddress.ip_network(address_space or "", strict=True)
    except ValueError:
        space = None  # its own problem is reported
    for i, text in enumerate(hand_off.address_prefixes):
        try:
            prefix = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            found.add(f"{path}.addressPrefixes[{i}]", f"{text!r} is not a valid CIDR block ({exc})", "e.g. 10.0.0.0/8")
            continue
        if space is not None and prefix.overlaps(space):  # type: ignore[arg-type]
            found.add(f"{path}.addressPrefixes[{i}]", f"{prefix} overlaps addressSpace {space}: routes to our VNet "
                      "and to that network would collide", "give the VNet an address space the network does not use")


def _first_free(space: ipaddress.IPv4Network | ipaddress.IPv6Network, taken: list, prefix: int):
    """The lowest /prefix block of `space` that overlaps nothing in `taken`, or None."""
    if prefix < space.prefixlen:
        return None
    for candidate in space.subnets(new_prefix=prefix):
        if not any(candidate.overlaps(t) for t in taken):
            return candidate
    return None


def _check_encryption(found: ProblemCollector, stack: str, raw: _RawConfig) -> None:
    enc = raw.encryption
    path = f"{NAMESPACE}encryption.cosmosDbPrincipalId"
    lookup = "az ad sp show --id a232010e-820c-4083-83bb-3ace5fc29d0b --query id -o tsv"
    if not enc.customer_managed_key:
        if enc.cosmos_db_principal_id is not None:
            found.add(path, "is only used with customerManagedKey: true", "remove it")
        return
    if not enc.cosmos_db_principal_id:
        found.add(path, "a customer-managed key needs the object id of the 'Azure Cosmos DB' service principal, "
                  "which encrypts the workspace's metadata with it", f"find it with `{lookup}`, then "
                  f"{fix_command(stack, path, '<object id>')}")
    elif not _GUID.match(enc.cosmos_db_principal_id):
        found.add(path, f"{enc.cosmos_db_principal_id!r} is not an Entra object id (a GUID)", f"find it with `{lookup}`")


def _check_controller(found: ProblemCollector, stack: str, raw: _RawConfig) -> None:
    ctl, path = raw.controller, f"{NAMESPACE}controller"
    if not ctl.enabled:
        return
    problem = naming.check("cluster", ctl.name)
    if problem:
        found.add(f"{path}.name", f"cluster name {problem}", fix_command(stack, f"{path}.name", "jobs-controller"))
    if ctl.name.lower() in {c.name.lower() for c in raw.clusters}:
        found.add(f"{path}.name", f"{ctl.name!r} is also the name of one of aml-hpc:clusters",
                  "give the controller cluster a name of its own")
    if ctl.sku != CONTROLLER_SKU and ctl.usd_per_hour is None:
        found.add(f"{path}.usdPerHour", f"no price for {ctl.sku} (the reference price is for {CONTROLLER_SKU})",
                  fix_command(stack, f"{path}.usdPerHour", "<usd-per-node-hour>"))


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
