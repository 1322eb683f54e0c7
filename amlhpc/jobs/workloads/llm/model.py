"""A Llama-style decoder: RMSNorm, rotary position embeddings, SwiGLU MLP, grouped-query attention.

The architecture of Meta's Llama 2/3 family (arXiv:2307.09288, arXiv:2407.21783): pre-norm
blocks with RMSNorm, attention with rotary embeddings on queries and keys and fewer key/value
heads than query heads (GQA), a SwiGLU feed-forward, an untied (or tied) output projection.
Attention runs through torch's scaled_dot_product_attention (flash kernels on GPU).

Built on the meta device and initialised after sharding (`init_weights`), so an 8B or 70B
model is never materialised whole on one rank. Besides the module:
- `ModelConfig.param_count()`: parameters, from the shape alone;
- `ModelConfig.flops_per_token(seq_len)`: training FLOPs per token, 6 x (parameters in
  matmuls) + 12 x layers x heads x head_dim x seq_len (PaLM, arXiv:2204.02311 appendix B;
  the same count as pytorch/torchtitan's get_dense_model_nparams_and_flops, read 2026-11-25):
  forward 2 FLOPs per multiply-add, backward twice the forward. The input embedding is a
  lookup and the norms are elementwise, so both are left out; the output projection (tied to
  the embedding or not) is a matmul and counts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_dim: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: dim {self.dim} must divide by n_heads {self.n_heads}, and n_heads by "
                             f"n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"{self.name}: the head dimension {self.head_dim} must be even (rotary embeddings)")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def layer_matmul_params(self) -> int:
        kv = self.n_kv_heads * self.head_dim
        attention = self.dim * self.dim * 2 + self.dim * kv * 2  # q, o; k, v
        return attention + 3 * self.dim * self.ffn_dim  # SwiGLU's three matrices

    def layer_params(self) -> int:
        return self.layer_matmul_params() + 2 * self.dim  # and two norms

    def embedding_params(self) -> int:
        return self.vocab_size * self.dim

    def param_count(self) -> int:
        output = 0 if self.tie_embeddings else self.embedding_params()
        return self.embedding_params() + output + self.n_layers * self.layer_params() + self.dim

    def matmul_params(self) -> int:
        """Parameters that multiply every token: the layers' matrices and the output projection."""
        return self.n_layers * self.layer_matmul_params() + self.embedding_params()

    def flops_per_token(self, seq_len: int) -> float:
        return 6.0 * self.matmul_params() + 12.0 * self.n_layers * self.n_heads * self.head_dim * seq_len

    def to_json(self) -> dict:
        return {**asdict(self), "params": self.param_count()}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary_tables(head_dim: int, seq_len: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation per position and frequency pair, (seq_len, head_dim / 2)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (even, odd) pairs of x (batch, heads, seq, head_dim) by each position's angles."""
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[: x.shape[-2]], sin[: x.shape[-2]]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.n_kv_heads != self.n_heads:  # each key/value head serves n_heads / n_kv_heads query heads
            repeat = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Token ids (batch, seq) -> logits, or the mean next-token loss when `targets` are given."""

    def __init__(self, cfg: ModelConfig, max_seq_len: int, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg, self.max_seq_len, self.activation_checkpointing = cfg, max_seq_len, activation_checkpointing
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rotary_tables(cfg.head_dim, max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Weights after `to_empty` (sharded or not): normal(0, 0.02), the residual outputs
        scaled by 1/sqrt(2 x layers) (GPT-2's scheme), norms at 1; the rotary tables again."""
        std, out_std = 0.02, 0.02 / math.sqrt(2 * self.cfg.n_layers)
        nn.init.normal_(self.tok_embeddings.weight, std=std)
        for layer in self.layers:
            for linear in (layer.attention.wq, layer.attention.wk, layer.attention.wv, layer.feed_forward.w1,
                           layer.feed_forward.w3):
                nn.init.normal_(linear.weight, std=std)
            nn.init.normal_(layer.attention.wo.weight, std=out_std)
            nn.init.normal_(layer.feed_forward.w2.weight, std=out_std)
            nn.init.ones_(layer.attention_norm.weight)
            nn.init.ones_(layer.ffn_norm.weight)
        nn.init.ones_(self.norm.weight)
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.output.weight, std=std)
        cos, sin = rotary_tables(self.cfg.head_dim, self.max_seq_len, self.cfg.rope_theta, device=self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            if self.activation_checkpointing and self.training:
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(layer, x, self.rope_cos, self.rope_sin, use_reentrant=False)
            else:
                x = layer(x, self.rope_cos, self.rope_sin)
        logits = self.output(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
