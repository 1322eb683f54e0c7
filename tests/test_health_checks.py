"""A node's own checks: GPU figures graded against the catalog (fake measure layer),
InfiniBand ports (fake sysfs), ECC and row remapping (fake NVML)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from amlhpc.core import skus
from amlhpc.jobs.runtime.health import checks, fleet
from amlhpc.jobs.runtime.health.checks import QUICK, gpu_checks, node_checks
from amlhpc.jobs.runtime.health.ecc import check_ecc
from amlhpc.jobs.runtime.health.grading import FAIL, INFO, NOT_CHECKED, PASS, SKIP, WARN
from amlhpc.jobs.runtime.health.infiniband import check_infiniband, ib_ports
from amlhpc.jobs.runtime.health.measure import TorchGpuMeasurer
from amlhpc.jobs.runtime.health.results import NodeReport
from amlhpc.jobs.runtime.health.tools import Tools
from amlhpc.jobs.runtime.node.nvml import NvmlSession
from amlhpc.jobs.runtime.node.skufacts import parse_sku_facts
from tests import fake_nvml
from tests.fake_nvml import FakeNvml, nd96asr_gpus
from tests.fake_sysfs import build_nd96asr_sysfs, ib_port, pci_device


def facts(name: str):
    return parse_sku_facts(json.dumps(dataclasses.asdict(skus.get(name))))


ND96ASR = facts("Standard_ND96asr_v4")
A100 = skus.get("Standard_ND96asr_v4")
GEMM_EXPECTED, GEMM_WARN, GEMM_MIN = A100.health.gemm_tflops
PCI_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


class FakeMeasurer:
    """The measure layer with chosen figures; records calls and the CPU affinity of copies."""

    software_missing = False

    def __init__(self, gpus: int = 8, gemm=270.0, h2d=25.0, d2h=25.0, d2d=2600.0, p2p=250.0, reason: str = ""):
        self.gpus, self.unavailable_reason = gpus, reason
        self.figures = {"gemm": gemm, "h2d": h2d, "d2h": d2h, "d2d": d2d, "p2p": p2p}
        self.calls: list[tuple] = []
        self.copy_affinity: dict[int, set[int]] = {}

    def _figure(self, kind: str, index: int) -> float:
        value = self.figures[kind]
        value = value(index) if callable(value) else value
        if isinstance(value, Exception):
            raise value
        return value

    def device_count(self) -> int:
        return self.gpus

    def device_name(self, index: int) -> str:
        return "NVIDIA A100-SXM4-40GB"

    def gemm_tflops(self, index, dtype, shape, iters):
        self.calls.append(("gemm", index, dtype, shape, iters))
        return self._figure("gemm", index)

    def gemm_sustained_tflops(self, indices, dtype, shape, seconds, settle_seconds):
        self.calls.append(("gemm_sustained", tuple(indices), dtype, shape, seconds, settle_seconds))
        rates = {}
        for index in indices:
            try:
                rates[index] = self._figure("gemm", index)
            except Exception as exc:  # noqa: BLE001 - as the real measurer hands back a GPU's error
                rates[index] = exc
        return rates

    def p2p_gbytes_per_s(self, dst, src, nbytes, iters):
        self.calls.append(("p2p", dst, src))
        value = self._figure("p2p", dst)
        return value(src) if callable(value) else value

    def h2d_gbytes_per_s(self, index, nbytes, iters):
        self.copy_affinity[index] = set(os.sched_getaffinity(0))
        self.calls.append(("h2d", index, nbytes, iters))
        return self._figure("h2d", index)

    def d2h_gbytes_per_s(self, index, nbytes, iters):
        return self._figure("d2h", index)

    def d2d_gbytes_per_s(self, index, nbytes, iters):
        return self._figure("d2d", index)


@pytest.fixture
def nd96asr(tmp_path):
    return build_nd96asr_sysfs(tmp_path / "sys")


def by(results, check):
    return [r for r in results if r.check == check]


class TestGpuChecks:
    def test_healthy_node(self, nd96asr):
        """Eight GPUs above every mark: each figure passes and names its GPU's PCI address."""
        measurer = FakeMeasurer()
        results = gpu_checks(ND96ASR, measurer, QUICK, nd96asr, PCI_ORDER)
        assert by(results, "gpu_count")[0].status == PASS
        gemm = by(results, "gemm")
        assert [r.status for r in gemm] == [PASS] * 8
        assert gemm[2].subject == "gpu2 0003:00:00.0"
        assert gemm[0].threshold == pytest.approx(GEMM_MIN)
        assert "1024x10240x5120" in gemm[0].detail and "measured baseline ~271.2" in gemm[0].detail
        assert {c[3] for c in measurer.calls if c[0] == "gemm"} == {(1024, 10240, 5120)}  # the baseline's shape
        p2p = by(results, "p2p")
        assert [r.status for r in p2p] == [PASS] * 8 and p2p[0].threshold == A100.health.p2p_gbytes_per_s_min
        assert len([c for c in measurer.calls if c[0] == "p2p"]) == 8 * 7  # every ordered pair
        assert [r.threshold for r in by(results, "h2d")] == [A100.health.h2d_gbytes_per_s_min] * 8
        assert all(r.status == INFO for r in by(results, "d2d"))  # no published mark

    def test_gemm_uses_the_catalog_dtype(self, nd96asr):
        """V100 sizes measure fp16 (no bf16 tensor cores), A100 bf16."""
        v100 = FakeMeasurer()
        gpu_checks(facts("Standard_ND40rs_v2"), v100, QUICK, nd96asr, PCI_ORDER)
        assert {c[2] for c in v100.calls if c[0] == "gemm"} == {"fp16"}
        a100 = FakeMeasurer()
        gpu_checks(ND96ASR, a100, QUICK, nd96asr, PCI_ORDER)
        assert {c[2] for c in a100.calls if c[0] == "gemm"} == {"bf16"}

    def test_slow_gpu_fails_and_borderline_warns(self, nd96asr):
        """GPU 5 below the fail line (7 % under the measured baseline) fails; GPU 6 between the
        warn and fail lines warns (Azure's SKU baseline rule)."""
        gemm = {5: GEMM_MIN - 1, 6: (GEMM_MIN + GEMM_WARN) / 2}
        results = gpu_checks(ND96ASR, FakeMeasurer(gemm=lambda i: gemm.get(i, GEMM_EXPECTED)), QUICK, nd96asr, PCI_ORDER)
        statuses = [r.status for r in by(results, "gemm")]
        assert statuses == [PASS] * 5 + [FAIL, WARN, PASS]
        assert "(<" in by(results, "gemm")[5].line()

    def test_h2d_below_the_pass_mark_fails(self, nd96asr):
        results = gpu_checks(ND96ASR, FakeMeasurer(h2d=lambda i: 12.0 if i == 3 else 25.0), QUICK, nd96asr, PCI_ORDER)
        assert [r.status for r in by(results, "h2d")][3] == FAIL

    def test_cuda_error_is_a_failure_of_that_gpu(self, nd96asr):
        error = RuntimeError("CUDA error: uncorrectable ECC error encountered")
        results = gpu_checks(ND96ASR, FakeMeasurer(gemm=lambda i: error if i == 1 else 270.0), QUICK, nd96asr, PCI_ORDER)
        failed = by(results, "gemm")[1]
        assert failed.status == FAIL and "uncorrectable ECC error" in failed.detail

    def test_missing_gpu_fails(self, tmp_path):
        """Seven GPUs on the bus of an eight-GPU size."""
        root = build_nd96asr_sysfs(tmp_path / "sys", gpus=7)
        results = gpu_checks(ND96ASR, FakeMeasurer(gpus=7), QUICK, root, PCI_ORDER)
        count = by(results, "gpu_count")[0]
        assert count.status == FAIL and "7 GPU(s) on the PCI bus, Standard_ND96asr_v4 has 8" in count.detail

    def test_gpus_on_bus_but_not_in_cuda_fail(self, nd96asr):
        results = gpu_checks(ND96ASR, FakeMeasurer(gpus=0, reason="CUDA driver not loaded"), QUICK, nd96asr, PCI_ORDER)
        assert len(results) == 1
        assert results[0].status == FAIL and "CUDA sees none: CUDA driver not loaded" in results[0].detail

    def test_no_gpu_machine_is_skipped_not_faked(self, tmp_path):
        """A CPU machine: one skip that says so, no figures."""
        pci_device(tmp_path, "0000:00:00.0", "0x8086", "0x060000", -1, None)
        measurer = FakeMeasurer(gpus=0, reason="CUDA is not available")
        results = gpu_checks(ND96ASR, measurer, QUICK, tmp_path, PCI_ORDER)
        assert [(r.check, r.status) for r in results] == [("gpu_count", SKIP)]
        assert "no NVIDIA GPU on this machine (a Standard_ND96asr_v4 has 8)" in results[0].detail
        assert measurer.calls == []

    def test_real_torch_on_this_cpu_machine_is_skipped(self, tmp_path):
        """The real measure layer on this GPU-less machine reports why and measures nothing."""
        measurer = TorchGpuMeasurer()
        assert measurer.device_count() == 0 and "CUDA is not available" in measurer.unavailable_reason
        results = gpu_checks(ND96ASR, measurer, QUICK, tmp_path, PCI_ORDER)
        assert [r.status for r in results] == [SKIP]

    def test_copies_run_on_the_gpus_numa_cpus(self, tmp_path):
        """H2D for each GPU runs pinned to that GPU's local CPUs; affinity is restored afterwards."""
        available = sorted(os.sched_getaffinity(0))
        if len(available) < 2:
            pytest.skip("needs two CPUs to tell placements apart")
        first, second = available[:2]
        pci_device(tmp_path, "0001:00:00.0", "0x10de", "0x030200", 1, str(second))
        pci_device(tmp_path, "0002:00:00.0", "0x10de", "0x030200", 0, str(first))
        measurer = FakeMeasurer(gpus=2)
        before = os.sched_getaffinity(0)
        results = gpu_checks(None, measurer, QUICK, tmp_path, PCI_ORDER)
        assert measurer.copy_affinity == {0: {second}, 1: {first}}
        assert os.sched_getaffinity(0) == before
        assert "from NUMA node 1" in by(results, "h2d")[0].detail

    def test_fastest_first_numbering_is_not_matched_to_pci(self, nd96asr):
        """Without PCI_BUS_ID numbering a CUDA index says nothing about the PCI slot."""
        results = gpu_checks(ND96ASR, FakeMeasurer(), QUICK, nd96asr, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
        assert by(results, "gemm")[0].subject == "gpu0"
        assert "NUMA placement unknown" in by(results, "h2d")[0].detail

    def test_visible_devices_map_to_their_pci_slots(self, nd96asr):
        env = {**PCI_ORDER, "CUDA_VISIBLE_DEVICES": "2,3"}
        results = gpu_checks(ND96ASR, FakeMeasurer(gpus=2), QUICK, nd96asr, env)
        assert [r.subject for r in by(results, "gemm")] == ["gpu0 0003:00:00.0", "gpu1 0004:00:00.0"]
        assert by(results, "gpu_count")[0].status == PASS

    def test_without_sku_facts_figures_are_info(self, nd96asr):
        results = gpu_checks(None, FakeMeasurer(), QUICK, nd96asr, PCI_ORDER)
        assert {r.status for r in results if r.check in ("gemm", "h2d", "d2h", "d2d")} == {INFO}


def ubergemm_tools(answers=None, calls=None):
    """Tools with ubergemm on PATH answering per CUDA_VISIBLE_DEVICES value (the recorded
    line format of Azure's gpu_validation.md), or without it when `answers` is None."""
    def run(command, timeout):
        if calls is not None:
            calls.append((command, timeout))
        device = next(a.split("=", 1)[1] for a in command if a.startswith("CUDA_VISIBLE_DEVICES="))
        return answers(device)

    return Tools(run=run, read=lambda path: None, which=lambda name: "/usr/bin/ubergemm" if answers and name == "ubergemm" else None,
                 executable=lambda path: False)


def gflops(value: float) -> tuple[int, str]:
    return 0, f"tuning....\nGFlops:0.00000e+00 GFlops\nstarting....\nGFlops:{value:.5e} GFlops\nGFlops:{value:.5e} GFlops\n"


class TestGemmMethod:
    """The GEMM check measures the way the size's mark was measured, with the tool that measured it."""

    H100 = facts("Standard_ND96isr_H100_v5")
    H200 = facts("Standard_ND96isr_H200_v5")

    def test_without_ubergemm_an_ubergemm_mark_is_reported_not_graded(self, nd96asr):
        """ND H100 v5's mark is Azure's 60-second ubergemm: without ubergemm the gate runs torch the
        same way (every GPU at once, 60 s), reports it, and leaves the slow GPU to the fleet."""
        slow = {3: 700.0}
        measurer = FakeMeasurer(gemm=lambda i: slow.get(i, 770.0))
        results = by(gpu_checks(self.H100, measurer, checks.FULL, nd96asr, PCI_ORDER, ubergemm_tools()), "gemm")
        gemm_calls = [c for c in measurer.calls if c[0].startswith("gemm")]
        assert gemm_calls == [("gemm_sustained", tuple(range(8)), "bf16", (2048, 2048, 13312), 60.0, checks.FULL.settle_seconds)]
        assert {r.status for r in results} == {INFO} and results[3].value == 700.0 and results[3].threshold is None
        assert "every GPU at once for 60 s" in results[3].detail and "ubergemm" in results[3].detail
        assert "681.3" in results[3].detail and "power cap" in results[3].detail
        report = NodeReport("h", 0, self.H100.name, "gate", False, "", checks=results)
        (finding,) = fleet.fleet_findings([report])[0]
        assert finding.check == "fleet:gemm" and finding.subject == results[3].subject and finding.status == FAIL  # 9 % below the median

    def test_h200_torch_figure_is_graded_against_torch_mark(self, nd96asr):
        """The healthy H200 measured 2026-11-26 (681.3 TFLOP/s, torch, 60 s) failed the gate against
        ubergemm's 715 line; without ubergemm it is now graded against the torch mark and passes."""
        results = by(gpu_checks(self.H200, FakeMeasurer(gemm=681.3), checks.FULL, nd96asr, PCI_ORDER, ubergemm_tools()), "gemm")
        assert {r.status for r in results} == {PASS} and results[0].threshold == 633.6
        assert "torch.matmul mark ~681.3" in results[0].detail
        slow = by(gpu_checks(self.H200, FakeMeasurer(gemm=lambda i: 630.0 if i == 2 else 681.3), checks.FULL, nd96asr,
                             PCI_ORDER, ubergemm_tools()), "gemm")
        # the torch mark was measured on one H200 in a 16-vCPU VM: below its fail line only warns
        assert [r.status for r in slow] == [PASS, PASS, WARN] + [PASS] * 5
        assert "measured on one H200 SXM (700 W) in a 16-vCPU VM" in slow[2].detail

    # The ubergemm mark is ND H100 v5's, borrowed: below its fail line only warns.
    @pytest.mark.parametrize(("gflops_figure", "status"), [(760000.0, PASS), (730000.0, WARN), (700000.0, WARN)])
    def test_with_ubergemm_the_h200_is_graded_against_ubergemms_mark(self, nd96asr, gflops_figure, status):
        calls = []
        measurer = FakeMeasurer(gemm=681.3)
        results = by(gpu_checks(self.H200, measurer, checks.FULL, nd96asr, PCI_ORDER,
                                ubergemm_tools(lambda device: gflops(gflops_figure), calls)), "gemm")
        assert {r.status for r in results} == {status}
        assert results[0].value == pytest.approx(gflops_figure / 1000) and results[0].threshold == 715.0
        assert "ubergemm -t 60" in results[0].detail and not [c for c in measurer.calls if c[0].startswith("gemm")]
        assert sorted(c[0][1] for c in calls) == [f"CUDA_VISIBLE_DEVICES={i}" for i in range(8)]
        assert {tuple(c[0][2:]) for c in calls} == {("/usr/bin/ubergemm", "-t", "60")} and calls[0][1] > 60

    def test_ubergemm_sees_the_gates_own_gpu_under_visible_devices(self, nd96asr):
        calls = []
        environ = {**PCI_ORDER, "CUDA_VISIBLE_DEVICES": "4,6"}
        gpu_checks(self.H100, FakeMeasurer(gpus=2), checks.FULL, nd96asr, environ,
                   ubergemm_tools(lambda device: gflops(770000.0), calls))
        assert sorted(c[0][1] for c in calls) == ["CUDA_VISIBLE_DEVICES=4", "CUDA_VISIBLE_DEVICES=6"]

    def test_an_ubergemm_run_that_fails_fails_its_gpu_with_the_output(self, nd96asr):
        def answers(device):
            if device == "5":
                return 1, "starting....\nCUDA error: an illegal memory access was encountered\n"
            return (0, "Usage: ubergemm [options]\n") if device == "6" else gflops(770000.0)

        results = by(gpu_checks(self.H100, FakeMeasurer(), checks.FULL, nd96asr, PCI_ORDER, ubergemm_tools(answers)), "gemm")
        assert [r.status for r in results] == [PASS] * 5 + [FAIL, FAIL, PASS]
        assert "exit 1" in results[5].detail and "illegal memory access" in results[5].detail
        assert "no GFlops line" in results[6].detail and "Usage" in results[6].detail

    def test_quick_run_reports_a_sustained_mark_without_grading_it(self, nd96asr):
        calls = []
        measurer = FakeMeasurer(gemm=800.0)
        results = by(gpu_checks(self.H100, measurer, QUICK, nd96asr, PCI_ORDER,
                                ubergemm_tools(lambda device: gflops(770000.0), calls)), "gemm")
        assert {r.status for r in results} == {INFO} and results[0].threshold is None
        assert "60-second sustained rate" in results[0].detail and "not graded in a quick run" in results[0].detail
        assert {c[0] for c in measurer.calls if c[0].startswith("gemm")} == {"gemm"} and calls == []
        h200 = by(gpu_checks(self.H200, FakeMeasurer(gemm=723.2), QUICK, nd96asr, PCI_ORDER, ubergemm_tools()), "gemm")
        assert {r.status for r in h200} == {INFO}  # a burst is not graded against the sustained torch mark either

    def test_burst_mark_is_the_median_of_the_fastest_iterations_per_gpu(self, nd96asr):
        """mamf-finder's A100 figure is a torch burst: one GPU at a time, graded as before, ubergemm or not."""
        measurer = FakeMeasurer()
        results = by(gpu_checks(ND96ASR, measurer, checks.FULL, nd96asr, PCI_ORDER,
                                ubergemm_tools(lambda device: gflops(1.0))), "gemm")
        assert [c[1] for c in measurer.calls if c[0] == "gemm"] == list(range(8))
        assert "median of the 5 fastest" in results[0].detail and {r.status for r in results} == {PASS}

    def test_a_gpu_failing_in_the_sustained_run_fails_alone(self, nd96asr):
        error = RuntimeError("CUDA error: an illegal memory access was encountered")
        results = by(gpu_checks(self.H200, FakeMeasurer(gemm=lambda i: error if i == 5 else 681.3), checks.FULL,
                                nd96asr, PCI_ORDER, ubergemm_tools()), "gemm")
        assert [r.status for r in results] == [PASS] * 5 + [FAIL] + [PASS] * 2
        assert "illegal memory access" in results[5].detail


class TestInfiniband:
    def test_eight_active_hdr_ports_pass(self, nd96asr):
        """The Ethernet accelerated-networking port is not counted."""
        results = check_infiniband(nd96asr, ND96ASR)
        assert results[0].subject == "node" and results[0].status == PASS and results[0].value == 8
        assert [r.subject for r in results[1:]] == [f"mlx5_ib{i}/1" for i in range(8)]
        assert all(r.status == PASS and r.value == 200.0 for r in results[1:])

    def test_port_in_init_fails_with_the_reason(self, nd96asr):
        ib_port(nd96asr, "mlx5_ib3", state="2: INIT")
        failed = [r for r in check_infiniband(nd96asr, ND96ASR) if r.status == FAIL]
        assert [r.subject for r in failed] == ["mlx5_ib3/1"]
        assert "state INIT (link up but not configured by the subnet manager)" in failed[0].detail

    def test_port_trained_down_fails(self, nd96asr):
        ib_port(nd96asr, "mlx5_ib5", rate="100 Gb/sec (4X EDR)")
        failed = [r for r in check_infiniband(nd96asr, ND96ASR) if r.status == FAIL]
        assert failed[0].subject == "mlx5_ib5/1" and "rate 100 Gb/s below HDR 200 Gb/s" in failed[0].detail

    def test_link_down_fails(self, nd96asr):
        ib_port(nd96asr, "mlx5_ib0", state="1: DOWN", phys_state="3: Disabled")
        failed = [r for r in check_infiniband(nd96asr, ND96ASR) if r.status == FAIL]
        assert "state DOWN" in failed[0].detail and "physical state Disabled" in failed[0].detail

    def test_missing_hca_fails_the_count(self, tmp_path):
        root = build_nd96asr_sysfs(tmp_path / "sys", hcas=6)
        node = check_infiniband(root, ND96ASR)[0]
        assert node.status == FAIL and "6 InfiniBand port(s), 6 healthy, Standard_ND96asr_v4 has 8" in node.detail

    def test_no_ib_tree_fails_with_a_hint(self, tmp_path):
        node = check_infiniband(tmp_path, ND96ASR)[0]
        assert node.status == FAIL and "driver not loaded" in node.detail

    def test_size_without_infiniband_is_skipped(self, tmp_path):
        (result,) = check_infiniband(tmp_path, facts("Standard_NC24s_v3"))
        assert result.status == SKIP and "has no InfiniBand" in result.detail

    def test_ports_parse(self, nd96asr):
        ports = ib_ports(nd96asr)
        assert ports[0] == {"hca": "mlx5_ib0", "port": "1", "state": "ACTIVE", "phys_state": "LinkUp",
                            "rate_gbits": 200.0, "rate_text": "200 Gb/sec (4X HDR)"}


class TestEcc:
    def test_healthy_gpus_pass(self):
        results = check_ecc(NvmlSession(FakeNvml(nd96asr_gpus(8))), 8)
        assert [r.status for r in results] == [PASS] * 8
        assert results[0].subject == "gpu0 00000001:00:00.0"

    def test_pending_remap_fails(self):
        gpus = nd96asr_gpus(2)
        gpus[1].remapped_rows = (0, 1, 1, 0)
        results = check_ecc(NvmlSession(FakeNvml(gpus)), 2)
        assert results[1].status == FAIL and "row remapping pending" in results[1].detail

    def test_remap_failure_fails(self):
        gpus = nd96asr_gpus(1)
        gpus[0].remapped_rows = (0, 512, 0, 1)
        (result,) = check_ecc(NvmlSession(FakeNvml(gpus)), 1)
        assert result.status == FAIL and "spare rows exhausted" in result.detail

    def test_volatile_and_lifetime_sram_errors_both_fail(self):
        """Azure's rule: any uncorrectable SRAM error, volatile or aggregate, fails (before, a
        lifetime one only warned)."""
        gpus = nd96asr_gpus(2)
        gpus[0].sram_uncorrectable = {fake_nvml.NVML_VOLATILE_ECC: 1, fake_nvml.NVML_AGGREGATE_ECC: 1}
        gpus[1].sram_uncorrectable = {fake_nvml.NVML_VOLATILE_ECC: 0, fake_nvml.NVML_AGGREGATE_ECC: 2}
        first, second = check_ecc(NvmlSession(FakeNvml(gpus)), 2)
        assert first.status == FAIL and "since the driver loaded" in first.detail
        assert second.status == FAIL and "2 uncorrectable SRAM error(s) in the GPU's lifetime" in second.detail

    def test_v100_retirement_table_full_fails_pending_alone_warns(self):
        """V100 has no row remapping (not supported: left out) but retires pages: Azure fails a
        full table (>= 62 pages) with a retirement pending; a pending retirement alone warns."""
        gpus = nd96asr_gpus(2)
        for gpu in gpus:
            gpu.remapped_rows, gpu.sram_supported, gpu.retirement_pending = None, False, True
        gpus[0].retired_pages, gpus[1].retired_pages = (2, 61), (0, 3)
        full, pending = check_ecc(NvmlSession(FakeNvml(gpus)), 2)
        assert full.status == FAIL and "table full: 63 retired pages" in full.detail
        assert pending.status == WARN and "page retirement pending (3 retired pages)" in pending.detail
        assert "retired_double_bit=3" in pending.detail

    def test_ecc_disabled_warns(self):
        gpus = nd96asr_gpus(1)
        gpus[0].ecc_enabled = False
        (result,) = check_ecc(NvmlSession(FakeNvml(gpus)), 1)
        assert result.status == WARN and "ECC is disabled" in result.detail

    def test_without_nvml_or_nvidia_smi_it_is_not_checked(self):
        (result,) = check_ecc(NvmlSession(None, "the NVML bindings (pip package nvidia-ml-py) are not installed"), 8)
        assert result.status == NOT_CHECKED and "nvidia-ml-py" in result.detail


class TestNodeChecks:
    def test_cpu_machine_skips_hardware_checks_too(self, tmp_path):
        """No GPU at all: not the size's hardware, so IB and ECC expectations are skipped, with why."""
        results = node_checks(ND96ASR, FakeMeasurer(gpus=0, reason="no CUDA"), NvmlSession(None, "no driver"),
                              QUICK, tmp_path, PCI_ORDER)
        assert {r.status for r in results} == {SKIP}
        assert [r.check for r in results] == ["gpu_count", "infiniband", "ecc", "xid", "throttle", "nvlink", "ibstat",
                                              "ib_link_flaps", "nvme_count", "ib_write", "nccl_tests", "numa_balancing"]
        assert all("not a Standard_ND96asr_v4" in r.detail for r in results[1:])

    def test_gpu_node_runs_everything(self, nd96asr):
        from tests.test_health_tools import recorded_tools, sample

        tools = recorded_tools(healthy=True, outputs={"ibstat mlx5_ib": (0, sample("ibstat-mlx5-infiniband-active.txt"))})
        results = node_checks(ND96ASR, FakeMeasurer(), NvmlSession(FakeNvml(nd96asr_gpus(8))), QUICK, nd96asr, PCI_ORDER,
                              tools=tools)
        counts = {name: len(by(results, name)) for name in ("gpu_count", "gemm", "h2d", "d2h", "d2d", "p2p", "infiniband", "ecc", "ibstat")}
        assert counts == {"gpu_count": 1, "gemm": 8, "h2d": 8, "d2h": 8, "d2d": 8, "p2p": 8, "infiniband": 9, "ecc": 8, "ibstat": 9}
        assert {"xid", "throttle", "nvlink", "nvme_count"} <= {r.check for r in results}
        # ib_write_bw and all_reduce_perf are not in this fake image: not checked, so the node fails.
        assert {r.check for r in results if r.status == NOT_CHECKED} == {"ib_write", "nccl_tests"}
        assert {r.status for r in results} <= {PASS, INFO, SKIP, NOT_CHECKED}

    def test_a_missing_tool_fails_the_node(self, nd96asr):
        """The missing-tool case end to end: every figure passes, ibstat is absent from the image;
        the node report's verdict is fail, and the failure names the package to install."""
        from amlhpc.jobs.runtime.health.results import NodeReport
        from tests.test_health_tools import recorded_tools

        tools = recorded_tools(healthy=True, missing=("ibstat",),
                               outputs={"ib_write_bw": (0, ""), "env NCCL_TOPO_FILE=": (0, "")})
        results = node_checks(ND96ASR, FakeMeasurer(), NvmlSession(FakeNvml(nd96asr_gpus(8))), QUICK, nd96asr, PCI_ORDER,
                              tools=tools)
        report = NodeReport("node-0", 0, ND96ASR.name, "gate", True, "2026-11-23T12:00:00Z", checks=results)
        not_checked = [c for c in report.failures() if c.status == NOT_CHECKED]
        assert report.status == FAIL and [c.check for c in not_checked][:1] == ["ibstat"]
        assert "install infiniband-diags" in not_checked[0].line() and "not checked" in not_checked[0].line()

    def test_pytorch_missing_on_a_gpu_node_is_not_checked(self, nd96asr):
        measurer = FakeMeasurer(gpus=0, reason="PyTorch is not installed")
        measurer.software_missing = True
        (result,) = gpu_checks(ND96ASR, measurer, QUICK, nd96asr, PCI_ORDER)
        assert result.status == NOT_CHECKED and "8 GPU(s) on the PCI bus, none measured" in result.detail

    def test_amd_size_skips_nvidia_checks_and_runs_rccl(self, tmp_path):
        """An MI300X node: the GPUs are AMD Instinct devices on the PCI bus (class 0x1200);
        NVIDIA's tools and the ECC rule (none in Azure's MI300X configuration) are skipped, the
        InfiniBand checks and rccl-tests' all_reduce_perf run."""
        from tests.test_health_tools import recorded_tools, sample

        mi300x = facts("Standard_ND96isr_MI300X_v5")
        for gpu in range(8):
            pci_device(tmp_path, f"{gpu + 1:04x}:00:00.0", "0x1002", "0x120000", gpu // 4, "0-47" if gpu < 4 else "48-95")
            ib_port(tmp_path, f"mlx5_ib{gpu}", rate="400 Gb/sec (4X NDR)")
        tools = recorded_tools(outputs={"ibstat mlx5_ib": (0, sample("ibstat-mlx5-infiniband-active.txt")),
                                        "mpirun": (0, sample("all_reduce_perf-summary.txt"))})
        tools.which = lambda name: f"/usr/bin/{name}"
        results = node_checks(mi300x, FakeMeasurer(), NvmlSession(None, "no NVIDIA driver"), QUICK, tmp_path, PCI_ORDER,
                              tools=tools)
        assert by(results, "gpu_count")[0].status == PASS
        for check in ("xid", "throttle", "nvlink", "ecc"):
            (result,) = by(results, check)
            assert result.status == SKIP and "AMD GPUs" in result.detail
        (nccl,) = by(results, "nccl_tests")
        assert "RCCL all_reduce_perf" in nccl.detail and nccl.threshold == mi300x.health.nccl_allreduce_busbw_gbytes_per_s_min

    def test_quick_keeps_the_published_sizes(self):
        """--quick repeats less but keeps the GEMM size the pass mark assumes."""
        assert (checks.QUICK.gemm_n, checks.QUICK.copy_bytes) == (checks.FULL.gemm_n, checks.FULL.copy_bytes)
        assert checks.QUICK.gemm_seconds < checks.FULL.gemm_seconds and checks.QUICK.copy_iters < checks.FULL.copy_iters
        shape, iters, band, _ = checks.gemm_plan(ND96ASR, checks.QUICK)
        assert shape == (1024, 10240, 5120) and band == (271.2, 261.7, 252.2)
        assert iters == int(0.3 * 271.2e12 / (2 * 1024 * 10240 * 5120))  # about 0.3 s of work at the baseline
