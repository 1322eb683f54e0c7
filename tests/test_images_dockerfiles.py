"""The Dockerfiles and what they install, without a Docker engine: hadolint clean, the
structural rules (pinned base, ARGs = pins, no ENTRYPOINT, apt lists removed, required
components, labels) on the real files and on broken copies, the IB install script's
refusals, and the NCCL topology files against the SKU catalog."""

from __future__ import annotations

import os
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from amlhpc.core import nccl, skus
from amlhpc.images import catalog, lint
from amlhpc.images.pins import load_pins

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = {spec.name: ROOT / spec.dockerfile for spec in catalog.IMAGES}
INSTALL_SCRIPT = ROOT / "amlhpc" / "images" / "common" / "bin" / "install_ib_userspace.sh"
TOPO_DIR = ROOT / "amlhpc" / "images" / "common" / "nccl-topo"


class TestHadolint:
    def test_every_dockerfile_is_clean_at_the_strictest_threshold(self):
        assert lint.hadolint(list(DOCKERFILES.values())) == []

    def test_hadolint_really_runs(self, tmp_path):
        """A Dockerfile with known faults must be reported (else the clean result means nothing)."""
        bad = tmp_path / "Dockerfile"
        bad.write_text("FROM ubuntu\nRUN apt-get update && apt-get install -y curl\n")
        codes = {p.message.split()[0] for p in lint.hadolint([bad])}
        assert {"DL3006", "DL3009", "DL3015"} <= codes


class TestStructure:
    @pytest.mark.parametrize("spec", catalog.IMAGES, ids=lambda s: s.name)
    def test_real_dockerfiles_follow_every_rule(self, spec):
        assert lint.check_dockerfile(spec, load_pins(), DOCKERFILES[spec.name]) == []

    @pytest.mark.parametrize("spec", catalog.IMAGES, ids=lambda s: s.name)
    def test_base_comes_only_from_the_pinned_arg(self, spec):
        text = DOCKERFILES[spec.name].read_text()
        assert re.findall(r"^FROM\s+(\S+)", text, re.M) == ["${BASE_IMAGE}"]
        assert re.search(r"^ARG BASE_IMAGE$", text, re.M), "BASE_IMAGE must have no default"
        assert re.fullmatch(r"[^@\s]+:[\w.-]+@sha256:[0-9a-f]{64}", catalog.build_args(spec, load_pins())["BASE_IMAGE"])

    @pytest.mark.parametrize("spec", catalog.IMAGES, ids=lambda s: s.name)
    def test_declared_args_are_exactly_the_pins(self, spec):
        declared = set(re.findall(r"^ARG ([A-Z0-9_]+)", DOCKERFILES[spec.name].read_text(), re.M))
        assert declared - set(catalog.NOT_HASHED_ARGS) == set(catalog.build_args(spec, load_pins()))

    @pytest.mark.parametrize("spec", catalog.IMAGES, ids=lambda s: s.name)
    def test_no_entrypoint_or_cmd(self, spec):
        assert not re.search(r"^\s*(ENTRYPOINT|CMD)\b", DOCKERFILES[spec.name].read_text(), re.M)

    @pytest.mark.parametrize("spec", catalog.IMAGES, ids=lambda s: s.name)
    def test_ib_check_is_the_last_run_step(self, spec):
        """Nothing installed after the check can break what it verified."""
        runs = [s for s in lint.parse(DOCKERFILES[spec.name].read_text()) if s.keyword == "RUN"]
        assert runs[-1].args.startswith("aml-hpc-check-ib")


def broken(tmp_path: Path, spec: catalog.ImageSpec, old: str, new: str) -> list[str]:
    text = DOCKERFILES[spec.name].read_text()
    assert old in text, old
    path = tmp_path / "Dockerfile"
    path.write_text(text.replace(old, new, 1))
    return [p.render() for p in lint.check_dockerfile(spec, load_pins(), path)]


class TestStructureRulesBite:
    """Each rule, broken on purpose in a copy, is reported with the fix."""

    def test_unpinned_base(self, tmp_path):
        found = broken(tmp_path, catalog.PYTORCH, "FROM ${BASE_IMAGE}", "FROM nvcr.io/nvidia/pytorch:latest")
        assert any("bypasses the pinned base" in f for f in found)
        assert any("mentions `latest`" in f for f in found)

    def test_entrypoint_override(self, tmp_path):
        found = broken(tmp_path, catalog.PYTORCH, "ENV AMLHPC_IMAGE", 'ENTRYPOINT ["/bin/bash"]\nENV AMLHPC_IMAGE')
        assert any("ENTRYPOINT overrides" in f for f in found)

    def test_missing_pin_arg(self, tmp_path):
        found = broken(tmp_path, catalog.PYTORCH, "ARG DEEPSPEED_VERSION\n", "")
        assert any("does not declare ARG DEEPSPEED_VERSION" in f for f in found)

    def test_version_default_in_dockerfile(self, tmp_path):
        found = broken(tmp_path, catalog.TENSORFLOW, "ARG HOROVOD_VERSION\n", "ARG HOROVOD_VERSION=0.28.1\n")
        assert any("ARG HOROVOD_VERSION has a default" in f for f in found)

    def test_arg_without_pin(self, tmp_path):
        found = broken(tmp_path, catalog.TENSORFLOW, "ARG HOROVOD_VERSION\n", "ARG HOROVOD_VERSION\nARG NCCL_VERSION\n")
        assert any("declares ARG NCCL_VERSION, which no pin provides" in f for f in found)

    def test_apt_lists_left_behind(self, tmp_path):
        found = broken(tmp_path, catalog.PYTORCH, " && rm -rf /var/lib/apt/lists/*", "")
        assert any("without removing /var/lib/apt/lists" in f for f in found)

    def test_missing_component(self, tmp_path):
        found = broken(tmp_path, catalog.PYTORCH, "openssh-client openssh-server", "openssh-client")
        assert any("'openssh-server'" in f for f in found)

    @pytest.mark.parametrize("spec", [catalog.PYTORCH, catalog.TENSORFLOW], ids=lambda s: s.name)
    def test_missing_ubergemm_smoke(self, tmp_path, spec):
        """The GEMM check runs DCGM's ubergemm: an NVIDIA image must prove it ships it."""
        found = broken(tmp_path, spec, ' && test -x "$(command -v ubergemm)"', "")
        assert any("'ubergemm'" in f for f in found)

    def test_missing_label(self, tmp_path):
        found = broken(tmp_path, catalog.TENSORFLOW, "org.opencontainers.image.revision=", "org.example.revision=")
        assert any("no label org.opencontainers.image.revision" in f for f in found)

    def test_parse_joins_continuations_and_drops_comments(self):
        steps = lint.parse("# c\nRUN a \\\n  # inner\n  && b\nLABEL x=1\n")
        assert [(s.keyword, s.args, s.line) for s in steps] == [("RUN", "a && b", 2), ("LABEL", "x=1", 5)]


def run_install(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(INSTALL_SCRIPT)], env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True, timeout=30, check=False)


class TestHealthToolsScript:
    SCRIPT = ROOT / "amlhpc" / "images" / "common" / "bin" / "install_health_tools.sh"

    def test_shell_syntax(self):
        assert subprocess.run(["bash", "-n", str(self.SCRIPT)], check=False).returncode == 0

    def test_dcgm_brings_ubergemm_or_the_build_stops(self):
        """ubergemm ships in DCGM's proprietary CUDA plugins (its own -ubergemm2 package from 4.7),
        at the pinned version; the build stops when no ubergemm was installed."""
        text = self.SCRIPT.read_text()
        assert '"datacenter-gpu-manager-4-proprietary-cuda${cuda_major}=${DCGM_VERSION}"' in text
        assert 'apt-cache show "datacenter-gpu-manager-4-cuda${cuda_major}-ubergemm2=${DCGM_VERSION}"' in text
        assert '"$plugins/updated/ubergemm"' in text and 'die "DCGM ${DCGM_VERSION} installed no ubergemm' in text

    def test_rccl_tests_from_the_pinned_repository_with_one_rank_per_gpu(self):
        """The gate runs all_reduce_perf one rank per GPU under mpirun as Azure's check does, so
        rccl-tests is built with MPI=1, from the repository and folder pins.toml names (ROCm/rocm-systems
        projects/rccl-tests, not the legacy ROCm/rccl-tests), and numactl is there for ib_write_bw."""
        text = self.SCRIPT.read_text()
        assert "github.com/ROCm/rccl-tests" not in text
        assert 'clone_at "${RCCL_TESTS_REPO}" "${RCCL_TESTS_COMMIT}" "$work/rocm-systems" "${RCCL_TESTS_PATH}"' in text
        assert re.search(r'make -C "\$work/rocm-systems/\$\{RCCL_TESTS_PATH\}" [^\n]*MPI=1 MPI_HOME="\$mpi"', text)
        assert "amd) install_numactl;" in text and "nvidia) install_numactl;" in text
        args = catalog.build_args(catalog.ROCM, load_pins())
        assert args["RCCL_TESTS_REPO"] == "https://github.com/ROCm/rocm-systems.git"
        assert args["RCCL_TESTS_PATH"] == "projects/rccl-tests"


class TestInstallScript:
    def test_shell_syntax(self):
        assert subprocess.run(["bash", "-n", str(INSTALL_SCRIPT)], check=False).returncode == 0

    def test_needs_a_mode(self):
        done = run_install({})
        assert done.returncode != 0 and "IB_USERSPACE must be set" in done.stderr

    def test_unknown_mode(self):
        done = run_install({"IB_USERSPACE": "rocm"})
        assert done.returncode == 1 and "not one of none, doca, mlnx-ofed" in done.stderr

    def test_doca_needs_its_version(self):
        done = run_install({"IB_USERSPACE": "doca", "DOCA_REPO": "https://example.invalid"})
        assert done.returncode != 0 and "DOCA_VERSION must be set" in done.stderr

    def test_legacy_ofed_refuses_without_checksum(self):
        done = run_install({"IB_USERSPACE": "mlnx-ofed", "MLNX_OFED_VERSION": "24.10-1.1.4.0",
                            "MLNX_OFED_URL": "https://example.invalid", "MLNX_OFED_SHA256": ""})
        assert done.returncode == 1 and "mlnx_ofed_sha256 in amlhpc/images/pins.toml" in done.stderr

    def test_user_space_only_never_kernel_modules(self):
        text = INSTALL_SCRIPT.read_text()
        assert "--user-space-only" in text and "--without-fw-update" in text
        assert "doca-ofed-userspace" in text
        assert not re.search(r"apt-get install[^\n]*\b(doca-ofed|mlnx-ofed-kernel|dkms)\b(?!-userspace)", text)


def topology(path: Path) -> tuple[list[tuple[int, str]], int, dict[int, set[int]]]:
    """(GPU bus id, NUMA) pairs, HCA count, NUMA -> CPU ids, from an NCCL topology file."""
    root = ET.parse(path).getroot()
    gpus, hcas, cpus = [], 0, {}
    for cpu in root.iter("cpu"):
        numa = int(cpu.get("numaid"))
        mask = int(cpu.get("affinity").replace(",", ""), 16)
        cpus[numa] = {bit for bit in range(mask.bit_length()) if mask >> bit & 1}
        for pci in cpu.iter("pci"):
            if pci.get("class") == "0x030200":
                gpus.append((int(pci.get("busid").split(":")[0], 16), numa))
            elif pci.get("class") == "0x020700":
                hcas += 1
    return sorted(gpus), hcas, cpus


def cpulist(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def topology_files(sku_name: str) -> dict[str, str]:
    """{variable: file name} of the topology and graph files amlhpc/core/catalog/nccl.toml names
    for a size: the settings the plan resolves into the job's code snapshot (plan/tuning.py)."""
    return {s.name: s.value for s in nccl.for_size(sku_name) if s.resolve == "topology"}


def topo_file(sku) -> str:
    """The topology file amlhpc/core/catalog/nccl.toml names for a size."""
    return topology_files(sku.name)["NCCL_TOPO_FILE"]


TOPO_SKUS = [s for s in skus.CATALOG.values() if "NCCL_TOPO_FILE" in topology_files(s.name)]


class TestNcclTopology:
    def test_every_file_the_catalog_names_is_in_the_images(self):
        assert TOPO_SKUS, "the catalog names no topology file"
        for sku in TOPO_SKUS:
            for name in topology_files(sku.name).values():
                assert (TOPO_DIR / name).is_file(), name

    @pytest.mark.parametrize("sku", TOPO_SKUS, ids=lambda s: s.name)
    def test_one_entry_per_gpu_and_hca(self, sku):
        gpus, hcas, _ = topology(TOPO_DIR / topo_file(sku))
        assert len(gpus) == sku.gpus and hcas == sku.ib_hcas

    @pytest.mark.parametrize("sku", [s for s in TOPO_SKUS if s.numa], ids=lambda s: s.name)
    def test_gpu_numa_map_matches_the_catalog(self, sku):
        """GPU index = position in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
        gpus, _, cpus = topology(TOPO_DIR / topo_file(sku))
        for domain in sku.numa:
            assert {i for i, (_, numa) in enumerate(gpus) if numa == domain.node} == set(domain.gpu_ids)
            assert cpus[domain.node] == cpulist(domain.cpulist)

    def test_files_have_no_comments(self):
        """Older NCCL parsers stop at XML comments."""
        for path in TOPO_DIR.glob("*.xml"):
            assert "<!--" not in path.read_text()
