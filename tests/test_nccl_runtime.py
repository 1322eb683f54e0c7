"""amlhpc/jobs/runtime/node/nccl_env.py and nccl_transport.py: NCCL settings adapted to the node, and
NCCL's transport choice read from its real init log (tests/fixtures/tool-output/nccl-*.log,
sources in SOURCES.toml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.launch import launcher as launch
from amlhpc.jobs.runtime.node import nccl_env, nccl_transport
from tests.fake_sysfs import build_nd96asr_sysfs, ib_port, pci_device

LOGS = Path(__file__).parent / "fixtures" / "tool-output"


def log(name: str) -> str:
    return (LOGS / name).read_text()


class TestInitLog:
    def test_ib_on_azure(self):
        choice = nccl_transport.parse_init_log(log("nccl-ib-azure-nc24rs_v3.log"))
        assert choice.transport == "IB" and choice.devices == ("mlx4_0:1",) and choice.rdma

    def test_ib_with_using_network_line(self):
        choice = nccl_transport.parse_init_log(log("nccl-ib-using-network.log"))
        assert choice.transport == "IB" and choice.devices == ("mlx5_3:1", "mlx5_2:1", "mlx5_1:1", "mlx5_0:1")

    @pytest.mark.parametrize("name, cause", [
        ("nccl-socket-ib-disabled-azureml.log", "NCCL_IB_DISABLE=1 is set"),
        ("nccl-socket-no-libibverbs-h100.log", "libibverbs could not be loaded"),
        ("nccl-socket-no-ib-device.log", "no usable InfiniBand device"),
    ])
    def test_socket_fallbacks_name_their_cause(self, name, cause):
        choice = nccl_transport.parse_init_log(log(name))
        assert choice.transport == "Socket" and not choice.rdma
        assert any(cause in e for e in choice.evidence)
        status, detail = nccl_transport.verdict(choice, "Standard_ND96asr_v4", True, 2, {}, Path("/nonexistent"))
        assert status == "fail" and cause in detail and "TCP sockets" in detail

    def test_socket_on_one_node_only_warns_and_non_ib_is_info(self):
        choice = nccl_transport.parse_init_log(log("nccl-socket-no-libibverbs-h100.log"))
        assert nccl_transport.verdict(choice, "Standard_ND96asr_v4", True, 1, {}, Path("/x"))[0] == "warn"
        assert nccl_transport.verdict(choice, "Standard_NC24ads_A100_v4", False, 2, {}, Path("/x"))[0] == "info"

    def test_roce_port_beside_infiniband_warns(self):
        line = ("host:1:1 [5] NCCL INFO NET/IB : Using [0]mlx5_ib0:1/IB [1]mlx5_ib1:1/IB [2]mlx5_an0:1/RoCE [RO]; "
                "OOB eth0:10.215.224.34<0>\nhost:1:1 [5] NCCL INFO Using network IB\n")
        choice = nccl_transport.parse_init_log(line)
        assert choice.roce == ("mlx5_an0:1",)
        assert nccl_transport.verdict(choice, "Standard_ND96isr_H200_v5", True, 2, {}, Path("/x"))[0] == "warn"


class TestPreflight:
    def test_inherited_ib_disable_stops_a_multi_node_job(self, tmp_path):
        sysfs = build_nd96asr_sysfs(tmp_path / "sys")
        message = nccl_transport.preflight("Standard_ND96asr_v4", True, 2, {"NCCL_IB_DISABLE": "1"}, sysfs, lambda: True)
        assert message and "NCCL_IB_DISABLE=1" in message and "unset it" in message

    def test_missing_libibverbs_and_missing_devices(self, tmp_path):
        sysfs = tmp_path / "sys"
        pci_device(sysfs, "0001:00:00.0", "0x10de", "0x030200", 0, "0-23")
        ib_port(sysfs, "mlx5_an0", link_layer="Ethernet")
        message = nccl_transport.preflight("Standard_ND96asr_v4", True, 2, {}, sysfs, lambda: False)
        assert "no InfiniBand port" in message and "mlx5_an0:1 (Ethernet)" in message and "libibverbs.so.1" in message

    def test_healthy_node_single_node_and_cpu_machines_pass(self, tmp_path):
        sysfs = build_nd96asr_sysfs(tmp_path / "sys")
        assert nccl_transport.preflight("Standard_ND96asr_v4", True, 2, {}, sysfs, lambda: True) is None
        assert nccl_transport.preflight("Standard_ND96asr_v4", True, 1, {"NCCL_IB_DISABLE": "1"}, sysfs, lambda: True) is None
        cpu = tmp_path / "cpu"
        cpu.mkdir()
        assert nccl_transport.preflight("Standard_ND96asr_v4", True, 2, {"NCCL_IB_DISABLE": "1"}, cpu, lambda: False) is None

    def test_launcher_exits_with_the_nccl_code(self, tmp_path, monkeypatch, capsys):
        sysfs = build_nd96asr_sysfs(tmp_path / "sys")
        import dataclasses

        from amlhpc.core import skus

        env = {"RANK": "0", "WORLD_SIZE": "16", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8", "NCCL_IB_DISABLE": "1",
               "AMLHPC_SKU_JSON": json.dumps(dataclasses.asdict(skus.get("Standard_ND96asr_v4"))),
               "AMLHPC_SCRATCH": str(tmp_path / "scratch"), "AMLHPC_RUN_ID": "t"}
        options = launch.parse_options(["--sysfs", str(sysfs), "--report-dir", str(tmp_path / "r"), "--", "true"], env)
        assert launch.Launcher(options, env).run() == ExitCode.NCCL_SOCKETS == 8


class TestNodeEnvironment:
    def test_topology_file_is_found_in_the_snapshot(self, tmp_path):
        (tmp_path / "nccl-topo").mkdir()
        (tmp_path / "nccl-topo" / "ndv4-topo.xml").write_text("<system/>")
        env = {"NCCL_TOPO_FILE": "nccl-topo/ndv4-topo.xml", nccl_env.RESOLVE_VAR: json.dumps({"NCCL_TOPO_FILE": "topology"})}
        notes = nccl_env.apply(env, tmp_path / "sys", cwd=tmp_path, package_root=tmp_path / "none", image_dir=tmp_path / "img")
        assert env["NCCL_TOPO_FILE"] == str(tmp_path / "nccl-topo" / "ndv4-topo.xml") and notes

    def test_image_copy_when_the_snapshot_has_none(self, tmp_path):
        (tmp_path / "img").mkdir()
        (tmp_path / "img" / "ncv4-graph.xml").write_text("<graphs/>")
        env = {"NCCL_GRAPH_FILE": "nccl-topo/ncv4-graph.xml", nccl_env.RESOLVE_VAR: json.dumps({"NCCL_GRAPH_FILE": "topology"})}
        nccl_env.apply(env, tmp_path, cwd=tmp_path, package_root=tmp_path / "none", image_dir=tmp_path / "img")
        assert env["NCCL_GRAPH_FILE"] == str(tmp_path / "img" / "ncv4-graph.xml")

    def test_missing_file_unsets_the_variable_with_a_warning(self, tmp_path):
        env = {"NCCL_TOPO_FILE": "nccl-topo/ndv5-topo.xml", nccl_env.RESOLVE_VAR: json.dumps({"NCCL_TOPO_FILE": "topology"})}
        notes = nccl_env.apply(env, tmp_path, cwd=tmp_path, package_root=tmp_path / "none", image_dir=tmp_path / "img")
        assert "NCCL_TOPO_FILE" not in env and notes[0].startswith("warning: NCCL_TOPO_FILE: ndv5-topo.xml is neither")

    def test_the_real_snapshot_carries_the_files(self, tmp_path):
        from amlhpc.jobs.plan import build

        snap = build.snapshot(("amlhpc/jobs/runtime",), dest_root=tmp_path)
        env = {"NCCL_TOPO_FILE": "nccl-topo/ndv5-topo.xml", nccl_env.RESOLVE_VAR: json.dumps({"NCCL_TOPO_FILE": "topology"})}
        nccl_env.apply(env, tmp_path, cwd=snap, image_dir=tmp_path / "img")
        assert Path(env["NCCL_TOPO_FILE"]).read_bytes() == (Path("tests/reference/azhpc-images/topology/ndv5-topo.xml")).read_bytes()

    def test_device_names_follow_the_node(self, tmp_path):
        """A node whose HCAs are mlx5_0.. with an Ethernet RDMA device: UCX and NCCL get the IB ports only."""
        for n in range(2):
            ib_port(tmp_path, f"mlx5_{n}", rate="400 Gb/sec (4X NDR)")
        ib_port(tmp_path, "mlx5_an0", link_layer="Ethernet")
        env = {"UCX_NET_DEVICES": "mlx5_ib0:1", "NCCL_IB_HCA": "=mlx5_ib0:1,mlx5_ib1:1",
               nccl_env.RESOLVE_VAR: json.dumps({"UCX_NET_DEVICES": "ib-port", "NCCL_IB_HCA": "ib-ports"})}
        nccl_env.apply(env, tmp_path)
        assert env["UCX_NET_DEVICES"] == "mlx5_0:1" and env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"

    def test_azure_names_are_kept(self, tmp_path):
        for n in range(2):
            ib_port(tmp_path, f"mlx5_ib{n}")
        env = {"UCX_NET_DEVICES": "mlx5_ib0:1", nccl_env.RESOLVE_VAR: json.dumps({"UCX_NET_DEVICES": "ib-port"})}
        assert nccl_env.apply(env, tmp_path) == [] and env["UCX_NET_DEVICES"] == "mlx5_ib0:1"

    def test_bad_resolve_list_names_the_variable(self, tmp_path):
        from amlhpc.jobs.runtime.base.errors import RuntimeInputError

        with pytest.raises(RuntimeInputError, match="AMLHPC_NCCL_RESOLVE"):
            nccl_env.apply({nccl_env.RESOLVE_VAR: '{"X": "everything"}'}, tmp_path)

    def test_multi_node_nvlink_is_kept_when_the_container_has_an_imex_channel(self, tmp_path):
        (tmp_path / "imex").mkdir()
        (tmp_path / "imex" / "channel0").touch()
        env = {"NCCL_MNNVL_ENABLE": "1", nccl_env.RESOLVE_VAR: json.dumps({"NCCL_MNNVL_ENABLE": "imex"})}
        assert nccl_env.apply(env, tmp_path, imex_dir=tmp_path / "imex") == [] and env["NCCL_MNNVL_ENABLE"] == "1"

    def test_multi_node_nvlink_without_an_imex_channel_falls_back_with_a_warning(self, tmp_path):
        """NCCL cannot start multi-node NVLink without an IMEX channel: the job would fail at init."""
        env = {"NCCL_MNNVL_ENABLE": "1", nccl_env.RESOLVE_VAR: json.dumps({"NCCL_MNNVL_ENABLE": "imex"})}
        notes = nccl_env.apply(env, tmp_path, imex_dir=tmp_path / "no-imex")
        assert env["NCCL_MNNVL_ENABLE"] == "0"
        assert notes and notes[0].startswith("warning: NCCL_MNNVL_ENABLE=0") and "channel0" in notes[0]
