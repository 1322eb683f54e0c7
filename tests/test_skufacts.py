"""AMLHPC_SKU_JSON: the catalog record as the job builder serialises it, read inside the job."""

from __future__ import annotations

import dataclasses
import json

import pytest

from amlhpc.core import skus
from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.node.skufacts import load_sku_facts, parse_sku_facts


def _doc(name: str) -> dict:
    return dataclasses.asdict(skus.get(name))


@pytest.mark.parametrize("name", skus.names())
def test_every_catalog_size_round_trips(name):
    """Each runtime field equals the catalog's, so the runtime never re-types a figure."""
    sku = skus.get(name)
    facts = parse_sku_facts(json.dumps(_doc(name)))
    assert (facts.name, facts.gpus, facts.vcpus, facts.gpu_gemm_dtype) == (sku.name, sku.gpus, sku.vcpus, sku.gpu_gemm_dtype)
    assert facts.gpu_peak_dense_tflops == sku.gpu_peak_dense_tflops
    assert (facts.ib_hcas, facts.ib_gbits_per_s_per_hca, facts.ib_generation) == (sku.ib_hcas, sku.ib_gbits_per_s_per_hca, sku.ib_generation)
    assert facts.storage_nic_gbits_per_s == sku.storage_nic_gbits_per_s
    for field in dataclasses.fields(facts.health):
        if field.name == "multinode":
            assert [(b.scope, b.busbw_gbytes_per_s, b.sharp, b.message_bytes) for b in facts.health.multinode] == \
                [(b.scope, b.busbw_gbytes_per_s, b.sharp, b.message_bytes) for b in sku.health.multinode]
            continue
        assert getattr(facts.health, field.name) == getattr(sku.health, field.name), field.name
    if sku.numa is None:
        assert facts.numa is None
    else:
        assert [(d.node, d.cpulist, d.gpu_ids) for d in facts.numa] == [(d.node, d.cpulist, d.gpu_ids) for d in sku.numa]


def test_unknown_keys_are_ignored():
    """A newer catalog with extra fields still works in an older image."""
    doc = _doc("Standard_ND96asr_v4") | {"future_field": 1}
    assert parse_sku_facts(json.dumps(doc)).name == "Standard_ND96asr_v4"


def test_unset_means_unknown():
    assert load_sku_facts({}) is None
    assert load_sku_facts({"AMLHPC_SKU_JSON": "  "}) is None


def test_missing_required_keys_are_all_named():
    with pytest.raises(RuntimeInputError) as info:
        parse_sku_facts("{}")
    text = info.value.render()
    assert "AMLHPC_SKU_JSON: name: is missing" in text
    assert "AMLHPC_SKU_JSON: gpus: is missing" in text
    assert "fix: the job builder sets it from amlhpc/core/catalog/skus.toml" in text


def test_wrong_types_name_key_and_value():
    doc = _doc("Standard_ND96asr_v4")
    doc["gpus"] = "8"
    doc["gpu_gemm_dtype"] = "fp8"
    doc["health"]["h2d_gbytes_per_s_min"] = "fast"
    doc["health"]["gemm_tflops"] = [250.0, 260.0, 270.0]
    doc["health"]["nccl_multinode_busbw_gbytes_per_s"] = [300, 400, 450]
    doc["numa"][1]["gpu_ids"] = "0,1"
    with pytest.raises(RuntimeInputError) as info:
        parse_sku_facts(json.dumps(doc))
    problems = {p.path: p.message for p in info.value.problems}
    assert problems["gpus"] == "must be an integer, got '8'"
    assert "fp8" in problems["gpu_gemm_dtype"] and "bf16, fp16" in problems["gpu_gemm_dtype"]
    assert problems["health.h2d_gbytes_per_s_min"] == "must be a number, got 'fast'"
    assert "falling order" in problems["health.gemm_tflops"]
    assert "falling order" in problems["health.nccl_multinode_busbw_gbytes_per_s"]
    assert "list of integers" in problems["numa[1].gpu_ids"]
    assert len(problems) == 6


def test_not_json_and_not_an_object():
    with pytest.raises(RuntimeInputError, match="not valid JSON"):
        parse_sku_facts("Standard_ND96asr_v4")
    with pytest.raises(RuntimeInputError, match="must be a JSON object, got list"):
        parse_sku_facts("[1, 2]")


def test_negative_count_is_refused():
    doc = _doc("Standard_NC24s_v3") | {"ib_hcas": -1}
    with pytest.raises(RuntimeInputError, match="ib_hcas: must be >= 0"):
        parse_sku_facts(json.dumps(doc))


def test_gemm_tool_and_torch_mark_travel_with_the_size():
    h200 = parse_sku_facts(json.dumps(_doc("Standard_ND96isr_H200_v5"))).health
    assert h200.gemm_tool == "ubergemm" and h200.gemm_torch_tflops == (681.3, 657.5, 633.6)
    assert parse_sku_facts(json.dumps(_doc("Standard_ND96asr_v4"))).health.gemm_tool == "torch"


def test_a_job_built_before_gemm_tool_reads_azures_baseline_as_ubergemm():
    doc = _doc("Standard_ND96isr_H100_v5")
    del doc["health"]["gemm_tool"]
    assert parse_sku_facts(json.dumps(doc)).health.gemm_tool == "ubergemm"


def test_a_bad_gemm_tool_names_the_key():
    doc = _doc("Standard_ND96isr_H100_v5")
    doc["health"]["gemm_tool"] = "cublas"
    doc["health"]["gemm_torch_tflops"] = [1, 2]
    with pytest.raises(RuntimeInputError) as info:
        parse_sku_facts(json.dumps(doc))
    problems = {p.path: p.message for p in info.value.problems}
    assert "torch, ubergemm" in problems["health.gemm_tool"] and "cublas" in problems["health.gemm_tool"]
    assert "3 numbers" in problems["health.gemm_torch_tflops"]
