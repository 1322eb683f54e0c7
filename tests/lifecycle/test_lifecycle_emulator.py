"""The emulator behaves as azure-native and Azure do (sources in lifecycle_engine.py and
lifecycle_cloud.py): small programs, one behaviour each. The scenarios in
test_lifecycle_scenarios.py rely on every one of these."""

from __future__ import annotations

import pulumi
import pytest
from pulumi_azure_native import authorization, keyvault, resources, storage
from pulumi_azure_native import machinelearningservices as ml

from tests.lifecycle.lifecycle_cloud import AzureError, FakeAzure
from tests.lifecycle.lifecycle_engine import DeploymentFailed, Engine

SUB = "aaaaaaaa-0000-0000-0000-000000000001"
OTHER = "bbbbbbbb-0000-0000-0000-000000000002"


def group(name: str = "rg", **opts) -> resources.ResourceGroup:
    return resources.ResourceGroup(name, resource_group_name=name, location="eastus",
                                   opts=pulumi.ResourceOptions(**opts))


def account(name: str, rg: str = "rg", **opts) -> storage.StorageAccount:
    return storage.StorageAccount(name, account_name=name, resource_group_name=rg, location="eastus",
                                  kind="StorageV2", sku=storage.SkuArgs(name="Standard_LRS"), is_hns_enabled=False,
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
    run(engine, "one", lambda: account("sharedacct", rg="rg", depends_on=[group()]))
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
    # Adopt the retained group and account (what amlhpc.infra.adopt plans), then up: the singleton is
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


class TestLocks:
    """A lock blocks deleting its scope and everything under it; the lock itself can go."""

    RG = f"/subscriptions/{SUB}/resourceGroups/rg"
    ACCOUNT = f"{RG}/providers/Microsoft.Storage/storageAccounts/lockedacct"
    CONTAINER = f"{ACCOUNT}/blobServices/default/containers/datasets"
    ROLE = f"{CONTAINER}/providers/Microsoft.Authorization/roleAssignments/0f0e0d0c-0000-4000-8000-000000000001"
    SETTING = f"{ACCOUNT}/blobServices/default/providers/Microsoft.Insights/diagnosticSettings/to-log-analytics"
    ENDPOINT = f"{RG}/providers/Microsoft.Network/privateEndpoints/pe-datasets"
    LOCK = f"{ACCOUNT}/providers/Microsoft.Authorization/locks/do-not-delete"
    GROUP_BODY = {"location": "eastus"}
    ACCOUNT_BODY = {"location": "eastus", "kind": "StorageV2", "sku": {"name": "Standard_LRS"}}
    """The least Resource Manager accepts (location; an account's kind and sku): FakeAzure refuses less."""

    def locked(self, azure: FakeAzure, level: str = "CanNotDelete") -> FakeAzure:
        azure.put("azure-native:resources:ResourceGroup", self.RG, "rg", self.GROUP_BODY)
        azure.put("azure-native:storage:StorageAccount", self.ACCOUNT, "lockedacct", self.ACCOUNT_BODY)
        azure.put("azure-native:storage:BlobContainer", self.CONTAINER, "datasets", {})
        azure.put("azure-native:authorization:RoleAssignment", self.ROLE, "ra",
                  {"principalId": "p", "roleDefinitionId": "r", "scope": self.CONTAINER})
        azure.put("azure-native:monitor:DiagnosticSetting", self.SETTING, "to-log-analytics", {})
        azure.put("azure-native:network:PrivateEndpoint", self.ENDPOINT, "pe-datasets",
                  {"privateLinkServiceConnections": [{"privateLinkServiceId": self.ACCOUNT}]})
        azure.put("azure-native:authorization:ManagementLockByScope", self.LOCK, "do-not-delete", {"level": level})
        return azure

    @pytest.mark.parametrize("what", ["ACCOUNT", "CONTAINER", "ROLE", "SETTING", "ENDPOINT", "RG"])
    def test_cannot_delete_blocks_the_scope_and_everything_under_it(self, azure, what):
        self.locked(azure)
        before = set(azure.objects)
        with pytest.raises(AzureError, match="ScopeLocked.*cannot perform delete operation.*lockedacct"):
            azure.delete(getattr(self, what))
        assert set(azure.objects) == before  # never a partial deletion

    def test_the_lock_itself_can_be_deleted_and_then_everything_else(self, azure):
        self.locked(azure)
        azure.delete(self.LOCK)
        for what in (self.ROLE, self.SETTING, self.ENDPOINT, self.RG):
            azure.delete(what)
        assert not azure.objects

    def test_unrelated_resources_and_writes_are_not_blocked(self, azure):
        self.locked(azure)
        other = f"{self.RG}/providers/Microsoft.Storage/storageAccounts/otheracct"
        azure.put("azure-native:storage:StorageAccount", other, "otheracct", self.ACCOUNT_BODY)
        azure.delete(other)  # a sibling in the same group
        azure.put("azure-native:storage:BlobContainer", f"{self.ACCOUNT}/blobServices/default/containers/new", "new", {})
        azure.reset_to_defaults(f"{self.ACCOUNT}/blobServices/default")  # a PUT, not a delete

    def test_read_only_also_refuses_writes_under_its_scope(self, azure):
        self.locked(azure, level="ReadOnly")
        with pytest.raises(AzureError, match="cannot perform write operation"):
            azure.put("azure-native:storage:BlobContainer", f"{self.ACCOUNT}/blobServices/default/containers/x", "x", {})
        with pytest.raises(AzureError, match="cannot perform delete operation"):
            azure.delete(self.ROLE)

    def test_a_destroy_stops_at_the_locked_delete_and_keeps_the_rest_in_the_state(self, azure, engine):
        """The engine's view: the update fails; what was deleted before stays deleted."""
        def build():
            rg = group(retain_on_delete=True)
            acct = account("lockedacct", rg="rg", retain_on_delete=True, depends_on=[rg])
            authorization.ManagementLockByScope("lock", lock_name="do-not-delete", scope=acct.id,
                                                level="CanNotDelete", opts=pulumi.ResourceOptions(retain_on_delete=True))
            authorization.RoleAssignment("grant", principal_id="p", principal_type="User", role_definition_id="r",
                                         scope=acct.id)
            account("plainacct", rg="rg", depends_on=[rg])

        run(engine, "s", build)
        with pytest.raises(DeploymentFailed, match="ScopeLocked"):
            engine.destroy("s")
        left = engine.select("s").resources.values()
        assert "azure-native:authorization:RoleAssignment" in {r.type for r in left}
        # The state tells the truth: what it still holds is still in Azure.
        assert all(azure.exists(r.id) for r in left if r.custom)
        engine.azure.delete(f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/"
                            "lockedacct/providers/Microsoft.Authorization/locks/do-not-delete")  # az lock delete
        engine.destroy("s")
        assert engine.select("s").resources == {}


@pytest.mark.parametrize("named", [True, False])
def test_a_retained_role_assignment_is_found_again_only_under_a_declared_name(azure, engine, named):
    """azure-native auto-names an assignment with a random GUID: after `destroy` keeps it,
    nothing can compute its id, and creating it again hits RoleAssignmentExists."""
    from amlhpc.infra.components.access import role_assignment_name
    from amlhpc.infra.plan.mocks import PlanMocks

    scope = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/grantacct"
    inputs = {"scope": scope, "principalId": "p", "roleDefinitionId": "r", "principalType": "User"}
    if named:
        inputs["roleAssignmentName"] = role_assignment_name(scope, "p", "r")

    def build():
        rg = group(retain_on_delete=True)
        acct = account("grantacct", rg="rg", retain_on_delete=True, depends_on=[rg])
        authorization.RoleAssignment("grant", principal_id="p", principal_type="User", role_definition_id="r",
                                     scope=acct.id, role_assignment_name=inputs.get("roleAssignmentName"),
                                     opts=pulumi.ResourceOptions(retain_on_delete=True))

    run(engine, "s", build)
    engine.destroy("s")
    planned = PlanMocks(SUB)._arm_id("azure-native:authorization:RoleAssignment", inputs, "grant")  # noqa: SLF001
    adopt = [{"type": "azure-native:resources:ResourceGroup", "name": "rg", "id": f"/subscriptions/{SUB}/resourceGroups/rg"},
             {"type": "azure-native:storage:StorageAccount", "name": "grantacct", "id": scope}]
    if azure.exists(planned):  # what amlhpc.infra.adopt's existence probe does
        adopt.append({"type": "azure-native:authorization:RoleAssignment", "name": "grant", "id": planned})
    engine.import_file("s", {"resources": adopt}, protect=False)
    if named:
        run(engine, "s", build)
        assert len(azure.of_type("azure-native:authorization:RoleAssignment")) == 1
    else:
        with pytest.raises(DeploymentFailed, match="RoleAssignmentExists"):
            run(engine, "s", build)


def test_a_failed_up_leaves_nothing_for_asyncio_to_report_later(azure, engine, caplog):
    """Pulumi sets a failed resource's error on every output future of it and of what uses
    its outputs; left unreported, the garbage collector would format those tracebacks at a
    random later point (python/cpython#106905 turned one into a failing test elsewhere)."""
    import gc

    def taken_name_and_a_user_of_its_outputs():
        taken = account("takenacct", depends_on=[group()])
        authorization.RoleAssignment("grant", principal_id="p", principal_type="User", role_definition_id="r",
                                     scope=taken.id)

    run(engine, "first", lambda: account("takenacct", depends_on=[group()]))
    with caplog.at_level("WARNING", logger="asyncio"):
        try:  # not pytest.raises: its traceback would keep the futures alive past gc.collect()
            run(engine, "second", taken_name_and_a_user_of_its_outputs)
        except DeploymentFailed as failure:
            assert "already existing resource" in str(failure)
        else:
            pytest.fail("the second up should fail on the existing group")
        run(engine, "third", lambda: group("other"))  # the next run lets go of the failed run's state
        gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


class TestAzureAnswers:
    """GETs answer as Azure does (lifecycle_answers), and import reads inputs from them."""

    def test_an_identity_gets_a_new_random_principal_on_every_create(self, azure, engine):
        from pulumi_azure_native import managedidentity

        def build():
            managedidentity.UserAssignedIdentity("id", resource_name_="uai", resource_group_name="rg",
                                                 location="eastus", opts=pulumi.ResourceOptions(depends_on=[group()]))

        run(engine, "s", build)
        first = engine.select("s").resources["urn:pulumi:s::aml-hpc::azure-native:managedidentity:UserAssignedIdentity::id"]
        engine.destroy("s")
        run(engine, "s", build)
        second = engine.select("s").resources[first.urn]
        assert first.outputs["principalId"] != second.outputs["principalId"]
        assert len(first.outputs["principalId"]) == 36 and first.outputs["clientId"] != second.outputs["clientId"]

    def test_import_reads_server_defaults_and_drops_read_only_properties(self, azure, engine):
        run(engine, "s", lambda: account("readacct", depends_on=[group(retain_on_delete=True)], retain_on_delete=True))
        account_id = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/readacct"
        engine.destroy("s")
        engine.import_file("s", {"resources": [{"type": "azure-native:storage:StorageAccount", "name": "readacct",
                                                "id": account_id}]})
        [imported] = engine.select("s").resources.values()
        assert imported.inputs["isHnsEnabled"] is False  # a server default, read back
        assert "creationTime" not in imported.inputs and "primaryEndpoints" not in imported.inputs  # read-only
        assert imported.outputs["provisioningState"] == "Succeeded"

    def test_a_force_new_difference_after_import_fails_the_up(self, azure, engine):
        """The hazard of pulumi-azure-native #2003: a program that leaves isHnsEnabled unset
        adopts an account that reports it, and the next up would replace the account."""
        def unset():
            rg = group(retain_on_delete=True)
            storage.StorageAccount("hnsacct", account_name="hnsacct", resource_group_name="rg", location="eastus",
                                   kind="StorageV2", sku=storage.SkuArgs(name="Standard_LRS"),
                                   opts=pulumi.ResourceOptions(depends_on=[rg], retain_on_delete=True))

        run(engine, "s", unset)
        engine.destroy("s")
        engine.import_file("s", {"resources": [
            {"type": "azure-native:resources:ResourceGroup", "name": "rg", "id": f"/subscriptions/{SUB}/resourceGroups/rg"},
            {"type": "azure-native:storage:StorageAccount", "name": "hnsacct",
             "id": f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/hnsacct"}]},
            protect=False)
        with pytest.raises(DeploymentFailed, match="replacement after import, forced by isHnsEnabled"):
            run(engine, "s", unset)

    def test_location_is_compared_as_azure_native_does(self, azure, engine):
        run(engine, "s", lambda: resources.ResourceGroup("rg", resource_group_name="rg", location="eastus"))
        run(engine, "s", lambda: resources.ResourceGroup("rg", resource_group_name="rg", location="East US"))
        assert engine.last_steps == [("update", "urn:pulumi:s::aml-hpc::azure-native:resources:ResourceGroup::rg")]
        with pytest.raises(DeploymentFailed, match="already existing"):  # a real move: a replacement
            run(engine, "s", lambda: resources.ResourceGroup("rg", resource_group_name="rg", location="westus"))
        assert engine.last_steps[0][0] == "replace"

    def test_role_assignments_are_listed_by_scope_role_and_principal(self, azure, engine):
        scope = f"/subscriptions/{SUB}/resourceGroups/rg"
        azure.put("azure-native:resources:ResourceGroup", scope, "rg", {"location": "eastus"})
        for guid, principal in (("a" * 8 + "-0000-4000-8000-000000000001", "p1"),
                                ("b" * 8 + "-0000-4000-8000-000000000002", "p2")):
            azure.put("azure-native:authorization:RoleAssignment",
                      f"{scope}/providers/Microsoft.Authorization/roleAssignments/{guid}", guid,
                      {"principalId": principal, "roleDefinitionId": "/subscriptions/s/providers/x/roleDefinitions/r1",
                       "scope": scope})
        assert [o.body["principalId"] for o in azure.role_assignments(scope.upper(), "R1", "p2")] == ["p2"]
        assert len(azure.role_assignments(scope)) == 2 and azure.role_assignments(scope + "/x") == []


class TestRegistryStorage:
    """An ML registry comes with a storage account per region and one geo-replicated ACR,
    which exist under the ids its answer reports; a private endpoint needs a target that exists."""

    def registry(self, regions: tuple[str, ...] = ("eastus", "westus3"), **opts) -> ml.Registry:
        return ml.Registry("reg", registry_name="mlr-shared", resource_group_name="rg", location="eastus",
                           opts=pulumi.ResourceOptions(**opts),
                           region_details=[ml.RegistryRegionArmDetailsArgs(
                               location=r,
                               acr_details=[ml.AcrDetailsArgs(system_created_acr_account=ml.SystemCreatedAcrAccountArgs(
                                   acr_account_sku="Premium"))],
                               storage_account_details=[ml.StorageAccountDetailsArgs(
                                   system_created_storage_account=ml.SystemCreatedStorageAccountArgs(
                                       storage_account_type="Standard_LRS"))]) for r in regions])

    def test_what_azure_ml_creates_exists_under_the_reported_ids(self, azure, engine):
        run(engine, "s", lambda: self.registry(depends_on=[group()]))
        [registry] = azure.of_type("azure-native:machinelearningservices:Registry")
        details = azure.response(registry.id)["regionDetails"]
        acrs = {d["acrDetails"][0]["systemCreatedAcrAccount"]["armResourceId"]["resourceId"] for d in details}
        accounts = [d["storageAccountDetails"][0]["systemCreatedStorageAccount"]["armResourceId"]["resourceId"]
                    for d in details]
        assert len(acrs) == 1 and len(set(accounts)) == 2  # one ACR for all regions, storage per region
        assert all(azure.exists(i) for i in [*acrs, *accounts])

    def test_a_private_endpoint_to_a_resource_that_does_not_exist_is_refused(self, azure, engine):
        from pulumi_azure_native import network

        guessed = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/mlrsharedst0"

        def build():
            # The endpoint waits for the group and the registry: only its guessed target is missing
            # (the engine creates resources without a dependency in any order).
            rg = group()
            made = [rg, self.registry(depends_on=[rg])]
            network.PrivateEndpoint("pe", private_endpoint_name="pe-guess", resource_group_name="rg",
                                    location="eastus", subnet=network.SubnetArgs(id="subnet"),
                                    private_link_service_connections=[network.PrivateLinkServiceConnectionArgs(
                                        name="pe-guess", private_link_service_id=guessed, group_ids=["blob"])],
                                    opts=pulumi.ResourceOptions(depends_on=made))

        with pytest.raises(DeploymentFailed, match="private link resource .*mlrsharedst0' of private endpoint "
                                                   "'pe-guess' does not exist"):
            run(engine, "s", build)
