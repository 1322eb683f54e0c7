"""The stack's shared services, as its keys type them: the managed runs' controller cluster, the
Azure ML registry and the workspace's container registry."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from amlhpc.core.values import UsdPerHour
from amlhpc.infra.config.base import _Model

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


RegistrySku = Literal["Basic", "Standard", "Premium"]


class ContainerRegistryConfig(_Model):
    """The workspace's container registry, which every node of every cluster pulls the training
    image from when a job starts."""

    sku: RegistrySku | None = None
    """Default: Standard under public isolation, Premium otherwise (private endpoints need it).
    The plan checks the reads a start of every cluster's nodes takes against the tier's
    reads per minute; Premium allows over 3x Standard's. Changing it updates the registry in place."""


class MlRegistryConfig(_Model):
    enabled: bool = False
    regions: list[str] = Field(default_factory=list)
    """Extra replication regions; the stack's location is always included."""
