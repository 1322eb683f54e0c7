"""jobs.tuning and jobs.scale: per-SKU environment and scaling arithmetic (pure)."""

from __future__ import annotations

import json

import pytest

from core import skus
from core.errors import UserError
from jobs import scale, tuning


@pytest.mark.parametrize("name", [n for n in skus.names() if skus.get(n).infiniband])
def test_every_ib_size_gets_rdma_settings_never_ib_disable(name):
    t = tuning.tune(skus.get(name), 4, "pytorch", {"NCCL_IB_DISABLE": "1"})
    assert t.env["NCCL_IB_PCI_RELAXED_ORDERING"] == "1" and t.env["OMPI_MCA_coll_hcoll_enable"] == "0"
    assert "NCCL_IB_DISABLE" not in t.env and t.warnings
    assert ("NCCL_TOPO_FILE" in t.env) == bool(skus.get(name).nccl_topo_file)


def test_sku_json_is_the_catalog_record():
    record = json.loads(tuning.sku_json(skus.get("Standard_ND96asr_v4")))
    assert record["gpus"] == 8 and [d["gpu_ids"] for d in record["numa"]] == [[2, 3], [0, 1], [6, 7], [4, 5]]
    assert skus.get("Standard_ND96asr_v4").gpu_order == (2, 3, 0, 1, 6, 7, 4, 5)


def test_recipe_value_wins_with_warning():
    t = tuning.tune(skus.get("Standard_ND96asr_v4"), 2, "pytorch", {"NCCL_DEBUG": "WARN"})
    assert t.env["NCCL_DEBUG"] == "WARN" and any("recipe wins" in w for w in t.warnings)


def test_multi_node_without_ib_refused():
    with pytest.raises(UserError) as info:
        tuning.check_multi_node(skus.get("Standard_NC24s_v3"), 2, "nc", False, "recipe")
    assert "--allow-tcp" in info.value.render()
    tuning.check_multi_node(skus.get("Standard_NC24s_v3"), 2, "nc", True, "recipe")
    tuning.check_multi_node(skus.get("Standard_NC24s_v3"), 1, "nc", False, "recipe")


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
