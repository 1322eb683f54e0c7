"""The emulator behaves as azure-native and Azure do (sources in lifecycle_engine.py and
lifecycle_cloud.py): small programs, one behaviour each. The scenarios in
test_lifecycle_scenarios.py rely on every one of these."""

from __future__ import annotations

import pulumi
import pytest
from pulumi_azure_native import keyvault, resources, storage
from pulumi_azure_native import machinelearningservices as ml

from tests.lifecycle.lifecycle_cloud import FakeAzure
from tests.lifecycle.lifecycle_engine import DeploymentFailed, Engine

SUB = "aaaaaaaa-0000-0000-0000-000000000001"
OTHER = "bbbbbbbb-0000-0000-0000-000000000002"


def group(name: str = "rg", **opts) -> resources.ResourceGroup:
    return resources.ResourceGroup(name, resource_group_name=name, location="eastus",
                                   opts=pulumi.ResourceOptions(**opts))


def account(name: str, rg: str = "rg", **opts) -> storage.StorageAccount:
    return storage.StorageAccount(name, account_name=name, resource_group_name=rg, location="eastus",
                                  kind="StorageV2", sku=storage.SkuArgs(name="Standard_LRS"),
                                  opts=pulumi.ResourceOptions(**opts))


def workspace(rg: str = "rg", **opts) -> ml.Workspace:
    return ml.Workspace("ws", workspace_name="mlw", resource_group_name=rg, location="eastus",
                        opts=pulumi.ResourceOptions(**opts))


def vault(rg: str = "rg", create_mode: str | None = None) -> keyvault.Vault:
    return keyvault.Vault("kv", vault_name="kv-shared-name", resource_group_name=rg, location="eastus",
                          properties=keyvault.VaultPropertiesArgs(
                              tenant_id="t", sku=keyvault.SkuArgs(family="A", name="standard"),
                              enable_purge_protection=True, soft_delete_retention_in_days=90,
                              create_mode=create_mode))


def run(engine: Engine, stack: str, build) -> dict:
    """`pulumi up` of a program that exports nothing."""
    def program() -> dict:
        build()
        return {}

    return engine.up(stack, program)


@pytest.fixture
def azure() -> FakeAzure:
    return FakeAzure()


@pytest.fixture
def engine(azure) -> Engine:
    return Engine(azure, SUB)


def test_creating_a_resource_that_exists_fails(azure, engine):
    """defaultCreate: GET first, then "cannot create already existing resource"."""
    run(engine, "one", lambda: account("sharedacct", rg="rg") if group() else None)
    with pytest.raises(DeploymentFailed, match="cannot create already existing resource"):
        run(engine, "two", lambda: group())


def test_retained_resources_stay_in_azure_but_leave_the_state(azure, engine):
    def build():
        rg = group(retain_on_delete=True)
        account("keptacct", rg="rg", retain_on_delete=True, depends_on=[rg])

    run(engine, "s", build)
    engine.destroy("s")
    assert engine.select("s").resources == {}
    assert {o.name for o in azure.objects.values()} >= {"rg", "keptacct"}


def test_protected_resources_block_destroy_and_exclude_protected_keeps_them(azure, engine):
    def build():
        rg = group()
        account("protacct", rg="rg", protect=True, depends_on=[rg])
        account("plainacct", rg="rg", depends_on=[rg])

    run(engine, "s", build)
    with pytest.raises(DeploymentFailed, match="protected"):
        engine.destroy("s")
    assert azure.get(f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/plainacct")
    engine.destroy("s", exclude_protected=True)
    kept = {r.type for r in engine.select("s").resources.values()}
    assert kept == {"azure-native:storage:StorageAccount", "azure-native:resources:ResourceGroup"}  # and its group
    assert not azure.get(f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/plainacct")


def test_a_deleted_singleton_is_reset_to_defaults(azure, engine):
    """azure-native deletes blob service properties by PUTting their default (empty) body."""
    def build():
        rg = group(retain_on_delete=True)
        acct = account("singleacct", rg="rg", retain_on_delete=True, depends_on=[rg])
        storage.BlobServiceProperties("svc", account_name=acct.name, resource_group_name="rg",
                                      blob_services_name="default",
                                      delete_retention_policy=storage.DeleteRetentionPolicyArgs(enabled=True, days=7))

    run(engine, "s", build)
    service_id = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/singleacct/blobServices/default"
    assert azure.get(service_id).body["deleteRetentionPolicy"]["enabled"] is True
    engine.destroy("s")
    assert azure.get(service_id).body == {}
    # Adopt the retained group and account (what infra.adopt plans), then up: the singleton is
    # created again with a PUT whatever exists, so it needs no adoption.
    engine.import_file("s", {"resources": [
        {"type": "azure-native:resources:ResourceGroup", "name": "rg", "id": f"/subscriptions/{SUB}/resourceGroups/rg"},
        {"type": "azure-native:storage:StorageAccount", "name": "singleacct", "id": service_id.rsplit("/blobServices", 1)[0]},
    ]}, protect=False)
    run(engine, "s", build)
    assert azure.get(service_id).body["deleteRetentionPolicy"]["enabled"] is True


def test_a_deleted_workspace_holds_its_name_for_14_days(azure, engine):
    run(engine, "base", group)  # the group lives in another stack
    run(engine, "s", workspace)
    engine.destroy("s")
    with pytest.raises(DeploymentFailed, match="soft-deleted workspace"):
        run(engine, "s", workspace)
    azure.advance(days=13)
    with pytest.raises(DeploymentFailed, match="soft-deleted workspace"):
        run(engine, "s", workspace)
    azure.advance(days=2)
    run(engine, "s", workspace)


def test_a_purge_protected_vault_holds_its_name_and_can_only_be_recovered(azure, engine):
    run(engine, "base", group)
    run(engine, "s", vault)
    engine.destroy("s")
    with pytest.raises(DeploymentFailed, match="deleted state"):
        run(engine, "s", vault)
    other = Engine(azure, OTHER)  # Key Vault names are global: nobody else gets it either
    run(other, "base", group)
    with pytest.raises(DeploymentFailed, match="deleted state"):
        run(other, "s", vault)
    run(engine, "s", lambda: vault(create_mode="recover"))


def test_global_names_are_unique_across_subscriptions(azure, engine):
    run(engine, "s", lambda: account("globalacct", rg="rg", depends_on=[group()]))
    with pytest.raises(DeploymentFailed, match="StorageAccountAlreadyTaken"):
        run(Engine(azure, OTHER), "s", lambda: account("globalacct", rg="rg", depends_on=[group()]))


def test_deleting_a_group_deletes_what_it_holds(azure, engine):
    """Why the resource group holding retained data must be retained too."""
    def build():
        rg = group()
        account("ingroupacct", rg="rg", retain_on_delete=True, depends_on=[rg])

    run(engine, "s", build)
    engine.destroy("s")
    assert not any(o.name == "ingroupacct" for o in azure.objects.values())


def test_import_refuses_missing_ids_and_urns_in_the_state(azure, engine):
    run(engine, "s", lambda: group())
    document = {"resources": [{"type": "azure-native:resources:ResourceGroup", "name": "rg",
                               "id": f"/subscriptions/{SUB}/resourceGroups/rg"}]}
    with pytest.raises(DeploymentFailed, match="already in the stack's state"):
        engine.import_file("s", document)
    missing = {"resources": [{"type": "azure-native:resources:ResourceGroup", "name": "other",
                              "id": f"/subscriptions/{SUB}/resourceGroups/other"}]}
    with pytest.raises(DeploymentFailed, match="does not exist"):
        engine.import_file("s", missing)
