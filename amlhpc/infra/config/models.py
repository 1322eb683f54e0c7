"""The typed shape of a stack's `aml-hpc:` keys and the validated StackConfig the components receive."""

from __future__ import annotations

import re
from datetime import date, datetime
from typing import Literal

from pydantic import Field

from amlhpc.core import pricing, project, skus
from amlhpc.core.values import Gbps, Nodes, Usd, UsdPerHour
from amlhpc.infra import naming
from amlhpc.infra.config.base import _Model
from amlhpc.infra.config.checkpoint_accounts import CheckpointAccountsConfig
from amlhpc.infra.config.services import (
    ContainerRegistryConfig,
    ControllerConfig,
    MlRegistryConfig,
    RegistrySku,
)

PROJECT = "aml-hpc"
NAMESPACE = f"{PROJECT}:"
LOCATION_KEY = "azure-native:location"
EXPERIMENT_PREFIX = "exp-"
REPO_ROOT = project.root()
"""The project folder: its Pulumi.<stack>.yaml files (amlhpc/core/project.py finds it)."""

StackKind = Literal["environment", "experiment"]


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
    """Azure VM size, one of amlhpc.core.skus.CATALOG. Changing it replaces the cluster."""
    min_nodes: int = Field(0, ge=0)
    """Nodes kept even when idle. Anything above 0 bills around the clock: needs allowIdleNodes."""
    max_nodes: Nodes
    """1 to 10,000 (amlhpc/core/values.py RANGES['nodes'])."""
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
    """Opt-in for a size amlhpc/core/catalog/availability.toml does not list in the stack's region
    (the lists are a snapshot; Azure adds regions). Retired sizes stay refused."""


OutboundMode = Literal["AllowOnlyApprovedOutbound", "AllowInternetOutbound"]

DEFAULT_FQDN_RULES: dict[str, str] = {
    "pypi.org": "pip's index, for recipes and jobs that pip-install at start",
    "files.pythonhosted.org": "where pip downloads what pypi.org lists",
}
"""Hosts a managed, approved-only network lets jobs reach unless the stack says otherwise, and
why. Not here on purpose: general-purpose code and file hosts (github.com, gist, paste and
tunnel services), where a job could push data as easily as it pulls code - a team that needs
one adds it to the stack's fqdnRules and to amlhpc/infra/policy/outbound.toml, where the platform
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
    coordination_account: bool = False
    """The managed runs' supervision records in a small account of their own (stack output
    coordinationAccount), never starved by checkpoint bytes. Off: they stay in the dataset
    account's `supervision` container, where a stack deployed before holds its active runs' records."""


class BudgetConfig(_Model):
    monthly_amount_usd: Usd
    alert_emails: list[str] = Field(default_factory=list)
    thresholds_percent: list[int] = Field(default_factory=lambda: [50, 80, 100])


class _RawConfig(_Model):
    """The `aml-hpc:` keys of a stack file, types only."""

    name_prefix: str = "amlhpc"
    owner: str
    cost_center: str | None = None
    environment: str | None = None
    environment_stack: str | None = None
    network: NetworkConfig = NetworkConfig()
    storage: StorageConfig = StorageConfig()
    checkpoint_accounts: CheckpointAccountsConfig | None = None
    clusters: list[ClusterConfig] = Field(default_factory=list)
    budget: BudgetConfig | None = None
    ml_registry: MlRegistryConfig = MlRegistryConfig()
    container_registry: ContainerRegistryConfig = ContainerRegistryConfig()
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
    allow_unlisted_region: bool = False
    """Opt-in for an azure-native:location that Azure's list of public regions in amlhpc/core/regions.py
    does not hold (a region opened after the list was read); without it such a location is refused as a typo."""


_TOP_LEVEL_KEYS = {field.alias or name for name, field in _RawConfig.model_fields.items()}
_ENVIRONMENT_ONLY = {"network", "storage", "mlRegistry", "containerRegistry", "names", "encryption", "diagnostics", "hbiWorkspace", "locks",
                     "nameSuffix", "workspaceStorageAuth", "submitters", "controller"}
_TEXT_KEYS = {"namePrefix", "owner", "costCenter", "environment", "environmentStack", "expiresAt", "nameSuffix",
              "workspaceStorageAuth"}
NAME_SUFFIX_KEY = f"{NAMESPACE}nameSuffix"
"""Random characters every global name of an environment carries, generated once per stack
and kept in its stack file (amlhpc/infra/adopt.py), so two copies of this repository never ask
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
    """How Azure ML reaches its own storage (amlhpc.infra.quirks.default_workspace_storage_auth)."""
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
    checkpoint_accounts: CheckpointAccountsConfig | None = None
    """The stack's own checkpoint accounts; None: checkpoints go where the environment puts them."""
    container_registry_sku: RegistrySku = "Standard"
    """The workspace registry's tier (aml-hpc:containerRegistry.sku, else the isolation's default)."""

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


# Formats the rules check a value against.
EMAIL_FORMAT = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
SSH_PUBLIC_KEY_FORMAT = re.compile(r"^(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]{20,}( .*)?$")
EXPERIMENT_NAME_FORMAT = re.compile(r"^exp-[a-z0-9](?:[a-z0-9-]{0,18}[a-z0-9])?$")
GUID_FORMAT = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
