"""Up, down and up again, with the real program, the real tooling steps (amlhpc.infra.adopt) and an
emulated engine, provider and Azure (tests/lifecycle): each redeploy scenario a test, plus
the counter-tests showing the emulator refuses what Azure refuses when the
tooling's fixes are left out."""

from __future__ import annotations

import re
import shutil

import pulumi
import pytest
import yaml

from amlhpc.images import catalog
from amlhpc.infra.config import NAME_SUFFIX_KEY, REPO_ROOT
from amlhpc.infra.lifecycle import new_experiment
from tests.lifecycle.lifecycle_cloud import FakeAzure
from tests.lifecycle.lifecycle_engine import DeploymentFailed
from tests.lifecycle.lifecycle_tooling import Adopter, clone

SUB_A = "aaaaaaaa-0000-0000-0000-000000000001"
SUB_B = "bbbbbbbb-0000-0000-0000-000000000002"
ACCOUNT = "azure-native:storage:StorageAccount"
CONTAINER = "azure-native:storage:BlobContainer"
BLOB_SERVICE = "azure-native:storage:BlobServiceProperties"
VERSION = "azure-native:machinelearningservices:EnvironmentVersion"
COMPUTE = "azure-native:machinelearningservices:Compute"
ROLE = "azure-native:authorization:RoleAssignment"
LOCK = "azure-native:authorization:ManagementLockByScope"
DIAGNOSTIC_SETTING = "azure-native:monitor:DiagnosticSetting"
PRIVATE_ENDPOINT = "azure-native:network:PrivateEndpoint"


@pytest.fixture
def azure() -> FakeAzure:
    return FakeAzure()


@pytest.fixture
def adopter(azure, tmp_path) -> Adopter:
    return Adopter(azure, clone(tmp_path / "clone-a"), SUB_A)


def up_again_changes_nothing(adopter: Adopter, stack: str) -> None:
    """The last `up` of up -> down -> up -> up: the program and Azure agree, no step at all."""
    adopter.make_up(stack)
    assert adopter.engine.last_steps == [], adopter.engine.last_steps


def by_type(adopter: Adopter, stack: str, type_token: str):
    return [r for r in adopter.state(stack).values() if r.type == type_token]


def dataset_objects(azure: FakeAzure, outputs: dict):
    account = next(o for o in azure.of_type(ACCOUNT) if o.name == outputs["storage"]["account"])
    containers = {o.name: o for o in azure.of_type(CONTAINER) if o.id.lower().startswith(account.id.lower())}
    return account, containers


def upload_data(azure: FakeAzure, outputs: dict) -> None:
    _, containers = dataset_objects(azure, outputs)
    azure.upload(containers["datasets"].id, "bert/wiki/shard-000.tfrecord.gz", b"data")
    azure.upload(containers["checkpoints"].id, "bert/step-1000/model.pt", b"weights")


def registry_private_links(azure: FakeAzure) -> tuple[set[str], set[str]]:
    """(what Azure ML created for the registry, what our private endpoints connect to), ids in lower case."""
    [registry] = azure.of_type("azure-native:machinelearningservices:Registry")
    created = set()
    for region in azure.response(registry.id)["regionDetails"]:
        for kind, key in (("acrDetails", "systemCreatedAcrAccount"), ("storageAccountDetails", "systemCreatedStorageAccount")):
            created |= {e[key]["armResourceId"]["resourceId"].lower() for e in region[kind]}
    linked = {c["privateLinkServiceId"].lower() for e in azure.of_type(PRIVATE_ENDPOINT)
              for c in e.body["privateLinkServiceConnections"]}
    return created, linked


class TestEnvironmentRedeploy:
    def test_dev_up_down_up_keeps_data_and_needs_no_manual_step(self, azure, adopter):
        """make up / make down CONFIRM=dev / make up: the second up adopts what down kept."""
        first = adopter.make_up("dev")
        upload_data(azure, first)
        account, containers = dataset_objects(azure, first)
        suffix = yaml.safe_load((adopter.root / "Pulumi.dev.yaml").read_text())["config"][NAME_SUFFIX_KEY]
        assert first["storage"]["account"].endswith(suffix)

        adopter.make_down("dev")
        assert adopter.state("dev") == {}
        kept_service = azure.get(f"{account.id}/blobServices/default")
        # The blob service is retained with its account: soft delete stays on between deploys.
        assert kept_service.body["deleteRetentionPolicy"] == {"enabled": True, "days": 14}
        assert not azure.of_type(COMPUTE)  # what costs money by the hour is gone

        second = adopter.make_up("dev")
        assert adopter.adopted, "the tooling adopted the retained resources by itself"
        assert second["storage"] == first["storage"] and second["workspace"] == first["workspace"]
        account2, containers2 = dataset_objects(azure, second)
        assert account2 is account and containers2["datasets"].blobs == {"bert/wiki/shard-000.tfrecord.gz": b"data"}
        assert containers2["checkpoints"].blobs == {"bert/step-1000/model.pt": b"weights"}
        # dev's two GPU clusters and the managed runs' controller cluster, all created again
        assert len(by_type(adopter, "dev", COMPUTE)) == 3
        # Nothing beyond the README: the only file change is the suffix line, made once.
        text = (adopter.root / "Pulumi.dev.yaml").read_text()
        assert len(re.findall(rf"^\s+{NAME_SUFFIX_KEY}:", text, flags=re.MULTILINE)) == 1

        up_again_changes_nothing(adopter, "dev")
        adopter.make_down("dev")
        assert adopter.make_up("dev")["storage"] == first["storage"]  # and again

    def test_without_adoption_the_second_up_fails_as_in_azure(self, azure, adopter, monkeypatch):
        """The counter-test: skip the import step and azure-native refuses to create what exists."""
        from amlhpc.infra import adopt

        adopter.make_up("dev")
        adopter.make_down("dev")
        monkeypatch.setattr(adopt, "plan_import", lambda *a, **k: {"resources": []})
        with pytest.raises(DeploymentFailed, match="cannot create already existing resource"):
            adopter.make_up("dev")

    def test_prod_down_keeps_protected_resources_and_up_again_works(self, azure, adopter):
        """prod: destroy without --exclude-protected refuses; make down keeps them; up again works."""
        first = adopter.make_up("prod")
        upload_data(azure, first)
        created, linked = registry_private_links(azure)
        assert len(created) == 3 and created <= linked  # the registry's ACR and its storage in both regions
        with pytest.raises(DeploymentFailed, match="protected"):
            adopter.engine.destroy("prod")  # a plain `pulumi destroy`
        assert len(adopter.state("prod")) > 40  # nothing was deleted

        adopter.make_down("prod")
        kept = adopter.state("prod")
        kept_types = {r.type for r in kept.values()}
        assert {ACCOUNT, CONTAINER, "azure-native:machinelearningservices:Workspace",
                "azure-native:keyvault:Vault", "azure-native:resources:ResourceGroup"} <= kept_types
        assert COMPUTE not in kept_types and "azure-native:network:NatGateway" not in kept_types

        second = adopter.make_up("prod")
        assert second["storage"] == first["storage"] and second["registry"]["mlRegistry"] == first["registry"]["mlRegistry"]
        created, linked = registry_private_links(azure)
        assert created <= linked  # endpoints back after down, to what Azure reports
        _, containers = dataset_objects(azure, second)
        assert containers["datasets"].blobs  # data intact
        assert len(by_type(adopter, "prod", COMPUTE)) == 2  # the GPU cluster and the controller
        up_again_changes_nothing(adopter, "prod")


def lock_of(azure: FakeAzure, outputs: dict):
    account, _ = dataset_objects(azure, outputs)
    return azure.get(f"{account.id}/providers/Microsoft.Authorization/locks/do-not-delete")


def under(azure: FakeAzure, scope_id: str) -> set[str]:
    """Types of everything Azure would refuse to delete while `scope_id` is locked."""
    scope = scope_id.lower()
    found = set()
    for o in azure.objects.values():
        endpoint_targets = [c.get("privateLinkServiceId", "").lower()
                            for c in o.body.get("privateLinkServiceConnections") or []]
        if (o.id.lower().startswith(scope + "/") or scope in endpoint_targets) and o.type != LOCK:
            found.add(o.type)
    return found


def edit_stack(root, stack: str, change) -> None:
    path = root / f"Pulumi.{stack}.yaml"
    document = yaml.safe_load(path.read_text())
    change(document["config"])
    path.write_text(yaml.safe_dump(document, sort_keys=False))


class TestDeleteLock:
    """Outside dev the dataset account carries an Azure CanNotDelete lock; Azure refuses to
    delete anything under it. What sits there is protected, so `make down` leaves it."""

    def test_prod_up_down_up_with_the_lock_in_place_all_along(self, azure, adopter):
        first = adopter.make_up("prod")
        upload_data(azure, first)
        account, _ = dataset_objects(azure, first)
        assert lock_of(azure, first).body["level"] == "CanNotDelete"
        inside = under(azure, account.id)
        assert {ROLE, DIAGNOSTIC_SETTING, PRIVATE_ENDPOINT, CONTAINER} <= inside

        adopter.make_down("prod")  # no manual step: nothing under the lock is deleted
        assert lock_of(azure, first) is not None
        assert under(azure, account.id) == inside
        kept = {r.type for r in adopter.state("prod").values() if r.protect}
        assert {ROLE, DIAGNOSTIC_SETTING, PRIVATE_ENDPOINT} <= kept  # still Pulumi's, not orphans
        assert not azure.of_type(COMPUTE) and not azure.of_type("azure-native:network:PrivateDnsZoneGroup")

        second = adopter.make_up("prod")
        assert second["storage"] == first["storage"] and lock_of(azure, second) is not None
        assert dataset_objects(azure, second)[1]["datasets"].blobs  # data intact
        up_again_changes_nothing(adopter, "prod")

    def test_counter_test_unprotected_grants_make_down_fail_with_scope_locked(self, azure, adopter, monkeypatch):
        """What `down` did before: Pulumi deletes what the lock covers, Azure refuses."""
        from amlhpc.infra import program

        build = program.build

        def unprotected(cfg, now=None, environment=None):
            def strip(args):
                if args.type_ in (ROLE, DIAGNOSTIC_SETTING, PRIVATE_ENDPOINT):
                    return pulumi.ResourceTransformationResult(
                        args.props, pulumi.ResourceOptions.merge(args.opts, pulumi.ResourceOptions(protect=False)))
                return None

            pulumi.runtime.register_stack_transformation(strip)
            return build(cfg, now=now, environment=environment)

        monkeypatch.setattr(program, "build", unprotected)
        adopter.make_up("prod")
        with pytest.raises(DeploymentFailed, match="ScopeLocked"):
            adopter.make_down("prod")

    def test_revoking_a_grant_under_the_lock_is_refused_until_the_lock_is_lifted(self, azure, adopter):
        """Removing an uploader must not silently leave their access behind: `up` refuses,
        and the documented steps (docs/isolation.md) revoke it and lock the account again."""
        uploader = {"principalId": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", "principalType": "User"}
        edit_stack(adopter.root, "prod", lambda c: c.setdefault("aml-hpc:storage", {}).update(dataContributors=[uploader]))
        first = adopter.make_up("prod")

        def uploader_grants():
            return [o for o in azure.of_type(ROLE) if o.body["principalId"] == uploader["principalId"]]

        [grant] = uploader_grants()
        edit_stack(adopter.root, "prod", lambda c: c["aml-hpc:storage"].pop("dataContributors"))
        with pytest.raises(DeploymentFailed, match="protected"):
            adopter.make_up("prod")
        assert uploader_grants() == [grant]  # nothing half-done, and loudly so

        lock = lock_of(azure, first)
        azure.delete(lock.id)          # az lock delete --ids <lock id>   (Owner / User Access Administrator)
        azure.delete(grant.id)         # az role assignment delete --ids <assignment id>
        adopter.make_up("prod")        # refresh forgets the assignment; the lock is created again
        assert uploader_grants() == [] and lock_of(azure, first) is not None

    def test_private_network_customer_key_and_lock_up_down_up(self, azure, tmp_path):
        """Every option on (our VNet, CMK, diagnostics, the lock): the endpoint to the locked
        account stays with its subnet; the NAT gateway, billed by the hour, goes."""
        from tests.conformance.conformance_stacks import EVERYTHING

        root = clone(tmp_path / "everything")
        (root / "Pulumi.everything.yaml").write_text(yaml.safe_dump({"config": EVERYTHING}, sort_keys=False))
        adopter = Adopter(azure, root, SUB_A)
        first = adopter.make_up("everything")
        upload_data(azure, first)
        adopter.make_down("everything")
        assert not azure.of_type("azure-native:network:NatGateway") and not azure.of_type(COMPUTE)
        [endpoint] = [o for o in azure.of_type(PRIVATE_ENDPOINT)]
        assert endpoint.name.endswith("datasets-blob")
        second = adopter.make_up("everything")
        assert second["storage"] == first["storage"] and dataset_objects(azure, second)[1]["datasets"].blobs
        up_again_changes_nothing(adopter, "everything")


class TestManagedNetwork:
    def test_managed_network_workspace_adopted_with_its_system_rules_up_down_up_up(self, azure, tmp_path):
        """Unprotected, so `down` drops the workspace from the state and `up` imports it: Azure
        answers with the rules it added to the managed network itself; the up after the
        import sends the program's rules, and the last up has nothing to do."""
        from tests.conformance.conformance_stacks import EVERYTHING_MANAGED

        config = {**EVERYTHING_MANAGED, "aml-hpc:protectData": False, "aml-hpc:encryption": {}}
        config["aml-hpc:clusters"] = [{k: v for k, v in c.items() if v is not None}
                                      for c in config["aml-hpc:clusters"]]
        root = clone(tmp_path / "managed")
        (root / "Pulumi.managed.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        adopter = Adopter(azure, root, SUB_A)
        adopter.make_up("managed")
        [workspace] = azure.of_type("azure-native:machinelearningservices:Workspace")
        system = [n for n, r in azure.response(workspace.id)["managedNetwork"]["outboundRules"].items()
                  if r["category"] == "Required"]
        assert system  # added by Azure, in no request
        adopter.make_down("managed")
        adopter.make_up("managed")
        assert any(u.endswith("::ml-mlw") for u in adopter.adopted)
        up_again_changes_nothing(adopter, "managed")


class TestRbacPropagation:
    """A customer-managed key's grants are made in the same up as the workspace, and Azure ML
    checks them when it creates it; a grant takes effect some operations after it is made."""

    def cmk(self, azure, tmp_path) -> Adopter:
        from tests.conformance.conformance_stacks import EVERYTHING

        config = {**EVERYTHING, "aml-hpc:protectData": False, "aml-hpc:network": {"isolation": "public"},
                  "aml-hpc:clusters": [{"name": "nc-a100", "sku": "Standard_NC24ads_A100_v4", "maxNodes": 1}]}
        root = clone(tmp_path / "cmk")
        (root / "Pulumi.cmk.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        azure.propagation_operations = 25
        return Adopter(azure, root, SUB_A)

    def test_the_up_waits_for_the_key_grants_and_tries_again(self, azure, tmp_path):
        adopter = self.cmk(azure, tmp_path)
        adopter.make_up("cmk")
        assert adopter.retries >= 1  # the first attempt met the grant before it was in effect
        assert azure.of_type("azure-native:machinelearningservices:Workspace")
        up_again_changes_nothing(adopter, "cmk")

    def test_without_the_wait_the_workspace_is_refused(self, azure, tmp_path, monkeypatch):
        """The counter-test: one attempt, as before the tooling retried."""
        from amlhpc.infra import quirks

        monkeypatch.setattr(quirks, "RBAC_PROPAGATION_ATTEMPTS", 1)
        with pytest.raises(DeploymentFailed, match="ForbiddenByRbac"):
            self.cmk(azure, tmp_path).make_up("cmk")


class TestRoleAssignmentNames:
    def test_retained_assignments_are_found_again_by_their_name(self, azure, tmp_path):
        """An unlocked stack with a customer-managed key: the key's role assignments are
        retained with the workspace, and the next `up` adopts them by id."""
        from tests.conformance.conformance_stacks import EVERYTHING

        config = {**EVERYTHING, "aml-hpc:protectData": False, "aml-hpc:network": {"isolation": "public"},
                  "aml-hpc:clusters": [{"name": "nc-a100", "sku": "Standard_NC24ads_A100_v4", "maxNodes": 1}]}
        root = clone(tmp_path / "cmk")
        (root / "Pulumi.cmk.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        adopter = Adopter(azure, root, SUB_A)
        adopter.make_up("cmk")
        grants = {o.id for o in azure.of_type(ROLE) if "/keys/" in o.id}
        adopter.make_down("cmk")
        assert {o.id for o in azure.of_type(ROLE) if "/keys/" in o.id} == grants  # retained
        adopter.make_up("cmk")
        assert {u for u in adopter.adopted if "crypto-user" in u} and len(azure.of_type(LOCK)) == 0
        assert {o.id for o in azure.of_type(ROLE) if "/keys/" in o.id} == grants
        up_again_changes_nothing(adopter, "cmk")


class TestExperimentRedeploy:
    def test_created_destroyed_and_created_again_under_the_same_name(self, azure, adopter):
        adopter.make_up("dev")
        path = new_experiment("sweep", "dev", 7, adopter.root, now=azure.now)
        adopter.make_up("exp-sweep")
        computes = {o.name for o in azure.of_type(COMPUTE)}
        assert "sweep" in computes

        adopter.make_down("exp-sweep")
        assert not path.exists() and "exp-sweep" not in adopter.engine.stacks
        assert "sweep" not in {o.name for o in azure.of_type(COMPUTE)}

        new_experiment("sweep", "dev", 7, adopter.root, now=azure.now)
        outputs = adopter.make_up("exp-sweep")
        assert list(outputs["clusters"]) == ["sweep"]
        budget = next(o for o in azure.of_type("azure-native:consumption:Budget") if "exp-sweep" in o.name)
        compute = next(o for o in azure.of_type(COMPUTE) if o.name == "sweep")
        assert budget.body["filter"]["dimensions"]["values"] == [compute.id.lower()]
        up_again_changes_nothing(adopter, "exp-sweep")


class TestTwoAdopters:
    def test_two_clones_with_the_shipped_config_get_no_name_collision(self, azure, tmp_path):
        a = Adopter(azure, clone(tmp_path / "a"), SUB_A)
        b = Adopter(azure, clone(tmp_path / "b"), SUB_B)
        out_a, out_b = a.make_up("dev"), b.make_up("dev")
        for key in ("account",):
            assert out_a["storage"][key] != out_b["storage"][key]
        assert out_a["registry"]["loginServer"] != out_b["registry"]["loginServer"]
        vaults = [o.name for o in azure.of_type("azure-native:keyvault:Vault")]
        assert len(vaults) == 2 and len(set(vaults)) == 2

    def test_the_same_names_twice_are_refused_as_in_azure(self, azure, tmp_path):
        """The counter-test: a second adopter with the first one's stack file (same suffix)."""
        a = Adopter(azure, clone(tmp_path / "a"), SUB_A)
        a.make_up("dev")
        b_root = clone(tmp_path / "b")
        shutil.copy(a.root / "Pulumi.dev.yaml", b_root / "Pulumi.dev.yaml")
        with pytest.raises(DeploymentFailed, match="already taken|already in use"):
            Adopter(azure, b_root, SUB_B).make_up("dev")


class TestEnvironmentVersions:
    def test_an_image_tag_that_comes_back_after_a_revert_is_adopted(self, azure, adopter, tmp_path, monkeypatch):
        images = tmp_path / "images-checkout"
        shutil.copytree(REPO_ROOT / "amlhpc" / "images", images / "amlhpc" / "images", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO_ROOT / "amlhpc" / "jobs" / "runtime", images / "amlhpc" / "jobs" / "runtime",
                        ignore=shutil.ignore_patterns("__pycache__"))
        pins = images / "amlhpc" / "images" / "pins.toml"
        original = pins.read_text()
        from_checkout = catalog.releases
        # The program registers the images of "this checkout": here, the copy we edit.
        monkeypatch.setattr(catalog, "releases", lambda *a, **k: from_checkout(images))

        def tags() -> set[str]:
            return {r.inputs["version"] for r in by_type(adopter, "dev", VERSION)}

        adopter.make_up("dev")
        tag_a = tags()
        pins.write_text(original.replace('deepspeed = "0.19.8"', 'deepspeed = "0.19.7"'))
        adopter.make_up("dev")
        tag_b = tags()
        assert tag_a != tag_b
        pins.write_text(original)  # the revert
        adopter.make_up("dev")
        assert tags() == tag_a
        in_azure = {o.body["version"] for o in azure.of_type(VERSION)}
        assert tag_a | tag_b <= in_azure  # finished jobs still find both

