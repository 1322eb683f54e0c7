"""GPU-NUMA pinning from a fake sysfs tree laid out like the NDv4 performance article's ND96asr_v4."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from amlhpc.core import skus
from amlhpc.jobs.runtime.node import topology
from amlhpc.jobs.runtime.node.skufacts import parse_sku_facts
from tests.fake_sysfs import build_nd96asr_sysfs
from tests.fake_sysfs import pci_device as _device

ALL_CPUS = frozenset(range(96))
ND96ASR = parse_sku_facts(json.dumps(dataclasses.asdict(skus.get("Standard_ND96asr_v4"))))


@pytest.fixture
def nd96asr(tmp_path):
    return build_nd96asr_sysfs(tmp_path / "sys")


class TestCpulist:
    def test_round_trip(self):
        """A cpulist parses into CPUs and formats back compactly."""
        cpus = topology.parse_cpulist("0-3,8,10-11")
        assert cpus == {0, 1, 2, 3, 8, 10, 11}
        assert topology.format_cpulist(cpus) == "0-3,8,10-11"

    def test_empty(self):
        assert topology.parse_cpulist("\n") == frozenset()
        assert topology.format_cpulist([]) == ""


class TestDiscover:
    def test_sysfs_layout(self, nd96asr):
        """Eight GPUs in PCI order with the NDv4 performance article's NUMA nodes; the NVSwitch is not a GPU."""
        topo = topology.discover(nd96asr, ND96ASR, ALL_CPUS)
        assert topo.source == "sysfs"
        assert [g.index for g in topo.gpus] == list(range(8))
        assert [g.numa_node for g in topo.gpus] == [1, 1, 0, 0, 3, 3, 2, 2]
        assert topo.gpus[0].cpus == frozenset(range(24, 48))
        assert [h.name for h in topo.hcas] == [f"mlx5_ib{i}" for i in range(8)]
        assert topo.hcas[2].numa_node == 0 and topo.hcas[2].pci_address == "0103:00:00.0"

    def test_numa_order_is_the_ndv4_articles(self, nd96asr):
        """Walking NUMA domains in order gives CUDA_VISIBLE_DEVICES=2,3,0,1,6,7,4,5."""
        assert topology.discover(nd96asr, ND96ASR, ALL_CPUS).numa_order == (2, 3, 0, 1, 6, 7, 4, 5)

    def test_catalog_order_is_the_same(self):
        """The catalog's own map yields the same order (both derived from the NDv4 performance article)."""
        assert skus.get("Standard_ND96asr_v4").gpu_order == (2, 3, 0, 1, 6, 7, 4, 5)

    def test_falls_back_to_catalog_when_sysfs_has_no_numa(self, tmp_path):
        """numa_node -1 on every GPU: the catalog's map is used, and says so."""
        root = build_nd96asr_sysfs(tmp_path / "sys", numa_known=False)
        topo = topology.discover(root, ND96ASR, ALL_CPUS)
        assert topo.source == "catalog"
        assert topo.numa_order == (2, 3, 0, 1, 6, 7, 4, 5)
        assert "catalog" in topo.notes[0]

    def test_catalog_not_used_when_its_cpus_are_missing(self, tmp_path):
        """A 2-core machine cannot be an ND96asr_v4: the catalog map is refused, with the reason."""
        root = build_nd96asr_sysfs(tmp_path / "sys", numa_known=False)
        topo = topology.discover(root, ND96ASR, frozenset({0, 1}))
        assert topo.source == "none"
        assert "2-95" in topo.notes[0]

    def test_catalog_used_without_pci_tree(self, tmp_path):
        """No /sys/bus/pci at all (a locked-down container): the catalog's map applies."""
        topo = topology.discover(tmp_path / "empty", ND96ASR, ALL_CPUS)
        assert topo.source == "catalog" and topo.numa_order == (2, 3, 0, 1, 6, 7, 4, 5)

    def test_no_gpus(self, tmp_path):
        """A PCI tree without NVIDIA GPUs (a CPU machine): nothing to pin, said plainly."""
        _device(tmp_path, "0000:00:00.0", "0x8086", "0x060000", -1, "0-1")
        topo = topology.discover(tmp_path, ND96ASR, ALL_CPUS)
        assert topo.source == "none" and topo.gpus == ()
        assert "no GPU on the PCI bus" in topo.notes[0]

    def test_amd_instinct_gpus_are_found(self, tmp_path):
        """MI300X GPUs are AMD processing accelerators (class 0x1200) in two NUMA domains, as the
        catalog's MI300X map has them; AMD's other platform functions (0x1080) are not GPUs, and
        asking for one vendor leaves the other's out."""
        mi300x = parse_sku_facts(json.dumps(dataclasses.asdict(skus.get("Standard_ND96isr_MI300X_v5"))))
        for gpu in range(8):
            _device(tmp_path, f"{gpu + 1:04x}:00:00.0", "0x1002", "0x120000", gpu // 4, "0-47" if gpu < 4 else "48-95")
        _device(tmp_path, "0000:c1:00.1", "0x1002", "0x108000", 0, "0-47")
        _device(tmp_path, "0000:c2:00.0", "0x10de", "0x030200", 1, "48-95")
        assert [g.pci_address for g in topology.sysfs_gpus(tmp_path, "amd")] == [f"{g + 1:04x}:00:00.0" for g in range(8)]
        assert [g.pci_address for g in topology.sysfs_gpus(tmp_path, "nvidia")] == ["0000:c2:00.0"]
        assert len(topology.sysfs_gpus(tmp_path)) == 9
        topo = topology.discover(tmp_path, mi300x, ALL_CPUS)
        assert topo.source == "sysfs" and len(topo.gpus) == 8 and not topo.notes

    def test_gpu_count_mismatch_is_noted(self, tmp_path):
        """Seven GPUs where the size has eight: pinning goes on, the note says what is missing."""
        root = build_nd96asr_sysfs(tmp_path / "sys", gpus=7)
        topo = topology.discover(root, ND96ASR, ALL_CPUS)
        assert topo.source == "sysfs"
        assert "7 GPU(s) but Standard_ND96asr_v4 has 8" in topo.notes[0]


class TestPlan:
    def test_eight_ranks_two_per_numa_domain(self, nd96asr):
        """Rank r drives CUDA device r = physical GPU order[r] and runs on that GPU's domain."""
        plan = topology.plan_pinning(topology.discover(nd96asr, ND96ASR, ALL_CPUS), 8, ALL_CPUS)
        assert plan.cuda_visible_devices == "2,3,0,1,6,7,4,5"
        assert [r.gpu_indices for r in plan.ranks] == [(2,), (3,), (0,), (1,), (6,), (7,), (4,), (5,)]
        # The NDv4 performance article's srun masks ffffff, ffffff000000, ffffff + 12 and 18 zeros:
        # NUMA domains 0-3 are CPUs 0-23, 24-47, 48-71 and 72-95.
        cpus = [topology.format_cpulist(r.cpus) for r in plan.ranks]
        numa0, numa1, numa2, numa3 = "0-23", "24-47", "48-71", "72-95"
        assert cpus == [numa0, numa0, numa1, numa1, numa2, numa2, numa3, numa3]
        assert [r.numa_nodes for r in plan.ranks] == [(0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,)]
        assert plan.ranks[0].hcas == ("mlx5_ib2", "mlx5_ib3")

    def test_four_ranks_take_two_gpus_each(self, nd96asr):
        """Four local ranks on eight GPUs: one NUMA domain (two GPUs) per rank."""
        plan = topology.plan_pinning(topology.discover(nd96asr, ND96ASR, ALL_CPUS), 4, ALL_CPUS)
        assert [r.gpu_indices for r in plan.ranks] == [(2, 3), (0, 1), (6, 7), (4, 5)]
        assert topology.format_cpulist(plan.ranks[1].cpus) == "24-47"

    def test_uneven_ranks_are_not_pinned(self, nd96asr):
        """Three ranks cannot split eight GPUs: no per-rank pinning, and the note says why."""
        plan = topology.plan_pinning(topology.discover(nd96asr, ND96ASR, ALL_CPUS), 3, ALL_CPUS)
        assert plan.ranks == ()
        assert any("3 local ranks" in n for n in plan.notes)

    def test_existing_cuda_visible_devices_is_respected(self, nd96asr):
        """A scheduler's CUDA_VISIBLE_DEVICES keeps its order; CPUs follow the GPUs it names."""
        plan = topology.plan_pinning(topology.discover(nd96asr, ND96ASR, ALL_CPUS), 2, ALL_CPUS, "4,5")
        assert plan.cuda_visible_devices is None
        assert [r.gpu_indices for r in plan.ranks] == [(4,), (5,)]
        assert topology.format_cpulist(plan.ranks[0].cpus) == "72-95"

    def test_uuid_cuda_visible_devices_is_left_alone(self, nd96asr):
        plan = topology.plan_pinning(topology.discover(nd96asr, ND96ASR, ALL_CPUS), 1, ALL_CPUS, "GPU-8d1f")
        assert plan.ranks == () and plan.cuda_visible_devices is None
        assert "GPU-8d1f" in plan.notes[-1]

    def test_cpus_outside_this_process_are_dropped(self, nd96asr):
        """Only CPUs this process may use are kept; a rank left with none is noted, not pinned."""
        allowed = frozenset(range(12))
        plan = topology.plan_pinning(topology.discover(nd96asr, ND96ASR, allowed), 8, allowed)
        assert topology.format_cpulist(plan.ranks[0].cpus) == "0-11"
        assert plan.ranks[2].cpus == frozenset()
        assert any("local rank 2" in n for n in plan.notes)

    def test_no_gpus_no_plan(self, tmp_path):
        plan = topology.plan_pinning(topology.discover(tmp_path, None, ALL_CPUS), 2, ALL_CPUS)
        assert plan.ranks == () and plan.cuda_visible_devices is None


class TestApply:
    def test_sets_affinity_and_environment(self, nd96asr):
        """Local rank 3 gets GPU order and PCI bus numbering, and the CPUs of NUMA1."""
        calls = []
        plan = topology.plan_pinning(topology.discover(nd96asr, ND96ASR, ALL_CPUS), 8, ALL_CPUS)
        applied = topology.apply_pinning(plan, 3, {}, set_affinity=lambda pid, cpus: calls.append((pid, cpus)))
        assert applied.env == {"CUDA_VISIBLE_DEVICES": "2,3,0,1,6,7,4,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        assert calls == [(0, set(range(24, 48)))]

    def test_nothing_applied_without_a_plan(self, tmp_path):
        calls = []
        plan = topology.plan_pinning(topology.discover(tmp_path, None, ALL_CPUS), 2, ALL_CPUS)
        applied = topology.apply_pinning(plan, 0, {}, set_affinity=lambda *a: calls.append(a))
        assert applied.env == {} and calls == [] and applied.cpus == frozenset()

    def test_real_affinity_is_inherited_by_a_child(self, tmp_path):
        """A real sched_setaffinity: the process and the command it starts run on CPU 0 only."""
        root = tmp_path / "sys"
        _device(root, "0001:00:00.0", "0x10de", "0x030200", 0, "0")
        script = (
            "import os, subprocess, sys\n"
            "from pathlib import Path\n"
            "from amlhpc.jobs.runtime.node import topology as t\n"
            "avail = frozenset(os.sched_getaffinity(0))\n"
            f"plan = t.plan_pinning(t.discover(Path({str(root)!r}), None, avail), 1, avail)\n"
            "t.apply_pinning(plan, 0, os.environ)\n"
            "child = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],"
            " capture_output=True, text=True, check=True)\n"
            "print(child.stdout.strip())\n"
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parents[1])
        assert out.stdout.strip() == "[0]"


class TestCli:
    def test_prints_plan(self, nd96asr, capsys, monkeypatch):
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setenv("AMLHPC_SKU_JSON", json.dumps(dataclasses.asdict(skus.get("Standard_ND96asr_v4"))))
        assert topology.main(["--sysfs", str(nd96asr), "--local-world-size", "8"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert len(out["gpus"]) == 8
        assert out["plan"]["cudaVisibleDevices"] == "2,3,0,1,6,7,4,5"
        assert out["plan"]["source"] == "sysfs"

    def test_bad_sku_json_exits_2(self, nd96asr, capsys, monkeypatch):
        monkeypatch.setenv("AMLHPC_SKU_JSON", "{not json")
        assert topology.main(["--sysfs", str(nd96asr)]) == 2
        err = capsys.readouterr().err
        assert "AMLHPC_SKU_JSON" in err and "not valid JSON" in err and "fix:" in err
