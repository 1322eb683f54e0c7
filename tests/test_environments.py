"""amlhpc/infra/components/environments.py under Pulumi's mock runtime (amlhpc.infra.plan.record, which
records every registered resource): one Azure ML environment per image, registered by
image reference with the content-hash tag as version, never rebuilt, old versions kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pulumi
import pytest

from amlhpc.images import catalog
from amlhpc.infra.components.environments import TrainingEnvironments, TrainingEnvironmentsArgs
from amlhpc.infra.plan import record

ROOT = Path(__file__).resolve().parent.parent
LOGIN = "myacr.azurecr.io"
TAGS = {"owner": "o@example.com", "environment": "dev", "stack": "dev"}
CONTAINER = "azure-native:machinelearningservices:EnvironmentContainer"
VERSION = "azure-native:machinelearningservices:EnvironmentVersion"


def register(images=None, login_server=LOGIN):
    def program():
        args = TrainingEnvironmentsArgs(resource_group_name="rg-amlhpc-dev", workspace_name="mlw-amlhpc-dev",
                                        login_server=login_server, tags=TAGS)
        if images is not None:
            args.images = images
        envs = TrainingEnvironments("environments", args)
        return {"environments": envs.environments, "ids": envs.environment_ids}

    return record(program)


@pytest.fixture(scope="module")
def releases():
    """Resolved once: amlhpc/jobs/runtime may change under a long test run, and with it the tags."""
    return catalog.releases()


@pytest.fixture(scope="module")
def registered(releases):
    return register(images=releases)


def by_type(resources, type_token):
    return {r.inputs["name"]: r for r in resources if r.type == type_token}


class TestRegistration:
    def test_default_is_every_catalog_image(self):
        resources, _, _ = register()
        assert sorted(by_type(resources, VERSION)) == sorted(s.name for s in catalog.ALL_IMAGES), "the controller's too"

    def test_one_container_and_version_per_image(self, registered):
        resources, _, _ = registered
        names = [s.name for s in catalog.IMAGES]
        assert sorted(by_type(resources, CONTAINER)) == sorted(names)
        assert sorted(by_type(resources, VERSION)) == sorted(names)

    def test_version_is_the_image_tag_and_points_at_the_image(self, registered, releases):
        resources, _, _ = registered
        versions = by_type(resources, VERSION)
        for release in releases:
            version = versions[release.spec.name]
            assert version.inputs["version"] == release.tag
            assert version.inputs["properties"]["image"] == f"{LOGIN}/{release.spec.repository}:{release.tag}"
            assert version.inputs["workspaceName"] == "mlw-amlhpc-dev"
            assert version.inputs["resourceGroupName"] == "rg-amlhpc-dev"

    def test_azure_ml_never_builds_anything(self, registered):
        resources, _, _ = registered
        for version in by_type(resources, VERSION).values():
            props = version.inputs["properties"]
            assert props["autoRebuild"] == "Disabled" and props["osType"] == "Linux"
            assert "build" not in props and "condaFile" not in props

    def test_old_versions_survive_removal(self, registered):
        resources, _, _ = registered
        assert all(v.retain_on_delete for v in by_type(resources, VERSION).values())

    def test_children_of_the_component_with_stack_tags(self, registered):
        resources, _, _ = registered
        component = next(r for r in resources if r.type == "aml-hpc:ml:TrainingEnvironments")
        assert not component.custom
        for r in [*by_type(resources, CONTAINER).values(), *by_type(resources, VERSION).values()]:
            assert r.parent == component.urn
        for version in by_type(resources, VERSION).values():
            tags = version.inputs["properties"]["tags"]
            assert TAGS.items() <= tags.items() and tags["image-tag"] == version.inputs["version"]
            assert tags["base-image"].startswith(("nvcr.io/nvidia/", "rocm/pytorch:"))

    def test_versions_wait_for_their_container(self, registered):
        resources, _, _ = registered
        containers = by_type(resources, CONTAINER)
        for name, version in by_type(resources, VERSION).items():
            assert containers[name].urn in version.depends_on

    def test_outputs_map_names_to_refs_and_asset_ids(self, registered, releases):
        _, outputs, _ = registered
        assert outputs["environments"] == {r.spec.name: r.ref(LOGIN) for r in releases}
        assert outputs["ids"] == {r.spec.name: f"azureml:{r.spec.name}:{r.tag}" for r in releases}


class TestInputs:
    def test_login_server_from_another_resource(self):
        """The registry's login server is an Output of the Registry resource, not a string."""
        resources, outputs, _ = register(login_server=pulumi.Output.from_input("Late.azurecr.io"))
        ref = outputs["environments"]["aml-hpc-pytorch"]
        assert ref.startswith("late.azurecr.io/aml-hpc/pytorch:")
        assert by_type(resources, VERSION)["aml-hpc-pytorch"].inputs["properties"]["image"] == ref

    def test_a_subset_of_images(self):
        resources, outputs, _ = register(images=[catalog.release(catalog.TENSORFLOW)])
        assert list(by_type(resources, VERSION)) == ["aml-hpc-tensorflow"]
        assert list(outputs["environments"]) == ["aml-hpc-tensorflow"]

    def test_duplicate_image_is_refused(self):
        release = catalog.release(catalog.PYTORCH)
        with pytest.raises(pulumi.RunError, match="listed twice"):
            register(images=[release, release])

    def test_a_pin_change_registers_a_new_version(self, tmp_path):
        shutil.copytree(ROOT / "amlhpc" / "images", tmp_path / "amlhpc" / "images", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "amlhpc" / "jobs" / "runtime", tmp_path / "amlhpc" / "jobs" / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
        pins = tmp_path / "amlhpc" / "images" / "pins.toml"
        before = by_type(register(images=catalog.releases(tmp_path))[0], VERSION)["aml-hpc-pytorch"].inputs["version"]
        pins.write_text(pins.read_text().replace('deepspeed = "0.19.8"', 'deepspeed = "0.19.7"'))
        after = by_type(register(images=catalog.releases(tmp_path))[0], VERSION)["aml-hpc-pytorch"].inputs["version"]
        assert before != after


@pytest.mark.slow
def test_the_dev_stack_registers_the_catalog_images():
    """The real program (amlhpc/infra/program.py) wires the component into the outputs document."""
    from amlhpc.infra.plan import evaluate

    plan = evaluate("dev")
    login = plan.outputs["registry"]["loginServer"]
    every = catalog.releases(specs=catalog.ALL_IMAGES)
    assert plan.outputs["registry"]["environments"] == {r.spec.name: r.ref(login) for r in every}
    assert len(plan.of_type(VERSION)) == len(catalog.ALL_IMAGES)
