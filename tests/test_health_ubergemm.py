"""DCGM's ubergemm in the GEMM check: finding it, reading its output (the line format of
Azure/ai-infrastructure-on-azure gpu_validation.md: `GFlops:1.85620e+06 GFlops`), grading it."""

from __future__ import annotations

from pathlib import Path

import pytest

from amlhpc.jobs.runtime.health import ubergemm
from amlhpc.jobs.runtime.health.grading import FAIL, PASS, WARN
from amlhpc.jobs.runtime.health.tools import Tools

PLUGIN = Path("/usr/libexec/datacenter-gpu-manager-4/plugins/cuda13/updated/ubergemm")
MARK = (769.0, 742.0, 715.0)


def fake_tools(*, on_path: str | None = None, files: tuple[Path, ...] = (), answer=(0, "")) -> Tools:
    return Tools(run=lambda command, timeout: answer, read=lambda path: None,
                 which=lambda name: on_path if name == "ubergemm" else None, executable=lambda path: path in files)


class TestParse:
    def test_the_documented_line_is_gflops(self):
        assert ubergemm.parse_gflops("GFlops:1.85620e+06 GFlops\n") == pytest.approx(1856200.0)

    def test_the_steady_state_after_starting_is_averaged_without_zeros(self):
        text = ("tuning....\nGFlops:9.0e+05 GFlops\nstarting....\nGFlops:0.00000e+00 GFlops\n"
                "GFlops:7.60000e+05 GFlops\nGFlops:7.80000e+05 GFlops\n")
        assert ubergemm.parse_gflops(text) == pytest.approx(770000.0)

    @pytest.mark.parametrize("text", ["", "Segmentation fault (core dumped)\n", "GFlops:abc GFlops\n",
                                      "starting....\nGFlops:0.00000e+00 GFlops\n"])
    def test_garbage_has_no_figure(self, text):
        assert ubergemm.parse_gflops(text) is None


class TestFind:
    def test_path_comes_first(self):
        assert ubergemm.find_ubergemm(fake_tools(on_path="/usr/local/bin/ubergemm", files=(PLUGIN,))) == "/usr/local/bin/ubergemm"

    def test_found_at_dcgms_plugin_path(self):
        """Azure's images have it there and not on PATH (gpu_validation.md)."""
        assert ubergemm.find_ubergemm(fake_tools(files=(PLUGIN,))) == str(PLUGIN)

    def test_the_cuda12_plugin_when_there_is_no_cuda13_one(self):
        cuda12 = Path("/usr/libexec/datacenter-gpu-manager-4/plugins/cuda12/updated/ubergemm")
        assert ubergemm.find_ubergemm(fake_tools(files=(cuda12,))) == str(cuda12)

    def test_absent(self):
        assert ubergemm.find_ubergemm(fake_tools()) is None


class TestGrade:
    def results(self, answer, count=2):
        return ubergemm.ubergemm_results(fake_tools(answer=answer), str(PLUGIN), MARK, 60.0,
                                         [f"gpu{i}" for i in range(count)], {})

    @pytest.mark.parametrize(("figure", "status"), [("7.60000e+05", PASS), ("7.30000e+05", WARN), ("7.00000e+05", FAIL)])
    def test_graded_against_the_mark_in_tflops(self, figure, status):
        (result, _) = self.results((0, f"starting....\nGFlops:{figure} GFlops\n"))
        assert result.status == status and result.value == pytest.approx(float(figure) / 1000) and result.threshold == 715.0

    def test_non_zero_exit_fails_with_the_tail(self):
        (result,) = self.results((134, "starting....\nGFlops:7.6e+05 GFlops\nterminate called: cudaErrorLaunchFailure\n"), 1)
        assert result.status == FAIL and result.value is None
        assert "exit 134" in result.detail and "cudaErrorLaunchFailure" in result.detail

    def test_no_figure_fails(self):
        (result,) = self.results((0, "ubergemm: unrecognized option\n"), 1)
        assert result.status == FAIL and "no GFlops line" in result.detail and "unrecognized option" in result.detail

    def test_runs_every_gpu_at_once_for_the_marks_duration(self):
        seen = []

        def run(command, timeout):
            seen.append(command)
            return 0, "GFlops:7.7e+05 GFlops"

        tools = Tools(run=run, read=lambda path: None, which=lambda name: None, executable=lambda path: False)
        ubergemm.ubergemm_results(tools, "/x/ubergemm", MARK, 30.0, ["gpu0", "gpu1"], {"CUDA_VISIBLE_DEVICES": "1,3"})
        assert sorted(seen) == [["env", f"CUDA_VISIBLE_DEVICES={d}", "/x/ubergemm", "-t", "30"] for d in ("1", "3")]
