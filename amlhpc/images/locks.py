"""Hashed Python requirements for the images: every package pip installs is pinned with its
SHA-256, so a build installs exactly the files the lock names (`pip install --require-hashes`).

The top-level versions come from amlhpc/images/pins.toml ([python], and Horovod in [tensorflow]); the
lock is their full dependency closure for the image's Python (3.12) and platform, resolved by
`uv pip compile --generate-hashes` (`python -m amlhpc.images lock`), minus the packages the base image
ships and holds with its own pip constraints (`BASE_PROVIDED`: reinstalling them would fight the
base's constraint file). The Dockerfiles install with `--no-deps` and then run `pip check`, so a
dependency the lock leaves out and the base lacks fails the build by name.

Each lock starts with a line holding the hash of its inputs; `python -m amlhpc.images check` refuses a
lock whose inputs changed (a pin moved without `python -m amlhpc.images lock`), a line without a hash,
or a top-level version that is not the pin. Pure except `compile_lock` (runs uv).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

from amlhpc.core import invocation
from amlhpc.core.errors import Problem
from amlhpc.images.catalog import IMAGES, ImageSpec, lock_name
from amlhpc.images.pins import IMAGES_DIR, Pins

LOCK_DIR = IMAGES_DIR / "common" / "requirements"
PYTHON_VERSION = "3.12"
"""Every base image runs Python 3.12 (NGC 25.02+/26.07, rocm/pytorch py3.12)."""

BASE_PROVIDED = ("torch", "triton", "numpy", "protobuf", "setuptools", "pip", "wheel", "packaging", "typing-extensions")
"""Installed and constrained by every base image (NGC's /etc/pip/constraint.txt, AMD's venv):
left out of the locks so our install never replaces the framework's own builds."""

_PIP_PINS = {"azureml-mlflow": "python.azureml_mlflow", "mlflow-skinny": "python.mlflow_skinny",
             "azure-storage-blob": "python.azure_storage_blob", "azure-identity": "python.azure_identity",
             "isal": "python.isal"}
_HEADER = "# aml-hpc lock inputs: "
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


HOROVOD_SUFFIX = "-horovod"
"""The TensorFlow image's second lock: Horovod is built only when the base lacks it, so its
closure is installed apart from the runtime's (`<image>-horovod.txt`)."""


def lock_variants(spec: ImageSpec) -> tuple[str, ...]:
    """The lock suffixes an image has: "" (the runtime) and, for TensorFlow, "-horovod"."""
    return ("", HOROVOD_SUFFIX) if spec.framework == "tensorflow" else ("",)


def top_level(spec: ImageSpec, pins: Pins, variant: str = "") -> dict[str, str]:
    """{distribution: version} one lock of the image asks for, from the pins."""
    if variant == HOROVOD_SUFFIX:
        return {"horovod": pins.tensorflow.horovod}
    wanted = {name: pins.value(key) for name, key in _PIP_PINS.items()}
    if spec.framework == "pytorch":
        wanted["deepspeed"] = pins.python.deepspeed
    return dict(sorted(wanted.items()))


def python_platform(spec: ImageSpec) -> str:
    return f"{spec.host_arch}-manylinux_2_28"


def inputs_digest(spec: ImageSpec, pins: Pins, variant: str = "") -> str:
    """What the lock was resolved from: the top-level pins, the platform, Python and the exclusions."""
    text = "\n".join([*(f"{k}=={v}" for k, v in top_level(spec, pins, variant).items()), python_platform(spec),
                      PYTHON_VERSION, *BASE_PROVIDED])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def lock_path(spec: ImageSpec, root: Path = LOCK_DIR, variant: str = "") -> Path:
    return root / lock_name(spec).replace(".txt", f"{variant}.txt")


def compile_lock(spec: ImageSpec, pins: Pins, root: Path = LOCK_DIR, variant: str = "") -> Path:
    """Resolve and write one of the image's locks with uv (network: the package index)."""
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    root.mkdir(parents=True, exist_ok=True)
    source = root / f".{spec.name}{variant}.in"
    source.write_text("".join(f"{k}=={v}\n" for k, v in top_level(spec, pins, variant).items()))
    out = lock_path(spec, root, variant)
    common = ["--python-version", PYTHON_VERSION, "--python-platform", python_platform(spec), "-q"]
    try:
        # The framework's own dependencies (torch's CUDA wheels, sympy, ...) come with the base
        # image: resolve torch alone to learn them, and leave them out with it.
        provided = set(BASE_PROVIDED)
        if spec.framework == "pytorch":
            torch_in = root / f".{spec.name}-torch.in"
            torch_in.write_text("torch\n")
            closure = subprocess.run([uv, "pip", "compile", str(torch_in), "--no-header", "--no-annotate", *common],
                                     check=True, capture_output=True, text=True).stdout
            torch_in.unlink()
            provided |= set(requirements(closure))
        argv = [uv, "pip", "compile", str(source), "--generate-hashes", "--no-header", "--no-annotate", *common,
                "-o", str(out)]
        for name in sorted(provided):
            argv += ["--no-emit-package", name]
        subprocess.run(argv, check=True)
    finally:
        source.unlink(missing_ok=True)
    out.write_text(f"{_HEADER}{inputs_digest(spec, pins, variant)} ({spec.name}{variant}, Python {PYTHON_VERSION}, "
                   f"{python_platform(spec)}; regenerate: python -m amlhpc.images lock)\n" + out.read_text())
    return out


def requirements(text: str) -> dict[str, tuple[str, int]]:
    """{normalized name: (version, number of hashes)} of a lock's requirement entries."""
    found: dict[str, tuple[str, int]] = {}
    for entry in re.split(r"\n(?=\S)", text):
        match = _REQUIREMENT.match(entry.strip())
        if match:
            found[_normalize(match.group(1))] = (match.group(2), entry.count("--hash=sha256:"))
    return found


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def check_lock(spec: ImageSpec, pins: Pins, root: Path = LOCK_DIR, variant: str = "") -> list[Problem]:
    """Every problem of one lock (empty: it matches the pins and every line is hashed)."""
    path = lock_path(spec, root, variant)
    ref = f"amlhpc/images/common/requirements/{path.name}"
    fix = f"regenerate it: {invocation.command('images', 'lock')}"
    if not path.is_file():
        return [Problem(ref, "", f"is missing ({spec.name} installs its Python packages from it)", fix)]
    text = path.read_text()
    problems = []
    first = text.splitlines()[0] if text else ""
    if not first.startswith(_HEADER) or first[len(_HEADER):].split()[0] != inputs_digest(spec, pins, variant):
        problems.append(Problem(ref, "line 1", "was resolved from other pins than amlhpc/images/pins.toml holds now", fix))
    entries = requirements(text)
    if not entries:
        problems.append(Problem(ref, "", "holds no pinned requirement", fix))
    for name, (_version, hashes) in sorted(entries.items()):
        if hashes == 0:
            problems.append(Problem(ref, name, "has no --hash=sha256: pip --require-hashes would refuse the build", fix))
    for name, version in top_level(spec, pins, variant).items():
        got = entries.get(_normalize(name))
        if got is None or got[0] != version:
            problems.append(Problem(ref, name, f"is {got[0] if got else 'missing'}, amlhpc/images/pins.toml pins {version}", fix))
    for name in BASE_PROVIDED:
        if name in entries:
            problems.append(Problem(ref, name, "is provided and constrained by the base image but the lock installs it",
                                    fix))
    return problems


def check_all(pins: Pins, root: Path = LOCK_DIR) -> list[Problem]:
    return [p for spec in IMAGES for variant in lock_variants(spec) for p in check_lock(spec, pins, root, variant)]


def compile_all(pins: Pins, root: Path = LOCK_DIR) -> list[Path]:
    return [compile_lock(spec, pins, root, variant) for spec in IMAGES for variant in lock_variants(spec)]
