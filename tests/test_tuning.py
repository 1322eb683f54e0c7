"""amlhpc.jobs.plan.tuning and amlhpc.jobs.plan.scale: the per-size environment held against what Azure sets (reference
tables in tests/reference/azure-nccl-env.toml), the topology files against Azure's own
(tests/reference/azhpc-images/topology), and the scaling arithmetic."""

from __future__ import annotations

import json
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from amlhpc.core import nccl, skus
from amlhpc.core.errors import UserError
from amlhpc.jobs.plan import scale, tuning
from amlhpc.jobs.runtime.node import nccl_env

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = tomllib.loads((ROOT / "tests" / "reference" / "azure-nccl-env.toml").read_text())
AZURE_TOPOLOGY = ROOT / "tests" / "reference" / "azhpc-images" / "topology"
SHIPPED_TOPOLOGY = ROOT / "amlhpc" / "images" / "common" / "nccl-topo"
IB_SIZES = [n for n in skus.names() if skus.get(n).infiniband]


def azure_env(size: str) -> dict[str, str]:
    """Everything Azure's files set for one size (nccl.conf and hopper.conf merged)."""
    env: dict[str, str] = {}
    for entry in REFERENCE["nccl_conf"]:
        if size in entry["sizes"]:
            for name, value in entry["env"].items():
                assert env.get(name, value) == value, f"Azure's files disagree on {name} for {size}"
                env[name] = value
    return env


def listed(kind: str, name: str, size: str) -> bool:
    return any(e["name"] == name and (e["sizes"] == "all" or size in e["sizes"]) for e in REFERENCE[kind])


def job_env(size: str, distribution: str = "pytorch") -> dict[str, str]:
    sku = skus.get(size)
    return tuning.tune(sku, 2 if sku.infiniband else 1, distribution).env


def comparable(name: str, value: str) -> str:
    """Topology variables are compared by the file they name (paths differ: /opt/microsoft vs the snapshot)."""
    return Path(value).name if name in ("NCCL_TOPO_FILE", "NCCL_GRAPH_FILE") else value


class TestAgainstAzure:
    @pytest.mark.parametrize("size", skus.names())
    def test_every_value_azure_sets_is_set_or_listed_as_different(self, size):
        ours = job_env(size)
        for name, value in azure_env(size).items():
            if comparable(name, ours.get(name, "<unset>")) != value:
                assert listed("differs", name, size), (
                    f"{size}: Azure sets {name}={value}, the job has {ours.get(name, '<unset>')}: "
                    "fix amlhpc/core/catalog/nccl.toml or list it under [[differs]] with the reason")

    @pytest.mark.parametrize("size", skus.names())
    def test_every_variable_the_job_adds_is_listed_with_a_reason(self, size):
        azure = azure_env(size)
        for name in job_env(size):
            if name not in azure:
                assert listed("adds", name, size), f"{size}: the job sets {name}, Azure does not: list it under [[adds]]"

    def test_every_listed_difference_is_still_real(self):
        """A [[differs]] entry whose value now matches Azure's is stale."""
        for entry in REFERENCE["differs"]:
            for size in entry["sizes"]:
                ours, azure = job_env(size), azure_env(size)
                assert comparable(entry["name"], ours.get(entry["name"], "<unset>")) != azure.get(entry["name"]), entry

    def test_hopper_conf_values_on_h100_and_h200(self):
        for size in ("Standard_ND96isr_H100_v5", "Standard_ND96isr_H200_v5"):
            env = job_env(size)
            assert (env["NCCL_MIN_NCHANNELS"], env["NCCL_IB_QPS_PER_CONNECTION"], env["NCCL_P2P_NET_CHUNKSIZE"],
                    env["NCCL_PXN_DISABLE"]) == ("32", "4", str(2 * 1024 * 1024), "1")
            assert env["UCX_TLS"] == "rc" and env["UCX_NET_DEVICES"] == "mlx5_ib0:1"
            assert env["NCCL_IGNORE_CPU_AFFINITY"] == "1"

    def test_sharp_is_opt_in(self):
        h100 = skus.get("Standard_ND96isr_H100_v5")
        assert "NCCL_COLLNET_ENABLE" not in tuning.tune(h100, 2, "pytorch").env
        sharp = tuning.tune(h100, 2, "pytorch", opt_ins={"sharp"})
        assert sharp.env["NCCL_COLLNET_ENABLE"] == "1" and sharp.env["SHARP_COLL_ENABLE_SAT"] == "1"
        assert json.loads(sharp.env[nccl_env.RESOLVE_VAR])["SHARP_SMX_UCX_INTERFACE"] == "ib-port"
        a100 = tuning.tune(skus.get("Standard_ND96asr_v4"), 2, "pytorch", opt_ins={"sharp"})
        assert "NCCL_COLLNET_ENABLE" not in a100.env and any("sharp: true has no effect" in w for w in a100.warnings)

    def test_mpi_jobs_get_ucx_pml(self):
        env = job_env("Standard_ND96asr_v4", "mpi")
        assert env["OMPI_MCA_pml"] == "ucx" and env["OMPI_MCA_btl"] == "^openib,smcuda"
        assert "OMPI_MCA_pml" not in job_env("Standard_ND96asr_v4")


class TestCatalogSources:
    def test_every_setting_cites_a_dated_public_source(self):
        for setting in nccl.SETTINGS:
            source = nccl.SOURCES[setting.source]
            assert source.url.startswith("https://") and source.as_of and source.title, setting.name
            assert setting.why.strip()

    def test_unknown_size_in_the_catalog_is_named(self, tmp_path):
        text = nccl.CATALOG_FILE.read_text().replace('sizes = ["Standard_ND40rs_v2"]', 'sizes = ["Standard_ND40r_v2"]', 1)
        (tmp_path / "nccl.toml").write_text(text)
        with pytest.raises(nccl.NcclCatalogError, match=r"setting\[0\] \(NCCL_TOPO_FILE\).*Standard_ND40r_v2"):
            nccl._load(tmp_path / "nccl.toml")

    def test_a_variable_set_twice_for_one_size_is_refused(self, tmp_path):
        text = nccl.CATALOG_FILE.read_text().replace('value = "ndv4-topo.xml"\nsizes = ["Standard_ND96asr_v4", ',
                                                     'value = "ndv4-topo.xml"\nsizes = ["Standard_ND40rs_v2", ', 1)
        (tmp_path / "nccl.toml").write_text(text)
        with pytest.raises(nccl.NcclCatalogError, match="NCCL_TOPO_FILE is set twice for Standard_ND40rs_v2"):
            nccl._load(tmp_path / "nccl.toml")


class TestTopologyFiles:
    def test_shipped_files_are_azures(self):
        """Byte for byte the reference copies of Azure/azhpc-images topology/ (tests/reference/azhpc-images/SOURCES.toml)."""
        shipped = sorted(p.name for p in SHIPPED_TOPOLOGY.glob("*.xml"))
        assert shipped == sorted(p.name for p in AZURE_TOPOLOGY.glob("*.xml"))
        for name in shipped:
            assert (SHIPPED_TOPOLOGY / name).read_bytes() == (AZURE_TOPOLOGY / name).read_bytes(), name

    def test_every_reference_copy_names_its_source(self):
        sources = tomllib.loads((AZURE_TOPOLOGY.parent / "SOURCES.toml").read_text())["file"]
        for path in AZURE_TOPOLOGY.glob("*.xml"):
            entry = sources[f"topology/{path.name}"]
            assert entry["url"].startswith("https://github.com/Azure/azhpc-images/") and entry["date"] and entry["commit"]

    def test_every_file_the_catalog_names_is_shipped(self):
        named = {s.value for s in nccl.SETTINGS if s.resolve == "topology"}
        assert named == {p.name for p in SHIPPED_TOPOLOGY.glob("*.xml")}

    def test_ndv5_sockets_hold_their_own_gpus(self):
        """Azure's 2025-01-27 fix: GPUs 0-3 (bus 0001-0008) belong to CPUs 0-47, GPUs 4-7 to 48-95."""
        root = ET.parse(SHIPPED_TOPOLOGY / "ndv5-topo.xml").getroot()
        cpus = {}
        for cpu in root.iter("cpu"):
            mask = int(cpu.get("affinity").replace(",", ""), 16)
            gpus = [p.get("busid") for p in cpu.iter("pci") if p.get("class") == "0x030200"]
            cpus[(min(b for b in range(96) if mask >> b & 1), max(b for b in range(96) if mask >> b & 1))] = gpus
        assert cpus[(0, 47)] == ["0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0008:00:00.0"]


class TestJobEnvironment:
    @pytest.mark.parametrize("name", IB_SIZES)
    def test_never_ib_disable_on_infiniband(self, name):
        t = tuning.tune(skus.get(name), 4, "pytorch", {"NCCL_IB_DISABLE": "1"})
        assert "NCCL_IB_DISABLE" not in t.env and any("dropped NCCL_IB_DISABLE" in w for w in t.warnings)
        assert t.env["NCCL_DEBUG"] == "INFO" and "INIT" in t.env["NCCL_DEBUG_SUBSYS"]

    def test_topology_file_points_into_the_snapshot_and_is_resolved_on_the_node(self):
        env = job_env("Standard_NC96ads_A100_v4")
        assert env["NCCL_TOPO_FILE"] == "nccl-topo/ncv4-topo.xml" and env["NCCL_GRAPH_FILE"] == "nccl-topo/ncv4-graph.xml"
        assert json.loads(env[nccl_env.RESOLVE_VAR]) == {"NCCL_GRAPH_FILE": "topology", "NCCL_TOPO_FILE": "topology"}

    def test_recipe_value_wins_with_warning_and_is_not_resolved(self):
        t = tuning.tune(skus.get("Standard_ND96asr_v4"), 2, "pytorch",
                        {"NCCL_DEBUG": "WARN", "NCCL_TOPO_FILE": "/opt/mine/topo.xml"})
        assert t.env["NCCL_DEBUG"] == "WARN" and any("recipe wins" in w for w in t.warnings)
        assert "NCCL_TOPO_FILE" not in json.loads(t.env[nccl_env.RESOLVE_VAR])

    def test_reasons_cite_the_source(self):
        t = tuning.tune(skus.get("Standard_ND96isr_H100_v5"), 2, "pytorch")
        assert "hopper.conf" in t.reasons["NCCL_MIN_NCHANNELS"] and "2026-03-04" in t.reasons["NCCL_MIN_NCHANNELS"]

    def test_sku_json_is_the_catalog_record(self):
        record = json.loads(tuning.sku_json(skus.get("Standard_ND96asr_v4")))
        assert record["gpus"] == 8 and [d["gpu_ids"] for d in record["numa"]] == [[2, 3], [0, 1], [6, 7], [4, 5]]
        assert skus.get("Standard_ND96asr_v4").gpu_order == (2, 3, 0, 1, 6, 7, 4, 5)

    def test_multi_node_without_ib_refused(self):
        with pytest.raises(UserError) as info:
            tuning.check_multi_node(skus.get("Standard_NC24ads_A100_v4"), 2, "nc", False, "recipe")
        assert "--allow-tcp" in info.value.render() and "Standard_NC24rs_v3" not in info.value.render()  # retired
        tuning.check_multi_node(skus.get("Standard_NC24s_v3"), 2, "nc", True, "recipe")
        tuning.check_multi_node(skus.get("Standard_NC24s_v3"), 1, "nc", False, "recipe")


def test_docs_table_is_the_catalog():
    """docs/tuning.md shows exactly amlhpc/core/catalog/nccl.toml (regenerate: python -m amlhpc.jobs.plan.tuning)."""
    text = (ROOT / "docs" / "tuning.md").read_text()
    start, end = text.index(tuning.TABLE_BEGIN), text.index(tuning.TABLE_END)
    assert text[start:end + len(tuning.TABLE_END)] == tuning.docs_table()


def test_node_counts():
    assert scale.node_counts(8) == [1, 2, 4, 8]
    assert scale.node_counts(6) == [1, 2, 4, 6]
    assert scale.node_counts(1) == [1]


def test_scaling_efficiency():
    rows = scale.report([scale.ScalingRow(4, "c", "Completed", 360.0, "samples/s"),
                         scale.ScalingRow(1, "a", "Completed", 100.0, "samples/s"),
                         scale.ScalingRow(2, "b", "Failed", None, "samples/s")])
    assert [r.nodes for r in rows] == [1, 2, 4]
    assert rows[2].speedup == pytest.approx(3.6) and rows[2].efficiency == pytest.approx(0.9)
    assert rows[1].efficiency is None


class TestNewGenerations:
    """The environment of the sizes added with MI300X, GB200/GB300 and NC H100 v5."""

    @pytest.mark.parametrize("size", ["Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4"])
    def test_a100_v4_pins_nccl_to_its_infiniband_hcas(self, size):
        """Azure lists ND A100 v4 among the sizes with an accelerated-networking RDMA device
        (run-health-checks.sh AN40): NCCL_IB_HCA keeps NCCL off mlx5_an0 there too."""
        env = job_env(size)
        assert env["NCCL_IB_HCA"].startswith("=mlx5_ib0:1") and "an0" not in env["NCCL_IB_HCA"]
        assert json.loads(env[nccl_env.RESOLVE_VAR])["NCCL_IB_HCA"] == "ib-ports"

    def test_mi300x_gets_rccls_environment(self):
        env = job_env("Standard_ND96isr_MI300X_v5")
        assert env["HSA_NO_SCRATCH_RECLAIM"] == "1" and env["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"
        assert env["UCX_TLS"] == "rc" and env["UCX_NET_DEVICES"] == "mlx5_ib0:1"
        assert "NCCL_TOPO_FILE" not in env and "NCCL_IGNORE_CPU_AFFINITY" not in env

    @pytest.mark.parametrize("size", ["Standard_ND128isr_NDR_GB200_v6", "Standard_ND128isr_GB300_v6"])
    def test_grace_blackwell_gets_multi_node_nvlink_resolved_against_imex(self, size):
        env = job_env(size)
        assert env["NCCL_MNNVL_ENABLE"] == "1" and env["NCCL_NVLS_ENABLE"] == "1" and env["NCCL_NET_GDR_C2C"] == "1"
        assert json.loads(env[nccl_env.RESOLVE_VAR])["NCCL_MNNVL_ENABLE"] == "imex"
        assert "NCCL_TOPO_FILE" not in env  # Azure ships no topology file for the family (ndv6.sh)

    @pytest.mark.parametrize("size", ["Standard_NC40ads_H100_v5", "Standard_NC80adis_H100_v5", "Standard_NC48ads_A100_v4"])
    def test_nc_sizes_without_infiniband_get_no_ib_settings(self, size):
        env = job_env(size)
        assert not any(k.startswith(("NCCL_IB_", "UCX_")) for k in env)
