"""The node-tool checks held against the way Azure's own checks run: the reference
copies of Azure/azurehpc-health-checks customTests (tests/reference/azurehpc-health-checks) are
read here, so a command line or a rule that drifts from Azure's fails a test.

- NVLink (azure_gpu_nvlink.nhc): empty output and a GPU listing no link pass; only inactive links fail;
- XIDs (azure_gpu_xid.nhc): counted within the whole hours of Azure's time window;
- all-reduce tests (azure_nccl_allreduce.nhc, azure_rccl_allreduce.nhc): one rank per GPU under
  mpirun with Azure's MPI arguments and environment;
- ib_write_bw (azure_ib_write_bw_gdr.nhc, _non_gdr.nhc): Azure's flags, bound with numactl to the
  HCA's NUMA node;
- kernel.numa_balancing: a warning on AMD sizes (AMD's MI300X workload optimization guide)."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from datetime import datetime
from pathlib import Path

import pytest

from amlhpc.core import skus
from amlhpc.jobs.runtime.health import tools
from amlhpc.jobs.runtime.health.grading import FAIL, INFO, NOT_CHECKED, PASS, SKIP, WARN
from amlhpc.jobs.runtime.node.skufacts import parse_sku_facts
from amlhpc.jobs.runtime.node.xids import XID_WINDOW_HOURS
from tests.fake_sysfs import build_nd96asr_sysfs, ib_port

AZURE = Path(__file__).parent / "reference" / "azurehpc-health-checks" / "customTests"
OUTPUT = Path(__file__).parent / "fixtures" / "tool-output"
NOW = datetime(2026, 11, 23, 12).timestamp()


def facts(name: str):
    return parse_sku_facts(json.dumps(dataclasses.asdict(skus.get(name))))


def azure(name: str) -> str:
    return (AZURE / name).read_text()


def azure_assignment(name: str, variable: str) -> list[str]:
    """The words of `VARIABLE="..."` in one of Azure's check scripts."""
    match = re.search(rf'^\s*{variable}="([^"]*)"', azure(name), flags=re.M)
    assert match, f"{variable} not in {name}"
    return match.group(1).split()


class Recorded:
    """Tools answering from recorded output; every command line it is asked to run is kept."""

    def __init__(self, outputs: dict[str, tuple[int, str]], files: dict[str, str] | None = None,
                 have: tuple[str, ...] = ("nvidia-smi", "ib_write_bw", "all_reduce_perf", "mpirun", "numactl")):
        self.outputs, self.files, self.have, self.commands = outputs, files or {}, have, []

    def tools(self) -> tools.Tools:
        def run(command, timeout):
            self.commands.append(list(command))
            text = " ".join(command)
            matching = [key for key in self.outputs if key in text]
            return self.outputs[max(matching, key=len)] if matching else (127, f"{command[0]}: not found")

        return tools.Tools(run=run, read=lambda path: self.files.get(str(path)),
                           which=lambda name: f"/usr/bin/{name}" if name in self.have else None, now=lambda: NOW)


class TestNvlinkAsAzureChecksIt:
    """azure_gpu_nvlink.nhc: `NVLINK is not enabled` (empty output) passes; a GPU fails only for
    inactive links. NC40ads_H100_v5 (one H100 NVL, no NVLink) runs the check in Azure's conf."""

    def test_azures_rule_is_what_the_reference_copy_says(self):
        text = azure("azure_gpu_nvlink.nhc")
        assert "NVLINK is not enabled" in text and "inactive" in text

    def test_empty_output_passes_on_a_size_without_nvlink(self):
        nc40 = facts("Standard_NC40ads_H100_v5")
        assert not nc40.nvlink and nc40.health.nvlink_check  # Azure's conf runs the check on it
        (result,) = tools.check_nvlink(Recorded({"nvidia-smi nvlink": (0, "")}).tools(), nc40)
        assert result.status == PASS and "as Azure's check_nvlink_status" in result.detail

    def test_a_gpu_line_without_links_passes_on_a_size_without_nvlink(self):
        text = "GPU 0: NVIDIA H100 NVL (UUID: GPU-5b7a1c0e-3d2f-4e8b-9a61-0c2d4e6f8a10)\n"
        (result,) = tools.check_nvlink(Recorded({"nvidia-smi nvlink": (0, text)}).tools(), facts("Standard_NC40ads_H100_v5"))
        assert result.status == PASS and "no NVLink on Standard_NC40ads_H100_v5" in result.detail

    def test_a_gpu_line_without_links_only_warns_on_an_nvlink_size(self):
        text = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"
        (result,) = tools.check_nvlink(Recorded({"nvidia-smi nvlink": (0, text)}).tools(), facts("Standard_ND96isr_H100_v5"))
        assert result.status == WARN

    def test_an_inactive_link_still_fails(self):
        text = "GPU 3: NVIDIA H100 80GB HBM3 (UUID: GPU-3)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n"
        (result,) = tools.check_nvlink(Recorded({"nvidia-smi nvlink": (0, text)}).tools(), facts("Standard_ND96isr_H100_v5"))
        assert (result.subject, result.status) == ("gpu3", FAIL) and "link(s) 1 inactive" in result.detail


class TestXidWindow:
    """azure_gpu_xid.nhc counts an XID while (now - then) / 3600 in whole hours is at most its
    time_threshold (2 by default): an old XID no longer fails the node until its next reboot."""

    def test_window_is_azures_default(self):
        text = azure("azure_gpu_xid.nhc")
        default = re.search(r"time_threshold=(\d+)", text)
        assert default and int(default.group(1)) == XID_WINDOW_HOURS
        assert "(( (current_ts - log_date) / 3600 ))" in text and '-le $time_threshold' in text

    @staticmethod
    def _dmesg(age_s: float, uptime_s: float = 200_000.0) -> tools.Tools:
        at = uptime_s - age_s
        line = f"[{at:12.6f}] NVRM: Xid (PCI:0000:44:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
        return Recorded({"dmesg": (0, line)}, files={"/proc/uptime": f"{uptime_s:.2f} 1599000.00\n"}).tools()

    @pytest.mark.parametrize(("age_s", "status"), [(60.0, FAIL), (3 * 3600 - 1.0, FAIL), (3 * 3600 + 1.0, PASS),
                                                    (30 * 3600.0, PASS)])
    def test_dmesg_xids_dated_from_the_boot(self, age_s, status):
        (result,) = tools.check_xid(self._dmesg(age_s))
        assert result.status == status, result.detail
        if status == PASS:
            assert "older critical XID(s) 79 outside the window" in result.detail

    def test_syslog_xids_outside_the_window_pass(self):
        old = datetime.fromtimestamp(NOW - 4 * 3600).strftime("%b %e %H:%M:%S")
        recent = datetime.fromtimestamp(NOW - 1800).strftime("%b %e %H:%M:%S")
        line = " node-1 kernel: NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.\n"
        broken_dmesg = {"dmesg": (1, "dmesg: read kernel buffer failed: Operation not permitted")}
        (result,) = tools.check_xid(Recorded(broken_dmesg, files={"/var/log/syslog": old + line}).tools())
        assert result.status == PASS
        (result,) = tools.check_xid(Recorded(broken_dmesg, files={"/var/log/syslog": recent + line}).tools())
        assert result.status == FAIL

    def test_an_undated_xid_still_fails(self):
        """No /proc/uptime: the time of a dmesg line is unknown, and it counts."""
        line = "[  100.000000] NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.\n"
        (result,) = tools.check_xid(Recorded({"dmesg": (0, line)}).tools())
        assert result.status == FAIL


class TestAllReduceOneRankPerGpu:
    """Azure runs all_reduce_perf with `mpirun $MPI_ARGS $ENVIRON_VARS <binary> $NCCL_ARGS`."""

    @staticmethod
    def _azure(script: str, args_variable: str, gpus: int, size: int) -> tuple[list[str], dict[str, str], list[str]]:
        """(MPI arguments, exported environment, the binary's arguments) of Azure's script."""
        mpi = [w.replace("$gpu_count", str(gpus)) for w in azure_assignment(script, "MPI_ARGS")]
        words = azure_assignment(script, "ENVIRON_VARS")
        env = dict(v.split("=", 1) for v in words[1::2] if not v.startswith("LD_LIBRARY_PATH"))
        binary = [w.replace("$MESSAGE_SIZE", str(size)) for w in azure_assignment(script, args_variable)]
        return mpi, env, binary

    @staticmethod
    def _ours(command: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
        at = next(i for i, w in enumerate(command) if w.endswith("all_reduce_perf"))
        head, binary = command[1:at], command[at + 1:]
        env = {}
        mpi = []
        i = 0
        while i < len(head):
            if head[i] == "-x":
                if "=" in head[i + 1]:
                    name, value = head[i + 1].split("=", 1)
                    env[name] = value
                i += 2
                continue
            mpi.append(head[i])
            i += 1
        return mpi, env, binary

    @staticmethod
    def _normalise(mpi: list[str]) -> list[str]:
        return ["--bind-to" if w == "-bind-to" else w for w in mpi]

    def test_nccl_command_is_azures(self):
        sku = facts("Standard_ND96isr_H100_v5")
        size = sku.health.nccl_allreduce_message_bytes
        mpi, env, binary = self._ours(tools.nccl_test_command("/opt/aml-hpc/tools/bin/all_reduce_perf", sku, 8))
        a_mpi, a_env, a_binary = self._azure("azure_nccl_allreduce.nhc", "NCCL_ARGS", 8, size)
        assert self._normalise(mpi) == self._normalise(a_mpi)
        assert env == a_env and env["NCCL_TOPO_FILE"] == ""
        assert binary == a_binary and binary[binary.index("-g") + 1] == "1"

    def test_rccl_command_is_azures_with_the_variable_reaching_the_ranks(self):
        """Azure writes `-x HSA_NO_SCRATCH_RECLAIM=1` among rccl-tests' own arguments, where -x is
        rccl-tests' --cta_policy; here the variable goes to every rank as mpirun's -x."""
        sku = facts("Standard_ND96isr_MI300X_v5")
        size = sku.health.nccl_allreduce_message_bytes
        mpi, env, binary = self._ours(tools.nccl_test_command("/opt/aml-hpc/tools/bin/all_reduce_perf", sku, 8))
        a_mpi, a_env, a_binary = self._azure("azure_rccl_allreduce.nhc", "RCCL_ARGS", 8, size)
        assert a_binary[:2] == ["-x", "HSA_NO_SCRATCH_RECLAIM=1"]
        assert self._normalise(mpi) == self._normalise(a_mpi)
        assert env == {**a_env, "HSA_NO_SCRATCH_RECLAIM": "1"} and "NCCL_TOPO_FILE" not in env
        assert binary == a_binary[2:]

    def test_the_check_runs_it_and_grades_the_summary(self):
        recorded = Recorded({"mpirun": (0, (OUTPUT / "all_reduce_perf-summary.txt").read_text())})
        (result,) = tools.check_nccl_tests(recorded.tools(), facts("Standard_ND96isr_H100_v5"), 8)
        assert recorded.commands[0][:3] == ["mpirun", "-np", "8"] and "one per GPU" in result.detail

    def test_a_binary_built_without_mpi_is_not_checked(self):
        """Under mpirun a non-MPI build runs 8 one-rank tests, each printing `# Rank 0`: not an all-reduce."""
        one = "#  Rank  0 Group  0 Pid  12345 on  node-1 device  0 [0x01] NVIDIA H100 80GB HBM3\n"
        text = one * 8 + (OUTPUT / "all_reduce_perf-summary.txt").read_text()
        (result,) = tools.check_nccl_tests(Recorded({"mpirun": (0, text)}).tools(), facts("Standard_ND96isr_H100_v5"), 8)
        assert result.status == NOT_CHECKED and "built without MPI" in result.detail

    def test_without_mpirun_it_is_not_checked(self):
        recorded = Recorded({}, have=("all_reduce_perf",))
        (result,) = tools.check_nccl_tests(recorded.tools(), facts("Standard_ND96isr_H100_v5"), 8)
        assert result.status == NOT_CHECKED and "mpirun" in result.detail and not recorded.commands


class TestIbWriteBwAsAzureRunsIt:
    def test_gpudirect_flags_and_numa_binding_are_azures(self, tmp_path):
        """azure_ib_write_bw_gdr.nhc: `numactl -N n -m n ib_write_bw -p PORT -s 8388608 -x 0 -F
        --report_gbits --perform_warm_up --use_cuda=i -d HCA`, n the HCA's NUMA node."""
        build_nd96asr_sysfs(tmp_path)
        sku = facts("Standard_ND96asr_v4")
        runs = tools.ib_write_runs(Recorded({}).tools(), sku, tmp_path)
        assert len(runs) == 8
        azure_args = [w.replace("$PORTARG", "{port}").replace("$MESSAGE_SIZE", "8388608")
                      for w in azure_assignment("azure_ib_write_bw_gdr.nhc", "IB_WRITE_BW_ARGS")]
        for index, run in enumerate(runs):
            node = int((tmp_path / "class" / "infiniband" / run.device / "device" / "numa_node").read_text())
            expected_args = [w.format(port=tools.IB_WRITE_PORTS + index) for w in azure_args]
            assert run.server == ["numactl", "-N", str(node), "-m", str(node), "ib_write_bw", *expected_args,
                                  f"--use_cuda={index}", "-d", run.device]
            assert run.client == [*run.server, "localhost"]
        assert len({r.server[r.server.index("-p") + 1] for r in runs}) == 8  # one port per HCA: all at once

    def test_host_memory_flags_and_binding_are_azures(self, tmp_path):
        """azure_ib_write_bw_non_gdr.nhc: `numactl --membind=n -C core ib_write_bw -s SIZE -D 10 -x 0 -F
        --report_gbits --perform_warm_up -d HCA -q 2`, the server on the node's first core, the client
        on the next."""
        sku = facts("Standard_ND96isr_MI300X_v5")
        for hca in range(8):
            ib_port(tmp_path, f"mlx5_ib{hca}", rate="400 Gb/sec (4X NDR)")
            device = tmp_path / "class" / "infiniband" / f"mlx5_ib{hca}" / "device"
            device.mkdir()
            (device / "numa_node").write_text(f"{hca // 4}\n")
        for node, cpus in ((0, "0-47"), (1, "48-95")):
            folder = tmp_path / "devices" / "system" / "node" / f"node{node}"
            folder.mkdir(parents=True)
            (folder / "cpulist").write_text(cpus + "\n")
        runs = tools.ib_write_runs(Recorded({}).tools(), sku, tmp_path)
        size = str(sku.health.ib_write_message_bytes)
        for run in runs:
            node = int(run.device.removeprefix("mlx5_ib")) // 4
            core = 48 * node
            azure_args = [w.replace("$MSG_SIZE", size).replace("${IB_WRITE_BW_DURATION}", "10").replace("$device", run.device)
                          for w in azure_assignment("azure_ib_write_bw_non_gdr.nhc", "IB_WRITE_BW_ARGS")]
            assert run.server == ["numactl", f"--membind={node}", "-C", str(core), "ib_write_bw", *azure_args]
            assert run.client == ["numactl", f"--membind={node}", "-C", str(core + 1), "ib_write_bw", *azure_args, "localhost"]

    def test_results_say_how_they_were_bound(self, tmp_path):
        build_nd96asr_sysfs(tmp_path)
        report = (OUTPUT / "ib_write_bw-report-gbits.txt").read_text()
        results = tools.check_ib_write(Recorded({"ib_write_bw": (0, report)}).tools(), facts("Standard_ND96asr_v4"), tmp_path)
        assert len(results) == 8 and all("numactl -N" in r.detail for r in results)
        unbound = tools.check_ib_write(Recorded({"ib_write_bw": (0, report)}, have=("ib_write_bw",)).tools(),
                                       facts("Standard_ND96asr_v4"), tmp_path)
        assert all("not NUMA-bound" in r.detail for r in unbound)

    def test_every_reference_script_is_copied_whole(self):
        for name in ("azure_ib_write_bw_gdr.nhc", "azure_ib_write_bw_non_gdr.nhc", "azure_nccl_allreduce.nhc",
                     "azure_rccl_allreduce.nhc", "azure_gpu_xid.nhc", "azure_gpu_nvlink.nhc"):
            assert shlex.split(azure(name).splitlines()[0]) == ["#!/bin/bash"], name


class TestNumaBalancing:
    PATH = str(tools.NUMA_BALANCING)

    def test_on_warns_on_amd(self):
        (result,) = tools.check_numa_balancing(Recorded({}, files={self.PATH: "1\n"}).tools(), facts("Standard_ND96isr_MI300X_v5"))
        assert result.status == WARN and "sysctl kernel.numa_balancing=0" in result.detail

    def test_on_is_information_on_nvidia(self):
        (result,) = tools.check_numa_balancing(Recorded({}, files={self.PATH: "1\n"}).tools(), facts("Standard_ND96isr_H100_v5"))
        assert result.status == INFO

    def test_off_passes_and_unreadable_skips(self):
        (off,) = tools.check_numa_balancing(Recorded({}, files={self.PATH: "0\n"}).tools(), facts("Standard_ND96isr_MI300X_v5"))
        (unknown,) = tools.check_numa_balancing(Recorded({}).tools(), facts("Standard_ND96isr_MI300X_v5"))
        assert (off.status, unknown.status) == (PASS, SKIP)

    def test_the_gate_runs_it(self, tmp_path):
        recorded = Recorded({}, files={self.PATH: "1\n"}, have=())
        results = tools.tool_checks(facts("Standard_ND96isr_MI300X_v5"), tmp_path, 8, recorded.tools())
        assert [r.status for r in results if r.check == "numa_balancing"] == [WARN]
