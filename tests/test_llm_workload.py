"""The LLM workload: model FLOPs against torch's own counter, shapes against the published
parameter counts, sizing from the catalog's GPU memory, peak FLOP/s from the catalog, and real
two-rank FSDP2 runs over gloo (the recipe's local profile: the tiny shape, deterministic
kernels) that log tokens/s and MFU every step and checkpoint with common.save_state: a resume
logs the uninterrupted run's losses bit for bit, a version of 2 ranks loads into 1 with the
same model and optimizer state, a forged `.metadata` is refused without running, and the
rehearsal (`jobs run llm-pretrain --local`) restarts a crashed rank inside the job and leaves
records `jobs report` reads MFU and tokens/s from."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from amlhpc.core import skus  # noqa: E402
from amlhpc.jobs import recipes  # noqa: E402
from amlhpc.jobs.plan import tuning  # noqa: E402
from amlhpc.jobs.runtime.base import contract  # noqa: E402
from amlhpc.jobs.runtime.node.skufacts import parse_sku_facts  # noqa: E402
from amlhpc.jobs.workloads.llm import data, sizing, throughput  # noqa: E402
from amlhpc.jobs.workloads.llm.model import ModelConfig, Transformer  # noqa: E402
from tests.jobs_helpers import outputs_file  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRAIN = "amlhpc.jobs.workloads.llm.train"
PROFILE = recipes.load("llm-pretrain", local=True).command.split(f"-m {TRAIN}", 1)[1].split()
"""The local profile's arguments: the tiny shape, 8 steps, versions at 4 and 8, deterministic."""


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
    KW = {"micro_batch": 2, "seq_len": 40, "vocab": 1000, "seed": 3}

    def test_batches_follow_the_position_and_rank(self):
        ranks = [data.Position(rank=r, world=2, grad_accum=2, **self.KW) for r in (0, 1)]
        a = ranks[1].batch(1)
        assert torch.equal(a[0], ranks[1].batch(1)[0])
        assert torch.equal(a[0][:, 1:], a[1][:, :-1]), "targets are the inputs shifted by one"
        seen = set()
        for _ in range(2):
            seen |= {tuple(p.batch(m)[0][i].tolist()) for p in ranks for m in (0, 1) for i in (0, 1)}
            for p in ranks:
                p.step_done()
        assert len(seen) == 16, "no sample repeats across steps, micro-batches and ranks"

    def test_another_world_size_goes_on_with_the_same_samples(self):
        """2 ranks x 1 pass and 1 rank x 2 passes train step k on the same 4 samples."""
        two = [data.Position(rank=r, world=2, grad_accum=1, **self.KW) for r in (0, 1)]
        for p in two:
            p.step_done()
        one = data.Position(rank=0, world=1, grad_accum=2, **self.KW)
        one.load_state_dict(two[0].state_dict(), same_world=False)
        assert torch.equal(torch.cat([p.batch(0)[0] for p in two]), torch.cat([one.batch(m)[0] for m in (0, 1)]))


# --- real runs: FSDP2 over gloo, versioned checkpoints ---------------------------------------


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AMLHPC_")}
    return {**base, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


def torchrun(args: list[str], cwd: Path, env: dict[str, str], script: list[str] | None = None) -> subprocess.CompletedProcess:
    target = script or ["-m", TRAIN]
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           *target, *args], cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=300)


def step_lines(stdout: str) -> list[dict]:
    """Rank 0's metric lines, in order (a rehearsal's log has them as they are)."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"step"')]


def losses(stdout: str) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in step_lines(stdout)}


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> dict:
    """The local profile's run, uninterrupted, by torchrun: 2 ranks, versions at steps 4 and 8."""
    root = tmp_path_factory.mktemp("llm-whole")
    result = torchrun(PROFILE, root, {contract.CHECKPOINT_DIR: str(root / "ckpt"),
                                      contract.PROGRESS_FILE: str(root / "progress.json"),
                                      "AMLHPC_SKU_JSON": tuning.sku_json(skus.get("Standard_ND96isr_H100_v5"))})
    assert result.returncode == 0, result.stderr[-3000:]
    return {"root": root, "result": result, "losses": losses(result.stdout),
            "versions": root / "ckpt" / "versions"}


slow = pytest.mark.slow


@slow
def test_two_ranks_fsdp_log_mfu_every_step_and_write_versions(whole):
    """Each step's tokens/s and MFU; every rank's DTensor shards in a version of the tier; the
    completion report names this rank's part of the final version; no thread left behind."""
    result, versions = whole["result"], whole["versions"]
    header = json.loads(result.stdout.splitlines()[0])
    assert header["fsdp"] is True and header["world"] == 2 and header["model"]["name"] == "tiny"
    assert header["peak_source"].startswith("measured: best fp32"), "no catalog peak for a CPU"
    steps = step_lines(result.stdout)
    assert [s["step"] for s in steps] == list(range(1, 9))
    assert all(s["tokens_per_s"] > 0 and 0 < s["mfu"] < 1 and s["step_time_s"] > 0 for s in steps)
    assert sorted(p.name for p in versions.iterdir()) == ["step-000000004", "step-000000008"]
    assert {p.name for p in (versions / "step-000000008").iterdir()} == {"rank-0", "rank-1", "rank-0.json", "rank-1.json"}
    assert {p.name for p in (versions / "step-000000008" / "rank-1").iterdir()} == {".metadata", "__0_0.distcp",
                                                                                   "trainer.json", "blocks.json"}
    trainer = json.loads((versions / "step-000000004" / "rank-1" / "trainer.json").read_text())
    assert trainer["step"] == 4 and trainer["sampler"] == {"consumed": 16, "per_step": 4} and "torch" in trainer["rng"]
    completed = json.loads((whole["root"] / "progress.json").read_text())["completed"]
    assert completed["step"] == 8 and re.search(r"/versions/step-000000008/rank-[01]\.json$", completed["checkpoint"])
    assert Path(completed["checkpoint"]).is_file()
    summary = json.loads((whole["root"] / "outputs" / "aml-hpc" / "metrics.json").read_text())
    assert summary["workload"] == "llm-pretrain" and summary["throughput_unit"] == "tokens/s" and summary["mfu"] > 0
    assert "still running after destroy_process_group" not in result.stderr


@slow
def test_a_resumed_run_logs_bit_identical_losses(whole, tmp_path):
    """Resumed from the version of step 4 (as after a crash at a later step; the rehearsal below
    crashes one): every later step logs the uninterrupted run's loss, bit for bit - model,
    optimizer, data position and RNG came back."""
    version = whole["versions"] / "step-000000004"
    again = torchrun(PROFILE, tmp_path, {contract.CHECKPOINT_DIR: str(tmp_path / "ckpt"),
                                         contract.RESUME_VERSION: str(version)})
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from step-000000004 (step 4)" in again.stdout
    resumed = losses(again.stdout)
    assert sorted(resumed) == [5, 6, 7, 8] and resumed == {k: whole["losses"][k] for k in resumed}


LOAD = r"""
import shutil, sys, torch
from pathlib import Path
from torch.distributed.checkpoint.state_dict import get_state_dict
from amlhpc.jobs.workloads import common
from amlhpc.jobs.workloads.llm import sizing, train

version, out, args = Path(sys.argv[1]), Path(sys.argv[2]), train.parse(sys.argv[3:])
d = common.init_distributed()
if d.world > 1:  # as on a node of its own: this rank's part of the version only
    own = out.parent / f"node{d.rank}" / version.name
    shutil.copytree(version / f"rank-{d.rank}", own / f"rank-{d.rank}")
    shutil.copy(version / f"rank-{d.rank}.json", own)
    version = own
cfg = sizing.PRESETS["tiny"]
model, _ = train.build(cfg, d, args)
optimizer = train.optimizer_for(model, d, args)
state = common.TrainState(model, optimizer, sampler=train.position_for(cfg, d, args))
full = lambda sd: {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in sd.items()}
fresh = full(get_state_dict(model, optimizer)[0])
step = common.load_state(state, version)
model_sd, optim_sd = get_state_dict(model, optimizer)
dump = {"step": step, "consumed": state.sampler.consumed, "fresh": fresh, "model": full(model_sd),
        "optim": {k: full(v) for k, v in optim_sd["state"].items()}}
if d.rank == 0:
    torch.save(dump, out)
"""


@slow
def test_a_version_of_two_ranks_loads_into_one_with_the_same_state(whole, tmp_path):
    """2 ranks load the version of step 4 each from its own node's part (their own shards); 1 rank
    loads it resharded from both parts: model and AdamW state are equal element for element."""
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    version = whole["versions"] / "step-000000004"
    two = torchrun([str(version), str(tmp_path / "two.pt"), *PROFILE], tmp_path, {}, script=[str(script)])
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run([sys.executable, str(script), str(version), str(tmp_path / "one.pt"), *PROFILE], cwd=tmp_path,
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "resharded from world size 2" in one.stdout and "resharded" not in two.stdout
    a, b = (torch.load(tmp_path / name, weights_only=True) for name in ("two.pt", "one.pt"))
    assert a["step"] == b["step"] == 4 and a["consumed"] == b["consumed"] == 16
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert any(not torch.equal(b["fresh"][k], b["model"][k]) for k in b["model"]), "the weights were loaded"
    assert a["optim"].keys() == b["optim"].keys()
    for name, moments in a["optim"].items():
        assert moments.keys() == b["optim"][name].keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(moments[k], b["optim"][name][k]) for k in moments), name
        assert float(moments["step"]) == 4.0


class _Payload:
    """What a forged checkpoint pickles: unpickling it would create `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _train_here(monkeypatch, version: Path, tmp_path: Path) -> int:
    """The training's main on one rank in this process (no process group), resuming from `version`."""
    from amlhpc.jobs.workloads.llm import train

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29500"), (contract.RESUME_VERSION, str(version)),
                        (contract.CHECKPOINT_DIR, str(tmp_path / "ckpt"))):
        monkeypatch.setenv(name, value)
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        return train.main([*PROFILE, "--output-dir", str(tmp_path / "outputs")])
    finally:
        torch.use_deterministic_algorithms(deterministic)


@slow
def test_a_forged_metadata_pickle_is_refused_and_never_run(whole, tmp_path, monkeypatch, capsys):
    version = tmp_path / "step-000000004"
    shutil.copytree(whole["versions"] / version.name, version)
    marker = tmp_path / "payload-ran"
    (version / "rank-0" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    assert _train_here(monkeypatch, version, tmp_path) == 2
    err = capsys.readouterr().err
    assert "llm-pretrain: cannot resume:" in err and "nothing in it was run" in err
    assert re.search(r"refers to (io|builtins)\.open", err)
    assert not marker.exists()


@slow
def test_a_version_missing_a_ranks_part_is_refused_on_another_world_size(whole, tmp_path, monkeypatch, capsys):
    """One rank loads whole tensors: node 0's part alone is not enough (rank 1's shards are missing),
    and the load says so instead of leaving half of each tensor as initialised."""
    version = tmp_path / "step-000000004"
    shutil.copytree(whole["versions"] / version.name, version)
    shutil.rmtree(version / "rank-1")
    (version / "rank-1.json").unlink()
    assert _train_here(monkeypatch, version, tmp_path) == 2
    assert re.search(r"model\.\S+ is only partly there: the ranks present \(0\) hold part of what rank 0 loads",
                     capsys.readouterr().err)


@pytest.fixture
def blob_env(azurite):
    env = _env(**{contract.BLOB_CONNECTION_STRING: azurite.connection_string, "COLUMNS": "200",
                  contract.TELEMETRY_INTERVAL_S: "1"})
    env.pop("PYTHONPATH", None)
    return env


@slow
@pytest.mark.azurite
def test_rehearsal_restarts_a_crashed_rank_in_the_job_and_reports_mfu(whole, tmp_path, blob_env):
    """`jobs run llm-pretrain --local` on 2 simulated nodes: rank 1 crashes after step 5, both
    launchers restart the training from the version of step 4 each node holds (its own shards),
    every step logs tokens/s and MFU and the uninterrupted run's loss, and `jobs report`'s
    records of the rehearsal's folder have the MFU and tokens/s of every step."""
    from amlhpc.jobs.report import figures, records

    work = tmp_path / "work"
    result = subprocess.run([sys.executable, "-m", "amlhpc.jobs", "run", "llm-pretrain", "--local", "--nodes", "2",
                             "--procs-per-node", "1", "--outputs", str(outputs_file("dev")), "--workdir", str(work),
                             "--name", f"llm-{uuid.uuid4().hex[:6]}", "--set", "health=off",
                             "--fault", "crash@step=5,rank=1"],
                            cwd=REPO, env=blob_env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "rehearsal succeeded: 2 processes" in result.stdout
    logged = step_lines((work / "node0" / "user_logs" / "std_log_process_0.txt").read_text())
    assert [s["step"] for s in logged] == [1, 2, 3, 4, 5, 5, 6, 7, 8], "step 5 again after the restart"
    assert all(s["tokens_per_s"] > 0 and 0 < s["mfu"] < 1 for s in logged)
    assert all(s["loss"] == whole["losses"][s["step"]] for s in logged), "every loss is the uninterrupted run's"
    for node in (0, 1):
        launch = json.loads((work / f"node{node}" / "outputs" / "aml-hpc" / f"launch-node{node:03d}.json").read_text())
        (again,) = launch["restarts"]
        assert (again["cause"], again["source"], again["version"]) == ("exit", "local", "step-000000004")
        assert launch["completed"]["checkpoint"].endswith(f"/versions/step-000000008/rank-{node}.json")
        held = {p.name for p in work.glob(f"node{node}/scratch/amlhpc-checkpoints/*/versions/step-*/rank-*")}
        assert held == {f"rank-{node}", f"rank-{node}.json"}, "each node holds its own ranks' parts only"

    found = records.read(work)
    assert found.throughput_unit == "tokens/s" and found.mfu is not None and found.throughput is not None
    assert [[x for x, _ in segment] for segment in found.mfu.segments] == [[1, 2, 3, 4, 5], [5, 6, 7, 8]]
    assert found.mfu.points == [(s["step"], pytest.approx(100 * s["mfu"])) for s in logged]
    assert found.throughput.points == [(s["step"], pytest.approx(s["tokens_per_s"])) for s in logged]
    assert found.step_times[0].points == [(s["step"], pytest.approx(s["step_time_s"])) for s in logged]
    samples = [json.loads(line) for path in work.glob("node*/outputs/aml-hpc/telemetry-node*.jsonl")
               for line in path.read_text().splitlines()]
    assert any(sample["step"] for sample in samples), "node telemetry was sampled, with the training's step"
    assert found.gpu_util == {} and not found.problems, "a CPU node's samples have no GPU figures, and no error"
    plots = {p.key: p for p in figures.all_plots(found)}
    assert plots["mfu"].series and plots["throughput"].series
