"""The managed-run controller's image (amlhpc/images/controller): a pinned Python base, its packages
from hashed pins that are exactly uv.lock's, installed so that nothing else can come in;
registered like the training images, and what the controller job runs on."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from amlhpc.images import catalog, lint
from amlhpc.images.pins import load_pins

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "amlhpc" / "images" / "controller" / "requirements.txt"


def pinned() -> dict[str, tuple[str, set[str]]]:
    """name -> (version, hashes) of amlhpc/images/controller/requirements.txt."""
    found = {}
    for block in re.split(r"\n(?=[a-z0-9])", REQUIREMENTS.read_text()):
        head = re.match(r"([a-z0-9._-]+)==([^ ;\\]+)", block)
        if head:
            found[head.group(1)] = (head.group(2), set(re.findall(r"--hash=sha256:([0-9a-f]{64})", block)))
    return found


def test_every_package_is_locked_with_its_hashes():
    lock = {p["name"]: p for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    packages = pinned()
    assert {"azure-ai-ml", "azure-identity", "azure-storage-blob"} <= set(packages)
    for name, (version, hashes) in packages.items():
        assert name in lock and lock[name]["version"] == version, f"{name}=={version} is not uv.lock's"
        locked = {f["hash"].removeprefix("sha256:") for f in [*lock[name].get("wheels", []), lock[name].get("sdist") or {}]
                  if f.get("hash")}
        assert hashes and hashes <= locked, f"{name}: hashes not from uv.lock"


def test_the_group_is_what_the_controller_imports():
    group = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["controller"]
    assert sorted(re.split(r"[<>=]", d)[0] for d in group) == ["azure-ai-ml", "azure-identity", "azure-storage-blob"]


def test_the_dockerfile_installs_only_the_hashed_pins(tmp_path):
    pins = load_pins()
    path = ROOT / catalog.CONTROLLER.dockerfile
    assert lint.check_dockerfile(catalog.CONTROLLER, pins, path) == []
    text = path.read_text()
    for old, new, message in (
            ("--require-hashes --only-binary", "--only-binary", "--require-hashes"),
            ("-r /opt/aml-hpc/controller/requirements.txt", "-r /opt/aml-hpc/controller/requirements.txt "
                                                            "&& pip install azure-ai-ml", "without --require-hashes"),
            ("python -m pip check", "conda install -y azure-ai-ml && python -m pip check", "through conda")):
        broken = tmp_path / "Dockerfile"
        broken.write_text(text.replace(old, new, 1))
        assert any(message in p.message for p in lint.check_dockerfile(catalog.CONTROLLER, pins, broken)), message


def test_registered_with_a_base_pinned_by_digest_and_no_training_layers():
    release = catalog.release(catalog.CONTROLLER)
    assert release.build_args["BASE_IMAGE"] == load_pins().controller.ref
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", release.build_args["BASE_IMAGE"])
    assert "IB_USERSPACE" not in release.build_args and set(release.files) == {"Dockerfile", "requirements.txt"}
    assert catalog.CONTROLLER in catalog.ALL_IMAGES and catalog.CONTROLLER not in catalog.IMAGES
    assert catalog.by_name("controller") is catalog.CONTROLLER
