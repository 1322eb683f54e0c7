"""amlhpc.jobs.plan.deepspeed and `jobs deepspeed-plan`: model states per GPU held against DeepSpeed's own
estimators, the ZeRO stage and offload choice, ds_config.

Reference: deepspeedai/DeepSpeed version 0.19.6 (commit edaa722, 2026-08-22),
deepspeed/runtime/zero/stage_1_and_2.py `estimate_zero2_model_states_mem_needs` and
deepspeed/runtime/zero/stage3.py `estimate_zero3_model_states_mem_needs`. The functions
below restate their GPU-memory formulas as DeepSpeed documents them (integer division as
DeepSpeed rounds), independently of amlhpc/jobs/plan/deepspeed.py, so the test compares two derivations.
DeepSpeed has no stage-1 estimator: stage 1 is derived from the byte breakdown in the
stage-2 estimator's own comment (2 bytes of 16-bit parameters; 2 of 16-bit gradients, 4 of
32-bit gradients, 4 of 32-bit parameters, 8 of Adam moments) with the 16-bit gradients left
whole, as deepspeed/runtime/engine.py builds stage 1 with partition_grads false.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from amlhpc.core import skus
from amlhpc.jobs.cli.main import app
from amlhpc.jobs.plan import deepspeed as ds
from amlhpc.jobs.recipes.schema import DeepSpeedSpec, ModelShape

BERT_LARGE = ModelShape(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096, seq_len=128)
GIB = 2 ** 30


def deepspeed_zero2_gpu_bytes(total_params: int, total_gpus: int, cpu_offload: bool) -> int:
    """estimate_zero2_model_states_mem_needs: 2P with the optimizer on the CPU, else 2P + int(18P/N)."""
    return int(2 * total_params) if cpu_offload else int(2 * total_params + int(18 * total_params / total_gpus))


def deepspeed_zero1_gpu_bytes(total_params: int, total_gpus: int, cpu_offload: bool) -> int:
    """Stage 1: 2P parameters + 2P whole 16-bit gradients, + int(16P/N) partitioned unless offloaded."""
    return int(4 * total_params) if cpu_offload else int(4 * total_params + int(16 * total_params / total_gpus))


def deepspeed_zero3_gpu_bytes(total_params: int, largest_layer: int, total_gpus: int, cpu_offload: bool,
                              cpu_offload_params: bool) -> int:
    """estimate_zero3_model_states_mem_needs: 4L, 4L + int(2P/N), or 4L + int(18P/N)."""
    if cpu_offload and cpu_offload_params:
        return 4 * largest_layer
    if cpu_offload:
        return 4 * largest_layer + int(2 * total_params / total_gpus)
    return 4 * largest_layer + int(18 * total_params / total_gpus)


# Model sizes from 125M to 70B with a largest layer of vocab x hidden (GPT-style shapes).
MODELS = {"125M": (125_000_000, 50_257 * 768), "1.3B": (1_300_000_000, 50_257 * 2048),
          "6.7B": (6_700_000_000, 50_257 * 4096), "13B": (13_000_000_000, 50_257 * 5120),
          "30B": (30_000_000_000, 50_257 * 7168), "70B": (70_000_000_000, 32_000 * 8192)}


def reference(params: int, layer: int, gpus: int, stage: int, offload_optimizer: bool, offload_param: bool) -> int:
    if stage == 0:
        return deepspeed_zero2_gpu_bytes(params, 1, False)  # nothing partitioned: one "GPU" holds it all
    if stage == 1:
        return deepspeed_zero1_gpu_bytes(params, gpus, offload_optimizer)
    if stage == 2:
        return deepspeed_zero2_gpu_bytes(params, gpus, offload_optimizer)
    return deepspeed_zero3_gpu_bytes(params, layer, gpus, offload_optimizer, offload_param)


@pytest.mark.parametrize("gpus", [8, 32])
@pytest.mark.parametrize("model", list(MODELS))
def test_deepspeed_plan_json_within_5_percent_of_deepspeeds_estimators(model, gpus):
    params, layer = MODELS[model]
    result = CliRunner().invoke(app, ["deepspeed-plan", "--params", str(params), "--largest-layer", str(layer),
                                      "--gpus", str(gpus), "--gpu-gib", "80", "--json"])
    assert result.exit_code in (0, 1), result.output
    document = json.loads(result.stdout)
    seen = set()
    for option in document["options"]:
        assert set(option) == {"stage", "offload_optimizer", "offload_param", "gib_per_gpu"}
        key = (option["stage"], option["offload_optimizer"], option["offload_param"])
        expected = reference(params, layer, gpus, *key) / GIB
        assert option["gib_per_gpu"] == pytest.approx(expected, rel=0.05, abs=0.002), key
        seen.add(key)
    assert seen == {(0, False, False), (1, False, False), (1, True, False), (2, False, False), (2, True, False),
                    (3, False, False), (3, True, False), (3, True, True)}


def test_stage_2_is_two_plus_eighteen_over_n_bytes_per_parameter():
    p = 1_000_000_000
    assert ds.model_state_bytes_per_gpu(p, 2, 8) == pytest.approx((2 + 18 / 8) * p)
    assert ds.model_state_bytes_per_gpu(p, 0, 8) == 20 * p


@pytest.mark.parametrize("gpus", [2, 8, 64])
def test_stage_1_keeps_the_whole_16_bit_gradient_so_it_needs_2p_times_1_minus_1_over_n_more_than_stage_2(gpus):
    """ZeRO-1 partitions only the optimizer states: the 16-bit gradients (2 bytes per parameter)
    stay whole on every GPU, which stage 2's 2P + 18P/N leaves out."""
    p = 1_000_000_000
    stage1 = ds.model_state_bytes_per_gpu(p, 1, gpus)
    stage2 = ds.model_state_bytes_per_gpu(p, 2, gpus)
    assert stage1 == pytest.approx((4 + 16 / gpus) * p)
    assert stage1 - stage2 == pytest.approx(2 * p * (1 - 1 / gpus))
    assert ds.model_state_bytes_per_gpu(p, 1, gpus, offload_optimizer=True) == 4 * p


def test_70b_on_8_a100_40gb_fits_with_zero3_optimizer_offload():
    """The case the old estimate called impossible: DeepSpeed puts it at 4L + 2P/N (~17 GiB)."""
    params, layer = MODELS["70B"]
    document = CliRunner().invoke(app, ["deepspeed-plan", "--params", "70B", "--largest-layer", str(layer),
                                        "--gpus", "8", "--gpu-gib", "40", "--json"])
    choice = json.loads(document.stdout)["choice"]
    assert (choice["stage"], choice["offload_optimizer"], choice["offload_param"]) == (3, True, False)
    assert choice["gib_per_gpu"] == pytest.approx(deepspeed_zero3_gpu_bytes(params, layer, 8, True, False) / GIB, rel=1e-3)
    assert 16 < choice["gib_per_gpu"] < 18.5


def test_zero_offload_at_stage_2_when_stage_3_is_not_wanted():
    """A 1.3B model on one 16 GB GPU: stages 0-2 do not fit; ZeRO-Offload (stage 2) does."""
    params, layer = MODELS["1.3B"]
    document = ds.choose(ds.options(params, layer, 1), 16 * 0.9 * GIB, min_stage=1)[0]
    assert (document.stage, document.offload_optimizer) == (2, True)


def test_plan_prints_a_table_and_exits_1_when_nothing_fits():
    result = CliRunner().invoke(app, ["deepspeed-plan", "--params", "70B", "--largest-layer", "8B", "--gpus", "8",
                                      "--gpu-gib", "16"])
    assert result.exit_code == 1 and "no option fits" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--params", "seventy", "--largest-layer", "1M", "--gpus", "8", "--gpu-gib", "40"], "--params: 'seventy' is not a positive"),
    (["--params", "1B", "--largest-layer", "2B", "--gpus", "8", "--gpu-gib", "40"], "--largest-layer"),
    (["--params", "1B", "--largest-layer", "1M", "--gpus", "0", "--gpu-gib", "40"], "--gpus: 0 is out of range"),
])
def test_bad_input_exits_2_with_the_flag_named(args, message):
    result = CliRunner().invoke(app, ["deepspeed-plan", *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def spec(**kwargs) -> DeepSpeedSpec:
    return DeepSpeedSpec(model=kwargs.pop("model", BERT_LARGE), **kwargs)


def test_bert_large_parameter_count():
    """BERT-large is the 0.34B model of the tables of Azure's large-scale training guide."""
    assert 330e6 < ds.param_count(BERT_LARGE) < 345e6
    assert ds.largest_layer(BERT_LARGE) == 30522 * 1024  # the word embeddings


def test_stage_by_size_table():
    """Azure's large-scale training guide: < 300M: 0, < 1B: 1, < 10B: 2, else 3."""
    assert [ds.stage_by_size(n) for n in (100e6, 299e6, 300e6, 999e6, 5e9, 20e9)] == [0, 0, 1, 1, 2, 3]


def test_stage_raised_until_it_fits_and_offload_last():
    """A 6.7B model on 4 x V100 16 GB: stage 2 by size would not fit, stage 3 neither; ZeRO-Offload
    at stage 2 (2 bytes per parameter on the GPU) does, before any stage 3 offload."""
    big = ModelShape(hidden_size=4096, num_layers=32, num_heads=32, seq_len=512)
    plan = ds.plan_memory(spec(model=big, micro_batch=1, activation_checkpointing=True), skus.get("Standard_NC24rs_v3"), world=4)
    assert (plan.stage, plan.offload_optimizer, plan.offload_param) == (2, True, False) and plan.fits
    assert any("ZeRO 3: " in r and "would not fit" in r for r in plan.reasons)
    roomy = ds.plan_memory(spec(model=big, micro_batch=1, activation_checkpointing=True), skus.get("Standard_ND96isr_H100_v5"), world=64)
    assert roomy.stage == 2 and not roomy.offload and roomy.fits


def test_recipe_stage_1_gets_zero_offload_when_it_does_not_fit():
    big = ModelShape(hidden_size=4096, num_layers=32, num_heads=32, seq_len=512)
    plan = ds.plan_memory(spec(model=big, micro_batch=1, activation_checkpointing=True, zero_stage=1),
                          skus.get("Standard_ND96asr_v4"), world=4)
    assert plan.stage == 1 and plan.offload_optimizer and not plan.offload_param
    config = ds.ds_config(spec(model=big, zero_stage=1), skus.get("Standard_ND96asr_v4"), plan)
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}


def test_ds_config_precision_follows_gpu_and_no_partition_activations():
    v100 = skus.get("Standard_ND40rs_v2")
    plan = ds.plan_memory(spec(), v100, 16)
    config = ds.ds_config(spec(flops_profiler=True, activation_checkpointing=True), v100, plan)
    assert config["fp16"]["enabled"] and "bf16" not in config
    assert config["train_batch_size"] == 8 * 1 * 16
    assert config["tensorboard"]["enabled"] and config["flops_profiler"]["enabled"]
    assert "partition_activations" not in config["activation_checkpointing"]  # no model parallelism
    a100 = skus.get("Standard_ND96asr_v4")
    assert ds.ds_config(spec(tensorboard=False), a100, ds.plan_memory(spec(), a100, 8))["bf16"] == {"enabled": True}


def test_autotune_space_only_feasible():
    a100 = skus.get("Standard_ND96asr_v4")
    space = ds.autotune_space(spec(), a100, 16)
    assert space and all(c["grad_accum"] in (1, 2) for c in space)
    usable = a100.gpu_memory_gib * ds.USABLE_GPU_MEMORY_FRACTION
    for c in space:
        total = (ds.model_state_bytes_per_gpu(ds.param_count(BERT_LARGE), c["stage"], 16,
                                              largest_layer_params=ds.largest_layer(BERT_LARGE))
                 + ds.activation_bytes_per_gpu(BERT_LARGE, c["micro_batch"], False)) / ds.GIB
        assert total <= usable
    assert max(c["micro_batch"] for c in space) < 512


def deepspeed_cpu_bytes(params: int, layer: int, per_node: int, nodes: int, stage: int, offload_optimizer: bool,
                        offload_param: bool) -> float:
    """The estimators' cpu_mem (additional_buffer_factor 1.5; stage 3 with zero_init)."""
    gpus = per_node * nodes
    if stage == 3:
        if offload_optimizer and offload_param:
            return params * 18 * (1 / nodes) * 1.5
        if offload_optimizer:
            return params * 16 * (1 / nodes) * 1.5
        return layer * 4 * per_node * 1.5
    if offload_optimizer:
        return params * max(4 * gpus, 16) * 1.5
    return params * 4 * per_node * 1.5


@pytest.mark.parametrize("per_node, nodes", [(4, 1), (4, 18), (8, 2), (1, 1)])
@pytest.mark.parametrize("model", ["1.3B", "13B", "70B"])
def test_host_memory_per_node_is_deepspeeds_cpu_estimate(model, per_node, nodes):
    params, layer = MODELS[model]
    for option in ds.options(params, layer, per_node * nodes, per_node):
        expected = deepspeed_cpu_bytes(params, layer, per_node, nodes, option.stage, option.offload_optimizer,
                                       option.offload_param)
        assert option.host_bytes_per_node == pytest.approx(expected), option.label


def test_an_offload_the_nodes_memory_cannot_hold_is_not_chosen():
    """12.8B parameters on one NC40ads H100 v5 (one 94 GiB GPU, 320 GiB of host memory): the
    GPU alone cannot hold stage 3's states, and offloading the optimizer needs 16P x 1.5 = 286
    GiB of host memory, which fits; on a node with 64 GiB the same plan could not offload."""
    shape = ModelShape(hidden_size=5120, num_layers=40, num_heads=40, intermediate_size=20480, seq_len=128)
    spec = DeepSpeedSpec(model=shape, micro_batch=1, activation_checkpointing=True)
    nc40 = skus.get("Standard_NC40ads_H100_v5")
    plan = ds.plan_memory(spec, nc40, 1)
    assert plan.offload_optimizer and plan.host_memory_gib == nc40.memory_gib
    assert plan.host_gib_per_node <= nc40.memory_gib and plan.fits
    import dataclasses

    small = dataclasses.replace(nc40, memory_gib=64)
    squeezed = ds.plan_memory(spec, small, 1)
    assert any("of host memory per node would not fit in the node's 64 GiB" in r for r in squeezed.reasons)
    assert not squeezed.fits
