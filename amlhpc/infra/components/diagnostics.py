"""Diagnostic settings: the platform's resource logs and metrics into its Log Analytics workspace.

One `Microsoft.Insights/diagnosticSettings` per resource (azure-native monitor
DiagnosticSetting, REST API 2021-05-01-preview). What each resource sends, and why:

- the Azure ML workspace: every log category (`allLogs`: cluster and node events, job
  events, model and data changes), into resource-specific tables (`Dedicated`);
- the Key Vault: the `audit` group (AuditEvent: every key and secret access);
- Blob storage (the dataset account and the workspace's own): writes and deletes
  (StorageWrite, StorageDelete) - who changed the data. Reads (StorageRead) only when the
  stack asks: a training job reads millions of blobs and Log Analytics bills by ingestion.
  Storage logs live on the blob service (`<account>/blobServices/default`), not the account.
- metrics: AllMetrics, Transaction for blob storage.

A setting on a blob service under an Azure delete lock (the dataset account outside dev)
is an extension resource of the locked account: Azure refuses to delete it (ScopeLocked),
so it is `protect`ed and `make down` leaves it in place (amlhpc/infra/components/access.py says
the same of role assignments).

Category names: Microsoft Learn, "Supported categories for Azure Monitor resource logs"
(Microsoft.MachineLearningServices/workspaces, Microsoft.KeyVault/vaults,
Microsoft.Storage/storageAccounts/blobServices).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import monitor

SETTING_NAME = "to-log-analytics"


@dataclass(frozen=True)
class DiagnosticTarget:
    key: str
    """Short name for the resource name, e.g. "workspace"."""
    resource_uri: pulumi.Input[str]
    log_groups: tuple[str, ...] = ()
    """Category groups: allLogs or audit."""
    log_categories: tuple[str, ...] = ()
    metric_category: str | None = "AllMetrics"
    dedicated: bool = False
    """Resource-specific Log Analytics tables instead of AzureDiagnostics."""
    protect: bool = False
    """The resource is under an Azure delete lock, so the setting cannot be deleted either."""


@dataclass
class DiagnosticsArgs:
    log_analytics_id: pulumi.Input[str]
    targets: list[DiagnosticTarget] = field(default_factory=list)


def platform_targets(*, workspace_id: pulumi.Input[str], vault_id: pulumi.Input[str],
                     storage_account_ids: dict[str, pulumi.Input[str]], storage_reads: bool = False,
                     locked_accounts: frozenset[str] = frozenset()) -> list[DiagnosticTarget]:
    """The workspace, its Key Vault and the blob service of each storage account
    (`locked_accounts`: keys of `storage_account_ids` under a delete lock)."""
    blob_logs = ("StorageRead", "StorageWrite", "StorageDelete") if storage_reads else ("StorageWrite", "StorageDelete")
    targets = [
        DiagnosticTarget("workspace", workspace_id, log_groups=("allLogs",), dedicated=True),
        DiagnosticTarget("key-vault", vault_id, log_groups=("audit",)),
    ]
    for key, account_id in storage_account_ids.items():
        blob_service = pulumi.Output.from_input(account_id).apply(lambda i: f"{i}/blobServices/default")
        targets.append(DiagnosticTarget(f"{key}-blob", blob_service, log_categories=blob_logs,
                                        metric_category="Transaction", protect=key in locked_accounts))
    return targets


class Diagnostics(pulumi.ComponentResource):
    """One diagnostic setting per target, all to the same Log Analytics workspace."""

    def __init__(self, name: str, args: DiagnosticsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:monitoring:Diagnostics", name, None, opts)
        for target in args.targets:
            logs = [monitor.DiagnosticsLogSettingsArgs(category_group=g, enabled=True) for g in target.log_groups]
            logs += [monitor.DiagnosticsLogSettingsArgs(category=c, enabled=True) for c in target.log_categories]
            monitor.DiagnosticSetting(
                f"{name}-{target.key}",
                name=SETTING_NAME,
                resource_uri=target.resource_uri,
                workspace_id=args.log_analytics_id,
                log_analytics_destination_type="Dedicated" if target.dedicated else None,
                logs=logs or None,
                metrics=[monitor.DiagnosticsMetricSettingsArgs(category=target.metric_category, enabled=True)]
                if target.metric_category else None,
                opts=pulumi.ResourceOptions(parent=self, protect=True if target.protect else None),
            )
        self.register_outputs({})
