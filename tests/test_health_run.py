"""The health run on every process: real torch.distributed (gloo, separate processes) for the
all-reduce and the gate's verdict, a fake collective for the NCCL pass marks, and the
`summarize` command over the per-node JSON reports."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amlhpc.core import skus
from amlhpc.jobs.local.azurite import free_port
from amlhpc.jobs.runtime.health import HealthOptions, run_health, tools
from amlhpc.jobs.runtime.health.__main__ import main as health_main
from amlhpc.jobs.runtime.health.collective import AllReduceFigure, rendezvous_address
from amlhpc.jobs.runtime.health.grading import FAIL, INFO, PASS, WARN, bus_bandwidth
from amlhpc.jobs.runtime.health.results import CheckResult, NodeReport
from amlhpc.jobs.runtime.node.nvml import NvmlSession
from tests.fake_sysfs import build_nd96asr_sysfs

REPO = Path(__file__).resolve().parents[1]


def sku_json(name: str) -> str:
    return json.dumps(dataclasses.asdict(skus.get(name)))


def launch_ranks(world: int, local: int, report_dir: Path, extra_args=(), per_rank_args=None, mode="gate", timeout=120):
    """Start `world` processes of `python -m amlhpc.jobs.runtime.health` the way Azure ML would."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank % local), "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(local), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "AMLHPC_SKU_JSON": sku_json("Standard_ND96asr_v4"), "AMLHPC_RUN_ID": f"health-{port}",
               "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
        args = [sys.executable, "-m", "amlhpc.jobs.runtime.health", "--mode", mode, "--quick", "--report-dir", str(report_dir),
                "--timeout", "60", *extra_args, *((per_rank_args or {}).get(rank, ()))]
        procs.append(subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        outputs.append((proc.returncode, out))
    return outputs


@pytest.mark.torch
@pytest.mark.slow
class TestRealGloo:
    def test_two_nodes_of_two_ranks(self, tmp_path):
        """2 nodes x 2 ranks over gloo (the local rehearsal's shape): a per-node all-reduce in
        each node's own group, a correct job-wide one, one report per node, a summary."""
        outputs = launch_ranks(4, 2, tmp_path)
        assert [code for code, _ in outputs] == [0, 0, 0, 0], outputs
        reports = sorted(tmp_path.glob("health-node*.json"))
        assert [p.name.split("-")[1] for p in reports] == ["node000", "node001"]
        for path in reports:
            checks = NodeReport.from_json(json.loads(path.read_text())).checks
            (node,) = [c for c in checks if c.check == "allreduce_node"]
            (job,) = [c for c in checks if c.check == "allreduce_job"]
            assert node.status == job.status == INFO  # gloo: the GPU pass marks do not apply
            assert node.value > 0 and "2 ranks" in node.detail
            assert "2 nodes x 2 ranks" in job.detail and "16 MiB over gloo" in job.detail
            algbw = float(job.detail.split("algbw ")[1].split(" GB/s")[0])
            assert job.value == pytest.approx(bus_bandwidth(algbw, 4), rel=0.01)
        summary = json.loads((tmp_path / "health-summary.json").read_text())
        assert [n["node"] for n in summary["nodes"]] == [0, 1]
        assert "node health: 2 node(s)" in outputs[0][1]  # rank 0 prints the table
        assert "node health" not in outputs[1][1] + outputs[2][1]

    def test_gate_stops_every_rank_and_names_the_failing_node(self, tmp_path):
        """Node 1 has GPUs on its PCI bus that CUDA cannot use: every rank exits 3, the log
        names node 1 and the failed check, node 0's report still passes."""
        broken = build_nd96asr_sysfs(tmp_path / "broken-sys")
        outputs = launch_ranks(2, 1, tmp_path / "reports", per_rank_args={1: ("--sysfs", str(broken))})
        assert [code for code, _ in outputs] == [3, 3], outputs
        assert "health gate FAILED, stopping before training: node 1" in outputs[0][1]
        assert "gpu_count node" in outputs[0][1]
        assert "8 NVIDIA GPU(s) on the PCI bus but CUDA sees none" in outputs[1][1]
        summary = json.loads((tmp_path / "reports" / "health-summary.json").read_text())
        assert [(n["node"], n["status"]) for n in summary["nodes"]] == [(0, "info"), (1, FAIL)]


class TestSingleProcess:
    def test_cpu_machine_passes_the_gate_with_skips(self, tmp_path):
        """One process on this CPU machine: nothing faked, nothing failed, a report written."""
        out = run_health(HealthOptions("gate", True, tmp_path), {"AMLHPC_SKU_JSON": sku_json("Standard_ND96asr_v4")},
                         nvml_factory=lambda: NvmlSession(None, "no driver"))
        assert out.exit_code == 0
        (report,) = out.reports
        assert report.status == "skip"
        assert (tmp_path / report.file_name()).exists()

    def test_missing_rendezvous_fails_the_gate(self, tmp_path, capsys):
        """Two ranks but no MASTER_ADDR: the gate fails instead of hanging."""
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
        out = run_health(HealthOptions("gate", True, tmp_path), env, nvml_factory=lambda: NvmlSession(None, "x"))
        assert out.exit_code == 3
        assert "rendezvous job: no rendezvous address: set MASTER_ADDR" in capsys.readouterr().err

    def test_warn_mode_goes_on(self, tmp_path, capsys):
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
        out = run_health(HealthOptions("warn", True, tmp_path), env, nvml_factory=lambda: NvmlSession(None, "x"))
        assert out.exit_code == 0 and out.failing
        assert "continuing (warn mode)" in capsys.readouterr().err

    def test_bad_sku_json_exits_2(self, tmp_path, capsys):
        out = run_health(HealthOptions(), {"AMLHPC_SKU_JSON": '{"name": "x", "gpus": "eight"}'})
        assert out.exit_code == 2
        assert "AMLHPC_SKU_JSON: gpus: must be an integer, got 'eight'" in capsys.readouterr().err

    def test_bad_rank_variables_exit_2(self, tmp_path, capsys):
        out = run_health(HealthOptions(report_dir=tmp_path), {"RANK": "0", "WORLD_SIZE": "2"})
        assert out.exit_code == 2 and "LOCAL_RANK" in capsys.readouterr().err


class FakeCollective:
    """Stands in for torch.distributed with NCCL figures chosen by the test."""

    backend = "nccl"

    def __init__(self, node_busbw: float, job_busbw: float, others: list[dict], world: int):
        self.node_busbw, self.job_busbw, self.others, self.world = node_busbw, job_busbw, others, world
        self.closed = False

    def node_group(self):
        return "node"

    def allreduce(self, group, group_rank, group_size, nbytes, iters, warmup):
        busbw = self.node_busbw if group == "node" else self.job_busbw
        algbw = busbw * group_size / (2 * (group_size - 1))
        return AllReduceFigure(group_size, nbytes, nbytes / algbw / 1e9, algbw, busbw, "nccl", True)

    def gather(self, obj):
        return [obj, *self.others]

    def close(self):
        self.closed = True


def _other_node(node: int, status: str = PASS) -> dict:
    report = NodeReport(f"host{node}", node, "Standard_ND96isr_H100_v5", "gate", True, "2026-01-01T00:00:00+00:00",
                        checks=[CheckResult("gemm", "gpu0", status, 700.0, "TFLOP/s", 593.4)])
    return report.to_json()


class TestNcclPassMarks:
    """Grading of the all-reduce figures with the size's published marks (fake collective)."""

    def _run(self, tmp_path, node_busbw, job_busbw, sku="Standard_ND96isr_H100_v5", others=None, local=8, world=16,
             env_extra=None):
        fake = FakeCollective(node_busbw, job_busbw, others if others is not None else [_other_node(1)], world)
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(local),
               "AMLHPC_SKU_JSON": sku_json(sku), **(env_extra or {})}
        import amlhpc.jobs.runtime.health.runner as runner

        original = runner.message_bytes
        runner.message_bytes = lambda c, s, cpu: (s.health.nccl_allreduce_message_bytes, "16384 MiB")
        try:
            out = run_health(HealthOptions("gate", True, tmp_path), env, nvml_factory=lambda: NvmlSession(None, "x"),
                             collective_factory=lambda *a: fake)
        finally:
            runner.message_bytes = original
        assert fake.closed
        return out

    SHARP = {"NCCL_COLLNET_ENABLE": "1"}
    """ND H100 v5's job-wide baseline is measured with SHARP: graded where the job turns it on."""

    def test_h100_node_and_job_pass(self, tmp_path):
        out = self._run(tmp_path, node_busbw=480.0, job_busbw=455.0, env_extra=self.SHARP)
        mine = out.reports[0]
        node = next(c for c in mine.checks if c.check == "allreduce_node")
        job = next(c for c in mine.checks if c.check == "allreduce_job")
        assert (node.status, node.threshold) == (PASS, 460.0)
        assert (job.status, job.threshold) == (PASS, 300.0)
        assert out.exit_code == 0

    def test_h100_job_below_warn_line_warns(self, tmp_path):
        out = self._run(tmp_path, node_busbw=480.0, job_busbw=380.0, env_extra=self.SHARP)
        job = next(c for c in out.reports[0].checks if c.check == "allreduce_job")
        assert job.status == WARN and out.exit_code == 0

    def test_h100_job_below_fail_line_stops_the_job(self, tmp_path, capsys):
        out = self._run(tmp_path, node_busbw=480.0, job_busbw=250.0, env_extra=self.SHARP)
        assert out.exit_code == 3
        assert "allreduce_job job" in capsys.readouterr().err

    def test_a100_single_node_mark(self, tmp_path):
        """ND96asr_v4: 228 GB/s at 8 GiB inside one node; 225 fails, 230 warns (within 3.5 %)."""
        failing = self._run(tmp_path / "a", 225.0, 0.0, sku="Standard_ND96asr_v4", others=[], world=8)
        assert next(c for c in failing.reports[0].checks if c.check == "allreduce_node").status == FAIL
        warning = self._run(tmp_path / "b", 230.0, 0.0, sku="Standard_ND96asr_v4", others=[], world=8)
        assert next(c for c in warning.reports[0].checks if c.check == "allreduce_node").status == WARN

    def test_other_nodes_failure_stops_this_node_too(self, tmp_path, capsys):
        """Every rank reaches the same verdict: node 1's failed GEMM stops node 0 as well."""
        out = self._run(tmp_path, 480.0, 455.0, others=[_other_node(1, FAIL)])
        assert out.exit_code == 3 and [r.node for r in out.failing] == [1]
        assert "node 1 (host1): gemm gpu0" in capsys.readouterr().err

    # --- the job-wide band chosen by what the all-reduce crosses, and SHARP -------------

    GB300 = "Standard_ND128isr_GB300_v6"

    @staticmethod
    def _gb300_node(node: int, domain: str | None) -> dict:
        checks = [CheckResult("gemm", "gpu0", PASS, 2400.0, "TFLOP/s", 2000.0)]
        if domain:
            checks.append(CheckResult("nvlink_fabric", "node", PASS, 4.0, "GPUs", detail=f"{tools.DOMAIN_PREFIX}{domain}"))
        return NodeReport(f"host{node}", node, TestNcclPassMarks.GB300, "gate", True, "2026-01-01T00:00:00+00:00",
                          checks=checks).to_json()

    def test_a_healthy_gb300_job_across_two_racks_passes_at_azures_inter_rack_baseline(self, tmp_path):
        """Azure's inter-rack GB300 baseline is ~200 GB/s (warn below 180, fail below 150): a job on
        two racks at 190 GB/s is healthy; graded against the one-rack MNNVL band (fail below 600)
        it failed and gate mode stopped training."""
        out = self._run(tmp_path, node_busbw=700.0, job_busbw=190.0, sku=self.GB300, local=4, world=8,
                        others=[self._gb300_node(1, "rack-b")])
        job = next(c for c in out.reports[0].checks if c.check == "allreduce_job")
        assert job.status == PASS and job.threshold == 150.0 and "InfiniBand" in job.detail
        assert out.exit_code == 0

    def test_gb300_across_racks_below_the_inter_rack_fail_line_stops(self, tmp_path):
        out = self._run(tmp_path, node_busbw=700.0, job_busbw=140.0, sku=self.GB300, local=4, world=8,
                        others=[self._gb300_node(1, "rack-b")])
        assert next(c for c in out.reports[0].checks if c.check == "allreduce_job").status == FAIL
        assert out.exit_code == 3

    def test_gb300_nodes_in_one_rack_are_graded_against_the_mnnvl_band(self):
        from amlhpc.jobs.runtime.base.ranks import Ranks
        from amlhpc.jobs.runtime.health import runner
        from amlhpc.jobs.runtime.node.skufacts import parse_sku_facts

        sku = parse_sku_facts(sku_json(self.GB300))
        ranks = Ranks(rank=0, local_rank=0, world_size=8, local_size=4, source="torch")
        reports = [NodeReport.from_json(self._gb300_node(n, "rack-a")) for n in (0, 1)]
        figure = AllReduceFigure(8, 16 << 30, 1.0, 500.0, 190.0, "nccl", True)
        one_rack = runner._grade_job(runner.JobAllReduce(figure, "16384 MiB"), sku, ranks, reports, {})
        assert one_rack.status == FAIL and one_rack.threshold == 600.0 and "NVLink domain rack-a" in one_rack.detail
        fast = AllReduceFigure(8, 16 << 30, 1.0, 500.0, 900.0, "nccl", True)
        assert runner._grade_job(runner.JobAllReduce(fast, "16384 MiB"), sku, ranks, reports, {}).status == PASS
        split = [NodeReport.from_json(self._gb300_node(0, "rack-a")), NodeReport.from_json(self._gb300_node(1, "rack-b"))]
        assert runner._grade_job(runner.JobAllReduce(figure, "16384 MiB"), sku, ranks, split, {}).status == PASS

    def test_h100_without_sharp_is_reported_not_graded(self, tmp_path):
        """ND H100 v5's 450 GB/s is Azure's figure with SHARP on; SHARP is opt-in here: a job
        without it gets the figure as INFO, never a warning against a SHARP baseline."""
        out = self._run(tmp_path, node_busbw=480.0, job_busbw=380.0)
        job = next(c for c in out.reports[0].checks if c.check == "allreduce_job")
        assert job.status == INFO and job.threshold is None and "measured with SHARP" in job.detail
        assert out.exit_code == 0


class TestRendezvous:
    def test_master_addr(self):
        assert rendezvous_address({"MASTER_ADDR": "10.0.0.4", "MASTER_PORT": "29500"}) == ("10.0.0.4", 29500)

    def test_azure_ml_mpi_variables(self):
        assert rendezvous_address({"AZ_BATCH_MASTER_NODE": "10.0.0.5:6105"}) == ("10.0.0.5", 6105)
        assert rendezvous_address({"AZ_BATCHAI_MPI_MASTER_NODE": "10.0.0.6"}) == ("10.0.0.6", 6105)

    def test_none(self):
        assert rendezvous_address({}) is None


class TestSummarize:
    def _write(self, folder: Path, node: int, gemm: list[float], status=PASS):
        checks = [CheckResult("gemm", f"gpu{i}", status, v, "TFLOP/s", 187.2) for i, v in enumerate(gemm)]
        NodeReport(f"nd-{node}", node, "Standard_ND96asr_v4", "report", False, "2026-01-01T00:00:00+00:00",
                   checks=checks).write(folder / f"rank-{node}")

    def test_table_over_nested_reports(self, tmp_path, capsys):
        """Azure ML nests each node's outputs; the summary finds them and flags the slow GPU."""
        self._write(tmp_path, 0, [260.0, 261.0, 259.0, 260.0])
        self._write(tmp_path, 1, [260.0, 230.0, 259.0, 260.0])
        assert health_main(["summarize", str(tmp_path)]) == 3
        out = capsys.readouterr().out
        assert "node health: 2 node(s), FAIL" in out
        assert "fleet:gemm gpu1" in out and "nd-1" in out
        assert "fleet gemm: 8 samples, median 260.0" in out

    def test_json(self, tmp_path, capsys):
        self._write(tmp_path, 0, [260.0, 261.0, 259.0, 260.0])
        assert health_main(["summarize", str(tmp_path), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["status"] == PASS and doc["nodes"][0]["host"] == "nd-0"

    def test_empty_folder_exits_2(self, tmp_path, capsys):
        assert health_main(["summarize", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert "holds no health-node*.json files" in err and "fix:" in err

    def test_corrupt_report_exits_2_naming_the_file(self, tmp_path, capsys):
        (tmp_path / "health-node000-x.json").write_text("{}")
        assert health_main(["summarize", str(tmp_path)]) == 2
        assert "health-node000-x.json: is not a node health report" in capsys.readouterr().err

    def test_plain_table_without_rich(self, tmp_path, monkeypatch):
        """The runtime image may lack rich: the same table in plain text."""
        import builtins
        import io

        from amlhpc.jobs.runtime.health.summary import summarize

        self._write(tmp_path, 0, [260.0])
        real_import = builtins.__import__

        def no_rich(name, *args, **kwargs):
            if name.startswith("rich"):
                raise ImportError(name)
            return real_import(name, *args, **kwargs)

        monkeypatch.setattr(builtins, "__import__", no_rich)
        stream = io.StringIO()
        summarize(tmp_path, stream)
        lines = stream.getvalue().splitlines()
        assert lines[1].split()[:3] == ["node", "host", "status"]
        assert lines[2].split()[:4] == ["0", "nd-0", "pass", "260.0"]
