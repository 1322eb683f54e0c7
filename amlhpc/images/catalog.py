"""The images: what each one is, its build args, its content-hash tag, its refs.

The training images (PyTorch, TensorFlow) and the managed-run controller's image. Pure
(no Pulumi, no Azure SDK): `python -m amlhpc.images build` uses it to build, and the Pulumi
program (amlhpc/infra/components/environments.py) uses it to register one Azure ML environment
per image, so both always agree on the tag. The tag is a hash of the image's build context
(its folder and, for a training image, amlhpc/images/common and amlhpc/jobs/runtime) and its resolved
build args (the pins): same inputs, same tag, on any machine; any change, a new tag.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from amlhpc.images import context
from amlhpc.images.pins import Pins, load_pins

# Where things live inside every image (docs/images.md; the job side sets NCCL_TOPO_FILE).
INSTALL_ROOT = "/opt/aml-hpc"
PYTHON_PATH = f"{INSTALL_ROOT}/python"
"""On sys.path through a .pth file: `python -m amlhpc.jobs.runtime.<task>` works anywhere."""
NCCL_TOPO_DIR = f"{INSTALL_ROOT}/nccl-topo"
"""NCCL topology files for sizes whose virtualized PCI layout NCCL cannot see (skus.nccl_topo_file)."""
SMOKE_COMMAND = "aml-hpc-smoke"
IB_CHECK_COMMAND = "aml-hpc-check-ib"
BUILD_REPORT = f"{INSTALL_ROOT}/ib-userspace.json"
"""What the build-time check found (libraries, versions), kept in the image."""

NOT_HASHED_ARGS = ("GIT_COMMIT", "IMAGE_VERSION")
"""Build args that only feed labels: a new commit with identical content is the same image."""


@dataclass(frozen=True)
class ImageSpec:
    """One training image: how it is built and which hardware it runs on."""

    name: str
    """Azure ML environment name, e.g. aml-hpc-pytorch (recipes refer to it)."""
    repository: str
    """Repository in the stack's container registry, e.g. aml-hpc/pytorch."""
    folder: str
    """amlhpc/images/<folder> holds the Dockerfile (two images may share one: an arch per build)."""
    framework: str
    description: str
    pip_args: Mapping[str, str] = field(default_factory=dict)
    """Dockerfile ARG -> dotted pins key for the Python packages this image installs."""
    base_pin: str = ""
    """Pins section of the base image ("pytorch", "rocm" or "tensorflow")."""
    extra_args: Mapping[str, str] = field(default_factory=dict)
    """Other Dockerfile ARG -> dotted pins key."""
    platform: str = "linux/amd64"
    """The platform `az acr build` builds for."""
    host_arch: str = "x86_64"
    """The VM CPU architecture the image runs on (amlhpc.core.skus Sku.host_arch)."""
    gpu_vendor: str = "nvidia"
    gpu_archs: tuple[str, ...] = ()
    """GPU architectures the image's framework build runs on: "sm_75+" (that compute capability
    and newer) or exact targets (gfx942); amlhpc.core.skus Sku.gpu_arch is matched against them."""
    gpu_archs_why: str = ""
    """Where the supported range comes from (the CUDA line's or the vendor build's targets)."""
    ib_userspace: str | None = None
    """The InfiniBand user space this image always carries (None: amlhpc/images/pins.toml's default)."""
    training: bool = True
    """A training image: the InfiniBand user space, the health tools, amlhpc/images/common and the job
    runtime go in. The controller's image has none of them (its code comes with each controller job)."""

    @property
    def dockerfile(self) -> str:
        return f"amlhpc/images/{self.folder}/Dockerfile"

    @property
    def key(self) -> str:
        """A short name unique among the images (the repository's last part: pytorch,
        pytorch-arm64, rocm, tensorflow), for names derived per image."""
        return self.repository.rsplit("/", 1)[-1]

    def runs_on(self, vendor: str, gpu_arch: str, host_arch: str) -> str:
        """"" when the image runs on a GPU of `gpu_arch` in a `host_arch` VM, else why not."""
        if host_arch != self.host_arch:
            return f"{self.name} is built for {self.host_arch} hosts, the size's are {host_arch}"
        if vendor != self.gpu_vendor:
            return f"{self.name} is built for {self.gpu_vendor} GPUs, the size has {vendor} GPUs"
        if not any(_arch_matches(gpu_arch, accepted) for accepted in self.gpu_archs):
            return (f"{self.name} supports {', '.join(self.gpu_archs)} ({self.gpu_archs_why}); "
                    f"the size's GPUs are {gpu_arch}")
        return ""


def _arch_matches(gpu_arch: str, accepted: str) -> bool:
    """sm_90 matches "sm_75+" and "sm_90"; gfx942 matches "gfx942" only."""
    if accepted.endswith("+"):
        floor = accepted[:-1]
        return (gpu_arch.startswith("sm_") and floor.startswith("sm_")
                and int(gpu_arch.removeprefix("sm_")) >= int(floor.removeprefix("sm_")))
    return gpu_arch == accepted


_RUNTIME_PIP = {
    "AZURE_STORAGE_BLOB_VERSION": "python.azure_storage_blob",
    "AZURE_IDENTITY_VERSION": "python.azure_identity",
    "ISAL_VERSION": "python.isal",
    "AZUREML_MLFLOW_VERSION": "python.azureml_mlflow",
    "MLFLOW_SKINNY_VERSION": "python.mlflow_skinny",
}
_CUDA_TOOLS = {
    "PERFTEST_VERSION": "tools.perftest", "PERFTEST_COMMIT": "tools.perftest_commit",
    "NCCL_TESTS_VERSION": "tools.nccl_tests", "NCCL_TESTS_COMMIT": "tools.nccl_tests_commit",
    "NVBANDWIDTH_VERSION": "tools.nvbandwidth", "NVBANDWIDTH_COMMIT": "tools.nvbandwidth_commit",
    "CUDA_REPO_KEY": "tools.cuda_repo_key",
}
_CUDA13 = ("sm_75+",)
_CUDA13_WHY = "CUDA 13 dropped Maxwell, Pascal and Volta: compute capability 7.5 and newer"

PYTORCH = ImageSpec(
    name="aml-hpc-pytorch",
    repository="aml-hpc/pytorch",
    folder="pytorch",
    framework="pytorch",
    description="NGC PyTorch + DeepSpeed + MLflow for Azure ML, InfiniBand user space, health tools, aml-hpc job runtime",
    base_pin="pytorch",
    pip_args=MappingProxyType({**_RUNTIME_PIP, "DEEPSPEED_VERSION": "python.deepspeed"}),
    extra_args=MappingProxyType({**_CUDA_TOOLS, "DCGM_VERSION": "tools.dcgm"}),
    gpu_archs=_CUDA13, gpu_archs_why=_CUDA13_WHY,
)
PYTORCH_ARM64 = ImageSpec(
    name="aml-hpc-pytorch-arm64",
    repository="aml-hpc/pytorch-arm64",
    folder="pytorch",
    framework="pytorch",
    description="NGC PyTorch for Grace (arm64) hosts of ND GB200/GB300 v6 + DeepSpeed + MLflow, DOCA-OFED, health tools, aml-hpc job runtime",
    base_pin="pytorch",
    pip_args=PYTORCH.pip_args,
    extra_args=MappingProxyType({**_CUDA_TOOLS, "DCGM_VERSION": "tools.dcgm_aarch64"}),
    platform="linux/arm64", host_arch="aarch64",
    gpu_archs=_CUDA13, gpu_archs_why=_CUDA13_WHY,
    ib_userspace="doca",
)
ROCM = ImageSpec(
    name="aml-hpc-rocm",
    repository="aml-hpc/rocm",
    folder="rocm",
    framework="pytorch",
    description="AMD ROCm PyTorch for ND MI300X v5 + DeepSpeed + MLflow, DOCA-OFED, RCCL tests and perftest with ROCm, aml-hpc job runtime",
    base_pin="rocm",
    pip_args=PYTORCH.pip_args,
    extra_args=MappingProxyType({"PERFTEST_VERSION": "tools.perftest", "PERFTEST_COMMIT": "tools.perftest_commit",
                                 "RCCL_TESTS_REPO": "tools.rccl_tests_repo", "RCCL_TESTS_PATH": "tools.rccl_tests_path",
                                 "RCCL_TESTS_COMMIT": "tools.rccl_tests_commit"}),
    gpu_vendor="amd", gpu_archs=("gfx90a", "gfx942"),
    gpu_archs_why="the CDNA 2/3 targets of AMD's ROCm 7.0 PyTorch build (MI200, MI300)",
    ib_userspace="doca",
)
TENSORFLOW = ImageSpec(
    name="aml-hpc-tensorflow",
    repository="aml-hpc/tensorflow",
    folder="tensorflow",
    framework="tensorflow",
    description="Last NGC TensorFlow + Horovod (CosmoFlow, as in NAG's tutorial), InfiniBand user space, health tools, aml-hpc job runtime",
    base_pin="tensorflow",
    pip_args=MappingProxyType(dict(_RUNTIME_PIP)),
    extra_args=MappingProxyType({"HOROVOD_VERSION": "tensorflow.horovod", **_CUDA_TOOLS, "DCGM_VERSION": "tools.dcgm"}),
    gpu_archs=("sm_70+",), gpu_archs_why="CUDA 12.8 still builds for Volta (compute capability 7.0) and newer",
)

IMAGES: tuple[ImageSpec, ...] = (PYTORCH, PYTORCH_ARM64, ROCM, TENSORFLOW)


def fitting(vendor: str, gpu_arch: str, host_arch: str, framework: str | None = None) -> list[ImageSpec]:
    """The images that run on this hardware (of one framework, when given)."""
    return [s for s in IMAGES if not s.runs_on(vendor, gpu_arch, host_arch)
            and (framework is None or s.framework == framework)]


CONTROLLER = ImageSpec(
    name="aml-hpc-controller",
    repository="aml-hpc/controller",
    folder="controller",
    framework="controller",
    description="Managed-run controller: pinned Python, azure-ai-ml, azure-identity and azure-storage-blob from hashed pins",
    base_pin="controller",
    training=False,
)
"""Azure ML pulls it for `python -m amlhpc.jobs.managed.controller`; it builds nothing (prod reaches
no conda channel or package index). Its Python packages are amlhpc/images/controller/requirements.txt,
exported with hashes from uv.lock's `controller` group."""

ALL_IMAGES: tuple[ImageSpec, ...] = (*IMAGES, CONTROLLER)
"""Every image the stack builds and registers: the training images (IMAGES) and the controller's."""


def by_name(name: str) -> ImageSpec:
    """The image called `name` (environment name, folder or repository all accepted)."""
    for spec in ALL_IMAGES:
        if name in (spec.name, spec.folder, spec.repository):
            return spec
    raise KeyError(name)


IB_ARGS = ("IB_USERSPACE", "DOCA_VERSION", "DOCA_REPO", "DOCA_KEY", "MLNX_OFED_VERSION", "MLNX_OFED_URL",
           "MLNX_OFED_SHA256")


def ib_build_args(pins: Pins, spec: ImageSpec = PYTORCH) -> dict[str, str]:
    """The InfiniBand build args: only the selected user space's versions are set, so
    changing an unused pin (DOCA while userspace = "none") does not change any tag. The DOCA
    version is the one Azure pins for the image's host architecture."""
    ib = pins.infiniband
    userspace = spec.ib_userspace or ib.userspace
    args = dict.fromkeys(IB_ARGS, "")
    args["IB_USERSPACE"] = userspace
    if userspace == "doca":
        args.update(DOCA_VERSION=ib.doca_aarch64 if spec.host_arch == "aarch64" else ib.doca, DOCA_REPO=ib.doca_repo,
                    DOCA_KEY=ib.doca_key)
    elif userspace == "mlnx-ofed":
        args.update(MLNX_OFED_VERSION=ib.mlnx_ofed, MLNX_OFED_URL=ib.mlnx_ofed_url, MLNX_OFED_SHA256=ib.mlnx_ofed_sha256)
    return args


def build_args(spec: ImageSpec, pins: Pins) -> dict[str, str]:
    """Every hashed build arg of `spec`, resolved from the pins (the Dockerfile declares each)."""
    base = getattr(pins, spec.base_pin)
    args = {
        "BASE_IMAGE": base.ref,
        "BASE_NAME": f"{base.image}:{base.tag}",
        "BASE_DIGEST": base.digest,
        "HOST_ARCH": spec.host_arch,
    }
    if spec.training:  # the controller installs its own hashed requirements.txt
        args["PIP_LOCK"] = lock_name(spec)
    args.update({arg: pins.value(key) for arg, key in spec.pip_args.items()})
    args.update({arg: pins.value(key) for arg, key in spec.extra_args.items()})
    if spec.training:
        args.update(ib_build_args(pins, spec))
    return dict(sorted(args.items()))


def lock_name(spec: ImageSpec) -> str:
    """The hashed requirements file (amlhpc/images/common/requirements/) this image installs from."""
    return f"{spec.name}.txt"


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
    pins = pins if pins is not None else load_pins(root / "amlhpc" / "images" / "pins.toml")
    files = context.context_files(spec.folder, root, runtime=spec.training)
    args = build_args(spec, pins)
    return ImageRelease(spec, context.content_hash(files, args), MappingProxyType(args), MappingProxyType(files))


def releases(root: Path = context.REPO_ROOT, pins: Pins | None = None,
             specs: tuple[ImageSpec, ...] = IMAGES) -> list[ImageRelease]:
    """The images (default: the training images), resolved once against the same pins."""
    pins = pins if pins is not None else load_pins(root / "amlhpc" / "images" / "pins.toml")
    return [release(spec, pins, root) for spec in specs]


def image_ref(login_server: str, repository: str, tag: str) -> str:
    """`<login server>/<repository>:<tag>`, e.g. amlhpcdevacr.azurecr.io/aml-hpc/pytorch:0123456789ab."""
    server = login_server.strip().removeprefix("https://").removeprefix("http://").rstrip("/").lower()
    if not server or "/" in server:
        raise ValueError(f"registry login server {login_server!r} must be a host name such as myacr.azurecr.io")
    return f"{server}/{repository}:{tag}"


def environment_id(name: str, version: str) -> str:
    """The Azure ML asset id of an environment version: azureml:<name>:<version>.

    Environments are registered with version = image tag (amlhpc/infra/components/environments.py),
    so a job can name the environment instead of the raw image reference.
    """
    return f"azureml:{name}:{version}"
