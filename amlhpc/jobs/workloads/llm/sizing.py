"""Which model a job trains: named shapes, and the largest that fits the GPUs it runs on.

Shapes are the public configurations of Meta's models (Hugging Face config.json of
meta-llama/Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B, Llama-3.1-70B, meta-llama/Llama-2-13b-hf
and codellama/CodeLlama-34b-hf, read 2026-11-25): hidden size, layers, heads, key/value heads,
SwiGLU width, vocabulary, tied embeddings, RoPE base. `tiny` is ours, for the CPU rehearsal.

`--model auto` picks by memory, never by VM size name: the largest shape whose estimated
memory per GPU fits in `USABLE_FRACTION` of the GPU's memory (the catalog's `gpu_memory_gib`
for the job's size, from AMLHPC_SKU_JSON). The estimate, bytes per GPU, for FSDP2 full
sharding over `world` GPUs with bf16 compute, fp32 master weights and AdamW:

- sharded states: 16 x params / world (fp32 weights 4, fp32 gradients 4, Adam moments 8);
- unsharded at a time: the largest FSDP unit (one block, or the embedding and output
  projection of the root) twice (the one computing and the one prefetched), its bf16 weights,
  bf16 gradients and their fp32 copy for the reduce-scatter: 2 x (2 + 2 + 4) bytes x its params;
- activations with every block checkpointed: each block's input kept (2 x b x s x d bytes per
  block) and one block recomputed at a time, 34 x b x s x d bytes (Korthikanti et al.,
  arXiv:2205.05198, eq. 1 without the s^2 attention term, which flash attention does not
  store); the logits in bf16 and their fp32 copy and gradient for the loss, 10 x b x s x vocab;
- `RESERVED_GIB` for the CUDA context, NCCL buffers and the allocator's fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

from amlhpc.jobs.workloads.llm.model import ModelConfig

PRESETS: dict[str, ModelConfig] = {c.name: c for c in (
    ModelConfig("tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_dim=192),
    ModelConfig("llama3.2-1b", dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=8192,
                tie_embeddings=True),
    ModelConfig("llama3.2-3b", dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, vocab_size=128256, ffn_dim=8192,
                tie_embeddings=True),
    ModelConfig("llama3.1-8b", dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336),
    ModelConfig("llama2-13b", dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, vocab_size=32000, ffn_dim=13824,
                rope_theta=10000.0),
    ModelConfig("codellama-34b", dim=8192, n_layers=48, n_heads=64, n_kv_heads=8, vocab_size=32000, ffn_dim=22016,
                rope_theta=1000000.0),
    ModelConfig("llama3.1-70b", dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=128256, ffn_dim=28672),
)}
AUTO_CANDIDATES = tuple(name for name in PRESETS if name != "tiny")
"""What `auto` chooses from. Memory does not grow with parameters alone (a 128K vocabulary's
logits and embeddings cost more than a 32K one's), so the pick is the most parameters among
the shapes that fit, not the last that fits."""

USABLE_FRACTION = 0.9
RESERVED_GIB = 6.0
GIB = 1 << 30


@dataclass(frozen=True)
class MemoryEstimate:
    model: str
    states_gib: float
    unsharded_gib: float
    activations_gib: float
    total_gib: float
    budget_gib: float

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.budget_gib

    def to_json(self) -> dict:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in self.__dict__.items()} | {"fits": self.fits}


def estimate(cfg: ModelConfig, *, gpu_memory_gib: float, world: int, micro_batch: int, seq_len: int) -> MemoryEstimate:
    """Bytes per GPU for training `cfg` (see the module docstring), in GiB."""
    params = cfg.param_count()
    states = 16.0 * params / max(world, 1)
    largest_unit = max(cfg.layer_params(), cfg.embedding_params() * (1 if cfg.tie_embeddings else 2))
    unsharded = 2 * (2 + 2 + 4.0) * largest_unit
    tokens = micro_batch * seq_len
    activations = 2.0 * tokens * cfg.dim * cfg.n_layers + 34.0 * tokens * cfg.dim + 10.0 * tokens * cfg.vocab_size
    total = (states + unsharded + activations) / GIB + RESERVED_GIB
    return MemoryEstimate(cfg.name, states / GIB, unsharded / GIB, activations / GIB, total, USABLE_FRACTION * gpu_memory_gib)


def choose(*, gpu_memory_gib: float, world: int, micro_batch: int, seq_len: int) -> tuple[ModelConfig, list[MemoryEstimate]]:
    """The AUTO_CANDIDATES shape with the most parameters that fits; every estimate, for the log. ValueError
    when even the smallest does not fit (the message names it and what to change)."""
    estimates = [estimate(PRESETS[name], gpu_memory_gib=gpu_memory_gib, world=world, micro_batch=micro_batch,
                          seq_len=seq_len) for name in AUTO_CANDIDATES]
    fitting = [e for e in estimates if e.fits]
    if not fitting:
        smallest = min(estimates, key=lambda e: e.total_gib)
        raise ValueError(f"no model fits {gpu_memory_gib:g} GiB per GPU with {world} GPUs, micro batch {micro_batch} and "
                         f"sequence length {seq_len}: the least demanding, {smallest.model}, needs {smallest.total_gib:.1f} GiB "
                         f"of the {smallest.budget_gib:.1f} GiB usable; lower --seq-len or --micro-batch, or add nodes")
    return max((PRESETS[e.model] for e in fitting), key=lambda c: c.param_count()), estimates
