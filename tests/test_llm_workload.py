"""The LLM workload: model FLOPs against torch's own counter, shapes against the published
parameter counts, sizing from the catalog's GPU memory, peak FLOP/s from the catalog, and a
real two-rank FSDP2 run over gloo that logs tokens/s and MFU every step and resumes from its
DCP checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core import skus  # noqa: E402
from jobs import tuning  # noqa: E402
from jobs.runtime.skufacts import parse_sku_facts  # noqa: E402
from jobs.workloads.llm import checkpointing, data, sizing, throughput  # noqa: E402
from jobs.workloads.llm.model import ModelConfig, Transformer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class TestFlops:
    @pytest.mark.parametrize("cfg", [
        ModelConfig("gqa", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_dim=192),
        ModelConfig("mha", dim=96, n_layers=3, n_heads=6, n_kv_heads=6, vocab_size=300, ffn_dim=256),
        ModelConfig("tied", dim=64, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=256, ffn_dim=128, tie_embeddings=True),
    ], ids=lambda c: c.name)
    def test_formula_matches_torch_flop_counter(self, cfg):
        """6 x matmul params + 12 x L x H x Q x T per token equals what FlopCounterMode counts for
        one forward and backward (attention on the math kernels, which the counter sees on CPU)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.utils.flop_counter import FlopCounterMode

        seq, batch = 32, 3
        torch.manual_seed(0)
        model = Transformer(cfg, seq)
        model.init_weights()
        tokens = torch.randint(0, cfg.vocab_size, (batch, seq))
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            model(tokens, tokens).backward()
        assert counter.get_total_flops() == pytest.approx(cfg.flops_per_token(seq) * batch * seq, rel=1e-9)

    @pytest.mark.parametrize("name", sorted(sizing.PRESETS))
    def test_param_count_is_the_modules(self, name):
        cfg = sizing.PRESETS[name]
        with torch.device("meta"):
            model = Transformer(cfg, 16)
        assert sum(p.numel() for p in model.parameters()) == cfg.param_count()

    # Parameter counts Hugging Face shows for each model (model cards, read 2026-11-25).
    PUBLISHED = {"llama3.2-1b": 1.24e9, "llama3.2-3b": 3.21e9, "llama3.1-8b": 8.03e9, "llama2-13b": 13.0e9,
                 "codellama-34b": 33.7e9, "llama3.1-70b": 70.6e9}

    @pytest.mark.parametrize("name", sorted(PUBLISHED))
    def test_shapes_match_the_published_sizes(self, name):
        assert sizing.PRESETS[name].param_count() == pytest.approx(self.PUBLISHED[name], rel=0.005)


def _facts(name: str):
    return parse_sku_facts(tuning.sku_json(skus.get(name)))


class TestSizing:
    def test_h200_trains_a_larger_model_than_h100(self):
        """Two nodes of each: the catalog's 80 vs 141 GiB decide, not the size's name."""
        picks = {}
        for name in ("Standard_ND96isr_H100_v5", "Standard_ND96isr_H200_v5"):
            facts = _facts(name)
            picks[name], _ = sizing.choose(gpu_memory_gib=facts.gpu_memory_gib, world=2 * facts.gpus, micro_batch=1,
                                           seq_len=4096)
        assert picks["Standard_ND96isr_H100_v5"].name == "codellama-34b"
        assert picks["Standard_ND96isr_H200_v5"].name == "llama3.1-70b"

    def test_more_memory_never_means_a_smaller_model(self):
        """Every GPU size in the catalog (MI300X, GB200 and whatever is added), 2 nodes each."""
        picks = []
        for name in skus.names():
            sku = skus.get(name)
            if not sku.gpus or not sku.gpu_memory_gib:
                continue
            try:
                cfg, _ = sizing.choose(gpu_memory_gib=sku.gpu_memory_gib, world=16, micro_batch=1, seq_len=4096)
            except ValueError:
                cfg = None
            picks.append((sku.gpu_memory_gib, cfg.param_count() if cfg else 0, name))
        picks.sort()
        assert all(a[1] <= b[1] for a, b in zip(picks, picks[1:], strict=False)), picks

    def test_nothing_fits_names_what_to_change(self):
        with pytest.raises(ValueError, match=r"no model fits 8 GiB per GPU with 1 GPUs.*lower --seq-len"):
            sizing.choose(gpu_memory_gib=8, world=1, micro_batch=1, seq_len=4096)

    def test_estimate_parts(self):
        """16 bytes of states per parameter over the world, plus what does not shard."""
        cfg = sizing.PRESETS["llama3.1-8b"]
        one, eight = (sizing.estimate(cfg, gpu_memory_gib=80, world=w, micro_batch=1, seq_len=4096) for w in (1, 8))
        assert one.states_gib == pytest.approx(16 * cfg.param_count() / sizing.GIB)
        assert eight.states_gib == pytest.approx(one.states_gib / 8)
        assert eight.activations_gib == one.activations_gib and not one.fits and eight.fits


class TestPeak:
    def test_catalog_peak_for_the_dtype(self):
        peak, why = throughput.catalog_peak(_facts("Standard_ND96isr_H100_v5"), "bf16")
        assert peak.tflops == skus.get("Standard_ND96isr_H100_v5").peak_tflops_bf16 and not why
        assert "Standard_ND96isr_H100_v5" in peak.source and "peak_tflops_bf16" in peak.source
        fp8, _ = throughput.catalog_peak(_facts("Standard_ND96isr_H100_v5"), "fp8")
        assert fp8.tflops == skus.get("Standard_ND96isr_H100_v5").peak_tflops_fp8 > peak.tflops

    def test_no_peak_for_another_dtype(self):
        """V100 has no bf16 tensor cores: the catalog gives it no bf16 figure, and an MFU
        against its fp16 figure would be invented."""
        peak, why = throughput.catalog_peak(_facts("Standard_ND40rs_v2"), "bf16")
        assert peak is None and "no peak bf16 TFLOP/s for Standard_ND40rs_v2" in why

    def test_step_rate(self):
        rate = throughput.step_rate(tokens=8192, seconds=2.0, devices=4, flops_per_token=1e9,
                                    peak=throughput.Peak(2.0, "test"))
        assert (rate.tokens_per_s, rate.tokens_per_s_per_device) == (4096, 1024)
        assert rate.tflops_per_device == pytest.approx(1.024) and rate.mfu == pytest.approx(0.512)


class TestData:
    def test_batches_are_a_function_of_step_and_rank(self):
        kwargs = {"world": 2, "micro_batch": 2, "grad_accum": 2, "seq_len": 40, "vocab": 1000, "seed": 3}
        a = data.batch(5, 1, rank=1, **kwargs)
        assert torch.equal(a[0], data.batch(5, 1, rank=1, **kwargs)[0])
        assert torch.equal(a[0][:, 1:], a[1][:, :-1]), "targets are the inputs shifted by one"
        seen = {tuple(data.batch(s, m, rank=r, **kwargs)[0][i].tolist()) for s in (1, 2) for m in (0, 1) for r in (0, 1)
                for i in (0, 1)}
        assert len(seen) == 16, "no sample repeats across steps, micro-batches and ranks"


def test_a_checkpoint_from_another_world_size_is_refused(tmp_path, monkeypatch):
    step = tmp_path / "step-000000004"
    step.mkdir()
    (step / "done-rank0.json").write_text(json.dumps({"step": 4, "world": 2}))
    monkeypatch.setenv("AMLHPC_CHECKPOINT_DIR", str(tmp_path))
    with pytest.raises(checkpointing.CheckpointMismatch, match="written by 2 ranks, this job has 1"):
        checkpointing._steps_held(0, 1)


def _torchrun(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           "-m", "jobs.workloads.llm.train", *args], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=300)


def test_two_ranks_fsdp_log_mfu_every_step_and_resume(tmp_path):
    """FSDP2 over gloo: each step's tokens/s and MFU, DCP shards per rank, then a resume that
    continues at the next step; the process group leaves no thread behind."""
    env = {"AMLHPC_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "AMLHPC_SKU_JSON": tuning.sku_json(skus.get("Standard_ND96isr_H100_v5"))}
    common = ["--model", "tiny", "--seq-len", "32", "--micro-batch", "2", "--warmup-steps", "1", "--lr", "3e-3",
              "--checkpoint-every", "2"]
    first = _torchrun([*common, "--steps", "4"], tmp_path, env)
    assert first.returncode == 0, first.stderr[-3000:]
    lines = [json.loads(line) for line in first.stdout.splitlines() if line.startswith("{")]
    header, steps = lines[0], [entry for entry in lines if "tokens_per_s" in entry]
    assert header["fsdp"] is True and header["world"] == 2 and header["model"]["name"] == "tiny"
    assert header["peak_source"].startswith("measured: best fp32"), "no catalog peak for a CPU"
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(s["tokens_per_s"] > 0 and 0 < s["mfu"] < 1 and s["tflops_per_device"] > 0 for s in steps)
    step_dirs = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert step_dirs == ["step-000000002", "step-000000004"]
    assert {p.name for p in (tmp_path / "ckpt" / "step-000000004").iterdir()} >= {
        ".metadata", "__0_0.distcp", "__1_0.distcp", "done-rank0.json", "done-rank1.json"}
    summary = json.loads((tmp_path / "outputs" / "aml-hpc" / "metrics.json").read_text())
    assert summary["workload"] == "llm-pretrain" and summary["throughput_unit"] == "tokens/s" and summary["mfu"] > 0
    assert "still running after destroy_process_group" not in first.stderr

    second = _torchrun([*common, "--steps", "6"], tmp_path, env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "step-000000004 (step 4)" in second.stdout
    resumed = [json.loads(line) for line in second.stdout.splitlines() if line.startswith('{"step"')]
    assert [s["step"] for s in resumed] == [5, 6]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000000004", "step-000000006"], "keep 2"
