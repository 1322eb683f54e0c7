"""Azure ML environments for the aml-hpc training images, registered by image reference.

One EnvironmentContainer per image (the name recipes use, e.g. aml-hpc-pytorch) and one
EnvironmentVersion per content-hash tag, whose only recipe is `image=<registry>/<repo>:<tag>`:
no Dockerfile and no conda file, and auto-rebuild disabled, so Azure ML never builds
anything - it pulls the image `python -m amlhpc.images build` pushed. The version string IS the
image tag, so `azureml:aml-hpc-pytorch:<tag>` and the image reference name the same bytes.

Versions are immutable in Azure ML: a new tag registers a new version, and the old one
is kept (retain_on_delete) because finished jobs still point at it. Each tag is its own
Pulumi resource, so a tag that comes back after a revert is adopted by the tooling
(amlhpc/infra/adopt.py) rather than created twice. Tags come from
amlhpc.images.catalog (pure), the same code the image build uses, so both always agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import machinelearningservices as ml

from amlhpc.images import catalog
from amlhpc.infra.components import ComponentError


def _default_images() -> list[catalog.ImageRelease]:
    return catalog.releases(specs=catalog.ALL_IMAGES)  # the training images and the managed-run controller's


@dataclass
class TrainingEnvironmentsArgs:
    resource_group_name: pulumi.Input[str]
    """Resource group of the workspace. Changing it replaces every environment."""
    workspace_name: pulumi.Input[str]
    """Azure ML workspace the environments belong to. Changing it replaces every environment."""
    login_server: pulumi.Input[str]
    """Login server of the workspace's container registry (e.g. myacr.azurecr.io), where
    `python -m amlhpc.images build` pushes the images. Changing it registers new versions."""
    images: Sequence[catalog.ImageRelease] = field(default_factory=_default_images)
    """Images to register, as resolved by amlhpc.images.catalog (default: every image, tags from
    this checkout and amlhpc/images/pins.toml). A new tag registers a new environment version."""
    tags: dict[str, str] = field(default_factory=dict)
    """Azure tags for the environment assets (the stack's tags); updated in place."""


class TrainingEnvironments(pulumi.ComponentResource):
    """An Azure ML environment per training image, pointing at the prebuilt image."""

    environments: pulumi.Output[dict[str, str]]
    """Environment name -> full image reference (the outputs document's registry.environments)."""
    environment_ids: pulumi.Output[dict[str, str]]
    """Environment name -> azureml:<name>:<version> asset id jobs can use instead of the image."""

    def __init__(self, name: str, args: TrainingEnvironmentsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("aml-hpc:ml:TrainingEnvironments", name, None, opts)
        seen: set[str] = set()
        for image in args.images:
            if image.spec.name in seen:
                raise ComponentError(self, f"image {image.spec.name!r} is listed twice; each environment name must be unique")
            seen.add(image.spec.name)

        refs: dict[str, pulumi.Output[str]] = {}
        ids: dict[str, str] = {}
        for image in args.images:
            spec = image.spec
            ref = pulumi.Output.from_input(args.login_server).apply(image.ref)
            asset_tags = {**args.tags, "image-repository": spec.repository, "image-tag": image.tag,
                          "base-image": image.build_args["BASE_NAME"], "ib-userspace": image.build_args.get("IB_USERSPACE", "none")}
            container = ml.EnvironmentContainer(
                f"{name}-{spec.key}",
                name=spec.name,
                resource_group_name=args.resource_group_name,
                workspace_name=args.workspace_name,
                properties=ml.EnvironmentContainerPropertiesArgs(
                    description=spec.description,
                    tags=args.tags,
                ),
                # Jobs name environments by container; it outlives the stack like its versions.
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
            )
            ml.EnvironmentVersion(
                # One logical name per tag: a tag that comes back (a revert) is the same
                # resource again, so the tooling can adopt the retained version instead of
                # trying to create it twice. The alias carries state from the single
                # `-version` name earlier releases used.
                f"{name}-{spec.key}-{image.tag}",
                name=spec.name,
                version=image.tag,
                resource_group_name=args.resource_group_name,
                workspace_name=args.workspace_name,
                properties=ml.EnvironmentVersionPropertiesArgs(
                    image=ref,
                    os_type="Linux",
                    # Never let Azure ML rebuild or re-layer the image: it is built and
                    # checked by `python -m amlhpc.images build`, tagged by content.
                    auto_rebuild="Disabled",
                    description=f"{spec.description} (base {image.build_args['BASE_NAME']}, tag {image.tag})",
                    properties={"aml-hpc.base-image": image.build_args["BASE_IMAGE"],
                                "aml-hpc.ib-userspace": image.build_args.get("IB_USERSPACE", "none")},
                    tags=asset_tags,
                ),
                # Finished jobs reference old versions; removing one from the stack must
                # not delete it in Azure ML.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[container], retain_on_delete=True,
                                            aliases=[pulumi.Alias(name=f"{name}-{spec.key}-version")]),
            )
            refs[spec.name] = ref
            ids[spec.name] = image.environment_id

        self.environments = pulumi.Output.all(**refs).apply(dict) if refs else pulumi.Output.from_input({})
        self.environment_ids = pulumi.Output.from_input(ids)
        self.register_outputs({"environments": self.environments, "environmentIds": self.environment_ids})
