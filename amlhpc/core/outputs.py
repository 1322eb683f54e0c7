"""The stack outputs document: the one contract between infra (producer) and jobs and
images (consumers). docs/contracts.md section 2 describes it.

`pulumi stack output --json` of a stack, a saved copy of it, and the offline plan all give
this document. infra builds it with the key names below (`amlhpc.infra.outputs.export` refuses a
key this model does not know, or a missing one); jobs validate it with the same model.
Every model forbids unknown keys, so a key renamed on one side breaks a test, not a job.

Never holds a secret: keys, SAS tokens and connection strings are not outputs at all.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from amlhpc.core.skus import Price


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    def document(self) -> dict[str, Any]:
        """The JSON document (camelCase keys), as the stack exports it."""
        return self.model_dump(by_alias=True, mode="json")


class ClusterOut(_Doc):
    """What jobs need to know about one GPU cluster."""

    sku: str
    min_nodes: int = Field(alias="minNodes", ge=0)
    max_nodes: int = Field(alias="maxNodes", ge=1)
    priority: Literal["Dedicated", "LowPriority"]
    gpus_per_node: int = Field(alias="gpusPerNode", ge=0)
    infiniband: bool
    ssh_enabled: bool = Field(alias="sshEnabled")
    idle_minutes: int = Field(alias="idleMinutes", ge=0)


class StorageOut(_Doc):
    """The dataset storage account jobs stage from and checkpoint to."""

    account: str
    blob_endpoint: str = Field(alias="blobEndpoint")
    containers: dict[str, str]
    """Logical container (datasets, checkpoints) -> container name."""
    tier: Literal["StandardHot", "PremiumBlockBlob"]
    egress_gbps: float = Field(alias="egressGbps", gt=0)
    ingress_gbps: float = Field(alias="ingressGbps", gt=0)


class RegistryOut(_Doc):
    login_server: str = Field(alias="loginServer")
    environments: dict[str, str]
    """Environment name -> image reference (registry/repo:tag)."""
    environment_ids: dict[str, str] = Field(alias="environmentIds")
    """Environment name -> azureml:<name>:<version>, the registered environments (version = image tag)."""
    ml_registry: str | None = Field(alias="mlRegistry")
    """Azure ML registry name, when the stack declares one."""


class IdentityOut(_Doc):
    """The clusters' user-assigned managed identity."""

    client_id: str = Field(alias="clientId")
    principal_id: str = Field(alias="principalId")
    id: str


class NetworkOut(_Doc):
    isolation: Literal["public", "private", "managed"]
    subnet_id: str | None = Field(alias="subnetId")
    """The compute subnet (private isolation), for experiment clusters; None in a managed network."""


class ControllerOut(_Doc):
    """The small CPU cluster the controllers of managed runs run on, with the identity they
    submit and watch jobs as (amlhpc/infra/components/controller.py, docs/managed-jobs.md)."""

    cluster: str
    sku: str
    usd_per_hour: float = Field(alias="usdPerHour", gt=0)
    """What one controller costs while it runs (one node per managed run)."""
    price_source: str = Field(alias="priceSource")
    identity: IdentityOut


class ReaderOut(_Doc):
    """A principal that reads the runs' checkpoints besides the GPU clusters' identity."""

    principal: Literal["controller", "submitter"]
    """Its principal in the permission model (amlhpc/core/catalog/permissions.toml)."""
    principal_id: str = Field(alias="principalId")
    principal_type: str = Field(alias="principalType")
    index: int | None = None
    """A submitter's position in the environment's aml-hpc:submitters (its grants' names carry it)."""


class BudgetOut(_Doc):
    monthly_amount_usd: float = Field(alias="monthlyAmountUsd", gt=0)
    alert_emails: list[str] = Field(alias="alertEmails")


class PriceOut(_Doc):
    """USD per node-hour of a size, resolved by infra from the stack's override or the catalog."""

    usd_per_hour: float = Field(alias="usdPerHour", gt=0)
    region: str
    as_of: str = Field(alias="asOf")
    source: str
    """A catalog source id, or the stack file and key that set it."""

    @classmethod
    def of(cls, price: Price) -> PriceOut:
        return cls(usd_per_hour=price.usd_per_hour, region=price.region, as_of=price.as_of, source=price.source)

    def to_price(self) -> Price:
        return Price(self.usd_per_hour, self.region, self.as_of, self.source)


class StackOutputs(_Doc):
    """`pulumi stack output --json` of an aml-hpc stack (environment or experiment)."""

    stack: str
    kind: Literal["environment", "experiment"]
    environment: str
    """The environment stack this stack belongs to (its own name for environments)."""
    subscription_id: str = Field(alias="subscriptionId")
    resource_group: str = Field(alias="resourceGroup")
    location: str
    workspace: str
    workspace_id: str = Field(alias="workspaceId")
    clusters: dict[str, ClusterOut]
    """Experiment stacks list only their own clusters."""
    datastores: dict[str, str]
    """Logical datastore (datasets, checkpoints) -> Azure ML datastore name."""
    storage: StorageOut
    registry: RegistryOut
    identity: IdentityOut
    network: NetworkOut
    budget: BudgetOut | None
    prices: dict[str, PriceOut]
    """Size -> price per node-hour, for every size the stack's clusters use that has one."""
    controller: ControllerOut | None = None
    """The managed runs' controller cluster; null when the stack declares none (or was
    deployed before it existed)."""
    checkpoint_accounts: list[str] | None = Field(None, alias="checkpointAccounts")
    """The accounts checkpoints are striped over, in striping order (each holds a `checkpoints`
    container); the dataset account alone when the stack declares none; null (absent) from a
    stack deployed before accounts by role: the dataset account."""
    coordination_account: str | None = Field(None, alias="coordinationAccount")
    """The account holding the `supervision` container; null (absent): the dataset account."""
    checkpoint_readers: list[ReaderOut] | None = Field(None, alias="checkpointReaders")
    """Environments: who besides the GPU identity reads checkpoints (the controller's identity, the
    submitters); an experiment's own checkpoint accounts grant them the same reads."""
    expires_at: str | None = Field(alias="expiresAt")
    """ISO 8601 UTC on experiment stacks; null on environments."""
    tags: dict[str, str]

    def account_endpoint(self, account: str) -> str:
        """The blob endpoint of one of the stack's accounts: the dataset account's endpoint with
        the account's name in its place (same cloud, same suffix)."""
        base = self.storage.blob_endpoint
        return base.replace(f"//{self.storage.account}.", f"//{account}.", 1) if account != self.storage.account else base

    def coordination_endpoint(self) -> str:
        """Where the managed runs' records live (`supervision`): the coordination account, else the dataset account."""
        return self.account_endpoint(self.coordination_account or self.storage.account)

    def stack_prices(self) -> dict[str, Price]:
        return {name: price.to_price() for name, price in self.prices.items()}


REQUIRED_DATASTORES = ("datasets", "checkpoints")
REQUIRED_CONTAINERS = ("datasets", "checkpoints")


def keys(model: type[BaseModel] = StackOutputs) -> set[str]:
    """The document keys (aliases) a model defines."""
    return {field.alias or name for name, field in model.model_fields.items()}
