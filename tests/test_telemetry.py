"""Node telemetry: GPU readings through a fake NVML (tests/fake_nvml.py), InfiniBand counters
from a fake sysfs (tests/fake_sysfs.py), XIDs and throttle reasons as the recorded tool output
shows them, the host from a fake /proc; on this CPU machine, GPU figures are absent, not made up."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.health.tools import CRITICAL_XIDS, parse_clock_reasons, parse_xids
from amlhpc.jobs.runtime.node import telemetry
from tests import fake_nvml
from tests.fake_nvml import FakeNvml, nd96asr_gpus
from tests.fake_sysfs import ib_port
from tests.test_launch import REPO, base_env, finish, start

TOOL_OUTPUT = Path(__file__).parent / "fixtures" / "tool-output"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def write_proc(root: Path, busy: int, idle: int, available_kib: int = 20 << 20) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")
    (root / "loadavg").write_text("1.50 1.20 0.90 3/400 12345\n")
    (root / "meminfo").write_text(f"MemTotal:       {24 << 20} kB\nMemFree:  1 kB\nMemAvailable:   {available_kib} kB\n")
    return root


def write_counters(sysfs: Path, hca: str, **values: int) -> None:
    folder = sysfs / "class" / "infiniband" / hca / "ports" / "1" / "counters"
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in values.items():
        (folder / name).write_text(f"{value}\n")


@pytest.fixture
def node(tmp_path):
    """A fake ND96asr_v4 node: 8 GPUs in NVML, two HDR ports with counters, a /proc."""
    sysfs = tmp_path / "sys"
    for hca in ("mlx5_ib0", "mlx5_ib1"):
        ib_port(sysfs, hca)
        write_counters(sysfs, hca, port_xmit_data=1000, port_rcv_data=2000, symbol_error=0, link_downed=1)
    proc = write_proc(tmp_path / "proc", busy=1000, idle=9000)
    lib = FakeNvml(nd96asr_gpus(8))
    clock = Clock()
    sampler = telemetry.Sampler(0, tmp_path / "reports", 10.0, sysfs=sysfs, proc=proc, nvml_module=lib, clock=clock)
    return sampler, lib, sysfs, proc, clock


def recorded_xids(name: str) -> list[int]:
    return [event.xid for event in parse_xids((TOOL_OUTPUT / name).read_text(), now=0.0)]


class TestSample:
    def test_gpu_readings_in_their_units(self, node):
        sampler, lib, *_ = node
        lib.gpus[3].event_reasons = 0x4 | 0x40  # SW power cap + HW thermal slowdown
        gpus = sampler.sample()["gpus"]
        assert len(gpus) == 8 and gpus[0]["bus_id"] == "00000001:00:00.0"
        assert (gpus[0]["util_percent"], gpus[0]["memory_util_percent"], gpus[0]["power_w"], gpus[0]["power_limit_w"]) == (97, 41, 350.0, 400.0)
        assert (gpus[0]["memory_used_mib"], gpus[0]["memory_total_mib"]) == (30 * 1024, 40 * 1024)
        assert (gpus[0]["temperature_c"], gpus[0]["sm_clock_mhz"], gpus[0]["memory_clock_mhz"]) == (62, 1410, 1215)
        assert gpus[3]["throttle_reasons"] == ["SW Power Cap", "HW Thermal Slowdown"] and gpus[0]["throttle_reasons"] == []

    def test_a_reading_nvml_refuses_is_left_out(self, node):
        sampler, lib, *_ = node
        lib.gpus[1].unsupported = ("nvmlDeviceGetPowerUsage",)
        gpu = sampler.sample()["gpus"][1]
        assert "power_w" not in gpu and gpu["unavailable"] == ["Not Supported"] and gpu["temperature_c"] == 62

    def test_reason_names_are_nvidia_smis(self):
        """The names we give the NVML bits are the ones nvidia-smi prints (recorded output, both eras)."""
        printed = set()
        for name in ("nvidia-smi-performance-event-reasons.txt", "nvidia-smi-performance-throttle-reasons.txt"):
            for reasons in parse_clock_reasons((TOOL_OUTPUT / name).read_text()).values():
                printed |= set(reasons)
        assert {name for _, name in telemetry.EVENT_REASONS} <= printed, printed

    def test_xid_events_from_the_recorded_kernel_logs(self, node):
        """XIDs as the recorded logs show them (43, 31, 94 contained; 79 fell off the bus) arrive
        through NVML's event set; each is reported once, on its GPU, 79 as critical (Azure's list)."""
        sampler, lib, *_ = node
        lib.gpus[2].pending_xids = recorded_xids("dmesg-T-xid.txt")
        lib.gpus[5].pending_xids = recorded_xids("kernel-xid-79.txt")
        events = sampler.sample()["xid_events"]
        assert [(e["gpu"], e["xid"], e["critical"]) for e in events] == [
            (2, 43, False), (2, 43, False), (2, 31, False), (2, 94, False), (5, 79, True)]
        assert 79 in CRITICAL_XIDS and sampler.sample()["xid_events"] == []

    def test_infiniband_rates_and_error_growth(self, node):
        sampler, _, sysfs, proc, clock = node
        first = sampler.sample()["ib"]
        assert first["mlx5_ib0:1"] == {"state": "ACTIVE", "rate_gbits": 200.0, "link_layer": "InfiniBand"}
        clock.now += 10
        # 1.25e9 words of 4 bytes in 10 s: 4 Gb/s out; 2.5e9: 8 Gb/s in
        write_counters(sysfs, "mlx5_ib0", port_xmit_data=1000 + 1_250_000_000, port_rcv_data=2000 + 2_500_000_000,
                       symbol_error=3, link_downed=2)
        write_proc(proc, busy=1000 + 300, idle=9000 + 700)
        second = sampler.sample()
        port = second["ib"]["mlx5_ib0:1"]
        assert port["xmit_gbits_per_s"] == pytest.approx(4.0) and port["rcv_gbits_per_s"] == pytest.approx(8.0)
        assert port["errors_grown"] == {"symbol_error": 3, "link_downed": 1}
        assert "errors_grown" not in second["ib"]["mlx5_ib1:1"]
        assert second["host"]["cpu_busy_pct"] == pytest.approx(30.0) and second["host"]["load_1m"] == 1.5

    def test_record_file_summary_and_metrics(self, node, tmp_path):
        sampler, lib, sysfs, _, clock = node

        class Mlflow:
            calls: list = []

            def log_metrics(self, metrics, step):
                self.calls.append((step, metrics))

        sampler.mlflow = Mlflow()
        lib.gpus[0].temperature_c = 81
        lib.gpus[6].event_reasons = 0x8
        sampler.sample()
        clock.now += 10
        write_counters(sysfs, "mlx5_ib1", symbol_error=5)
        lib.gpus[4].pending_xids = [79]
        sampler.sample()
        lines = [json.loads(line) for line in (tmp_path / "reports" / "telemetry-node000.jsonl").read_text().splitlines()]
        assert len(lines) == 2 and lines[1]["xid_events"][0]["xid"] == 79
        summary = sampler.summary
        assert (summary.samples, summary.gpus, summary.ib_ports, summary.max_temperature_c) == (2, 8, 2, 81)
        assert summary.throttle_reasons_seen == ["HW Slowdown"] and summary.ib_errors == {"mlx5_ib1:1 symbol_error": 5}
        step, metrics = Mlflow.calls[1]
        assert step == 2 and set(metrics) <= set(telemetry.RUN_METRICS)
        assert metrics["telemetry/gpu_temperature_max_c"] == 81.0 and metrics["telemetry/gpus_throttled"] == 1.0
        assert metrics["telemetry/gpu_util_mean_pct"] == 97.0 and metrics["telemetry/gpu_sm_clock_min_mhz"] == 1410.0
        assert metrics["telemetry/xid_events"] == 1.0 and metrics["telemetry/ib_errors_grown"] == 5.0
        written = json.loads((tmp_path / "reports" / "telemetry-node000.summary.json").read_text())
        assert written["samples"] == 2 and written["max_temperature_c"] == 81
        assert written["ib_errors"] == {"mlx5_ib1:1 symbol_error": 5}

    def test_only_the_first_node_logs_metrics(self, node, tmp_path):
        """Other nodes write their files and log nothing: the run's metric count does not grow with N."""
        sampler, lib, sysfs, proc, clock = node

        class Mlflow:
            calls: list = []

            def log_metrics(self, metrics, step):
                self.calls.append(metrics)

        other = telemetry.Sampler(7, tmp_path / "reports", 10.0, sysfs=sysfs, proc=proc, nvml_module=lib, clock=clock,
                                  mlflow=Mlflow())
        other.sample()
        assert Mlflow.calls == [] and (tmp_path / "reports" / "telemetry-node007.summary.json").is_file()
        assert telemetry.logged_values(24, 30.0) == len(telemetry.RUN_METRICS) * (2880 + 2)
        assert telemetry.logged_values(24, 0) == 0

    def test_the_report_reads_the_record_file(self, node, tmp_path):
        """`jobs report` (amlhpc/jobs/report/records.py) finds every GPU's utilisation and memory in it."""
        from amlhpc.jobs.report import records

        sampler, _, _, _, clock = node
        sampler.sample()
        clock.now += 10
        sampler.sample()
        found = records.read(tmp_path / "reports")
        assert len(found.gpu_util) == 8 and found.gpu_util["node 0 gpu 0"].points == [(0.0, 97.0), (10.0, 97.0)]
        assert found.gpu_memory["node 0 gpu 0"].points[0] == (0.0, 30.0)  # GiB

    def test_a_failing_mlflow_is_dropped_the_file_goes_on(self, node, tmp_path):
        sampler, *_ = node

        class Broken:
            def log_metrics(self, metrics, step):
                raise ConnectionError("tracking server unreachable")

        sampler.mlflow = Broken()
        sampler.sample()
        sampler.sample()
        assert sampler.mlflow is None
        assert len((tmp_path / "reports" / "telemetry-node000.jsonl").read_text().splitlines()) == 2

    def test_start_and_stop_sample_at_both_ends(self, node):
        """The thread waits a whole interval between samples: start and stop take one each."""
        sampler, lib, *_ = node
        sampler.interval_s = 3600
        summary = sampler.start().stop()
        assert summary["samples"] == 2 and summary["gpu_absent"] is None and summary["xids_watched"]


class TestWithoutGpus:
    def test_cpu_machine_records_host_and_says_gpus_are_absent(self, tmp_path):
        """This machine: no NVIDIA driver. Nothing GPU-shaped is recorded, and the reason is."""
        sampler = telemetry.Sampler(1, tmp_path, 10.0, sysfs=tmp_path / "empty-sys")
        record = sampler.sample()
        assert set(record["gpus"]) == {"absent"} and record["gpus"]["absent"]
        assert record["ib"] == {} and "memory_available_gib" in record["host"] and "load_1m" in record["host"]
        assert not any("/gpu" in name for name in telemetry.metrics_of(record))
        assert sampler.stop()["gpu_absent"] == record["gpus"]["absent"]

    def test_nvml_without_driver(self, tmp_path):
        lib = FakeNvml([], init_error=fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED)
        sampler = telemetry.Sampler(0, tmp_path, 10.0, sysfs=tmp_path, nvml_module=lib)
        assert "Driver Not Loaded" in sampler.sample()["gpus"]["absent"]


class TestSettings:
    def test_interval(self, caplog):
        assert telemetry.interval_from_env({}) == telemetry.DEFAULT_INTERVAL_S
        assert telemetry.interval_from_env({contract.TELEMETRY_INTERVAL_S: "5"}) == 5.0
        assert telemetry.interval_from_env({contract.TELEMETRY_INTERVAL_S: "0"}) == 0.0
        assert telemetry.interval_from_env({contract.TELEMETRY_INTERVAL_S: "soon"}) == telemetry.DEFAULT_INTERVAL_S
        assert "AMLHPC_TELEMETRY_INTERVAL_S='soon' is not a number" in caplog.text

    def test_event_constants_are_the_real_bindings(self):
        pynvml = pytest.importorskip("pynvml")
        for name in fake_nvml.EVENT_CONSTANTS:
            assert getattr(pynvml, name) == getattr(fake_nvml, name), name


class TestLauncher:
    def test_every_launch_records_telemetry(self, tmp_path):
        """A command under the launcher: its report carries the node's telemetry summary and the
        samples are in the report folder; on this CPU machine GPUs are absent, with the reason."""
        script = tmp_path / "train.py"
        script.write_text("from amlhpc.jobs.runtime.base import progress\nprogress.report(1)\nprogress.report(2)\n")
        env = base_env(tmp_path, PYTHONPATH=str(REPO), **{contract.TELEMETRY_INTERVAL_S: "3600"})
        code, out = finish(start(env, "--", sys.executable, str(script)))
        assert code == 0, out
        report = json.loads((tmp_path / "reports" / "launch-node000.json").read_text())
        assert report["telemetry"]["samples"] == 2 and report["telemetry"]["gpu_absent"]
        samples = [json.loads(line) for line in (tmp_path / "reports" / "telemetry-node000.jsonl").read_text().splitlines()]
        assert samples[-1]["step"] == 2 and samples[-1]["host"]["memory_used_gib"] > 0

    def test_interval_zero_turns_it_off(self, tmp_path):
        env = base_env(tmp_path, **{contract.TELEMETRY_INTERVAL_S: "0"})
        code, out = finish(start(env, "--", sys.executable, "-c", "pass"))
        assert code == 0, out
        assert json.loads((tmp_path / "reports" / "launch-node000.json").read_text())["telemetry"] is None
        assert not (tmp_path / "reports" / "telemetry-node000.jsonl").exists()
