"""The scripts that run inside the image: the build-time InfiniBand check on fake
filesystem trees (complete, and missing each required piece), and the smoke command
with fake tools on PATH."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "amlhpc" / "images" / "common" / "bin"
CHECK = BIN / "check_ib_userspace.py"
SMOKE = BIN / "smoke.py"
LIB = "usr/lib/x86_64-linux-gnu"


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def touch(root: Path, rel: str, text: str = "") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def tool(root: Path, rel: str, output: str, code: int = 0) -> Path:
    path = touch(root, rel, f"#!/bin/sh\necho '{output}'\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def complete(tmp_path):
    """A tree laid out like an NGC image with a full InfiniBand user space."""
    root = tmp_path / "image"
    for lib in ("libibverbs.so.1", "libmlx5.so.1", "librdmacm.so.1", "libnccl.so.2", "libnccl.so.2.27.7"):
        touch(root, f"{LIB}/{lib}")
    touch(root, f"{LIB}/libibverbs/libmlx5-rdmav34.so")
    touch(root, "etc/libibverbs.d/mlx5.driver", "driver mlx5\n")
    tool(root, "opt/hpcx/ompi/bin/ompi_info", "mpirun (Open MPI) 4.1.7")
    tool(root, "opt/hpcx/ucx/bin/ucx_info", "# Library version: 1.19.0")
    touch(root, "opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so")
    tool(root, "usr/bin/ibv_devinfo", "hca_id: mlx5_0")
    return root


def check(root: Path, *args: str, report: Path | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(CHECK), "--root", str(root), *args]
    if report:
        argv += ["--report", str(report)]
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""}
    return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=60, check=False)


class TestIbCheck:
    def test_complete_tree_passes_and_writes_a_report(self, complete, tmp_path):
        done = check(complete, report=tmp_path / "ib.json")
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads((tmp_path / "ib.json").read_text())
        assert report["ok"] is True and report["versions"]["openmpi"] == "mpirun (Open MPI) 4.1.7"
        names = {f["name"] for f in report["findings"] if f["ok"]}
        assert {"libibverbs", "mlx5 provider", "HPC-X/OpenMPI", "NCCL", "NCCL net plugin"} <= names

    @pytest.mark.parametrize(("remove", "finding"), [
        (f"{LIB}/libibverbs.so.1", "libibverbs"),
        (f"{LIB}/libibverbs/libmlx5-rdmav34.so", "mlx5 provider"),
        (f"{LIB}/libmlx5.so.1", "mlx5 provider"),
        ("opt/hpcx/ompi/bin/ompi_info", "HPC-X/OpenMPI"),
        (f"{LIB}/libnccl.so.2", "NCCL"),
        ("opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so", "NCCL net plugin"),
    ])
    def test_each_missing_piece_fails_the_build(self, complete, remove, finding):
        if remove.endswith("libnccl.so.2"):
            (complete / f"{LIB}/libnccl.so.2.27.7").unlink()
        (complete / remove).unlink()
        done = check(complete)
        assert done.returncode == 1
        assert f"[FAIL] {finding}:" in done.stdout and "missing: " in done.stdout and "fix:" in done.stdout

    def test_broken_ompi_info_fails(self, complete):
        tool(complete, "opt/hpcx/ompi/bin/ompi_info", "error while loading shared libraries: libucp.so.0", code=127)
        done = check(complete)
        assert done.returncode == 1 and "[FAIL] HPC-X/OpenMPI" in done.stdout and "does not run" in done.stdout

    def test_the_aws_ofi_plugin_does_not_count(self, complete):
        """NGC images also carry the EFA plugin, which is useless on Azure InfiniBand."""
        (complete / "opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so").unlink()
        touch(complete, "opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so")
        touch(complete, f"{LIB}/libnccl-net-ofi.so")
        done = check(complete)
        assert done.returncode == 1 and "ignored:" in done.stdout

    def test_libraries_found_through_ld_so_conf_includes(self, complete):
        (complete / f"{LIB}/libibverbs.so.1").unlink()
        touch(complete, "opt/rdma/lib/libibverbs.so.1")
        touch(complete, "etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
        touch(complete, "etc/ld.so.conf.d/rdma.conf", "# rdma-core\n/opt/rdma/lib\n")
        done = check(complete)
        assert done.returncode == 0 and "/opt/rdma/lib/libibverbs.so.1" in done.stdout

    def test_plugin_found_through_hpcx_variable(self, complete):
        (complete / "opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so").unlink()
        touch(complete, "opt/custom/plugin/lib/libnccl-net.so")
        env = {**os.environ, "PATH": "/usr/bin", "HPCX_NCCL_RDMA_SHARP_PLUGIN_DIR": "/opt/custom/plugin"}
        done = subprocess.run([sys.executable, str(CHECK), "--root", str(complete)], capture_output=True, text=True,
                              env=env, timeout=60, check=False)
        assert done.returncode == 0, done.stdout

    def test_optional_pieces_only_warn(self, complete):
        (complete / "usr/bin/ibv_devinfo").unlink()
        (complete / f"{LIB}/librdmacm.so.1").unlink()
        done = check(complete)
        assert done.returncode == 0 and "[warn] ibv_devinfo" in done.stdout and "[warn] librdmacm" in done.stdout

    def test_added_ofed_must_report_itself(self, complete):
        done = check(complete, "--expect", "doca")
        assert done.returncode == 1 and "[FAIL] ofed_info" in done.stdout

    def test_legacy_ofed_version_must_match_the_pin(self, complete):
        tool(complete, "usr/bin/ofed_info", "MLNX_OFED_LINUX-24.10-0.7.0.0:")
        wrong = check(complete, "--expect", "mlnx-ofed", "--mlnx-ofed-version", "24.10-1.1.4.0")
        assert wrong.returncode == 1 and "expected 24.10-1.1.4.0" in wrong.stdout
        tool(complete, "usr/bin/ofed_info", "MLNX_OFED_LINUX-24.10-1.1.4.0:")
        right = check(complete, "--expect", "mlnx-ofed", "--mlnx-ofed-version", "24.10-1.1.4.0")
        assert right.returncode == 0, right.stdout

    def test_legacy_ofed_needs_the_version(self, complete):
        done = check(complete, "--expect", "mlnx-ofed")
        assert done.returncode == 2 and "--mlnx-ofed-version" in done.stderr

    def test_nccl_version_decoding(self, monkeypatch):
        module = load(CHECK)

        class FakeLib:
            def __init__(self, code):
                self.code = code

            def ncclGetVersion(self, ref):  # noqa: N802 - NCCL's C name
                ref._obj.value = self.code
                return 0

        for code, text in ((22707, "2.27.7"), (2708, "2.7.8")):
            monkeypatch.setattr(module.ctypes, "CDLL", lambda _name, c=code: FakeLib(c))
            assert module.nccl_version("libnccl.so.2") == text


def smoke(bin_dir: Path, json_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    argv = [sys.executable, str(SMOKE), "--skip-health", "--json", str(json_path), *args]
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240, check=False)
    report = json.loads(json_path.read_text())
    return done, {r["name"]: r for r in report["results"]} | {"_passed": report["passed"]}


@pytest.fixture(scope="module")
def relaxed(tmp_path_factory):
    """One smoke run on this (GPU-less) machine with fake ibv_devinfo and ompi_info on PATH."""
    tmp = tmp_path_factory.mktemp("smoke")
    tool(tmp, "bin/ompi_info", "mpirun (Open MPI) 4.1.7")
    ibv = tmp / "bin" / "ibv_devinfo"
    ibv.write_text("#!/bin/sh\ncat <<'EOF'\nhca_id:\tmlx5_0\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"
                   "hca_id:\tmlx5_1\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\nEOF\n")
    ibv.chmod(0o755)
    return smoke(tmp / "bin", tmp / "smoke.json")


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    """One smoke run that expects GPUs and InfiniBand, with neither tool on PATH."""
    tmp = tmp_path_factory.mktemp("smoke-strict")
    (tmp / "bin").mkdir()
    return smoke(tmp / "bin", tmp / "smoke.json", "--expect-gpu", "--expect-ib")


@pytest.mark.slow
class TestSmoke:
    def test_reports_every_component(self, relaxed):
        done, results = relaxed
        assert {"python", "nccl", "ibv_devinfo", "ompi_info", "ucx_info"} <= set(results)
        assert results["ibv_devinfo"]["detail"] == "2 HCAs (mlx5_0, mlx5_1), 2 ports active"
        assert results["ompi_info"]["status"] == "ok" and "Open MPI" in results["ompi_info"]["detail"]
        assert results["ucx_info"]["status"] == "warn"
        assert "result:" in done.stdout and "ibv_devinfo" in done.stdout

    def test_framework_is_reported(self, relaxed):
        _, results = relaxed
        if importlib.util.find_spec("torch") is None:
            assert results["framework"]["status"] == "fail"
        else:
            assert results["torch"]["status"] == "ok" and results["torch"]["detail"].split()[0]

    def test_missing_nccl_fails_the_smoke(self, relaxed):
        """This machine has no libnccl: the smoke must say so and exit 1."""
        done, results = relaxed
        if results["nccl"]["status"] == "ok":
            pytest.skip("this machine has NCCL")
        assert results["nccl"]["status"] == "fail" and done.returncode == 1 and results["_passed"] is False

    def test_gpu_absence_is_a_warning_unless_expected(self, relaxed, strict):
        if importlib.util.find_spec("torch") is None:
            pytest.skip("no framework here to look for GPUs")
        if relaxed[1]["gpus"]["status"] == "ok":
            pytest.skip("this machine has a GPU")
        assert relaxed[1]["gpus"]["status"] == "warn"
        assert strict[1]["gpus"]["status"] == "fail" and strict[0].returncode == 1

    def test_expected_infiniband_missing_fails(self, strict):
        done, results = strict
        assert results["ibv_devinfo"] == {"name": "ibv_devinfo", "status": "fail", "detail": "not installed"}
        assert results["ompi_info"]["status"] == "fail" and done.returncode == 1

    def test_runs_the_runtime_health_cli_as_contracted(self, monkeypatch, tmp_path):
        module = load(SMOKE)
        calls = []
        monkeypatch.setattr(module, "_run", lambda argv, timeout=300: calls.append(argv) or (0, "all checks passed"))
        assert module.check_health(True, tmp_path).status == "ok"
        assert module.check_health(False, tmp_path).status == "ok"
        assert calls[0][1:] == ["-m", "amlhpc.jobs.runtime.health", "--quick", "--mode", "gate", "--report-dir", str(tmp_path)]
        assert calls[1][5] == "report"
        monkeypatch.setattr(module, "_run", lambda argv, timeout=300: (1, "gpu 3: ECC errors"))
        result = module.check_health(True, tmp_path)
        assert result.status == "fail" and "ECC" in result.detail
