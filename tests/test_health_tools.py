"""The node-tool checks (amlhpc/jobs/runtime/health/tools.py) on recorded real output: nvidia-smi,
dmesg/syslog, ibstat, ib_write_bw and nccl-tests as those tools print it
(tests/fixtures/tool-output/SOURCES.toml says where each sample comes from), and Azure's own
samples (tests/reference/azurehpc-health-checks/test-data)."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from datetime import datetime
from pathlib import Path

import pytest

from amlhpc.core import skus
from amlhpc.jobs.runtime.health import tools
from amlhpc.jobs.runtime.health.grading import FAIL, INFO, NOT_CHECKED, PASS, SKIP, WARN
from amlhpc.jobs.runtime.node.skufacts import parse_sku_facts
from tests.fake_sysfs import build_nd96asr_sysfs, ib_port

OUTPUT = Path(__file__).parent / "fixtures" / "tool-output"
AZURE = Path(__file__).parent / "reference" / "azurehpc-health-checks" / "test-data"


def sample(name: str) -> str:
    return (OUTPUT / name).read_text()


def facts(name: str):
    return parse_sku_facts(json.dumps(dataclasses.asdict(skus.get(name))))


def recorded_tools(*, healthy: bool = True, outputs: dict[str, tuple[int, str]] | None = None,
                   files: dict[str, str] | None = None, missing: tuple[str, ...] = (), now: float | None = None) -> tools.Tools:
    """Tools that answer from recorded output: commands by their first words, files by path."""
    answers = {"dmesg": (0, sample("dmesg-T-xid.txt") if healthy else sample("kernel-xid-79.txt")),
               "nvidia-smi -q": (0, sample("nvidia-smi-performance-event-reasons.txt")),
               "nvidia-smi nvlink": (0, (AZURE / ("good_nvlink_status.txt" if healthy else "bad_nvlink_status.txt")).read_text()),
               "ibstat": (0, sample("ibstat-mlx5-infiniband-active.txt"))}
    answers.update(outputs or {})

    def run(command, timeout):
        text = " ".join(command)
        matching = [key for key in answers if text.startswith(key) or key in text]
        if matching:
            return answers[max(matching, key=len)]  # the most specific recorded answer
        return 127, f"{command[0]}: not found"

    return tools.Tools(run=run, read=lambda path: (files or {}).get(str(path)),
                       which=lambda name: None if name in missing or name in ("ib_write_bw", "all_reduce_perf", "ubergemm") and name not in answers
                       else f"/usr/bin/{name}", now=lambda: now or datetime(2026, 11, 23, 12).timestamp())


class TestXid:
    def test_application_xids_pass_and_are_named(self):
        (result,) = tools.check_xid(recorded_tools(healthy=True, now=datetime(2024, 8, 1, 0).timestamp()))
        assert result.status == PASS and "43, 31, 94" in result.detail.replace("31, 43", "43, 31")

    def test_xid_79_fails(self):
        (result,) = tools.check_xid(recorded_tools(healthy=False))
        assert result.status == FAIL and "Xid 79 on PCI:0000:44:00" in result.detail

    def test_journal_format_is_parsed(self):
        events = tools.parse_xids(sample("journalctl-xid-45.txt"), 0)
        assert [e.xid for e in events] == [45, 45, 45, 45] and events[0].pci == "PCI:0000:dc:00"

    def test_dmesg_times_are_read(self):
        events = tools.parse_xids(sample("dmesg-T-xid.txt"), datetime(2026, 1, 1).timestamp())
        assert events[0].when == datetime(2024, 7, 31, 23, 14, 18).timestamp()

    def test_unreadable_kernel_log_is_a_skip(self):
        (result,) = tools.check_xid(recorded_tools(outputs={"dmesg": (1, "dmesg: read kernel buffer failed: Operation not permitted")}))
        assert result.status == SKIP and "not readable" in result.detail


class TestThrottle:
    @pytest.mark.parametrize("name, bus", [("nvidia-smi-performance-event-reasons.txt", "00000000:42:00.0"),
                                           ("nvidia-smi-performance-throttle-reasons.txt", "00000000:0E:00.0")])
    def test_both_section_names_parse(self, name, bus):
        reasons = tools.parse_clock_reasons(sample(name))
        assert list(reasons) == [bus] and reasons[bus]["HW Slowdown"] is False and "SW Power Cap" in reasons[bus]

    def test_idle_is_not_a_problem(self):
        results = tools.check_throttle(recorded_tools(outputs={"nvidia-smi -q": (0, sample("nvidia-smi-performance-throttle-reasons.txt"))}))
        assert [r.status for r in results] == [PASS] and "Idle" in results[0].detail

    def test_hardware_slowdown_warns(self):
        """The recorded sample with its HW Slowdown line switched to Active (the only edit)."""
        text = sample("nvidia-smi-performance-event-reasons.txt").replace(
            "HW Slowdown                       : Not Active", "HW Slowdown                       : Active")
        results = tools.check_throttle(recorded_tools(outputs={"nvidia-smi -q": (0, text)}))
        assert [r.status for r in results] == [WARN] and "HW Slowdown" in results[0].detail

    def test_without_nvidia_smi_it_is_not_checked(self):
        """No nvidia-smi on a GPU size: not a skip (which passed silently) but not-checked."""
        (result,) = tools.check_throttle(recorded_tools(missing=("nvidia-smi",)))
        assert result.status == NOT_CHECKED and "nvidia-smi is not on PATH" in result.detail

    @pytest.mark.parametrize("name, code", [("nvidia-smi-command-not-found.txt", 127), ("nvidia-smi-no-libnvidia-ml.txt", 255)])
    def test_nvidia_smi_that_cannot_run_is_not_checked(self, name, code):
        """The recorded shell and driver-library failures: before, a skip ("gave no GPU"), so the
        node passed with its clocks unread; now not-checked, which fails the node's verdict."""
        fake = recorded_tools(outputs={"nvidia-smi -q": (code, sample(name)), "nvidia-smi nvlink": (code, sample(name))})
        for result in tools.check_throttle(fake) + tools.check_nvlink(fake, facts("Standard_ND96amsr_A100_v4")):
            assert result.status == NOT_CHECKED and "nvidia-smi cannot run here" in result.detail, result


class TestNvlink:
    def test_azures_good_sample_passes(self):
        results = tools.check_nvlink(recorded_tools(healthy=True), facts("Standard_ND96amsr_A100_v4"))
        assert [(r.subject, r.status, r.value) for r in results] == [("gpu7", PASS, 12.0)]

    def test_azures_bad_sample_fails(self):
        results = tools.check_nvlink(recorded_tools(healthy=False), facts("Standard_ND96amsr_A100_v4"))
        assert [(r.subject, r.status) for r in results] == [("gpu6", FAIL)] and "all links inactive" in results[0].detail

    def test_no_nvlink_output_on_an_nvlink_size_warns(self):
        """Azure's check passes empty output ("NVLINK is not enabled"); where the catalog says the
        size has NVLink it is worth a warning, never a failure."""
        results = tools.check_nvlink(recorded_tools(outputs={"nvidia-smi nvlink": (0, "")}), facts("Standard_ND96asr_v4"))
        assert results[0].status == WARN
        assert tools.check_nvlink(recorded_tools(outputs={"nvidia-smi nvlink": (0, "")}), facts("Standard_NC24ads_A100_v4"))[0].status == SKIP


class TestInfiniband:
    def test_ibstat_formats(self):
        down = tools.parse_ibstat(sample("ibstat-mlx4-port-down.txt"))
        assert [(p["port"], p["state"], p["phys_state"]) for p in down] == [("1", "DOWN", "Disabled"), ("2", "ACTIVE", "LinkUp")]
        eth = tools.parse_ibstat(sample("ibstat-mlx5-ethernet.txt"))
        assert {p["link_layer"] for p in eth} == {"Ethernet"} and eth[0]["rate_gbits"] == 200

    def test_bare_ibstat_crash_on_mlx5_an0_no_longer_fails_a_healthy_node(self, tmp_path):
        """An ND A100 v4 whose eight HDR ports are Active, and whose bare `ibstat` panics on the
        Ethernet RDMA device mlx5_an0 (the recorded Azure/azhpc-images#213 output). Before, the
        check ran bare `ibstat` and failed the node on that crash; now it asks ibstat about each
        InfiniBand device sysfs lists and never about mlx5_an0."""
        root = build_nd96asr_sysfs(tmp_path / "sys")
        seen = []
        fake = recorded_tools(outputs={"ibstat": (255, sample("ibstat-ibpanic-mlx5_an0.txt")),
                                       "ibstat mlx5_ib": (0, sample("ibstat-mlx5-infiniband-active.txt"))})
        original = fake.run
        fake.run = lambda command, timeout: seen.append(command) or original(command, timeout)
        results = tools.check_ibstat(fake, facts("Standard_ND96amsr_A100_v4"), root)
        assert seen == [["ibstat", f"mlx5_ib{i}"] for i in range(8)]
        assert results[0].status == PASS and results[0].value == 8 and "mlx5_an0 left out" in results[0].detail
        assert [(r.subject, r.status) for r in results[1:]] == [(f"mlx5_ib{i}/1", PASS) for i in range(8)]

    def test_a_port_still_initializing_fails(self, tmp_path):
        """`ibstat mlx5_ib0` as recorded on an Azure VM (Azure/azhpc-diagnostics#59): port
        Initializing, i.e. no subnet manager configuration yet."""
        root = build_nd96asr_sysfs(tmp_path / "sys")
        fake = recorded_tools(outputs={"ibstat mlx5_ib": (0, sample("ibstat-mlx5-infiniband-active.txt")),
                                       "ibstat mlx5_ib0": (0, sample("ibstat-mlx5_ib0-initializing.txt"))})
        results = tools.check_ibstat(fake, facts("Standard_ND96asr_v4"), root)
        failed = [r for r in results if r.status == FAIL]
        assert [r.subject for r in failed] == ["mlx5_ib0/1"] and "state INITIALIZING" in failed[0].detail

    def test_without_sysfs_ibstat_lists_the_devices(self, tmp_path):
        """No /sys/class/infiniband in the container: `ibstat -l` names the devices; one that
        ibstat cannot open is reported, not counted, and the count then falls short."""
        fake = recorded_tools(outputs={"ibstat -l": (0, "mlx5_an0\nmlx5_ib0\n"),
                                       "ibstat mlx5_an0": (255, sample("ibstat-ibpanic-mlx5_an0.txt")),
                                       "ibstat mlx5_ib0": (0, sample("ibstat-mlx5-infiniband-active.txt"))})
        results = tools.check_ibstat(fake, facts("Standard_ND96asr_v4"), tmp_path)
        assert results[0].status == FAIL and "1 InfiniBand port(s)" in results[0].detail and "ibstat -l" in results[0].detail
        assert [(r.subject, r.status) for r in results[1:]] == [("mlx5_an0", INFO), ("mlx5_ib0/1", PASS)]

    def test_ethernet_rdma_ports_are_not_counted(self, tmp_path):
        ib_port(tmp_path, "mlx5_0")
        results = tools.check_ibstat(recorded_tools(outputs={"ibstat": (0, sample("ibstat-mlx5-ethernet.txt"))}),
                                     facts("Standard_ND96isr_H100_v5"), tmp_path)
        assert results[0].status == FAIL and "0 InfiniBand port(s)" in results[0].detail

    def test_missing_ibstat_is_not_checked(self, tmp_path):
        """ibstat absent on an InfiniBand size: before, a skip; now not-checked."""
        (result,) = tools.check_ibstat(recorded_tools(missing=("ibstat",)), facts("Standard_ND96asr_v4"), tmp_path)
        assert result.status == NOT_CHECKED and "infiniband-diags" in result.detail

    def test_azures_flap_samples(self, tmp_path):
        now = datetime(2026, 8, 17, 12).timestamp()
        assert tools.count_link_flaps((AZURE / "1dev_6flap_syslog").read_text(), now) == {"ib6": 6}
        assert tools.count_link_flaps((AZURE / "0flap_syslog").read_text(), now) == {}
        sku = facts("Standard_ND96asr_v4")
        flapping = recorded_tools(files={"/var/log/syslog": (AZURE / "1dev_6flap_syslog").read_text()}, now=now)
        results = tools.check_link_flaps(flapping, sku, tmp_path)
        assert [(r.check, r.status) for r in results] == [("ib_link_flaps", FAIL)] and "ib6 (6 lost carrier)" in results[0].detail
        old = recorded_tools(files={"/var/log/syslog": (AZURE / "1dev_6flap_syslog").read_text()}, now=now + 3 * 86400)
        assert tools.check_link_flaps(old, sku, tmp_path)[0].status == PASS  # outside the 24 h window

    def test_link_downed_counter_warns(self, tmp_path):
        port = ib_port(tmp_path, "mlx5_ib0")
        (port / "counters").mkdir()
        (port / "counters" / "link_downed").write_text("3\n")
        results = tools.check_link_flaps(recorded_tools(), facts("Standard_ND96asr_v4"), tmp_path)
        assert (results[0].check, results[0].status) == ("ib_link_downed", WARN) and "mlx5_ib0:1 x3" in results[0].detail
        assert results[1].status == SKIP  # no syslog in the container

    def test_ib_write_bw_report(self):
        gbits, line = tools.parse_ib_write_bw(sample("ib_write_bw-report-gbits.txt"))
        assert gbits == pytest.approx(0.48) and line.startswith("8 ")

    def test_ib_write_graded_per_hca(self, tmp_path):
        for hca in range(8):
            ib_port(tmp_path, f"mlx5_ib{hca}")
        report = sample("ib_write_bw-report-gbits.txt")
        fake = recorded_tools(outputs={"ib_write_bw": (0, report)})
        fake.which = lambda name: f"/usr/bin/{name}"
        results = tools.check_ib_write(fake, facts("Standard_ND96asr_v4"), tmp_path)
        assert len(results) == 8 and {r.status for r in results} == {FAIL} and results[0].threshold == 180.0
        assert "GPUDirect RDMA" in results[0].detail
        missing = tools.check_ib_write(recorded_tools(), facts("Standard_ND96asr_v4"), tmp_path)[0]
        assert missing.status == NOT_CHECKED and "perftest" in missing.detail


class TestNvmeAndNcclTests:
    def test_nvme_count_against_azures_figure(self, tmp_path):
        for n in range(7):
            (tmp_path / "block" / f"nvme{n}n1").mkdir(parents=True)
        (tmp_path / "block" / "sda").mkdir()
        (result,) = tools.check_nvme(tmp_path, facts("Standard_ND96isr_H100_v5"))
        assert result.status == FAIL and result.value == 7 and result.threshold == 8
        assert tools.check_nvme(tmp_path, facts("Standard_ND96asr_v4"))[0].status == INFO

    def test_nccl_tests_summary(self):
        busbw, correct = tools.parse_nccl_tests(sample("all_reduce_perf-summary.txt"))
        assert busbw == pytest.approx(92.3405) and correct

    def test_nccl_tests_run_without_topology_file(self):
        seen = []
        fake = recorded_tools(outputs={"mpirun": (0, sample("all_reduce_perf-summary.txt"))})
        fake.which = lambda name: f"/usr/bin/{name}"
        original = fake.run
        fake.run = lambda command, timeout: seen.append(command) or original(command, timeout)
        (result,) = tools.check_nccl_tests(fake, facts("Standard_ND96isr_H100_v5"), 8)
        assert "NCCL_TOPO_FILE=" in seen[0] and str(16 << 30) in seen[0]
        assert result.status == FAIL and result.threshold == 460.0  # 92 GB/s is far below the H100 pass mark


def test_every_fixture_names_its_source():
    sources = tomllib.loads((OUTPUT / "SOURCES.toml").read_text())
    for path in OUTPUT.iterdir():
        if path.name != "SOURCES.toml":
            assert sources[path.name]["url"].startswith("https://github.com/") and sources[path.name]["date"], path.name


class TestNvlinkFabric:
    """GB200/GB300: Azure's verify_nvlink_setup rules on the Fabric block of nvidia-smi -q."""

    GB200 = facts("Standard_ND128isr_NDR_GB200_v6")

    def test_a_fabric_that_did_not_register_fails(self):
        """Azure's recorded failure (Azure/azhpc-images#506): Completed, but Insufficient
        Resources, clique 0 and a zero ClusterUUID, which a check for "N/A" passed."""
        fake = recorded_tools(outputs={"nvidia-smi -q": (0, sample("nvidia-smi-q-fabric-insufficient-resources.txt"))})
        node, gpu = tools.check_nvlink_fabric(fake, self.GB200)
        assert gpu.status == FAIL and "Status 'Insufficient Resources'" in gpu.detail and "CliqueId '0'" in gpu.detail
        assert "ClusterUUID '00000000-0000-0000-0000-000000000000'" in gpu.detail
        assert node.status == FAIL and "0 NVLink domains" in node.detail

    def test_a_registered_fabric_passes_and_names_its_domain_an_unhealthy_summary_warns(self):
        fake = recorded_tools(outputs={"nvidia-smi -q": (0, sample("nvidia-smi-q-fabric-health-unhealthy.txt"))})
        node, gpu = tools.check_nvlink_fabric(fake, self.GB200)
        assert node.status == PASS and node.detail == tools.DOMAIN_PREFIX + "dc6e40c4-d722-4357-9ba6-5291dd461278"
        assert gpu.status == WARN and "health summary Unhealthy" in gpu.detail

    def test_only_sizes_with_an_nvlink_domain_are_asked(self):
        assert tools.check_nvlink_fabric(recorded_tools(), facts("Standard_ND96isr_H100_v5")) == []
        (result,) = tools.check_nvlink_fabric(recorded_tools(missing=("nvidia-smi",)), self.GB200)
        assert result.status == NOT_CHECKED

    def test_a_job_spread_over_two_racks_warns_once(self):
        from amlhpc.jobs.runtime.health.fleet import apply_fleet
        from amlhpc.jobs.runtime.health.results import CheckResult, NodeReport
        from amlhpc.jobs.runtime.health.summary import job_checks

        def node(n, uuid):
            check = CheckResult("nvlink_fabric", "node", PASS, 4.0, "GPUs", detail=tools.DOMAIN_PREFIX + uuid)
            return NodeReport(f"gb-{n}", n, self.GB200.name, "gate", False, "2026-11-23T12:00:00Z", checks=[check])

        reports = [node(n, "rack-a") for n in range(18)] + [node(18, "rack-b"), node(19, "rack-b")]
        apply_fleet(reports)
        (spread,) = job_checks(reports)
        assert spread.check == "fleet:nvlink_domain" and spread.status == WARN
        assert "spans 2 NVLink domains (rack-a: 18 node(s); rack-b: 2 node(s))" in spread.detail
        same = [node(n, "rack-a") for n in range(18)]
        apply_fleet(same)
        assert job_checks(same) == [] and all(r.status == PASS for r in same)
