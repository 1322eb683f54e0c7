"""Identity-based Azure ML datastores for the dataset account's containers.

No account key or SAS is stored in the workspace: jobs read and write with the cluster's
managed identity, and Studio previews use the workspace's identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import machinelearningservices as ml


@dataclass
class DatastoresArgs:
    resource_group_name: pulumi.Input[str]
    workspace_name: pulumi.Input[str]
    account_name: pulumi.Input[str]
    containers: list[str]
    """Container names; each becomes a datastore of the same name."""


class Datastores(pulumi.ComponentResource):
    """One credential-less blob datastore per container."""

    names: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: DatastoresArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:ml:Datastores", name, None, opts)
        self.names = {}
        for container in args.containers:
            store = ml.Datastore(
                f"{name}-{container}",
                name=container,
                resource_group_name=args.resource_group_name,
                workspace_name=args.workspace_name,
                properties=ml.AzureBlobDatastoreArgs(
                    datastore_type="AzureBlob",
                    account_name=args.account_name,
                    container_name=container,
                    credentials=ml.NoneDatastoreCredentialsArgs(credentials_type="None"),
                    endpoint="core.windows.net",
                    protocol="https",
                    service_data_access_auth_identity="WorkspaceSystemAssignedIdentity",
                    description=f"aml-hpc {container} (identity-based access)",
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.names[container] = store.name
        self.register_outputs({"names": dict(self.names)})
