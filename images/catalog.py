"""The images: what each one is, its build args, its content-hash tag, its refs.

The training images (PyTorch, TensorFlow) and the managed-run controller's image. Pure
(no Pulumi, no Azure SDK): `python -m images build` uses it to build, and the Pulumi
program (infra/components/environments.py) uses it to register one Azure ML environment
per image, so both always agree on the tag. The tag is a hash of the image's build context
(its folder and, for a training image, images/common and jobs/runtime) and its resolved
build args (the pins): same inputs, same tag, on any machine; any change, a new tag.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from images import context
from images.pins import Pins, load_pins

# Where things live inside every image (docs/images.md; the job side sets NCCL_TOPO_FILE).
INSTALL_ROOT = "/opt/aml-hpc"
PYTHON_PATH = f"{INSTALL_ROOT}/python"
"""On sys.path through a .pth file: `python -m jobs.runtime.<task>` works anywhere."""
NCCL_TOPO_DIR = f"{INSTALL_ROOT}/nccl-topo"
"""NCCL topology files for sizes whose virtualized PCI layout NCCL cannot see (skus.nccl_topo_file)."""
SMOKE_COMMAND = "aml-hpc-smoke"
IB_CHECK_COMMAND = "aml-hpc-check-ib"
BUILD_REPORT = f"{INSTALL_ROOT}/ib-userspace.json"
"""What the build-time check found (libraries, versions), kept in the image."""

NOT_HASHED_ARGS = ("GIT_COMMIT", "IMAGE_VERSION")
"""Build args that only feed labels: a new commit with identical content is the same image."""


def nccl_topo_path(file_name: str) -> str:
    """Absolute path inside the image of a topology file named in core.skus (nccl_topo_file)."""
    return f"{NCCL_TOPO_DIR}/{file_name}"


@dataclass(frozen=True)
class ImageSpec:
    """One training image."""

    name: str
    """Azure ML environment name, e.g. aml-hpc-pytorch (recipes refer to it)."""
    repository: str
    """Repository in the stack's container registry, e.g. aml-hpc/pytorch."""
    folder: str
    """images/<folder> holds the Dockerfile."""
    framework: str
    description: str
    pip_args: Mapping[str, str] = field(default_factory=dict)
    """Dockerfile ARG -> dotted pins key for the Python packages this image installs."""
    base_pin: str = ""
    """Pins section of the base image ("pytorch" or "tensorflow")."""
    extra_args: Mapping[str, str] = field(default_factory=dict)
    """Other Dockerfile ARG -> dotted pins key."""
    training: bool = True
    """A training image: the InfiniBand user space, images/common and the job runtime go in.
    The controller's image has none of them (its code comes with each controller job)."""

    @property
    def dockerfile(self) -> str:
        return f"images/{self.folder}/Dockerfile"


_RUNTIME_PIP = {
    "AZURE_STORAGE_BLOB_VERSION": "python.azure_storage_blob",
    "AZURE_IDENTITY_VERSION": "python.azure_identity",
    "ISAL_VERSION": "python.isal",
    "AZUREML_MLFLOW_VERSION": "python.azureml_mlflow",
    "MLFLOW_SKINNY_VERSION": "python.mlflow_skinny",
}

PYTORCH = ImageSpec(
    name="aml-hpc-pytorch",
    repository="aml-hpc/pytorch",
    folder="pytorch",
    framework="pytorch",
    description="NGC PyTorch + DeepSpeed + MLflow for Azure ML, InfiniBand user space, aml-hpc job runtime",
    base_pin="pytorch",
    pip_args=MappingProxyType({**_RUNTIME_PIP, "DEEPSPEED_VERSION": "python.deepspeed"}),
)
TENSORFLOW = ImageSpec(
    name="aml-hpc-tensorflow",
    repository="aml-hpc/tensorflow",
    folder="tensorflow",
    framework="tensorflow",
    description="Last NGC TensorFlow + Horovod (CosmoFlow, as in NAG's tutorial), InfiniBand user space, aml-hpc job runtime",
    base_pin="tensorflow",
    pip_args=MappingProxyType(dict(_RUNTIME_PIP)),
    extra_args=MappingProxyType({"HOROVOD_VERSION": "tensorflow.horovod"}),
)

CONTROLLER = ImageSpec(
    name="aml-hpc-controller",
    repository="aml-hpc/controller",
    folder="controller",
    framework="controller",
    description="Managed-run controller: pinned Python, azure-ai-ml, azure-identity and azure-storage-blob from hashed pins",
    base_pin="controller",
    training=False,
)
"""Azure ML pulls it for `python -m jobs.managed.controller`; it builds nothing (prod reaches
no conda channel or package index). Its Python packages are images/controller/requirements.txt,
exported with hashes from uv.lock's `controller` group."""

IMAGES: tuple[ImageSpec, ...] = (PYTORCH, TENSORFLOW)
"""The training images."""
ALL_IMAGES: tuple[ImageSpec, ...] = (*IMAGES, CONTROLLER)
"""Every image the stack builds and registers."""


def by_name(name: str) -> ImageSpec:
    """The image called `name` (environment name, folder or repository all accepted)."""
    for spec in ALL_IMAGES:
        if name in (spec.name, spec.folder, spec.repository):
            return spec
    raise KeyError(name)


IB_ARGS = ("IB_USERSPACE", "DOCA_VERSION", "DOCA_REPO", "MLNX_OFED_VERSION", "MLNX_OFED_URL", "MLNX_OFED_SHA256")


def ib_build_args(pins: Pins) -> dict[str, str]:
    """The InfiniBand build args: only the selected user space's versions are set, so
    changing an unused pin (DOCA while userspace = "none") does not change any tag."""
    ib = pins.infiniband
    args = dict.fromkeys(IB_ARGS, "")
    args["IB_USERSPACE"] = ib.userspace
    if ib.userspace == "doca":
        args.update(DOCA_VERSION=ib.doca, DOCA_REPO=ib.doca_repo)
    elif ib.userspace == "mlnx-ofed":
        args.update(MLNX_OFED_VERSION=ib.mlnx_ofed, MLNX_OFED_URL=ib.mlnx_ofed_url, MLNX_OFED_SHA256=ib.mlnx_ofed_sha256)
    return args


def build_args(spec: ImageSpec, pins: Pins) -> dict[str, str]:
    """Every hashed build arg of `spec`, resolved from the pins (the Dockerfile declares each)."""
    base = getattr(pins, spec.base_pin)
    args = {
        "BASE_IMAGE": base.ref,
        "BASE_NAME": f"{base.image}:{base.tag}",
        "BASE_DIGEST": base.digest,
    }
    args.update({arg: pins.value(key) for arg, key in spec.pip_args.items()})
    args.update({arg: pins.value(key) for arg, key in spec.extra_args.items()})
    if spec.training:
        args.update(ib_build_args(pins))
    return dict(sorted(args.items()))


@dataclass(frozen=True)
class ImageRelease:
    """An image as the current checkout and pins define it."""

    spec: ImageSpec
    tag: str
    build_args: Mapping[str, str]
    files: Mapping[str, context.ContextFile] = field(repr=False, compare=False)

    def ref(self, login_server: str) -> str:
        return image_ref(login_server, self.spec.repository, self.tag)

    @property
    def environment_id(self) -> str:
        return environment_id(self.spec.name, self.tag)


def release(spec: ImageSpec, pins: Pins | None = None, root: Path = context.REPO_ROOT) -> ImageRelease:
    """Resolve `spec` against the pins and the files under `root`."""
    pins = pins if pins is not None else load_pins(root / "images" / "pins.toml")
    files = context.context_files(spec.folder, root, runtime=spec.training)
    args = build_args(spec, pins)
    return ImageRelease(spec, context.content_hash(files, args), MappingProxyType(args), MappingProxyType(files))


def releases(root: Path = context.REPO_ROOT, pins: Pins | None = None,
             specs: tuple[ImageSpec, ...] = IMAGES) -> list[ImageRelease]:
    """The images (default: the training images), resolved once against the same pins."""
    pins = pins if pins is not None else load_pins(root / "images" / "pins.toml")
    return [release(spec, pins, root) for spec in specs]


def image_ref(login_server: str, repository: str, tag: str) -> str:
    """`<login server>/<repository>:<tag>`, e.g. amlhpcdevacr.azurecr.io/aml-hpc/pytorch:0123456789ab."""
    server = login_server.strip().removeprefix("https://").removeprefix("http://").rstrip("/").lower()
    if not server or "/" in server:
        raise ValueError(f"registry login server {login_server!r} must be a host name such as myacr.azurecr.io")
    return f"{server}/{repository}:{tag}"


def environment_id(name: str, version: str) -> str:
    """The Azure ML asset id of an environment version: azureml:<name>:<version>.

    Environments are registered with version = image tag (infra/components/environments.py),
    so a job can name the environment instead of the raw image reference.
    """
    return f"azureml:{name}:{version}"
