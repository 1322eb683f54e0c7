"""jobs.deepspeed: parameter count, 20 B/param model states, ZeRO stage choice, ds_config."""

from __future__ import annotations

from core import skus
from jobs import deepspeed as ds
from jobs.recipes.schema import DeepSpeedSpec, ModelShape

BERT_LARGE = ModelShape(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096, seq_len=128)


def spec(**kwargs) -> DeepSpeedSpec:
    return DeepSpeedSpec(model=kwargs.pop("model", BERT_LARGE), **kwargs)


def test_bert_large_parameter_count():
    """BERT-large is the 0.34B model of the tables of Azure's large-scale training guide."""
    assert 330e6 < ds.param_count(BERT_LARGE) < 345e6


def test_twenty_bytes_per_parameter_without_zero():
    assert ds.model_state_bytes_per_gpu(1_000_000, stage=0, world=8) == 20_000_000


def test_zero_partitions_shrink_states():
    p, w = 1_000_000_000, 16
    s = [ds.model_state_bytes_per_gpu(p, st, w) for st in (0, 1, 2, 3)]
    assert s[0] > s[1] > s[2] > s[3]
    assert s[3] == 20 * p / w


def test_stage_by_size_table():
    """Azure's large-scale training guide: < 300M: 0, < 1B: 1, < 10B: 2, else 3."""
    assert [ds.stage_by_size(n) for n in (100e6, 299e6, 300e6, 999e6, 5e9, 20e9)] == [0, 0, 1, 1, 2, 3]


def test_stage_raised_until_it_fits_and_offload_last():
    """A 6.7B model on 8 x V100 16 GB: stage 2 by size would not fit; stage 3, then offload."""
    big = ModelShape(hidden_size=4096, num_layers=32, num_heads=32, seq_len=512)
    plan = ds.plan_memory(spec(model=big, micro_batch=1, activation_checkpointing=True), skus.get("Standard_NC24rs_v3"), world=4)
    assert plan.stage == 3 and plan.offload
    roomy = ds.plan_memory(spec(model=big, micro_batch=1, activation_checkpointing=True), skus.get("Standard_ND96isr_H100_v5"), world=64)
    assert roomy.stage == 2 and not roomy.offload and roomy.fits


def test_ds_config_precision_follows_gpu():
    v100 = skus.get("Standard_ND40rs_v2")
    plan = ds.plan_memory(spec(), v100, 16)
    config = ds.ds_config(spec(flops_profiler=True), v100, plan)
    assert config["fp16"]["enabled"] and "bf16" not in config
    assert config["train_batch_size"] == 8 * 1 * 16
    assert config["tensorboard"]["enabled"] and config["flops_profiler"]["enabled"]
    a100 = skus.get("Standard_ND96asr_v4")
    assert ds.ds_config(spec(tensorboard=False), a100, ds.plan_memory(spec(), a100, 8))["bf16"] == {"enabled": True}


def test_autotune_space_only_feasible():
    a100 = skus.get("Standard_ND96asr_v4")
    space = ds.autotune_space(spec(), a100, 16)
    assert space and all(c["grad_accum"] in (1, 2) for c in space)
    usable = a100.gpu_memory_gib * ds.USABLE_GPU_MEMORY_FRACTION
    for c in space:
        total = (ds.model_state_bytes_per_gpu(ds.param_count(BERT_LARGE), c["stage"], 16)
                 + ds.activation_bytes_per_gpu(BERT_LARGE, c["micro_batch"], False)) / ds.GIB
        assert total <= usable
    assert max(c["micro_batch"] for c in space) < 512  # the memory model stops before OOM
