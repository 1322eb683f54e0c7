"""amlhpc/images/pins.toml: the one file every image version comes from - valid, cited, exact,
consistent with the project's own dependency ranges, and every bad edit reported by key."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from amlhpc.core.errors import UserError
from amlhpc.images.pins import PINS_FILE, load_pins

ROOT = Path(__file__).resolve().parent.parent
PINS_TEXT = PINS_FILE.read_text()


def write_pins(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pins.toml"
    path.write_text(text)
    return path


def problems_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(UserError) as caught:
        load_pins(write_pins(tmp_path, text))
    return caught.value.render()


class TestRealPins:
    def test_loads_and_pins_bases_by_tag_and_digest(self):
        pins = load_pins()
        for base in (pins.pytorch, pins.tensorflow):
            assert re.fullmatch(r"nvcr\.io/nvidia/[a-z]+:[\w.-]+@sha256:[0-9a-f]{64}", base.ref), base.ref
            assert base.tag != "latest"
        assert re.fullmatch(r"rocm/pytorch:rocm[\w.-]+@sha256:[0-9a-f]{64}", pins.rocm.ref)

    def test_no_latest_anywhere_in_the_file(self):
        values = [line.split("=", 1)[1] for line in PINS_TEXT.splitlines() if "=" in line and not line.lstrip().startswith("#")]
        assert not any("latest" in v.lower() for v in values)

    def test_every_section_says_where_its_pins_came_from(self):
        """A pin without a source comment is a pin nobody can re-check."""
        sections = re.split(r"^\[(\w+)\]$", PINS_TEXT, flags=re.M)[1:]
        for name, body in zip(sections[::2], sections[1::2], strict=True):
            comments = " ".join(line for line in body.splitlines() if line.lstrip().startswith("#"))
            assert len(comments) > 200, f"[{name}] has too little provenance"

    def test_unverified_digests_are_declared_as_such(self):
        """We could not reach the registries: the file must say so next to each digest."""
        for section, registry in (("pytorch", "nvcr.io"), ("tensorflow", "nvcr.io"), ("rocm", "Docker Hub")):
            body = PINS_TEXT.split(f"[{section}]", 1)[1].split("\n[", 1)[0]
            assert f"Not confirmed against {registry}" in body

    def test_runtime_pins_satisfy_pyproject_ranges(self):
        """The image must run amlhpc/jobs/runtime with versions the project declares it supports."""
        pins = load_pins()
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        ranges = {re.split(r"[<>=!~ \[]", d, maxsplit=1)[0]: SpecifierSet(d[len(re.split(r"[<>=!~ \[]", d, maxsplit=1)[0]):])
                  for d in project}
        for package, pinned in (("azure-storage-blob", pins.python.azure_storage_blob),
                                ("azure-identity", pins.python.azure_identity), ("isal", pins.python.isal)):
            assert Version(pinned) in ranges[package], f"{package}=={pinned} outside pyproject's {ranges[package]}"

    def test_identity_and_isal_match_the_lock(self):
        lock = tomllib.loads((ROOT / "uv.lock").read_text())
        locked = {p["name"]: p["version"] for p in lock["package"] if "version" in p}  # the project itself: dynamic
        pins = load_pins()
        assert pins.python.azure_identity == locked["azure-identity"]
        assert pins.python.isal == locked["isal"]

    def test_default_infiniband_layer_is_off(self):
        assert load_pins().infiniband.userspace == "none"


class TestBadPins:
    def test_latest_tag_is_refused_with_key_and_fix(self, tmp_path):
        text = problems_of(tmp_path, PINS_TEXT.replace('tag = "26.07-py3"', 'tag = "latest"'))
        assert "pytorch.tag" in text and "'latest'" in text and "never 'latest'" in text and "fix:" in text

    def test_bad_digest(self, tmp_path):
        text = problems_of(tmp_path, re.sub(r'digest = "sha256:21[0-9a-f]+"', 'digest = "sha256:abc"', PINS_TEXT))
        assert "pytorch.digest" in text and "imagetools inspect" in text

    def test_tag_inside_image_is_refused(self, tmp_path):
        text = problems_of(tmp_path, PINS_TEXT.replace('image = "nvcr.io/nvidia/pytorch"', 'image = "nvcr.io/nvidia/pytorch:25.10-py3"'))
        assert "pytorch.image" in text and "repository only" in text

    def test_version_range_is_refused(self, tmp_path):
        text = problems_of(tmp_path, PINS_TEXT.replace('deepspeed = "0.19.8"', 'deepspeed = ">=0.19"'))
        assert "python.deepspeed" in text and "one exact version" in text

    def test_typo_gets_a_suggestion(self, tmp_path):
        text = problems_of(tmp_path, PINS_TEXT.replace("[python]", "[python]\ndeepspeeed = '1.0'"))
        assert "unknown key 'deepspeeed'" in text and "did you mean 'deepspeed'" in text

    def test_missing_key(self, tmp_path):
        text = problems_of(tmp_path, PINS_TEXT.replace('horovod = "0.28.1"', ""))
        assert "tensorflow.horovod" in text and "is required" in text

    def test_unknown_userspace(self, tmp_path):
        text = problems_of(tmp_path, PINS_TEXT.replace('userspace = "none"', 'userspace = "rocm"'))
        assert "infiniband.userspace" in text and "'none', 'doca' or 'mlnx-ofed'" in text

    def test_plain_http_repo_is_refused(self, tmp_path):
        text = problems_of(tmp_path, PINS_TEXT.replace('doca_repo = "https://', 'doca_repo = "http://'))
        assert "infiniband.doca_repo" in text and "https://" in text

    def test_legacy_ofed_without_checksum_is_refused(self, tmp_path):
        text = problems_of(tmp_path, PINS_TEXT.replace('userspace = "none"', 'userspace = "mlnx-ofed"'))
        assert "infiniband.mlnx_ofed_sha256" in text and "sha256sum" in text

    def test_legacy_ofed_with_checksum_is_accepted(self, tmp_path):
        text = PINS_TEXT.replace('userspace = "none"', 'userspace = "mlnx-ofed"').replace(
            'mlnx_ofed_sha256 = ""', f'mlnx_ofed_sha256 = "{"a" * 64}"')
        assert load_pins(write_pins(tmp_path, text)).infiniband.userspace == "mlnx-ofed"

    def test_all_problems_reported_at_once(self, tmp_path):
        text = problems_of(tmp_path, PINS_TEXT.replace('tag = "26.07-py3"', 'tag = "latest"').replace('isal = "1.9.1"', 'isal = "*"'))
        assert "(2 problems)" in text

    def test_invalid_toml(self, tmp_path):
        text = problems_of(tmp_path, PINS_TEXT + "\n[broken\n")
        assert "not valid TOML" in text and str(tmp_path) in text

    def test_missing_file(self, tmp_path):
        with pytest.raises(UserError, match="file not found"):
            load_pins(tmp_path / "nope.toml")


REFERENCE = ROOT / "tests" / "reference"


def _amd_supported_user_space(driver: str) -> list[str]:
    """The row of AMD's support matrix (reference copy) for an amdgpu driver release, as major.minor."""
    text = (REFERENCE / "rocm-install-on-linux" / "user-kernel-space-compat-matrix.rst").read_text()
    wanted = ".".join(driver.split(".")[:2]) + ".x"
    for row in re.findall(r'^\s+"([\d.x]+)", "([^"]+)"$', text, flags=re.M):
        if row[0] == wanted:
            return [v.strip().removesuffix(".x") for v in row[1].split(",")]
    raise AssertionError(f"no row for {wanted} in AMD's matrix")


class TestRocmWithinTheHostDriversWindow:
    """ROCm 7.2.4 user space on Azure's 6.4.4 host driver was outside AMD's window: no more."""

    def test_host_driver_is_azures_mi300x_host_image(self):
        """Azure/azhpc-images versions.json (reference copy): the Ubuntu 24.04 image's amdgpu driver."""
        versions = json.loads((REFERENCE / "azhpc-images" / "versions.json").read_text())
        assert load_pins().rocm.host_driver == versions["rocm"]["ubuntu24.04"]["x86_64"]["version"]

    def test_window_is_amds_row_for_that_driver(self):
        pins = load_pins()
        assert pins.rocm.host_driver_supports == _amd_supported_user_space(pins.rocm.host_driver)

    def test_pinned_user_space_is_inside_the_window_and_in_the_tag(self):
        rocm = load_pins().rocm
        assert rocm.rocm in _amd_supported_user_space(rocm.host_driver)
        assert rocm.tag.startswith(f"rocm{rocm.rocm}_") or rocm.tag.startswith(f"rocm{rocm.rocm}.")

    def test_a_tag_outside_the_window_is_refused_with_the_fix(self, tmp_path):
        rocm = load_pins().rocm
        text = PINS_TEXT.replace(f'tag = "{rocm.tag}"', 'tag = "rocm7.2.4_ubuntu24.04_py3.12_pytorch_release_2.10.0"')
        text = text.replace(f'rocm = "{rocm.rocm}"', 'rocm = "7.2"')
        out = problems_of(tmp_path, text)
        assert "rocm" in out and "ROCm 7.2 user space is outside" in out and "6.4.4" in out

    def test_a_version_that_does_not_match_the_tag_is_refused(self, tmp_path):
        out = problems_of(tmp_path, PINS_TEXT.replace(f'rocm = "{load_pins().rocm.rocm}"', 'rocm = "6.4"'))
        assert "does not match the tag" in out


class TestRcclTestsFromTheMaintainedRepository:
    def test_pinned_from_rocm_systems(self):
        tools = load_pins().tools
        assert tools.rccl_tests_repo == "https://github.com/ROCm/rocm-systems.git"
        assert tools.rccl_tests_path == "projects/rccl-tests"

    @pytest.mark.parametrize("legacy", ["https://github.com/ROCm/rccl-tests.git", "https://github.com/ROCm/rccl-tests"])
    def test_the_legacy_repository_is_refused(self, tmp_path, legacy):
        out = problems_of(tmp_path, PINS_TEXT.replace('rccl_tests_repo = "https://github.com/ROCm/rocm-systems.git"',
                                                      f'rccl_tests_repo = "{legacy}"'))
        assert "tools.rccl_tests_repo" in out and "legacy repository" in out and "ROCm/rocm-systems" in out
