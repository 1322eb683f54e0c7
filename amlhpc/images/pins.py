"""The version pins of the training images: `amlhpc/images/pins.toml`, parsed once and validated.

Every problem in the file is reported together, by key, with the fix (amlhpc.core.errors);
nothing else in `amlhpc/images/` reads the TOML itself. Pure: no Pulumi, no Azure SDK.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from amlhpc.core.errors import Problem, ProblemCollector, UserError

IMAGES_DIR = Path(__file__).resolve().parent
PINS_FILE = IMAGES_DIR / "pins.toml"

IbUserspace = Literal["none", "doca", "mlnx-ofed"]

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# An exact, release-looking version: digits and dots, optionally a PEP 440 post/pre part
# ("1.62.0.post6", "24.10-1.1.4.0"). Ranges, wildcards and "latest" are refused.
_EXACT_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([.-]?(post|rc|a|b)?[0-9]+)*([.-][0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _exact(value: str) -> str:
    if not _EXACT_VERSION.match(value):
        raise ValueError("must be one exact version such as 1.2.3 (no ranges, wildcards or 'latest')")
    return value


class BaseImagePin(_Strict):
    """A base image pinned by tag and by digest."""

    image: str
    """Repository without tag, e.g. nvcr.io/nvidia/pytorch."""
    tag: str
    digest: str
    """Multi-arch index digest, sha256:<64 hex>."""

    @field_validator("image")
    @classmethod
    def _no_tag_in_image(cls, value: str) -> str:
        last = value.rsplit("/", 1)[-1]
        if ":" in last or "@" in value:
            raise ValueError("give the repository only; the tag and digest have their own keys")
        return value

    @field_validator("tag")
    @classmethod
    def _real_tag(cls, value: str) -> str:
        if value == "latest" or not _TAG.match(value):
            raise ValueError("must be a fixed release tag such as 25.10-py3 (never 'latest')")
        return value

    @field_validator("digest")
    @classmethod
    def _digest(cls, value: str) -> str:
        if not _DIGEST.match(value):
            raise ValueError("must be sha256:<64 lowercase hex> (docker buildx imagetools inspect IMAGE:TAG)")
        return value

    @property
    def ref(self) -> str:
        """`image:tag@digest`: Docker resolves by the digest, the tag stays readable."""
        return f"{self.image}:{self.tag}@{self.digest}"


class RocmPin(BaseImagePin):
    """AMD's ROCm PyTorch base, with the ROCm user space it carries and the host's AMD GPU driver
    it must run on: AMD supports a user space only within a window around the kernel-mode driver
    (ROCm/rocm-install-on-linux, User and AMD GPU Driver (amdgpu) support matrix)."""

    rocm: str
    """The image's ROCm user space, major.minor (e.g. 7.0)."""
    host_driver: str
    """The ROCm release whose amdgpu driver Azure's MI300X host image installs (Azure/azhpc-images
    versions.json, rocm.ubuntu24.04)."""
    host_driver_supports: list[str]
    """The user-space releases (major.minor) AMD supports on that driver."""

    @model_validator(mode="after")
    def _within_the_drivers_window(self) -> RocmPin:
        if f"rocm{self.rocm}" not in self.tag and f"rocm{self.rocm}." not in self.tag:
            raise ValueError(f"rocm {self.rocm!r} does not match the tag {self.tag!r} (rocm<major.minor> in AMD's tags)")
        if self.rocm not in self.host_driver_supports:
            raise ValueError(f"ROCm {self.rocm} user space is outside what AMD supports on the host's ROCm "
                             f"{self.host_driver} amdgpu driver ({', '.join(self.host_driver_supports)}): pick a "
                             "rocm/pytorch tag within that window, or state a host driver that supports it")
        return self


class TensorflowPins(BaseImagePin):
    horovod: str
    """Horovod version built when the base lacks it."""

    @field_validator("horovod")
    @classmethod
    def _exact_version(cls, value: str) -> str:
        return _exact(value)


class PythonPins(_Strict):
    deepspeed: str
    azureml_mlflow: str
    mlflow_skinny: str
    azure_storage_blob: str
    azure_identity: str
    isal: str

    @field_validator("*")
    @classmethod
    def _exact_version(cls, value: str) -> str:
        return _exact(value)


_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_KEY = re.compile(r"^([0-9A-F]{16}|[0-9A-F]{40})$")
_DEB_VERSION = re.compile(r"^([0-9]+:)?[0-9][A-Za-z0-9.+~]*(-[A-Za-z0-9.+~]+)?$")


def _key(value: str) -> str:
    if not _KEY.match(value):
        raise ValueError("must be an OpenPGP fingerprint (40 upper-case hex) or 64-bit key id (16), no spaces")
    return value


class InfinibandPins(_Strict):
    userspace: IbUserspace = "none"
    doca: str
    doca_aarch64: str
    doca_repo: str
    doca_key: str
    """Fingerprint (or 64-bit id) of the DOCA repository's signing key."""
    mlnx_ofed: str
    mlnx_ofed_url: str
    mlnx_ofed_sha256: str = ""

    @field_validator("doca", "doca_aarch64", "mlnx_ofed")
    @classmethod
    def _exact_version(cls, value: str) -> str:
        return _exact(value)

    @field_validator("doca_key")
    @classmethod
    def _fingerprint(cls, value: str) -> str:
        return _key(value)

    @field_validator("doca_repo", "mlnx_ofed_url")
    @classmethod
    def _https(cls, value: str) -> str:
        if not value.startswith("https://"):
            raise ValueError("must be an https:// URL (packages are fetched at build time)")
        return value.rstrip("/")

    @field_validator("mlnx_ofed_sha256")
    @classmethod
    def _sha(cls, value: str) -> str:
        if value and not _SHA256.match(value):
            raise ValueError("must be empty or 64 lowercase hex characters (sha256sum of the tarball)")
        return value


class ToolsPins(_Strict):
    """The health tools built into the images: release versions and the commits they must be."""

    perftest: str
    perftest_commit: str
    nccl_tests: str
    nccl_tests_commit: str
    nvbandwidth: str
    nvbandwidth_commit: str
    rccl_tests_repo: str
    """Where rccl-tests is developed: ROCm/rocm-systems (projects/rccl-tests) since January 2026;
    ROCm/rccl-tests is the legacy repository, no longer maintained."""
    rccl_tests_path: str
    """The folder of rccl-tests inside that repository."""
    rccl_tests_commit: str
    dcgm: str
    dcgm_aarch64: str
    cuda_repo_key: str

    @field_validator("perftest", "nccl_tests", "nvbandwidth")
    @classmethod
    def _exact_version(cls, value: str) -> str:
        return _exact(value)

    @field_validator("perftest_commit", "nccl_tests_commit", "nvbandwidth_commit", "rccl_tests_commit")
    @classmethod
    def _commit(cls, value: str) -> str:
        if not _COMMIT.match(value):
            raise ValueError("must be a full 40-hex git commit id (the build checks out exactly this commit)")
        return value

    @field_validator("rccl_tests_repo")
    @classmethod
    def _maintained(cls, value: str) -> str:
        if not value.startswith("https://github.com/"):
            raise ValueError("must be an https://github.com/ repository")
        if value.rstrip("/").removesuffix(".git").endswith("ROCm/rccl-tests"):
            raise ValueError("ROCm/rccl-tests is the legacy repository (rccl-tests moved into ROCm/rocm-systems, "
                             "projects/rccl-tests): pin a ROCm/rocm-systems commit")
        return value

    @field_validator("dcgm", "dcgm_aarch64")
    @classmethod
    def _deb_version(cls, value: str) -> str:
        if not _DEB_VERSION.match(value):
            raise ValueError("must be one exact Debian package version such as 1:4.6.0-1")
        return value

    @field_validator("cuda_repo_key")
    @classmethod
    def _fingerprint(cls, value: str) -> str:
        return _key(value)


class Pins(_Strict):
    """Everything in amlhpc/images/pins.toml."""

    pytorch: BaseImagePin
    rocm: RocmPin
    tensorflow: TensorflowPins
    python: PythonPins
    infiniband: InfinibandPins
    tools: ToolsPins
    controller: BaseImagePin
    """The managed-run controller's Python base (its packages: amlhpc/images/controller/requirements.txt)."""

    def value(self, dotted: str) -> str:
        """A pin by its dotted key, e.g. "python.deepspeed" or "pytorch.ref"."""
        node: Any = self
        for part in dotted.split("."):
            node = getattr(node, part)
        return str(node)


def load_pins(path: Path = PINS_FILE) -> Pins:
    """Parse and validate the pins file; every problem in one UserError."""
    reference = _display(path)
    if not path.is_file():
        raise UserError([Problem(reference, "", "file not found", "restore amlhpc/images/pins.toml from version control")],
                        "cannot read the image pins")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError([Problem(reference, "", f"not valid TOML: {exc}", "fix the syntax at the line shown")],
                        "cannot read the image pins") from exc
    found = ProblemCollector(reference, "invalid image pins")
    try:
        pins = Pins.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            found.problems.append(_problem(reference, err))
        found.raise_if_any()
        raise  # unreachable: a ValidationError always carries at least one error
    ib = pins.infiniband
    if ib.userspace == "mlnx-ofed" and not ib.mlnx_ofed_sha256:
        # The legacy tarball is downloaded at build time; without a checksum nothing
        # proves it is the file we meant. Refuse before any build (or registration) starts.
        found.add("infiniband.mlnx_ofed_sha256", 'is empty but userspace = "mlnx-ofed" downloads the MLNX_OFED tarball',
                  f"set it to the sha256sum of MLNX_OFED_LINUX-{ib.mlnx_ofed}-ubuntu24.04-x86_64.tgz, "
                  'or set userspace = "doca" / "none"')
    found.raise_if_any()
    return pins


def _problem(reference: str, err: Any) -> Problem:
    loc = [str(p) for p in err["loc"]]
    path = ".".join(loc)
    if err["type"] == "extra_forbidden":
        allowed = _allowed(loc[:-1])
        near = difflib.get_close_matches(loc[-1], allowed, n=1)
        hint = (f"did you mean {near[0]!r}? " if near else "") + f"allowed here: {', '.join(sorted(allowed))}"
        return Problem(reference, path, f"unknown key {loc[-1]!r}", hint)
    if err["type"] == "missing":
        return Problem(reference, path, "is required", f"add `{loc[-1]} = ...` under [{'.'.join(loc[:-1])}]")
    if err["type"] == "literal_error":
        return Problem(reference, path, f"{err.get('input')!r} is not allowed", err["msg"].replace("Input should be", "use"))
    message = err["msg"].removeprefix("Value error, ")
    return Problem(reference, path, f"{err.get('input')!r}: {message}", f"edit {path} in amlhpc/images/pins.toml")


def _allowed(parent: list[str]) -> list[str]:
    model: type[BaseModel] = Pins
    for part in parent:
        annotation = model.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(IMAGES_DIR.parent))
    except ValueError:
        return str(path)
